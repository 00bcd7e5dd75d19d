"""Causal attention over key-padded rows through the TPU splash (flash) attention kernel of
`jax.experimental.pallas.ops.tpu.splash_attention`; off TPU the same kernel runs in Pallas
interpret mode (exact but slow: for tests, not for training).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from mapfjax import parallel

Array = jax.Array

# The kernel's tiles: every block length is a multiple of the TPU's 128 lanes (the kernel
# checks this for the key blocks and, with segment ids, for the query blocks of its backward
# pass). Each sequence is padded to a multiple of LANES and cut into the largest of BLOCKS
# that divides it (512: MaxText's default for splash; not yet tuned on a TPU here).
LANES = 128
BLOCKS = (512, 256, 128)


def _block(n: int) -> int:
    return next(b for b in BLOCKS if n % b == 0)


def block_sizes(q_len: int, kv_len: int):
    """The kernel's `BlockSizes` for q_len queries over kv_len keys (forward and backward
    tiles alike); ValueError naming the shape unless both are positive multiples of LANES."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    for name, n in (("q_len", q_len), ("kv_len", kv_len)):
        if n <= 0 or n % LANES:
            raise ValueError(
                f"splash attention: {name}={n} (queries {q_len}, keys {kv_len}) must be a "
                f"positive multiple of {LANES}, cut into blocks of {BLOCKS}; pad the sequence "
                "(causal_attention pads it)"
            )
    bq, bkv = _block(q_len), _block(kv_len)
    return sa.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        block_q_dq=bq,
        block_kv_dq=bkv,
    )


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def interpret_mode() -> bool:
    """True where the kernel runs in Pallas interpret mode: every backend but TPU."""
    return jax.default_backend() != "tpu"


def causal_attention(q: Array, k: Array, v: Array, valid: Array, scale: float) -> Array:
    """Softmax attention of q [R, N, C, D] over k, v [R, K, S, D] (R rows, N = K x Q query
    heads, query head n reading KV head n // Q) -> [R, N, C, D] in q's dtype.

    Query c is the token in key slot S - C + c (C <= S: the last C keys are the queries' own,
    any earlier ones a prefix they all see). valid: bool [R, S], True on real tokens. A real
    query attends to the real keys at or before its slot; a padding query's output is finite
    but unspecified (it attends to padding keys, never to real ones: no row is ever fully
    masked, which would make the kernel divide by zero). Queries and keys are padded to
    multiples of LANES; under a `jax.set_mesh` mesh the kernel runs per device through
    `shard_map` (rows over the batch axes, KV heads over tp where they divide).
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    r, n, c, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    if k.shape != (r, kh, s, d) or v.shape != k.shape or valid.shape != (r, s) or c > s:
        raise ValueError(
            f"splash attention: q {q.shape}, k {k.shape}, v {v.shape}, valid {valid.shape}; "
            "expected q [R, N, C, D], k and v [R, K, S, D], valid [R, S] with C <= S"
        )
    if n % kh:
        raise ValueError(f"splash attention: {n} query heads are not a multiple of {kh} KV heads")
    offset = s - c
    c_pad = _round_up(c, LANES)
    # Every padding query (slot offset + i) finds a padding key at its own slot.
    s_pad = _round_up(offset + c_pad, LANES)
    blocks = block_sizes(c_pad, s_pad)
    mask = sa.MultiHeadMask([sa.CausalMask((c_pad, s_pad), offset=offset)] * n)
    kernel = sa.make_splash_mha_single_device(mask, block_sizes=blocks, interpret=interpret_mode())

    ids = jnp.pad(valid.astype(jnp.int32), ((0, 0), (0, s_pad - s)))  # 1 real, 0 padding
    q_ids = ids[:, offset : offset + c_pad]
    q = jnp.pad(q * jnp.asarray(scale, q.dtype), ((0, 0), (0, 0), (0, c_pad - c), (0, 0)))
    k = jnp.pad(k.astype(q.dtype), ((0, 0), (0, 0), (0, s_pad - s), (0, 0)))
    v = jnp.pad(v.astype(q.dtype), ((0, 0), (0, 0), (0, s_pad - s), (0, 0)))

    def one(q, k, v, q_ids, kv_ids):  # one row: q [N, C', D], k and v [K, S', D]
        return kernel(q, k, v, segment_ids=sa.SegmentIds(q=q_ids, kv=kv_ids))

    rows = jax.vmap(one)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and set(parallel.AXES) <= set(mesh.axis_names) and mesh.size > 1:
        spec = parallel.logical_to_spec(
            ("batch", "kv_heads", None, None), mesh, "train", k.shape
        )  # query heads follow their KV heads, so a head split keeps each group on one device
        ids_spec = PartitionSpec(spec[0], None)
        rows = jax.shard_map(
            rows,
            mesh=mesh,
            in_specs=(spec, spec, spec, ids_spec, ids_spec),
            out_specs=spec,
            check_vma=False,
        )
    out = rows(q, k, v, q_ids, ids)
    return out[:, :, :c]
