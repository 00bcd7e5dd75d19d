"""Qwen3 decoder in Flax NNX: architecture presets, the model and its KV cache.

Every parameter carries logical axis names in its `logical_axes` metadata; `mapfjax.parallel`
maps them onto a device mesh.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax import lax

from mapfjax import parallel
from mapfjax.checks import is_finite_real, require, require_int
from mapfjax.models import splash

Array = jax.Array

# Additive mask value: finite so that a fully masked row (a left-pad query) yields a uniform
# softmax instead of NaN, which would otherwise leak into gradients through 0 * NaN.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)

_ACT = ("batch", "seq", "act_embed")  # logical axes of activations [B, T, H]
KV_CACHE_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
# One layer's keys or values [B, K, S, D] (the sampler keeps a tuple of these per layer).
LAYER_KV_AXES = KV_CACHE_AXES[1:]


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Architecture hyper-parameters (names follow our code; `from_hf` maps HF's names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int":
                require_int(f.name, v, 1)
            elif f.type == "float":
                require(f.name, v, is_finite_real(v) and v > 0, "a number > 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def num_groups(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> Qwen3Config:
        """Builds a config from a Hugging Face `config.json` dict (transformers 4 or 5 layout)."""
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(
                f"config.json: rope_type={rope_type!r} is not supported; only 'default' RoPE is"
            )
        theta = rope.get("rope_theta", hf.get("rope_theta"))
        if theta is None:
            raise KeyError(
                "config.json: no rope_theta found (looked in 'rope_parameters.rope_theta' and "
                "top-level 'rope_theta')"
            )
        if hf.get("use_sliding_window"):
            raise NotImplementedError("config.json: use_sliding_window=true is not supported")
        if hf.get("attention_bias"):
            raise NotImplementedError("config.json: attention_bias=true is not supported")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise NotImplementedError(f"config.json: hidden_act={act!r}; only 'silu' is supported")
        try:
            heads = int(hf["num_attention_heads"])
            return cls(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=int(hf["hidden_size"]),
                intermediate_size=int(hf["intermediate_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
                rope_theta=float(theta),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                # transformers' Qwen3Config defaults to untied embeddings.
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 40960)),
            )
        except KeyError as e:
            raise KeyError(f"config.json: missing required key {e.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        """The transformers 5 `config.json` dict describing this architecture."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
        }


# Numbers from the public Qwen3 config.json files.
_QWEN3 = dict(vocab_size=151936, head_dim=128, num_kv_heads=8, rope_theta=1e6)
PRESETS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": Qwen3Config(
        hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, **_QWEN3
    ),
    "qwen3-1.7b": Qwen3Config(
        hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16, **_QWEN3
    ),
    "qwen3-4b": Qwen3Config(
        hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32, **_QWEN3
    ),
    "qwen3-4b-2507": Qwen3Config(
        hidden_size=2560,
        intermediate_size=9728,
        num_layers=36,
        num_heads=32,
        max_position_embeddings=262144,
        **{**_QWEN3, "rope_theta": 5e6},
    ),
    "qwen3-8b": Qwen3Config(
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        tie_word_embeddings=False,
        **_QWEN3,
    ),
    "tiny": Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=1e6,
    ),
}


