"""A decode step's attention through JAX's Pallas GPU decode kernel (`attention_impl=
"pallas_decode"`): `jax.experimental.pallas.ops.gpu.decode_attention.gqa`, which reads each
key and value once per step in blocks split over the sequence (flash-decoding).

One query per row attends to two caches: the prompt prefix its group of G rows shares and the
row's own earlier tokens. Each is one kernel call returning the unnormalised output with its
running max and sum, and the two are merged by log-sum-exp. For the prefix the G rows' query
heads are folded into the query-head axis (the kernel's query head n = kv_head * H + h, H the
query heads per KV head), so a group's prefix is read once, not G times.

The kernel masks keys outside one contiguous range [start_idx, kv_seq_len) per row: a prefix's
valid slots must be contiguous (left padding, as the sampler writes its prompts, or right
padding), and a row reads its own slots [0, index]. Sequences are read in place where their
length is a multiple of 16 with an odd factor of at most 15 (every power of two from 16 up,
as the sampler's prompt buckets and windows from 64 slots are, except a last window cut to
the budget); others are padded to the next such length at every call (a copy; `_layout`).
Off GPU the kernel runs in Pallas interpret mode: exact but slow, for tests; it is meant for
GPUs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode

# The kernel's key blocks: every split of the sequence holds a multiple of this many slots.
_MIN_BLOCK = 16
# Most splits of a sequence (the kernel's default), and the largest key block.
_MAX_SPLITS = 16
_MAX_BLOCK = 128


def _layout(length: int) -> tuple[int, int, int]:
    """(padded length, k_splits, block_k) for a sequence of `length` slots. Triton's blocks
    are powers of two, so each of the kernel's splits holds 16 * 2^j slots: the length is
    padded to the first multiple of 16 whose count of 16-slot blocks has an odd factor of at
    most 15 (a multiple of 16 up to 240 slots, a power of two times 16 x 1..15 beyond), split
    into the most such splits up to 16, read in key blocks of up to 128 slots."""
    blocks = -(-length // _MIN_BLOCK)
    while blocks // (blocks & -blocks) > _MAX_SPLITS:  # odd part of the block count
        blocks += 1
    odd, twos = blocks // (blocks & -blocks), blocks & -blocks
    splits = odd
    while splits * 2 <= _MAX_SPLITS and twos % (splits * 2 // odd) == 0:
        splits *= 2
    per_split = blocks * _MIN_BLOCK // splits
    return blocks * _MIN_BLOCK, splits, min(per_split, _MAX_BLOCK)


def _pad_seq(x: Array, axis: int, length: int) -> Array:
    """Pads `axis` with zeros to `length` slots (masked by the caller's ranges)."""
    extra = length - x.shape[axis]
    if not extra:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return jnp.pad(x, pad)


def _gqa(q, k, v, start, stop, interpret):
    """q [N, K * H, D]; k, v [N, K, S, D] (the cache layout); start, stop: int32 [N] or [].
    Returns (unnormalised out f32 [N, K * H, D], sum [N, K * H], max [N, K * H])."""
    length, splits, block = _layout(k.shape[2])
    k, v = _pad_seq(k, 2, length), _pad_seq(v, 2, length)
    # The kernel takes [N, S, K, D] and swaps back to [N, K, S, D]: the two transposes cancel.
    out, (total, peak) = pallas_decode.gqa(
        q,
        jnp.swapaxes(k, 1, 2),
        jnp.swapaxes(v, 1, 2),
        start_idx=start,
        kv_seq_len=stop,
        sm_scale=q.shape[-1] ** -0.5,
        block_k=block,
        k_splits=splits,
        interpret=interpret,
        return_residuals=True,
        normalize_output=False,
    )
    return out.astype(jnp.float32), total, peak


def _valid_range(valid: Array) -> tuple[Array, Array]:
    """bool [B, P] -> (first valid slot, last valid slot + 1), int32 [B] each (0, 0 if none).
    Exact for masks whose valid slots are contiguous."""
    p = valid.shape[1]
    any_valid = jnp.any(valid, axis=1)
    first = jnp.argmax(valid, axis=1).astype(jnp.int32)
    stop = (p - jnp.argmax(valid[:, ::-1], axis=1)).astype(jnp.int32)
    return jnp.where(any_valid, first, 0), jnp.where(any_valid, stop, 0)


def decode_attend(q: Array, prefix, own, index: Array, interpret: bool | None = None) -> Array:
    """One query per row: q [B, G, K, H, D]; prefix (kp, vp [B, K, P, D], valid bool [B, P],
    its valid slots contiguous) shared by a group's G rows; own (k, v [B, G, K, W, D]) each
    row's cache, of which slots [0, index] are read (index: int32 []). Returns [B, G, K, H, D]
    in q's dtype, the result of `qwen3._decode_attend` with allowed = arange(W) <= index.
    interpret: Pallas interpret mode (None: on when JAX's default backend is the CPU)."""
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    kp, vp, valid = prefix
    k, v = own
    b, g, kh, h, d = q.shape
    kp, vp = kp.astype(q.dtype), vp.astype(q.dtype)
    k, v = k.astype(q.dtype), v.astype(q.dtype)

    # Prefix: a group's G rows as G * H query heads per KV head, [B, K * G * H, D].
    qp = jnp.swapaxes(q, 1, 2).reshape(b, kh * g * h, d)
    start, stop = _valid_range(valid)
    op, lp, mp = _gqa(qp, kp, vp, start, stop, interpret)
    op = jnp.swapaxes(op.reshape(b, kh, g, h, d), 1, 2)  # [B, G, K, H, D]
    lp = jnp.swapaxes(lp.reshape(b, kh, g, h), 1, 2)
    mp = jnp.swapaxes(mp.reshape(b, kh, g, h), 1, 2)

    # Own cache: one batch row per sample, [B * G, K * H, D] against [B * G, K, W, D].
    qo = q.reshape(b * g, kh * h, d)
    rows_k = k.reshape(b * g, *k.shape[2:])
    rows_v = v.reshape(b * g, *v.shape[2:])
    stop_own = jnp.asarray(index, jnp.int32) + 1
    oo, lo, mo = _gqa(qo, rows_k, rows_v, jnp.int32(0), stop_own, interpret)
    oo, lo, mo = oo.reshape(q.shape), lo.reshape(q.shape[:-1]), mo.reshape(q.shape[:-1])

    # Log-sum-exp merge of the two parts.
    peak = jnp.maximum(mp, mo)
    wp, wo = jnp.exp(mp - peak), jnp.exp(mo - peak)
    total = lp * wp + lo * wo
    out = (op * wp[..., None] + oo * wo[..., None]) / total[..., None]
    return out.astype(q.dtype)
