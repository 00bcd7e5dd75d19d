"""GRPO train-step throughput (samples/s, completion tokens/s) of `mapfjax.rl.trainer.Trainer`
on a random small Qwen3 (fp32, CPU), optionally on a fake-device mesh.

    python benchmarks/bench_grpo.py --prompts 4 --group 8 --prompt-len 64 --response-len 256
    python benchmarks/bench_grpo.py --devices 8 --mesh fsdp4-tp2
    python benchmarks/bench_grpo.py --tunix --tunix-venv /tmp/tunix-venv   (vs google-tunix)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--prompts", type=int, default=4)
ARGS.add_argument("--group", type=int, default=8)
ARGS.add_argument("--prompt-len", type=int, default=64)
ARGS.add_argument("--response-len", type=int, default=256)
ARGS.add_argument("--accum", type=int, default=1)
ARGS.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
ARGS.add_argument("--hidden", type=int, default=256)
ARGS.add_argument("--layers", type=int, default=4)
ARGS.add_argument("--vocab", type=int, default=4096)
ARGS.add_argument("--remat", action="store_true")
ARGS.add_argument("--devices", type=int, default=1, help="fake CPU devices (sets XLA_FLAGS)")
ARGS.add_argument("--mesh", default="", help="e.g. fsdp4-tp2; empty = one device, no mesh")
ARGS.add_argument("--tunix", action="store_true", help="also time google-tunix's GRPO loss step")
ARGS.add_argument("--tunix-venv", default="~/.cache/mapfjax/tunix-venv")


def _setup_devices(n: int):
    # Must precede the first jax import: the fake device count is read once at start-up.
    if n > 1:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
        )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def random_batch(opts, vocab: int, seed: int = 0):
    """rows = prompts x group; prompts of varied length, completions of varied length (some
    truncated at the budget), old log-probs and advantages as a rollout would give them."""
    import numpy as np

    from mapfjax.rl.batch import make_batch

    rng = np.random.default_rng(seed)
    rows = opts.prompts * opts.group
    prompts, comps = [], []
    for i in range(rows):
        if i % opts.group == 0:
            prompt = list(
                rng.integers(1, vocab, rng.integers(opts.prompt_len // 2, opts.prompt_len + 1))
            )
        prompts.append(prompt)
        comps.append(list(rng.integers(1, vocab, rng.integers(1, opts.response_len + 1))))
    old = [list(rng.normal(-np.log(vocab), 0.1, len(c))) for c in comps]
    adv = rng.normal(size=rows)
    return make_batch(prompts, comps, 0, opts.prompt_len, opts.response_len, old, adv)


def bench_ours(opts) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mapfjax import parallel
    from mapfjax.models.qwen3 import Qwen3, Qwen3Config
    from mapfjax.rl.grpo import GRPOConfig
    from mapfjax.rl.trainer import OptimConfig, Trainer

    cfg = Qwen3Config(
        vocab_size=opts.vocab,
        hidden_size=opts.hidden,
        intermediate_size=3 * opts.hidden,
        num_layers=opts.layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=opts.hidden // 4,
        rope_theta=1e6,
    )
    mesh = None
    if opts.mesh:
        parts = (re.fullmatch(r"(\D+)(\d+)", p) for p in opts.mesh.split("-"))
        mesh = parallel.make_mesh({m[1]: int(m[2]) for m in parts})
    model = Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32)
    trainer = Trainer(
        model,
        OptimConfig(lr=1e-6, accum_steps=opts.accum, remat=opts.remat),
        "grpo",
        mesh,
        loss_cfg=GRPOConfig(group_size=opts.group),
    )
    batch = trainer.place_batch(random_batch(opts, cfg.vocab_size))
    t0 = time.perf_counter()
    trainer.step(batch)
    first = time.perf_counter() - t0
    times = []
    for _ in range(opts.steps):
        t0 = time.perf_counter()
        trainer.step(batch)  # returns host floats: the step has finished
        times.append(time.perf_counter() - t0)
    best = min(times)
    rows = opts.prompts * opts.group
    tokens = int(np.asarray(batch.loss_mask).sum())
    jax.clear_caches()
    return {
        "first_step_s": first,
        "best_step_s": best,
        "samples_per_s": rows / best,
        "completion_tokens_per_s": tokens / best,
        "sequence_tokens_per_s": rows * (opts.prompt_len + opts.response_len) / best,
    }


# Runs inside google-tunix's own virtualenv (it pins its own jax/flax): tunix's Qwen3 of the
# same shape, tunix's registered "grpo" policy loss on the same kind of batch, jitted with the
# same AdamW update as ours, so both sides time forward + backward + update of one GRPO step.
_TUNIX_SCRIPT = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from tunix.models.qwen3 import model as qm
from tunix.rl import algo_core, common
from tunix.rl.grpo.grpo_learner import GRPOConfig

o = json.loads(sys.argv[1])
cfg = qm.ModelConfig(
    num_layers=o["layers"], vocab_size=o["vocab"], embed_dim=o["hidden"],
    hidden_dim=3 * o["hidden"], num_heads=4, head_dim=o["hidden"] // 4, num_kv_heads=2,
    rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=o["tied"],
)
model = qm.Qwen3(cfg, rngs=nnx.Rngs(0))
b = {k: jnp.asarray(np.asarray(v)) for k, v in np.load(o["batch"]).items()}
example = common.TrainExample(
    prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"],
    completion_ids=b["completion_ids"], completion_mask=b["completion_mask"],
    advantages=b["advantages"], ref_per_token_logps=None,
    old_per_token_logps=b["old_logps"],
)
algo = GRPOConfig(num_generations=o["group"], beta=0.0, loss_agg_mode="token-mean")
# tunix 0.1.7's loss reads algo_config.temperature, a field its GRPOConfig does not declare.
algo.temperature = 1.0
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
graphdef, params = nnx.split(model, nnx.Param)
opt_state = tx.init(params)

@jax.jit
def step(params, opt_state, example):
    def loss(p):
        out = algo_core.grpo_loss_fn(
            nnx.merge(graphdef, p), example, algo, pad_id=0, eos_id=o["vocab"] - 1
        )
        return out[0]
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

t0 = time.perf_counter()
params, opt_state, v = step(params, opt_state, example); float(v)
first = time.perf_counter() - t0
times = []
for _ in range(o["steps"]):
    t0 = time.perf_counter()
    params, opt_state, v = step(params, opt_state, example); float(v)
    times.append(time.perf_counter() - t0)
print(json.dumps({"first_step_s": first, "best_step_s": min(times), "loss": float(v)}))
"""


