"""Ahead-of-time memory plan: compile Qwen3 computations for real shapes on fake CPU devices
and print XLA's bytes per device. No weights are allocated.

    python launch/memory_plan.py --model qwen3-4b --devices 8 --sizes 8x2048,32x4096
"""

import argparse
import os
import sys

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument(
    "--model", default="qwen3-4b", help="a name in mapfjax.models.qwen3.PRESETS, e.g. tiny"
)
ARGS.add_argument("--devices", type=int, default=8, help="fake CPU devices to plan for")
ARGS.add_argument("--meshes", default="fsdp8,fsdp4-tp2,data2-fsdp4,tp8", help="axisN-axisM,...")
ARGS.add_argument("--sizes", default="8x2048,8x8192", help="batch x sequence length, comma list")
ARGS.add_argument("--computations", default="all", help="names from COMPUTATIONS, or all")
OPTS = ARGS.parse_args()
# Must precede the first jax import: the fake device count is read once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={OPTS.devices}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mapfjax import parallel  # noqa: E402
from mapfjax.models import sampler  # noqa: E402
from mapfjax.models.qwen3 import PRESETS, Qwen3  # noqa: E402


def lowered_call(method):
    """Lowers model.<method>(tokens)[0] on [B, T] tokens with train rules: "__call__" gives
    float32 logits [B, T, V], "hidden_states" the final hidden states [B, T, H] (as chunked
    log-prob code uses them)."""

    def build(graphdef, state, mesh, b, t):
        spec = parallel.logical_to_sharding(("batch", "seq"), mesh, "train", (b, t))
        fn = jax.jit(lambda s, x: getattr(nnx.merge(graphdef, s), method)(x)[0])
        return fn.lower(state, jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=spec))

    return build


def sample(graphdef, state, mesh, b, t):
    """Sampling: prefill T/2 prompt tokens, decode T/2 more over a bf16 KV cache of T slots."""
    kw = dict(batch=b, prompt_len=t // 2, max_new_tokens=t - t // 2, mesh=mesh)
    return sampler.lower_generate(graphdef, state, **kw)


# name -> (sharding rules for the parameters, fn(graphdef, state, mesh, batch, seq) -> lowered)
COMPUTATIONS = {
    "forward": ("train", lowered_call("__call__")),
    "hidden": ("train", lowered_call("hidden_states")),
    "sample": ("sample", sample),
}


def main():
    cfg = PRESETS[OPTS.model]
    names = list(COMPUTATIONS) if OPTS.computations == "all" else OPTS.computations.split(",")
    sizes = [tuple(int(v) for v in s.split("x")) for s in OPTS.sizes.split(",")]
    print(
        f"{OPTS.model}, {OPTS.devices} devices, GiB per device "
        "(peak = args + out - aliased + temp, + the cache's last growth when sampling)"
    )
    for spec in OPTS.meshes.split(","):
        mesh = parallel.mesh_from_spec(spec)
        for name in names:
            rules, build = COMPUTATIONS[name]
            graphdef, state = parallel.abstract_sharded_state(lambda: Qwen3(cfg), mesh, rules)
            for b, t in sizes:
                with jax.set_mesh(mesh):  # activates the model's activation constraints
                    mem = parallel.memory_per_device(build(graphdef, state, mesh, b, t))
                if name == "sample":  # the last cache growth holds the old cache beside it
                    kw = dict(batch=b, max_new_tokens=t - t // 2, mesh=mesh)
                    mem["growth"] = sampler.growth_bytes(cfg, **kw)
                line = parallel.describe_memory(mem)
                print(f"{spec:>12} {name:>8} B={b:<4} T={t:<6} {line}", flush=True)


if __name__ == "__main__":
    main()
