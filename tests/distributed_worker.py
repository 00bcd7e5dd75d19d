"""One process of a multi-process job (run by tests/test_distributed.py, never imported by
pytest): joins through jax.distributed, runs two sharded SFT train steps on a tiny Qwen3 over
every process's CPU devices, prints a checksum of the parameters as JSON."""

import json
import os
import sys


def main():
    pid, nproc, port, local = (int(a) for a in sys.argv[1:5])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from mapfjax import parallel

    if nproc > 1:
        parallel.initialize_distributed(f"127.0.0.1:{port}", nproc, pid)
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from mapfjax.models.qwen3 import PRESETS, Qwen3
    from mapfjax.rl.batch import make_batch
    from mapfjax.rl.trainer import OptimConfig, Trainer

    mesh = parallel.make_mesh({"data": 1, "fsdp": 4, "tp": 2})
    model = parallel.init_sharded(
        lambda: Qwen3(
            PRESETS["tiny"], dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0)
        ),
        mesh,
        parallel.RULES["train"],
    )
    trainer = Trainer(model, OptimConfig(lr=1e-2, total_steps=10), "sft", mesh)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 255, rng.integers(3, 9))) for _ in range(8)]
    completions = [list(rng.integers(1, 255, rng.integers(2, 7))) for _ in range(8)]
    batch = make_batch(prompts, completions, 0, prompt_bucket=8, completion_bucket=8)
    losses = [trainer.step(batch)["loss"] for _ in range(2)]
    total = jax.jit(lambda p: sum(jnp.sum(x) for x in jax.tree.leaves(p)))(trainer.params)
    sq = jax.jit(lambda p: sum(jnp.sum(x * x) for x in jax.tree.leaves(p)))(trainer.params)
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "processes": jax.process_count(),
                "devices": jax.device_count(),
                "losses": losses,
                "sum": float(total),
                "sumsq": float(sq),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
