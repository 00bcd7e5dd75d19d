"""Grow a trained Qwen3 deeper or wider without changing what it computes.

Deeper: new decoder layers whose output projections (attention `o`, MLP `down`) are zero add
nothing to the residual stream until trained. Wider (`widen`, by an integer factor k): k times
the hidden size, heads, KV heads and MLP units; the trained weights fill the first block of
each, the new residual dimensions start at zero (embedding columns and every write into them
zero), new heads and MLP units write nothing, and the RMSNorm scales are divided by sqrt(k)
(a mean over k times the dimensions, of which the new ones are zero, is k times smaller). In
both, every other new weight is freshly initialised, so gradients reach the zeros at once.

    python -m projects.go_no_go.grow SRC DST --layers 18   # SRC, DST: HF checkpoint directories
    python -m projects.go_no_go.grow SRC DST --width 2     # 2x hidden, heads, MLP (~4x parameters)

Used to ask whether capacity, not more updates, is what a small model lacks
(projects/tiny_models/README.md): continue the grown model with the
same recipe and compare at equal compute.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from mapfjax.checks import is_int
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


def _fresh_like(model: Qwen3, cfg, seed: int):
    """A freshly initialised Qwen3 of config `cfg` with `model`'s dtypes and attention settings,
    and the flat parameter states {path: variable} of `model` and of it."""
    grown = Qwen3(
        cfg,
        dtype=model.dtype,
        param_dtype=model.embedding[...].dtype,
        rngs=nnx.Rngs(seed),
        attention_chunk=model.chunk,
        attention_block=model.score_block,
    )
    old = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    return grown, old, dict(nnx.to_flat_state(nnx.state(grown, nnx.Param)))


def deepen(model: Qwen3, num_layers: int, seed: int = 0) -> Qwen3:
    """A copy of `model` with `num_layers` decoder layers computing the same function (up to
    float rounding): its layers in order, with new zero-output layers between them
    (`layer_plan`). Embeddings, final norm and the other hyper-parameters are unchanged."""
    cfg = model.config
    plan = layer_plan(cfg.num_layers, num_layers)
    grown, old, fresh = _fresh_like(model, dataclasses.replace(cfg, num_layers=num_layers), seed)
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


def widen(model: Qwen3, factor: int, seed: int = 0) -> Qwen3:
    """A copy of `model` `factor` times as wide computing the same function (up to float
    rounding, and the q/k norms' epsilon, divided by `factor` with the others): hidden size,
    query and KV heads (so each query head keeps its KV head: head n = kv_head * Q + q with Q
    unchanged) and MLP units are multiplied; head_dim, layers and vocabulary are kept."""
    if not is_int(factor) or factor < 1:
        raise ValueError(f"width factor {factor!r}: allowed an integer >= 1")
    cfg = model.config
    h, n, kv, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    wide_cfg = dataclasses.replace(
        cfg,
        hidden_size=h * factor,
        num_heads=n * factor,
        num_kv_heads=kv * factor,
        intermediate_size=f * factor,
        # The hidden-size norms' mean of squares is `factor` times smaller; so is their epsilon
        # (one epsilon serves every norm: the per-head q/k norms see it halve, ~1e-7 relative).
        rms_norm_eps=cfg.rms_norm_eps / factor,
    )
    wide, old, fresh = _fresh_like(model, wide_cfg, seed)
    norm = 1.0 / float(factor) ** 0.5
    # Per parameter (layer axis first where stacked): the trained block's index, and whether it
    # writes into the residual stream (then its new entries are zero, not fresh).
    blocks = {
        # The embedding writes the residual stream too (tied, it is also the output head).
        ("embedding",): ((slice(None), slice(0, h)), True),
        ("layers", "attn", "q"): ((slice(None), slice(0, h), slice(0, n)), False),
        ("layers", "attn", "k"): ((slice(None), slice(0, h), slice(0, kv)), False),
        ("layers", "attn", "v"): ((slice(None), slice(0, h), slice(0, kv)), False),
        ("layers", "attn", "o"): ((slice(None), slice(0, n), slice(None), slice(0, h)), True),
        ("layers", "mlp", "gate"): ((slice(None), slice(0, h), slice(0, f)), False),
        ("layers", "mlp", "up"): ((slice(None), slice(0, h), slice(0, f)), False),
        ("layers", "mlp", "down"): ((slice(None), slice(0, f), slice(0, h)), True),
    }
    out = {}
    for path, var in fresh.items():
        trained, new = old[path][...], var[...]
        if path[-1] == "scale" and path[-2] in ("q_norm", "k_norm"):  # per head_dim: kept
            out[path] = var.replace(trained)
        elif path[-1] == "scale":  # the hidden-size norms
            out[path] = var.replace(jnp.full_like(new, norm).at[..., :h].multiply(trained))
        elif path in blocks:
            index, writer = blocks[path]
            base = jnp.zeros_like(new) if writer else new
            out[path] = var.replace(base.at[index].set(trained))
        else:
            raise ValueError(f"widen: parameter {'/'.join(path)} has no rule")
    nnx.update(wide, nnx.from_flat_state(out))
    return wide


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m projects.go_no_go.grow", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("src", help="a Hugging Face Qwen3 checkpoint directory")
    p.add_argument("dst", help="where the grown checkpoint goes (tokenizer files copied)")
    p.add_argument("--layers", type=int, help="decoder layers of the result (deeper)")
    p.add_argument("--width", type=int, help="factor on hidden size, heads and MLP (wider)")
    p.add_argument("--seed", type=int, default=0, help="initialisation of the new weights")
    a = p.parse_args(argv)
    if (a.layers is None) == (a.width is None):
        print("error: give one of --layers N (deeper) and --width K (wider)", file=sys.stderr)
        return 2
    try:
        model = hf.from_pretrained(a.src, dtype=jnp.float32)
        if a.layers is not None:
            grown = deepen(model, a.layers, a.seed)
        else:
            grown = widen(model, a.width, a.seed)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = hf.save_pretrained(grown, a.dst, copy_from=a.src)
    before = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    after = sum(x.size for x in jax.tree.leaves(nnx.state(grown, nnx.Param)))
    c, g = model.config, grown.config
    print(f"{a.src}: {c.num_layers} layers of width {c.hidden_size}, {before:,} parameters")
    print(f"-> {out}: {g.num_layers} layers of width {g.hidden_size}, {after:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
