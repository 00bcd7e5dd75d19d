"""Low-rank adapters (LoRA) for the trainer: the model's weights stay frozen and each targeted
kernel W trains as W + (alpha / rank) * A @ B, A [*in, rank] drawn at random and B [rank, *out]
zero, so training starts from the model itself (`OptimConfig.lora_rank`).

The update is applied by merging: every forward of the train step builds W + (alpha / rank) *
A @ B (in W's dtype, as a full fine-tune's weights are held) and runs the model unchanged, so
every attention and sampling path serves LoRA as it is. The optimiser's moments cover only A
and B (for Qwen3-4B at rank 32, 1.6 % of the weights), the reference policy of a KL term is
the frozen model itself (no copy), and a checkpoint holds A and B. The weight gradient still
has the kernel's full shape inside the step, before it is contracted to A and B.

Kernels by name (the last part of a parameter's path) with how many of their axes after the
stacked "layers" axis are inputs: attention's q, k, v (embed -> heads x head_dim) and o, the
MLP's gate, up and down.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

# kernel name -> input axes after the leading "layers" axis (see the module docstring)
TARGETS = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """rank: columns of A (rows of B); alpha: the delta's scale is alpha / rank, so that the
    best learning rate moves little with the rank; targets: kernel names in TARGETS."""

    rank: int
    alpha: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def spec_of(optim) -> LoraSpec | None:
    """The `LoraSpec` of an `OptimConfig` (None without adapters: lora_rank 0)."""
    if not optim.lora_rank:
        return None
    return LoraSpec(int(optim.lora_rank), float(optim.lora_alpha), tuple(optim.lora_targets))


def _axes(var) -> tuple:
    return tuple(var.get_metadata().get("logical_axes") or (None,) * len(var.get_value().shape))


def _split(path, var) -> tuple[int, int]:
    """(leading axes, input axes) of a targeted kernel: 1 leading when its first axis is the
    stacked layers'."""
    lead = 1 if _axes(var)[:1] == ("layers",) else 0
    return lead, TARGETS[path[-1]]


def targeted(base, spec: LoraSpec) -> list[tuple]:
    """Paths of `base` (an nnx.State of the model's Params) that `spec` adapts. Raises
    ValueError naming a target the model has no kernel for."""
    paths = [p for p, _ in nnx.to_flat_state(base) if p and p[-1] in spec.targets]
    missing = sorted(set(spec.targets) - {p[-1] for p in paths})
    if missing:
        raise ValueError(
            f"lora_targets {missing}: the model has no such kernel; allowed {sorted(TARGETS)}"
        )
    return paths


def init(base, spec: LoraSpec, rng) -> nnx.State:
    """Adapters for `base`: for each targeted kernel path, {"a": Param, "b": Param} at that
    path (an nnx.State of the same nesting), A ~ N(0, 1 / fan_in), B = 0, in the kernel's
    dtype; each factor carries the kernel's logical axes (the rank axis replicated). Works on
    abstract states (`jax.eval_shape`)."""
    flat = dict(nnx.to_flat_state(base))
    out = []
    paths = targeted(base, spec)
    for key, path in zip(jax.random.split(rng, len(paths)), paths, strict=True):
        var = flat[path]
        shape, dtype, axes = var.get_value().shape, var.get_value().dtype, _axes(var)
        lead, n_in = _split(path, var)
        fan_in = math.prod(shape[lead : lead + n_in])
        a_shape = (*shape[: lead + n_in], spec.rank)
        b_shape = (*shape[:lead], spec.rank, *shape[lead + n_in :])
        a = jax.random.normal(key, a_shape, jnp.float32) / math.sqrt(fan_in)
        a_axes = (*axes[: lead + n_in], None)  # the rank axis: replicated
        b_axes = (*axes[:lead], None, *axes[lead + n_in :])
        out.append(((*path, "a"), nnx.Param(a.astype(dtype), logical_axes=a_axes)))
        out.append(((*path, "b"), nnx.Param(jnp.zeros(b_shape, dtype), logical_axes=b_axes)))
    return nnx.from_flat_state(out)


def delta(a, b, shape, lead: int, scale: float):
    """scale * A @ B as a kernel of `shape` (float32): A [*lead, *in, r], B [*lead, r, *out]."""
    lead_shape = shape[:lead]
    r = a.shape[-1]
    a2 = a.reshape(math.prod(lead_shape), -1, r)
    b2 = b.reshape(math.prod(lead_shape), r, -1)
    d = jnp.einsum("lir,lro->lio", a2, b2, preferred_element_type=jnp.float32)
    return scale * d.reshape(shape)


def merge(base, adapters, spec: LoraSpec):
    """`base` with every adapted kernel W replaced by W + scale * A @ B (in W's dtype)."""
    flat = dict(nnx.to_flat_state(base))
    factors = dict(nnx.to_flat_state(adapters))
    for path in targeted(base, spec):
        var = flat[path]
        w = var.get_value()
        lead, _ = _split(path, var)
        a, b = factors[(*path, "a")].get_value(), factors[(*path, "b")].get_value()
        merged = w.astype(jnp.float32) + delta(a, b, w.shape, lead, spec.scale)
        flat[path] = var.replace(merged.astype(w.dtype))
    return nnx.from_flat_state(flat)


def num_params(state) -> int:
    """Number of scalars in a parameter tree."""
    return sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(state))


def trainable_fraction(base, adapters) -> float:
    """Scalars in the adapters over scalars in the model."""
    return num_params(adapters) / num_params(base)
