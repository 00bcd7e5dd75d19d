r"""Ahead-of-time plan of the GRPO train step (forward, backward, AdamW update) for real model
sizes on fake CPU devices: XLA's peak bytes, FLOPs and bytes accessed per device, with the
G samples of a prompt sharing its pass (GroupBatch) and with one prompt per row. No weights
are allocated.

    python launch/memory_plan_grpo.py --model qwen3-4b --prompts 8 --group 8 \
        --prompt-len 512 --response-len 4096 --accum 8 --meshes fsdp8,fsdp4-tp2
"""

import argparse
import os
import sys

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument(
    "--model", default="qwen3-4b", help="a name in mapfjax.models.qwen3.PRESETS, e.g. tiny"
)
ARGS.add_argument("--devices", type=int, default=8, help="fake CPU devices to plan for")
ARGS.add_argument("--meshes", default="fsdp8,fsdp4-tp2", help="axisN-axisM,...")
ARGS.add_argument("--prompts", type=int, default=8, help="prompts per update")
ARGS.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO group size)")
ARGS.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per row")
ARGS.add_argument("--response-len", type=int, default=4096, help="response tokens per row")
ARGS.add_argument("--accum", default="8", help="micro-batches per update, comma list")
ARGS.add_argument("--layouts", default="shared,rows", help="shared (GroupBatch), rows, or both")
# Qwen3 attends in query blocks only when the block divides the sequence (512 + 4096 = 9 x 512).
ARGS.add_argument(
    "--attention-chunk", type=int, default=512, help="query block of Qwen3's attention, in tokens"
)
ARGS.add_argument("--param-dtype", default="bfloat16", help="bfloat16 or float32 (master)")
OPTS = ARGS.parse_args()
# Must precede the first jax import: the fake device count is read once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={OPTS.devices}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mapfjax import parallel  # noqa: E402
from mapfjax.models.qwen3 import PRESETS, Qwen3  # noqa: E402
from mapfjax.rl.grpo import GRPOConfig  # noqa: E402
from mapfjax.rl.trainer import OptimConfig, lower_train_step  # noqa: E402


def main():
    cfg, rows, pdt = PRESETS[OPTS.model], OPTS.prompts * OPTS.group, jnp.dtype(OPTS.param_dtype)
    loss_cfg = GRPOConfig(group_size=OPTS.group, max_response_tokens=OPTS.response_len)
    print(
        f"{OPTS.model} GRPO step, {OPTS.prompts} prompts x {OPTS.group} samples, "
        f"{OPTS.prompt_len} + {OPTS.response_len} tokens, bf16 activations, {pdt.name} params + "
        f"Adam, remat, attention blocks of {OPTS.attention_chunk}; per device: GiB, TFLOP, TB"
    )
    model = lambda: Qwen3(  # attention_block=0: plan the accelerator's graph, not CPU blocks
        cfg, dtype=jnp.bfloat16, param_dtype=pdt, remat=True,
        attention_chunk=OPTS.attention_chunk, attention_block=0,
    )  # fmt: skip
    for spec in OPTS.meshes.split(","):
        mesh = parallel.mesh_from_spec(spec)
        for accum in (int(a) for a in OPTS.accum.split(",")):
            optim = OptimConfig(lr=1e-6, accum_steps=accum, remat=True)
            for layout in OPTS.layouts.split(","):
                g = OPTS.group if layout == "shared" else None
                lowered = lower_train_step(
                    model, optim, "grpo", loss_cfg, mesh, rows, OPTS.prompt_len,
                    OPTS.response_len, group_size=g,
                )  # fmt: skip
                mem = parallel.memory_per_device(lowered)
                print(
                    f"{spec:>10} accum={accum:<3} {layout:>6}: {mem['flops'] / 1e12:7.1f} TFLOP "
                    f"{mem['bytes_accessed'] / 1e12:6.2f} TB  {parallel.describe_memory(mem)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
