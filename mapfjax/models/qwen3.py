"""Qwen3 decoder in Flax NNX: architecture presets, the model and its KV cache.

Every parameter carries logical axis names in its `logical_axes` metadata; `mapfjax.parallel`
maps them onto a device mesh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax import lax

from mapfjax import parallel

Array = jax.Array

# Additive mask value: finite so that a fully masked row (a left-pad query) yields a uniform
# softmax instead of NaN, which would otherwise leak into gradients through 0 * NaN.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)

KV_CACHE_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")


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
    """Per-layer keys and values for incremental decoding.

    k, v: [L, B, S, num_kv_heads, head_dim] (cache dtype); valid: bool [B, S], True where a slot
    holds a real token; index: int32 [], the next slot to write (shared by all rows).
    """

    k: Array
    v: Array
    valid: Array
    index: Array

    @classmethod
    def init(cls, config: Qwen3Config, batch: int, max_len: int, dtype=jnp.bfloat16) -> KVCache:
        """An empty cache with room for `max_len` tokens per row."""
        shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
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


def _attend(q, k, v, allowed, scale):
    """q: [B, C, K, G, D]; k, v: [B, S, K, D]; allowed: bool [B, C, S] -> [B, C, K, G, D]."""
    scores = jnp.einsum("bckgd,bskd->bkgcs", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(allowed[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgcs,bskd->bckgd", probs, v)


# Long inputs attend in query chunks, each rematerialised in the backward pass, so the scores
# held at once are [B, K, G, chunk, S] rather than [B, K, G, T, S].
_attend_chunk = jax.checkpoint(_attend)


def attention(q, k, v, allowed, chunk: int):
    """Softmax attention, query-chunked when T > chunk and chunk divides T; see `_attend`."""
    b, t = q.shape[:2]
    scale = q.shape[-1] ** -0.5
    if t <= chunk or t % chunk:
        return _attend(q, k, v, allowed, scale)
    n = t // chunk
    qc = q.reshape(b, n, chunk, *q.shape[2:]).swapaxes(0, 1)  # [n, B, C, K, G, D]
    ac = allowed.reshape(b, n, chunk, -1).swapaxes(0, 1)  # [n, B, C, S]
    out = lax.map(lambda xs: _attend_chunk(xs[0], k, v, xs[1], scale), (qc, ac))
    return out.swapaxes(0, 1).reshape(q.shape)


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

    def __call__(self, x, positions, allowed, kv=None, layer=0, index=None):
        """x: [B, T, H]; positions: [B, T]; allowed: bool [B, T, S] (which slots each query sees).

        kv: optional (k_all, v_all), each [L, B, S, K, D]; this layer's new keys/values are written
        at slots [index, index + T) of layer `layer` (int32 [], may be traced) and attention
        reads all S slots. Without kv, S = T. Returns (out [B, T, H], updated kv or None).
        """
        cfg, dt = self.cfg, self.dtype
        b, t, _ = x.shape
        x = x.astype(dt)
        q = jnp.einsum("bth,hnd->btnd", x, self.q[...].astype(dt))
        k = jnp.einsum("bth,hkd->btkd", x, self.k[...].astype(dt))
        v = jnp.einsum("bth,hkd->btkd", x, self.v[...].astype(dt))
        q = rope(self.q_norm(q), positions, cfg.rope_theta)
        k = rope(self.k_norm(k), positions, cfg.rope_theta)
        if kv is not None:
            k_all, v_all = kv
            start = (layer, 0, index, 0, 0)
            k_all = lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), start)
            v_all = lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), start)
            kv = (k_all, v_all)
            k, v = k_all[layer].astype(dt), v_all[layer].astype(dt)
        # Query head n = kv_head * G + g, matching HF's repeat_interleave of KV heads.
        q = q.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim)
        out = attention(q, k, v, allowed, self.chunk).reshape(b, t, cfg.num_heads, -1)
        return jnp.einsum("btnd,ndh->bth", out, self.o[...].astype(dt)), kv


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
        gate = jnp.einsum("bth,hf->btf", x, self.gate[...].astype(dt))
        up = jnp.einsum("bth,hf->btf", x, self.up[...].astype(dt))
        return jnp.einsum("btf,fh->bth", jax.nn.silu(gate) * up, self.down[...].astype(dt))


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: Qwen3Config, *, dtype, param_dtype, rngs: nnx.Rngs, chunk: int):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.attn = Attention(cfg, **kw, chunk=chunk)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=param_dtype)
        self.mlp = MLP(cfg, **kw)

    def __call__(self, x, positions, allowed, kv=None, layer=0, index=None):
        """x: [B, T, H] -> ([B, T, H], kv); see `Attention.__call__`."""
        h, kv = self.attn(self.input_norm(x), positions, allowed, kv, layer, index)
        x = x + h
        return x + self.mlp(self.post_attn_norm(x)), kv


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


class Qwen3(nnx.Module):
    """Qwen3 causal language model.

    dtype is the activation/matmul dtype; norms, softmax and logits are always float32.
    remat rematerialises each layer in the backward pass; attention_chunk is the query block
    length above which attention is computed blockwise (memory O(chunk x S), not O(T x S)).
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
        remat: bool = False,
        rngs: nnx.Rngs | None = None,
        attention_chunk: int = 1024,
    ):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config, self.dtype, self.remat = config, dtype, remat
        v, h = config.vocab_size, config.hidden_size
        self.embedding = _param(rngs, (v, h), ("vocab", "embed"), param_dtype)
        kw = dict(dtype=dtype, param_dtype=param_dtype, chunk=attention_chunk)
        self.layers = _stacked_layers(config, rngs.params(), **kw)
        self.final_norm = RMSNorm(h, config.rms_norm_eps, param_dtype=param_dtype)
        if not config.tie_word_embeddings:
            self.unembedding = _param(rngs, (h, v), ("embed", "vocab"), param_dtype)

    def hidden_states(self, tokens, positions=None, attention_mask=None, cache=None):
        """tokens: int32 [B, T] -> (hidden [B, T, H] after the final norm, cache).

        positions: int32 [B, T]; by default each row counts its real tokens from 0 (continuing
        after the cache's valid slots when a cache is given). attention_mask: bool [B, T], True
        on real tokens. cache: KVCache or None; see `KVCache` for the write/read semantics.
        """
        b, t = tokens.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if positions is None:
            seen = 0 if cache is None else jnp.sum(cache.valid, axis=1, keepdims=True)
            positions = jnp.maximum(seen + jnp.cumsum(mask, axis=1) - 1, 0)
        positions = positions.astype(jnp.int32)
        if cache is None:
            index, valid, kv = 0, mask, None
        else:
            index = cache.index
            valid = lax.dynamic_update_slice(cache.valid, mask, (0, index))
            kv = (cache.k, cache.v)
        slot_q = index + jnp.arange(t)  # [T]
        slot_k = jnp.arange(valid.shape[1])  # [S]
        allowed = (slot_k[None, :] <= slot_q[:, None])[None] & valid[:, None, :]  # [B, T, S]

        act = ("batch", "seq", "act_embed")
        x = jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)
        x = parallel.constrain(x, act)
        graphdef, params = nnx.split(self.layers)

        def body(carry, layer_params):
            x, kv, i = carry
            x, kv = nnx.merge(graphdef, layer_params)(x, positions, allowed, kv, i, index)
            return (parallel.constrain(x, act), kv, i + 1), None

        # remat: keep only each layer's input for the backward pass, recompute the rest.
        body = jax.checkpoint(body) if self.remat else body
        (x, kv, _), _ = lax.scan(body, (x, kv, jnp.int32(0)), params)
        x = self.final_norm(x)
        if cache is not None:
            cache = KVCache(k=kv[0], v=kv[1], valid=valid, index=cache.index + t)
        return x, cache

    def lm_head(self, hidden: Array) -> Array:
        """hidden: [..., H] -> float32 logits [..., V]."""
        dt = self.dtype
        hidden = hidden.astype(dt)
        if self.config.tie_word_embeddings:
            w = self.embedding[...].astype(dt)
            logits = jnp.einsum("...h,vh->...v", hidden, w, preferred_element_type=jnp.float32)
        else:
            w = self.unembedding[...].astype(dt)
            logits = jnp.einsum("...h,hv->...v", hidden, w, preferred_element_type=jnp.float32)
        if logits.ndim == 3:
            logits = parallel.constrain(logits, ("batch", "seq", "act_vocab"))
        return logits

    def __call__(self, tokens, positions=None, attention_mask=None, cache=None):
        """tokens: int32 [B, T] -> (float32 logits [B, T, V], cache); see `hidden_states`."""
        hidden, cache = self.hidden_states(tokens, positions, attention_mask, cache)
        return self.lm_head(hidden), cache


def from_pretrained(*args, **kwargs) -> Qwen3:
    """Re-export of `mapfjax.models.hf.from_pretrained` (imported lazily: hf imports this)."""
    from mapfjax.models import hf

    return hf.from_pretrained(*args, **kwargs)
