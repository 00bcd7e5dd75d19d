"""Grow a trained Qwen3 deeper without changing what it computes: new decoder layers whose
output projections (attention `o`, MLP `down`) are zero add nothing to the residual stream until
trained; their other weights are freshly initialised, so gradients reach the zeros at once.

    python -m mapfjax.models.grow SRC DST --layers 18   # SRC, DST: HF checkpoint directories

Used to ask whether capacity, not more updates, is what a small model lacks
(docs/experiments.md, "The shipped tiny model's history"): continue the grown model with the
same recipe and compare at equal compute.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from mapfjax.models import hf
from mapfjax.models.qwen3 import Qwen3

# Per-layer parameters that write into the residual stream: zero in an inserted layer.
RESIDUAL_WRITERS = (("attn", "o"), ("mlp", "down"))


def layer_plan(old: int, new: int) -> list[int]:
    """For each of the `new` layers, the old layer it copies, or -1 for an inserted one; the
    inserted layers are spread evenly (each after a run of old ones), old order kept."""
    if not (isinstance(old, int) and isinstance(new, int) and 1 <= old <= new):
        raise ValueError(f"layers: grow {old!r} -> {new!r}; allowed: 1 <= old <= new")
    added = new - old
    plan, placed = [], 0
    for i in range(old):
        plan.append(i)
        # After old layer i, insert as many as keep the inserted share even so far.
        due = (i + 1) * added // old
        plan += [-1] * (due - placed)
        placed = due
    return plan


def deepen(model: Qwen3, num_layers: int, seed: int = 0) -> Qwen3:
    """A copy of `model` with `num_layers` decoder layers computing the same function (up to
    float rounding): its layers in order, with new zero-output layers between them
    (`layer_plan`). Embeddings, final norm and the other hyper-parameters are unchanged."""
    cfg = model.config
    plan = layer_plan(cfg.num_layers, num_layers)
    dtype = model.embedding[...].dtype
    grown = Qwen3(
        dataclasses.replace(cfg, num_layers=num_layers),
        dtype=model.dtype,
        param_dtype=dtype,
        rngs=nnx.Rngs(seed),
        attention_chunk=model.chunk,
        attention_block=model.score_block,
    )
    old = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    fresh = dict(nnx.to_flat_state(nnx.state(grown, nnx.Param)))
    out = {}
    for path, var in fresh.items():
        if path[0] != "layers":  # embeddings, final norm: the trained ones
            out[path] = old[path]
            continue
        trained, new = old[path][...], var[...]
        zero = any(path[1:3] == w for w in RESIDUAL_WRITERS)
        rows = [
            trained[i] if i >= 0 else (jnp.zeros_like(new[j]) if zero else new[j])
            for j, i in enumerate(plan)
        ]
        out[path] = var.replace(jnp.stack(rows))
    nnx.update(grown, nnx.from_flat_state(out))
    return grown


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mapfjax.models.grow", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("src", help="a Hugging Face Qwen3 checkpoint directory")
    p.add_argument("dst", help="where the grown checkpoint goes (tokenizer files copied)")
    p.add_argument("--layers", type=int, required=True, help="decoder layers of the result")
    p.add_argument("--seed", type=int, default=0, help="initialisation of the inserted layers")
    a = p.parse_args(argv)
    try:
        model = hf.from_pretrained(a.src, dtype=jnp.float32)
        grown = deepen(model, a.layers, a.seed)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = hf.save_pretrained(grown, a.dst, copy_from=a.src)
    before = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    after = sum(x.size for x in jax.tree.leaves(nnx.state(grown, nnx.Param)))
    print(f"{a.src}: {model.config.num_layers} layers, {before:,} parameters -> {out}: "
          f"{a.layers} layers, {after:,} parameters")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