def _tunix_python(opts) -> str:
    """The python of a virtualenv holding google-tunix, created on first use."""
    import subprocess

    venv = os.path.expanduser(opts.tunix_venv)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"creating {venv} with google-tunix (one-off)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "google-tunix"], check=True)
    return python


def bench_tunix(opts, batch) -> dict:
    """Times google-tunix's GRPO loss + AdamW step on the same model shape and batch."""
    import json
    import subprocess
    import tempfile

    import numpy as np

    P = batch.prompt_len
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.npz")
        np.savez(
            path,
            prompt_ids=np.where(batch.attention_mask[:, :P], batch.tokens[:, :P], 0),
            prompt_mask=batch.attention_mask[:, :P].astype(np.int32),
            completion_ids=np.where(batch.loss_mask, batch.tokens[:, P:], 0),
            completion_mask=batch.loss_mask.astype(np.int32),
            advantages=batch.advantages,
            old_logps=batch.old_logprobs,
        )
        args = dict(
            layers=opts.layers, vocab=opts.vocab, hidden=opts.hidden, group=opts.group,
            tied=True, steps=opts.steps, batch=path,
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run(
            [_tunix_python(opts), "-c", _TUNIX_SCRIPT, json.dumps(args)],
            capture_output=True,
            text=True,
            env=env,
        )
    if out.returncode:
        raise RuntimeError(f"tunix benchmark failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    opts = ARGS.parse_args(argv)
    _setup_devices(opts.devices)
    import jax

    print(
        f"GRPO step: {opts.prompts} prompts x {opts.group} samples, prompt {opts.prompt_len} + "
        f"response {opts.response_len} tokens, hidden {opts.hidden}, {opts.layers} layers, "
        f"vocab {opts.vocab}, accum {opts.accum}, mesh {opts.mesh or '-'}, "
        f"{jax.device_count()} {jax.devices()[0].platform} devices"
    )
    ours = bench_ours(opts)
    rates = (
        f"{ours['samples_per_s']:.1f} samples/s, {ours['completion_tokens_per_s']:.0f} "
        f"completion tokens/s, {ours['sequence_tokens_per_s']:.0f} sequence tokens/s"
    )
    first, best = ours["first_step_s"], ours["best_step_s"]
    print(f"mapfjax: first step {first:.2f} s (compile), best {best:.3f} s: {rates}")
    if opts.tunix:
        tunix = bench_tunix(opts, random_batch(opts, opts.vocab))
        t = tunix["best_step_s"]
        rows = opts.prompts * opts.group
        print(
            f"tunix:   first step {tunix['first_step_s']:.2f} s (compile), best {t:.3f} s: "
            f"{rows / t:.1f} samples/s (step time {t / best:.2f}x ours)"
        )


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    main()