@struct.dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding (`Qwen3.hidden_states` with a cache).

    k, v: [L, B, K, S, D] (cache dtype; K = num_kv_heads, S slots, D = head_dim: the heads
    axis precedes the slots so attention reads each head's keys as one contiguous [S, D]
    matrix, without a transposed copy); valid: bool [B, S], True where a slot holds a real
    token; index: int32 [], the next slot to write (shared by all rows).
    """

    k: Array
    v: Array
    valid: Array
    index: Array

    @classmethod
    def init(cls, config: Qwen3Config, batch: int, max_len: int, dtype=jnp.bfloat16) -> KVCache:
        """An empty cache with room for `max_len` tokens per row."""
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            valid=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
        )

    @staticmethod
    def logical_axes() -> KVCache:
        """The logical axis names of each field, as a KVCache of tuples."""
        return KVCache(k=KV_CACHE_AXES, v=KV_CACHE_AXES, valid=("batch", "cache_seq"), index=())


@struct.dataclass
class Prefix:
    """Keys and values of prompts that several completions share (one prompt per group).

    k, v: [L, B, K, P, D] per layer (B prompts of P slots, left-padded); valid: bool [B, P];
    lengths: int32 [B], real tokens per prompt (a completion's first position).
    Built by `Qwen3.prefix`; read by `Qwen3.extend` and the sampler's decode steps.
    """

    k: Array
    v: Array
    valid: Array
    lengths: Array


def _param(rngs: nnx.Rngs, shape, axes, dtype, std=0.02) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    """RMS normalisation over the last axis, computed in float32."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        """x: [..., dim] -> same shape and dtype."""
        x32 = x.astype(jnp.float32)
        y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope(x: Array, positions: Array, theta: float) -> Array:
    """Rotary embedding with HF's half-split layout. x: [B, T, N, D]; positions: int [B, T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [D/2]
    angle = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


@struct.dataclass
class Keys:
    """One segment of keys and values a query attends to.

    k, v: [B, G, K, S, D] (one set per row) or, when `shared`, [B, K, S, D] (one set per group
    of G rows: a prompt its completions share, never copied per row); allowed: bool,
    broadcastable to [B, G, C, S] for C queries. causal: a promise about `allowed` for kernels
    that build masks from structure ("splash"): these are the queries' own tokens (S = C) and
    allowed is the causal triangle and'ed with the keys' validity, which its last query row
    holds.
    """

    k: Array
    v: Array
    allowed: Array
    shared: bool = struct.field(pytree_node=False, default=False)
    causal: bool = struct.field(pytree_node=False, default=False)


def _attend(q: Array, segments: Sequence[Keys], scale: float) -> Array:
    """Softmax attention of q [B, G, C, K, Q, D] (B groups of G rows, C queries, Q query heads
    per KV head) over the concatenated key segments -> [B, G, C, K, Q, D]. Scores and softmax
    are float32; a shared segment's gradient sums over the G rows."""
    scores = []
    for seg in segments:
        spec = "bjckqd,bksd->bjkqcs" if seg.shared else "bjckqd,bjksd->bjkqcs"
        s = jnp.einsum(spec, q, seg.k, preferred_element_type=jnp.float32) * scale
        allowed = seg.allowed
        if seg.shared and allowed.ndim == 2:  # [B, S] validity of a shared prefix
            allowed = allowed[:, None, None, :]
        allowed = jnp.broadcast_to(allowed, s.shape[:2] + s.shape[-2:])[:, :, None, None]
        scores.append(jnp.where(allowed, s, _MASKED))
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
    out, start = 0, 0
    for seg in segments:
        n = seg.k.shape[-2]
        p = probs[..., start : start + n].astype(seg.v.dtype)
        spec = "bjkqcs,bksd->bjckqd" if seg.shared else "bjkqcs,bjksd->bjckqd"
        out = out + jnp.einsum(spec, p, seg.v)
        start += n
    return out


def _fused_implementation(dtype) -> str | None:
    """`jax.nn.dot_product_attention`'s implementation here: cuDNN's fused kernel on GPU for
    half-precision inputs (the only ones it takes), the XLA reference elsewhere (CPU, TPU,
    where XLA fuses the softmax itself, and float32 on GPU)."""
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if half and jax.default_backend() == "gpu" else None


def _attend_fused(q: Array, segments: Sequence[Keys], scale: float) -> Array:
    """`_attend` through `jax.nn.dot_product_attention`: the same inputs and result. Shared
    segments are broadcast over their G rows and all segments concatenated into one key axis
    (the kernel takes one key set per row; the broadcast's gradient sums over the G rows)."""
    b, g, c, kh, qh, d = q.shape
    ks, vs, masks = [], [], []
    for seg in segments:
        k, v, allowed = seg.k, seg.v, seg.allowed
        if seg.shared:
            k = jnp.broadcast_to(k[:, None], (b, g, *k.shape[1:]))
            v = jnp.broadcast_to(v[:, None], (b, g, *v.shape[1:]))
            if allowed.ndim == 2:  # [B, S] validity of a shared prefix
                allowed = allowed[:, None, None, :]
        s = k.shape[-2]
        ks.append(jnp.swapaxes(k, 2, 3).reshape(b * g, s, kh, d))  # [B * G, S, K, D]
        vs.append(jnp.swapaxes(v, 2, 3).reshape(b * g, s, kh, d).astype(q.dtype))
        masks.append(jnp.broadcast_to(allowed, (b, g, c, s)).reshape(b * g, 1, c, s))
    out = jax.nn.dot_product_attention(
        q.reshape(b * g, c, kh * qh, d),  # query head n = kv_head * Q + q, as the kernel's GQA
        jnp.concatenate(ks, axis=1).astype(q.dtype),
        jnp.concatenate(vs, axis=1),
        mask=jnp.concatenate(masks, axis=-1),
        scale=scale,
        implementation=_fused_implementation(q.dtype),
    )
    return out.reshape(q.shape)


def _splash_inputs(q: Array, segments: Sequence[Keys]):
    """(keys, values [B * G, K, S, D], valid bool [B * G, S]) for `splash.causal_attention`
    when `segments` are what the splash kernel can express: an optional shared prefix whose
    allowed is its validity [B, P], then one `causal` segment of the queries' own keys
    (prefill, training, `Qwen3.extend`). None otherwise (e.g. a prefill against a KV cache,
    whose causal offset is a traced index)."""
    b, g, c = q.shape[:3]
    *prefix, own = segments
    if len(prefix) > 1 or not own.causal or own.shared or own.k.shape[-2] != c:
        return None
    if prefix and not (prefix[0].shared and prefix[0].allowed.ndim == 2):
        return None
    ks, vs, valid = [], [], []
    for seg in segments:
        k, v = seg.k, seg.v
        if seg.shared:  # broadcast over the G rows (the broadcast's gradient sums over them)
            k = jnp.broadcast_to(k[:, None], (b, g, *k.shape[1:]))
            v = jnp.broadcast_to(v[:, None], (b, g, *v.shape[1:]))
            ok = seg.allowed[:, None, :]
        else:
            ok = jnp.broadcast_to(seg.allowed, (b, g, c, c))[:, :, -1, :]
        ks.append(k.reshape(b * g, *k.shape[2:]))
        vs.append(v.reshape(b * g, *v.shape[2:]).astype(k.dtype))
        valid.append(jnp.broadcast_to(ok, (b, g, ok.shape[-1])).reshape(b * g, -1))
    return jnp.concatenate(ks, axis=2), jnp.concatenate(vs, axis=2), jnp.concatenate(valid, 1)


def _attend_splash(q: Array, segments: Sequence[Keys], scale: float) -> Array:
    """`_attend` through the TPU splash kernel (`splash.causal_attention`; Pallas interpret
    mode off TPU) where `_splash_inputs` can express the segments, else `_attend` itself. The
    same result at real queries; outputs at padding queries differ (they are never read)."""
    inputs = _splash_inputs(q, segments)
    if inputs is None:
        return _attend(q, segments, scale)
    b, g, c, kh, qh, d = q.shape
    rows = jnp.moveaxis(q.reshape(b * g, c, kh * qh, d), 1, 2)  # [B * G, N, C, D], n = k * Q + q
    out = splash.causal_attention(rows, *inputs, scale)
    return jnp.moveaxis(out, 2, 1).reshape(q.shape)


# Attention implementations by name (`Qwen3(attention_impl=...)`), each fn(q [B, G, C, K, Q, D],
# segments, scale) -> [B, G, C, K, Q, D]: "einsum", the reference written out here (scores and
# softmax in float32); "fused", `jax.nn.dot_product_attention` (cuDNN's flash kernel on GPU,
# XLA's elsewhere); "splash", the TPU splash kernel (interpret mode elsewhere) for prefill and
# training, the einsum path for a prefill against a KV cache; "pallas_decode", the einsum path
# for prefill and training and JAX's Pallas GPU decode kernel for decode steps
# (`decode_attention.decode_attend`; interpret mode on CPU). Decoding (one query per row) uses
# `_decode_attend` under every other name.
ATTENTION_IMPLS: dict[str, Callable[[Array, Sequence[Keys], float], Array]] = {
    "einsum": _attend,
    "fused": _attend_fused,
    "splash": _attend_splash,
    "pallas_decode": _attend,
}


def _attend_named(q, segments, scale, impl):
    return ATTENTION_IMPLS[impl](q, segments, scale)


# Long inputs attend in query chunks, each rematerialised in the backward pass, so the scores
# held at once are [B, G, K, Q, chunk, S] rather than [..., C, S].
_attend_chunk = jax.checkpoint(_attend_named, static_argnums=(2, 3))


# On CPU, attention over many rows at once builds score tensors [rows, .., C, S] far larger
# than the caches, and the softmax streams them through memory several times; blocks of rows
# whose scores hold about this many floats (2 MiB) run 1.5-3x faster (measured on a 2-core
# x86 machine). Accelerators get one block: their attention is bound by other things.
CPU_SCORE_BLOCK = 1 << 19
# And within a block, long inputs attend in query chunks of this many positions: a GRPO update
# of 8 prompts of 200 tokens x 8 completions of 640 ran 1.3x faster than with whole rows per
# block (22.4 against 28.8 s; docs/training.md).
CPU_QUERY_CHUNK = 128


def _row_blocks(rows: int, per_row: int, block: int | None) -> int:
    """How many blocks to cut `rows` into (a divisor of rows) so that each block's scores hold
    about `block` floats; None: `CPU_SCORE_BLOCK` on CPU and one block elsewhere; 0: one."""
    if block is None:
        block = CPU_SCORE_BLOCK if jax.default_backend() == "cpu" else 0
    if block <= 0 or rows < 2:
        return 1
    n = min(rows, max(1, rows * per_row // block))
    while rows % n:
        n -= 1
    return n


def _cpu_query_chunk(queries: int, block: int | None, causal: bool = False) -> int:
    """The query chunk within a row block: `CPU_QUERY_CHUNK` where the row blocks are CPU's
    default (block None) and the input is longer, else 0 (whole rows). Without a causal
    segment the chunk must divide the input; with one the last chunk may be shorter, for an
    input of at least two chunks (a short one gains little from being cut)."""
    if block is not None or jax.default_backend() != "cpu":
        return 0
    k = CPU_QUERY_CHUNK
    return k if queries > k and (queries % k == 0 or causal and queries >= 2 * k) else 0


def attention(
    q: Array, segments: Sequence[Keys], chunk: int, block: int | None = None, impl: str = "einsum"
) -> Array:
    """Attention of q [B, G, C, K, Q, D] -> [B, G, C, K, Q, D] by the `ATTENTION_IMPLS` entry
    `impl`, query-chunked when C > chunk and chunk divides C (a segment's `allowed` must then
    be [.., C, S] or [.., 1, S]), and otherwise cut into blocks of rows whose scores hold
    about `block` floats (`_row_blocks`: by default on CPU only, where each block then runs
    in query chunks of `CPU_QUERY_CHUNK` when that divides C). Each chunk or block is
    rematerialised in the backward pass. cuDNN's fused kernel and the splash kernel take the
    whole input at once (they never hold the [C, S] scores); segments splash cannot express
    take the einsum path."""
    b, g, c = q.shape[:3]
    scale = q.shape[-1] ** -0.5
    if impl == "fused" and _fused_implementation(q.dtype) == "cudnn":
        return _attend_fused(q, segments, scale)
    if impl == "splash":  # unchunked: query chunks would break the causal structure
        if _splash_inputs(q, segments) is not None:
            return ATTENTION_IMPLS[impl](q, segments, scale)
        impl = "einsum"
    if c > chunk and c % chunk == 0:
        return _query_chunks(q, segments, chunk, scale, impl)
    keys = sum(seg.k.shape[-2] for seg in segments)
    n = _row_blocks(b, g * q.shape[3] * q.shape[4] * c * keys, block)
    inner = _cpu_query_chunk(c, block, any(seg.causal for seg in segments))

    def whole(qb, segs):
        if inner:
            return _query_chunks(qb, segs, inner, scale, impl)
        return _attend_chunk(qb, segs, scale, impl)

    if n == 1:
        return whole(q, segments) if inner else ATTENTION_IMPLS[impl](q, segments, scale)

    # Block j holds rows j, j + n, ...: with rows sharded in contiguous slices over devices,
    # every device keeps an equal share of every block.
    def split(x):
        if x.shape[0] != b:  # broadcast over rows
            return jnp.broadcast_to(x[None], (n, *x.shape))
        return jnp.moveaxis(x.reshape(b // n, n, *x.shape[1:]), 1, 0)

    parts = [(split(seg.k), split(seg.v), split(seg.allowed)) for seg in segments]

    def one(xs):
        qb, ps = xs
        segs = [
            Keys(k, v, a, seg.shared, seg.causal)
            for seg, (k, v, a) in zip(segments, ps, strict=True)
        ]
        return whole(qb, segs)

    out = lax.map(one, (split(q), parts))  # [n, B / n, ...]
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


def _causal_query_chunks(q, segments, chunk, scale, impl):
    """`_query_chunks` where a causal segment's keys after a block's last query are left out
    (they are masked for every query of the block): about half the scores of a long causal
    input (a GRPO update's attention 1.25x faster on CPU at 640 completion tokens). The
    blocks are unrolled, so the last one may be shorter (`chunk` need not divide C)."""
    outs, c = [], q.shape[2]
    for lo in range(0, c, chunk):
        hi = min(c, lo + chunk)
        segs = []
        for seg in segments:
            a = seg.allowed
            if a.ndim >= 4 and a.shape[2] != 1:
                a = a[:, :, lo:hi]
            if seg.causal:
                seg = seg.replace(k=seg.k[..., :hi, :], v=seg.v[..., :hi, :], allowed=a[..., :hi])
            else:
                seg = seg.replace(allowed=a)
            segs.append(seg)
        outs.append(_attend_chunk(q[:, :, lo:hi], segs, scale, impl))
    return jnp.concatenate(outs, axis=2)


def _query_chunks(q, segments, chunk, scale, impl):
    """Query blocks of `chunk` positions, one at a time (long sequences). With a causal
    segment (the queries' own keys), block i reads only its first (i + 1) * chunk keys, the
    ones its queries may see: the blocks then differ in shape and are unrolled (and `chunk`
    need not divide C); otherwise it must."""
    c = q.shape[2]
    n = c // chunk
    if any(seg.causal for seg in segments):
        return _causal_query_chunks(q, segments, chunk, scale, impl)

    def split(x):  # [B, G, C, ...] -> [n, B, G, chunk, ...]
        return jnp.moveaxis(x.reshape(*x.shape[:2], n, chunk, *x.shape[3:]), 2, 0)

    def split_allowed(a):
        if a.ndim < 4 or a.shape[2] == 1:
            return jnp.broadcast_to(a[None], (n, *a.shape))
        return split(a)

    allowed = [split_allowed(seg.allowed) for seg in segments]

    def one(xs):
        qc, masks = xs
        segs = [seg.replace(allowed=a) for seg, a in zip(segments, masks, strict=True)]
        return _attend_chunk(qc, segs, scale, impl)

    out = lax.map(one, (split(q), allowed))
    return jnp.moveaxis(out, 0, 2).reshape(q.shape)


# On CPU, a decode step's attention over a row's own cache of at least this many slots is
# written as multiply-and-sum rather than as batched matmuls (`_decode_attend`): every window
# (at a GRPO rollout's 8 samples per prompt, 1.3-1.5x faster decode steps at windows of 64-127
# slots; the same at one sample per prompt; docs/models.md).
CPU_FUSED_WINDOW = 1
# On CPU, a decode step's attention over the shared prefix runs as one [G * Q, D] x [D, P]
# matmul per (group, KV head) instead of G * Q matrix-vector products (`_decode_attend`; about
# 1.2x faster rollouts at 8 samples per prompt, `benchmarks/bench_sampler.py --schedules double
# --merged-prefix 1,0`). Read when the decode loop is traced.
CPU_MERGED_PREFIX = True
# On CPU, float32 decode steps run their attention through a compiled kernel
# (`cpu_decode.decode_attend`, an XLA FFI custom call built on first use) when it builds; the
# XLA form above otherwise (also with MAPFJAX_CPU_DECODE_KERNEL=0 in the environment). Read
# when the decode loop is traced.
CPU_DECODE_KERNEL = os.environ.get("MAPFJAX_CPU_DECODE_KERNEL", "1") != "0"


def _decode_attend(q: Array, prefix, own, allowed: Array) -> Array:
    """One query per row: q [B, G, K, Q, D]; prefix (kp, vp [B, K, P, D], valid bool [B, P])
    shared by a group's G rows; own (k, v [B, G, K, W, D]) each row's cache, of which slots
    where `allowed` [W] is True are read. Returns [B, G, K, Q, D]."""
    kp, vp, valid = prefix
    k, v = own
    scale = q.shape[-1] ** -0.5
    f32 = jnp.float32
    # XLA:CPU runs a row's own-cache products as many tiny batched matmuls, whose cost grows
    # faster than the window; as a broadcast multiply and sum they fuse into one loop (1.2x
    # faster per layer at 256 slots, 2x at 1,024; the same result).
    cpu = jax.default_backend() == "cpu"
    fused = cpu and k.shape[-2] >= CPU_FUSED_WINDOW
    b, g, kh, qh, d = q.shape
    merged = cpu and CPU_MERGED_PREFIX
    if merged:
        qm = jnp.transpose(q, (0, 2, 1, 3, 4)).reshape(b, kh, g * qh, d)
        sp = jnp.einsum("bkmd,bkpd->bkmp", qm, kp.astype(q.dtype), preferred_element_type=f32)
        sp = jnp.transpose(sp.reshape(b, kh, g, qh, -1), (0, 2, 1, 3, 4))
    else:
        sp = jnp.einsum("bjkqd,bkpd->bjkqp", q, kp.astype(q.dtype), preferred_element_type=f32)
    if fused:
        so = jnp.sum(q[..., None, :].astype(f32) * k[:, :, :, None].astype(f32), axis=-1)
    else:
        so = jnp.einsum("bjkqd,bjkwd->bjkqw", q, k.astype(q.dtype), preferred_element_type=f32)
    sp = jnp.where(valid[:, None, None, None, :], sp * scale, _MASKED)
    so = jnp.where(allowed, so * scale, _MASKED)
    probs = jax.nn.softmax(jnp.concatenate([sp, so], axis=-1), axis=-1).astype(q.dtype)
    p = kp.shape[2]
    if merged:
        pm = jnp.transpose(probs[..., :p], (0, 2, 1, 3, 4)).reshape(b, kh, g * qh, p)
        out = jnp.einsum("bkmp,bkpd->bkmd", pm, vp.astype(q.dtype))
        out = jnp.transpose(out.reshape(b, kh, g, qh, d), (0, 2, 1, 3, 4))
    else:
        out = jnp.einsum("bjkqp,bkpd->bjkqd", probs[..., :p], vp.astype(q.dtype))
    if fused:
        own = jnp.sum(probs[..., p:, None].astype(f32) * v[:, :, :, None].astype(f32), axis=-2)
        own = own.astype(q.dtype)
    else:
        own = jnp.einsum("bjkqw,bjkwd->bjkqd", probs[..., p:], v.astype(q.dtype))
    return out + own


def _dense(x: Array, w: Array, contract: int = 1, **kw) -> Array:
    """Contracts the last `contract` axes of x with the first ones of w as one 2-D matmul:
    x [..., I...] @ w [I..., O...] -> [..., O...]. Flattening first matters on CPU, where XLA's
    gradient of a many-axis einsum (its weight gradient contracts batch and sequence axes at
    once) runs about twice as slow as the same 2-D matmul."""
    lead, inner = x.shape[: x.ndim - contract], x.shape[x.ndim - contract :]
    out = w.shape[contract:]
    y = jnp.matmul(x.reshape(-1, math.prod(inner)), w.reshape(math.prod(inner), -1), **kw)
    return y.reshape(*lead, *out)


def _heads_first(x: Array) -> Array:
    """[B, T, K, D] -> [B, K, T, D], the cache layout."""
    return jnp.swapaxes(x, 1, 2)


class Attention(nnx.Module):
    """Grouped-query attention with per-head q/k RMSNorm before RoPE; KV heads are not repeated."""

    def __init__(self, cfg: Qwen3Config, *, dtype, param_dtype, rngs: nnx.Rngs, chunk: int = 1024):
        h, n, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = _param(rngs, (h, n, d), ("embed", "q_heads", "head_dim"), param_dtype)
        self.k = _param(rngs, (h, k, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.v = _param(rngs, (h, k, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.o = _param(rngs, (n, d, h), ("q_heads", "head_dim", "embed"), param_dtype)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.cfg, self.dtype, self.chunk = cfg, dtype, chunk

    def __call__(self, x, positions, attend):
        """x: [B, T, H]; positions: [B, T]; attend(q, k, v) -> (out, aux) with q
        [B, T, K, Q, D] (query head n = kv_head * Q + q, HF's order), this call's keys and
        values k, v [B, T, K, D] after RoPE, out [B, T, K, Q, D]. Returns ([B, T, H], aux)."""
        cfg, dt = self.cfg, self.dtype
        b, t, _ = x.shape
        x = x.astype(dt)
        q = _dense(x, self.q[...].astype(dt))  # [B, T, N, D]
        k = _dense(x, self.k[...].astype(dt))  # [B, T, K, D]
        v = _dense(x, self.v[...].astype(dt))
        q = rope(self.q_norm(q), positions, cfg.rope_theta)
        k = rope(self.k_norm(k), positions, cfg.rope_theta)
        q = q.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim)
        out, aux = attend(q, k, v)
        out = out.astype(dt).reshape(b, t, cfg.num_heads, cfg.head_dim)
        return _dense(out, self.o[...].astype(dt), contract=2), aux


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate x) * up x)."""

    def __init__(self, cfg: Qwen3Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.gate = _param(rngs, (h, f), ("embed", "mlp"), param_dtype)
        self.up = _param(rngs, (h, f), ("embed", "mlp"), param_dtype)
        self.down = _param(rngs, (f, h), ("mlp", "embed"), param_dtype)
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        """x: [B, T, H] -> [B, T, H]."""
        dt = self.dtype
        x = x.astype(dt)
        gate = _dense(x, self.gate[...].astype(dt))
        up = _dense(x, self.up[...].astype(dt))
        return _dense(jax.nn.silu(gate) * up, self.down[...].astype(dt))


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: Qwen3Config, *, dtype, param_dtype, rngs: nnx.Rngs, chunk: int):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.attn = Attention(cfg, **kw, chunk=chunk)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.mlp = MLP(cfg, **kw)

    def __call__(self, x, positions, attend):
        """x: [B, T, H] -> ([B, T, H], aux); see `Attention.__call__`."""
        h, aux = self.attn(self.input_norm(x), positions, attend)
        x = x + h
        return x + self.mlp(self.post_attn_norm(x)), aux


def _stacked_layers(config: Qwen3Config, key, **kw) -> DecoderLayer:
    """L decoder layers as one DecoderLayer whose parameters have a leading "layers" axis."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: DecoderLayer(config, rngs=nnx.Rngs(0), **kw)))
    keys = jax.random.split(key, config.num_layers)
    states = jax.vmap(lambda k: nnx.state(DecoderLayer(config, rngs=nnx.Rngs(params=k), **kw)))(
        keys
    )
    layers = nnx.merge(graphdef, states)
    for _, var in nnx.iter_graph(layers):
        if isinstance(var, nnx.Param):
            var.set_metadata("logical_axes", ("layers", *var.get_metadata()["logical_axes"]))
    return layers


# Remat policies by name: what each layer keeps for the backward pass (the rest is recomputed).
# "none": everything (no recomputation); "full": only the layer's input; "dots_saveable": the
# outputs of matmuls, recomputing norms, RoPE, softmax and activations (elementwise work);
# "dots_with_no_batch_dims_saveable": the weight matmuls' outputs, not attention's batched ones.
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_policy_name(remat: bool | str | None) -> str:
    """The `REMAT_POLICIES` name of a `remat` setting: True is "full", False or None "none";
    ValueError naming the value and the allowed names otherwise."""
    if remat is None or isinstance(remat, bool):
        return "full" if remat else "none"
    if remat not in REMAT_POLICIES:
        raise ValueError(
            f"remat={remat!r}: allowed True, False or a policy name in {sorted(REMAT_POLICIES)}"
        )
    return remat


def check_attention_impl(impl: str) -> str:
    """`impl` if it names an `ATTENTION_IMPLS` entry; ValueError naming the allowed ones."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl={impl!r}: allowed {sorted(ATTENTION_IMPLS)}")
    return impl


class Qwen3(nnx.Module):
    """Qwen3 causal language model.

    dtype is the activation/matmul dtype; norms, softmax and logits are always float32.
    remat: what each layer keeps for its backward pass, True ("full": its input only), False
    ("none") or a name in `REMAT_POLICIES`; attention_impl: a name in `ATTENTION_IMPLS` for
    prefill and training ("einsum", the reference; "fused", `jax.nn.dot_product_attention`
    with cuDNN on GPU; "splash", the TPU splash kernel, in Pallas interpret mode elsewhere;
    "pallas_decode", the einsum path; decode steps use the einsum path under every name but
    "pallas_decode", which runs them through JAX's Pallas GPU decode kernel,
    `decode_attention.decode_attend`, in interpret mode on CPU: exact there but slow, meant for
    GPUs; it needs a prefix's valid slots contiguous); attention_chunk is the query block
    length above which attention is computed blockwise (memory O(chunk x S), not O(T x S));
    attention_block: score floats per block of rows (None: `CPU_SCORE_BLOCK` on CPU, one
    block elsewhere; 0: one block, e.g. to plan an accelerator's memory on CPU). remat and
    attention_impl may be reassigned on a built model (they are read when a computation is
    traced).
    Under `jax.set_mesh`, activations are constrained to split rows over data x fsdp.
    The layers are stacked (parameters [L, ...]) and run with `lax.scan`: one compiled layer,
    and FSDP weight gathers happen layer by layer inside the loop.
    """

    def __init__(
        self,
        config: Qwen3Config,
        *,
        dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16,
        remat: bool | str = False,
        rngs: nnx.Rngs | None = None,
        attention_chunk: int = 1024,
        attention_block: int | None = None,
        attention_impl: str = "einsum",
    ):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        remat_policy_name(remat)
        self.attention_impl = check_attention_impl(attention_impl)
        self.config, self.dtype, self.remat = config, dtype, remat
        self.chunk, self.score_block = attention_chunk, attention_block
        v, h = config.vocab_size, config.hidden_size
        self.embedding = _param(rngs, (v, h), ("vocab", "embed"), param_dtype)
        kw = dict(dtype=dtype, param_dtype=param_dtype, chunk=attention_chunk)
        self.layers = _stacked_layers(config, rngs.params(), **kw)
        self.final_norm = RMSNorm(h, config.rms_norm_eps, param_dtype=param_dtype)
        if not config.tie_word_embeddings:
            self.unembedding = _param(rngs, (h, v), ("embed", "vocab"), param_dtype)

    def _attention(self, q, segments):
        impl = check_attention_impl(self.attention_impl)
        return attention(q, segments, self.chunk, self.score_block, impl)

    def _embed(self, tokens: Array) -> Array:
        x = jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)
        return parallel.constrain(x, _ACT)

    def _scan(self, x, positions, attend, xs=None, extra=None):
        """Runs the stacked layers with `lax.scan` (one compiled layer; FSDP gathers layer by
        layer). attend(extra, layer_xs, q, k, v) -> (out, (extra, y)) is the attention of
        `Attention.__call__` given the carried `extra` and this layer's slice of `xs`.
        Returns (x [B, T, H] after the final norm, extra, ys stacked over layers)."""
        graphdef, params = nnx.split(self.layers)

        def body(carry, inputs):
            x, extra = carry
            layer_params, layer_xs = inputs
            layer = nnx.merge(graphdef, layer_params)
            x, (extra, y) = layer(x, positions, lambda q, k, v: attend(extra, layer_xs, q, k, v))
            return (parallel.constrain(x, _ACT), extra), y

        # remat: keep what the policy names for the backward pass, recompute the rest.
        name = remat_policy_name(self.remat)
        if name != "none":
            body = jax.checkpoint(body, policy=REMAT_POLICIES[name])
        (x, extra), ys = lax.scan(body, (x, extra), (params, xs))
        return self.final_norm(x), extra, ys

    def hidden_states(self, tokens, positions=None, attention_mask=None, cache=None):
        """tokens: int32 [B, T] -> (hidden [B, T, H] after the final norm, cache).

        positions: int32 [B, T]; by default each row counts its real tokens from 0 (continuing
        after the cache's valid slots when a cache is given). attention_mask: bool [B, T], True
        on real tokens. cache: KVCache or None; see `KVCache` for the write/read semantics.
        """
        chex.assert_rank(tokens, 2)
        b, t = tokens.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        chex.assert_shape(mask, (b, t))
        if positions is None:
            seen = 0 if cache is None else jnp.sum(cache.valid, axis=1, keepdims=True)
            positions = jnp.maximum(seen + jnp.cumsum(mask, axis=1) - 1, 0)
        positions = positions.astype(jnp.int32)
        index = 0 if cache is None else cache.index
        valid = mask if cache is None else lax.dynamic_update_slice(cache.valid, mask, (0, index))
        slot_q = index + jnp.arange(t)  # [T]
        slot_k = jnp.arange(valid.shape[1])  # [S]
        allowed = (slot_k[None, :] <= slot_q[:, None])[None] & valid[:, None, :]  # [B, T, S]
        allowed = allowed[:, None]  # one row per group: [B, 1, T, S]

        def attend(kv, _, q, k, v):
            if kv is None:  # keys are this call's tokens
                k, v = _heads_first(k), _heads_first(v)
            else:  # write this call's keys at slots [index, index + T), read every slot
                k_all, v_all, i = kv
                start = (i, 0, 0, index, 0)
                k_all = lax.dynamic_update_slice(
                    k_all, _heads_first(k)[None].astype(k_all.dtype), start
                )
                v_all = lax.dynamic_update_slice(
                    v_all, _heads_first(v)[None].astype(v_all.dtype), start
                )
                kv = (k_all, v_all, i + 1)
                k, v = k_all[i].astype(q.dtype), v_all[i].astype(q.dtype)
            keys = Keys(k[:, None], v[:, None], allowed, causal=kv is None)
            return self._attention(q[:, None], [keys])[:, 0], (kv, None)

        kv = None if cache is None else (cache.k, cache.v, jnp.int32(0))
        x, kv, _ = self._scan(self._embed(tokens), positions, attend, extra=kv)
        if cache is not None:
            cache = KVCache(k=kv[0], v=kv[1], valid=valid, index=cache.index + t)
        return x, cache

    def prefix(self, tokens: Array, attention_mask: Array | None = None) -> tuple[Array, Prefix]:
        """Runs prompts that several completions will share.

        tokens: int32 [B, P] left-padded; attention_mask: bool [B, P] (default all True).
        Returns (hidden [B, P, H] after the final norm, `Prefix` with each layer's keys and
        values [L, B, K, P, D]). Positions count each row's real tokens from 0.
        """
        chex.assert_rank(tokens, 2)
        b, p = tokens.shape
        mask = jnp.ones((b, p), bool) if attention_mask is None else attention_mask.astype(bool)
        chex.assert_shape(mask, (b, p))
        positions = jnp.maximum(jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)
        causal = jnp.tril(jnp.ones((p, p), bool))
        allowed = (causal[None] & mask[:, None, :])[:, None]  # [B, 1, P, P]

        def attend(_, __, q, k, v):
            k, v = _heads_first(k), _heads_first(v)
            keys = Keys(k[:, None], v[:, None], allowed, causal=True)
            return self._attention(q[:, None], [keys])[:, 0], (None, (k, v))

        x, _, (k, v) = self._scan(self._embed(tokens), positions, attend)
        lengths = jnp.sum(mask, axis=1, dtype=jnp.int32)
        return x, Prefix(k=k, v=v, valid=mask, lengths=lengths)

    def extend(self, tokens: Array, prefix: Prefix, attention_mask: Array | None = None) -> Array:
        """Runs G continuations of each shared prefix at once (the GRPO update's layout).

        tokens: int32 [B, G, T], right-padded continuations of prefix row b; attention_mask:
        bool [B, G, T], True on real tokens (default all True). Token t of a row sits at
        position prefix.lengths[b] + t and attends to the prefix's valid slots and to the
        row's own tokens up to t. Returns hidden [B, G, T, H] after the final norm, equal to
        running each [prompt | continuation] row on its own; gradients reach the prefix's
        keys and values (summed over the G rows) and through them the prefix pass.
        """
        chex.assert_rank(tokens, 3)
        b, g, t = tokens.shape
        chex.assert_shape(prefix.valid, (b, None))
        mask = jnp.ones((b, g, t), bool) if attention_mask is None else attention_mask.astype(bool)
        chex.assert_shape(mask, (b, g, t))
        positions = prefix.lengths[:, None, None] + jnp.cumsum(mask, axis=2, dtype=jnp.int32) - 1
        positions = jnp.maximum(positions, prefix.lengths[:, None, None]).reshape(b * g, t)
        causal = jnp.tril(jnp.ones((t, t), bool))
        allowed = causal[None, None] & mask[:, :, None, :]  # [B, G, T, T]

        def attend(_, layer_prefix, q, k, v):
            kp, vp = layer_prefix
            q = q.reshape(b, g, t, *q.shape[2:])
            k = _heads_first(k).reshape(b, g, *k.shape[2:3], t, k.shape[-1])
            v = _heads_first(v).reshape(b, g, *v.shape[2:3], t, v.shape[-1])
            shared = Keys(kp.astype(q.dtype), vp.astype(q.dtype), prefix.valid, shared=True)
            out = self._attention(q, [shared, Keys(k, v, allowed, causal=True)])
            return out.reshape(b * g, t, *out.shape[3:]), (None, None)

        x = self._embed(tokens.reshape(b * g, t))
        x, _, _ = self._scan(x, positions, attend, xs=(prefix.k, prefix.v))
        return x.reshape(b, g, t, -1)

    def decode_step(self, tokens, positions, prefix: Prefix, cache, index, layer_params=None):
        """One decoding step of G rows per shared prefix, the layers unrolled.

        tokens, positions: int32 [B * G, 1]; prefix: a `Prefix` over the B groups whose k, v
        are per-layer sequences of [B, K, P, D] arrays (or stacked [L, ...]); cache: (ks, vs),
        per-layer sequences of [B * G, K, W, D] arrays holding the rows' own earlier tokens in
        slots [0, index); index: int32 [], the slot this step's token is written to.
        layer_params: per-layer parameter states (from `split_layers`), or None to slice the
        stacked parameters here. Returns (logits f32 [B * G, V], new cache).

        Each layer writes its keys and values first and then reads the updated cache (XLA
        updates a loop-carried cache in place in that order; reading it before the write makes
        XLA:CPU copy the whole cache at every step).
        """
        rows, groups = tokens.shape[0], prefix.valid.shape[0]
        g = rows // groups
        graphdef, stacked = nnx.split(self.layers)
        x = self._embed(tokens)
        window = cache[0][0].shape[2]
        allowed = jnp.arange(window) <= index  # [W]
        decode_attend = self.decode_attention(
            index, (x.astype(self.dtype), prefix.k[0], cache[0][0], cache[1][0])
        )
        ks, vs = list(cache[0]), list(cache[1])
        for i in range(self.config.num_layers):
            if layer_params is None:
                params = jax.tree.map(lambda a, i=i: a[i], stacked)
            else:
                params = layer_params[i]

            def attend(q, k, v, i=i):
                at = (0, 0, index, 0)
                ks[i] = lax.dynamic_update_slice(ks[i], _heads_first(k).astype(ks[i].dtype), at)
                vs[i] = lax.dynamic_update_slice(vs[i], _heads_first(v).astype(vs[i].dtype), at)
                out = decode_attend(
                    q[:, 0].reshape(groups, g, *q.shape[2:]),
                    (prefix.k[i], prefix.v[i], prefix.valid),
                    (ks[i], vs[i]),
                    allowed,
                )
                return out.reshape(rows, 1, *out.shape[2:]), None

            x, _ = nnx.merge(graphdef, params)(x, positions, attend)
            x = parallel.constrain(x, _ACT)
        logits = self.lm_head(self.final_norm(x)[:, 0])
        return logits, (tuple(ks), tuple(vs))

    def decode_attention(self, index, arrays) -> Callable:
        """A decode step's attention as `decode_step` runs it, for its `attention_impl` and the
        backend: fn(q [B, G, K, Q, D], prefix (kp, vp [B, K, P, D], valid bool [B, P]), own
        (k, v [B * G, K, W, D], the caches as the loop carries them), allowed bool [W]) ->
        [B, G, K, Q, D]. "pallas_decode": `decode_attention.decode_attend`; on CPU with
        `CPU_DECODE_KERNEL`, when `cpu_decode.usable(*arrays)` (float32, no multi-device mesh,
        the kernel built): `cpu_decode.decode_attend`; otherwise `_decode_attend` (XLA). The
        kernels read own slots [0, index], the XLA form those `allowed`; `decode_step` passes
        allowed = slots <= index."""

        def grouped(q, own):  # [B * G, ...] -> [B, G, ...]
            return tuple(c.reshape(*q.shape[:2], *c.shape[1:]) for c in own)

        if check_attention_impl(self.attention_impl) == "pallas_decode":
            from mapfjax.models import decode_attention

            return lambda q, prefix, own, _: decode_attention.decode_attend(
                q, prefix, grouped(q, own), index
            )
        if CPU_DECODE_KERNEL and jax.default_backend() == "cpu":
            from mapfjax.models import cpu_decode

            if cpu_decode.usable(*arrays):  # the caches as they are (a reshape made XLA copy them)
                return lambda q, prefix, own, _: cpu_decode.decode_attend(q, prefix, own, index)
        return lambda q, prefix, own, allowed: _decode_attend(q, prefix, grouped(q, own), allowed)

    def split_layers(self) -> list:
        """The stacked layer parameters as one state per layer (copies; for `decode_step`)."""
        _, stacked = nnx.split(self.layers)
        return [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(self.config.num_layers)]

    def lm_head(self, hidden: Array) -> Array:
        """hidden: [..., H] -> float32 logits [..., V]."""
        dt = self.dtype
        hidden = hidden.astype(dt)
        if self.config.tie_word_embeddings:
            w = self.embedding[...].astype(dt).T
        else:
            w = self.unembedding[...].astype(dt)
        logits = _dense(hidden, w, preferred_element_type=jnp.float32)
        if logits.ndim == 3:
            logits = parallel.constrain(logits, ("batch", "seq", "act_vocab"))
        return logits

    def __call__(self, tokens, positions=None, attention_mask=None, cache=None):
        """tokens: int32 [B, T] -> (float32 logits [B, T, V], cache); see `hidden_states`."""
        hidden, cache = self.hidden_states(tokens, positions, attention_mask, cache)
        return self.lm_head(hidden), cache
