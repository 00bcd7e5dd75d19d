"""KV-cached batch sampler for `Qwen3`: bucketed left-padded prefill, then one jitted
`lax.while_loop` decode (greedy, temperature, top-k, top-p) with per-row stops."""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mapfjax import parallel
from mapfjax.models.qwen3 import KV_CACHE_AXES, KVCache

# Qwen3's `<|im_end|>` (end of turn) and `<|endoftext|>` (pad); docs/paper.md section 7.
DEFAULT_STOP_TOKENS = (151645, 151643)
DEFAULT_PAD_ID = 151643


@flax.struct.dataclass
class SampleOutput:
    """Completions of one `generate` call; B = number of prompts, N = max_new_tokens.

    tokens: int32 [B, N], completions, `pad_id` after the stop token or the budget.
    lengths: int32 [B], generated tokens per row, the stop token included.
    logprobs: float32 [B, N], log-prob of each token under the distribution it was drawn
      from (temperature, then top-k, then top-p, renormalised); 0 after `lengths`. Greedy
      (temperature 0): log_softmax(logits).
    logprobs_full: float32 [B, N], log_softmax(logits / temperature) at each token, without
      top-k/top-p truncation (what a trainer recomputes); 0 after `lengths`. Greedy: equal
      to `logprobs`.
    finished: bool [B], True when the row stopped on a stop token, False when truncated.
    steps: int32 [], token positions actually sampled, 1..N (< N when every row stopped early).
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    logprobs_full: jax.Array
    finished: jax.Array
    steps: jax.Array


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# Length buckets: a stream of prompts of varied lengths compiles once per bucket.
BUCKETS: dict[str, Callable[[int], int]] = {
    "pow2": _next_pow2,
    "x64": lambda n: 64 * math.ceil(n / 64),
    "exact": lambda n: n,
}

# How often each jitted stage has been traced in this process (each trace = one compile).
_TRACES: collections.Counter[str] = collections.Counter()


def trace_counts() -> dict[str, int]:
    """Number of traces (compilations) of the prefill and decode stages so far."""
    return dict(_TRACES)


def filter_logits(scaled: jax.Array, top_k: int, top_p: jax.Array | float | None) -> jax.Array:
    """Keep the top-k, then the top-p nucleus of `scaled` [..., V]; others become -inf.

    Top-k keeps every token whose logit is >= the k-th largest (ties at the k-th value are
    all kept); `top_k=0` disables it. Top-p then sorts the surviving probabilities in
    descending order and keeps the shortest prefix whose mass reaches `top_p` (a token is
    kept when the mass strictly above it is < top_p, so the best token always survives;
    ties with the last kept value are kept too); `top_p=None` disables it.
    """
    vocab = scaled.shape[-1]
    if top_k == 0 and top_p is None:
        return scaled
    if top_k > 0:
        # [..., k] sorted descending; top-p then only needs to look at these.
        cand = jax.lax.top_k(scaled, top_k)[0]
    else:
        cand = -jnp.sort(-scaled, axis=-1)
    if top_p is not None:
        probs = jax.nn.softmax(cand, axis=-1)
        mass_above = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.maximum(jnp.sum(mass_above < top_p, axis=-1, keepdims=True), 1)
    else:
        kept = jnp.full(scaled.shape[:-1] + (1,), min(top_k, vocab), jnp.int32)
    cutoff = jnp.take_along_axis(cand, kept - 1, axis=-1)
    return jnp.where(scaled >= cutoff, scaled, -jnp.inf)


def _pick(logits, key, temperature, top_p, *, greedy, top_k):
    """One token per row from `logits` f32 [B, V] -> (token [B], logprob [B], logprob_full [B])."""
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        lp = jax.nn.log_softmax(logits, axis=-1)
        lp = jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]
        return token, lp, lp
    scaled = logits / temperature
    masked = filter_logits(scaled, top_k, top_p)
    token = jax.random.categorical(key, masked, axis=-1).astype(jnp.int32)

    def at(x):
        return jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), token[:, None], axis=-1)[:, 0]

    return token, at(masked), at(scaled)


def _constrain(x, sharding):
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _constrain_cache(cache, shardings):
    if shardings is None:
        return cache
    kv, valid = shardings
    return cache.replace(
        k=_constrain(cache.k, kv), v=_constrain(cache.v, kv), valid=_constrain(cache.valid, valid)
    )


@functools.partial(
    jax.jit, static_argnames=("graphdef", "config", "cache_len", "cache_dtype", "shardings")
)
def _prefill(graphdef, state, tokens, mask, *, config, cache_len, cache_dtype, shardings):
    """tokens int32 [B, P], mask bool [B, P] -> (last logits f32 [B, V], cache with index P)."""
    _TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    batch_sh, cache_sh = shardings if shardings is not None else (None, None)
    tokens, mask = _constrain(tokens, batch_sh), _constrain(mask, batch_sh)
    cache = KVCache.init(config, tokens.shape[0], cache_len, dtype=cache_dtype)
    cache = _constrain_cache(cache, cache_sh)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1, dtype=jnp.int32) - 1, 0)
    hidden, cache = model.hidden_states(
        tokens, positions=positions, attention_mask=mask, cache=cache
    )
    # Only the last prompt slot predicts the first new token: skip the [B, P, V] logits.
    logits = model.lm_head(hidden[:, -1:])[:, 0].astype(jnp.float32)
    return logits, _constrain_cache(cache, cache_sh)


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "max_new_tokens",
        "greedy",
        "top_k",
        "use_top_p",
        "stop_tokens",
        "pad_id",
        "shardings",
    ),
    donate_argnames=("cache",),
)
def _decode(
    graphdef,
    state,
    cache,
    logits,
    prompt_lens,
    done,
    key,
    temperature,
    top_p,
    *,
    max_new_tokens,
    greedy,
    top_k,
    use_top_p,
    stop_tokens,
    pad_id,
    shardings,
):
    """Sample up to N tokens per row; logits f32 [B, V] from the prefill, prompt_lens [B],
    done bool [B] (rows to skip). Returns (tokens, lengths, logprobs, logprobs_full,
    finished, steps) as in `SampleOutput`."""
    _TRACES["decode"] += 1
    model = nnx.merge(graphdef, state)
    batch_sh, cache_sh = shardings if shardings is not None else (None, None)
    (b, vocab), n = logits.shape, max_new_tokens
    stops = jnp.asarray(stop_tokens, jnp.int32)
    pick = functools.partial(_pick, greedy=greedy, top_k=top_k)
    top_p = top_p if use_top_p else None

    def record(carry, i, logits):
        """Sample column i from logits [B, V] and write it into the buffers."""
        toks, lps, lpfs, lengths, done, finished = carry
        tok, lp, lpf = pick(logits, jax.random.fold_in(key, i), temperature, top_p)
        live = ~done
        tok = jnp.where(live, tok, pad_id)
        toks = toks.at[:, i].set(tok)
        lps = lps.at[:, i].set(jnp.where(live, lp, 0.0))
        lpfs = lpfs.at[:, i].set(jnp.where(live, lpf, 0.0))
        lengths = lengths + live.astype(jnp.int32)
        stopped = live & jnp.isin(tok, stops)
        return toks, lps, lpfs, lengths, done | stopped, finished | stopped

    bufs = (
        jnp.full((b, n), pad_id, jnp.int32),
        jnp.zeros((b, n), jnp.float32),
        jnp.zeros((b, n), jnp.float32),
        jnp.zeros((b,), jnp.int32),
        done,
        jnp.zeros((b,), bool),
    )
    bufs = tuple(_constrain(x, batch_sh if x.ndim == 2 else _vector(batch_sh)) for x in bufs)
    bufs = record(bufs, 0, logits)

    def cond(carry):
        i, _, bufs = carry
        return (i < n) & ~jnp.all(bufs[4])

    def body(carry):
        i, cache, bufs = carry
        prev = jax.lax.dynamic_index_in_dim(bufs[0], i - 1, axis=1, keepdims=True)  # [B, 1]
        # Finished rows feed pad_id, which may lie outside a small vocabulary (an
        # out-of-range embedding lookup gives NaN); their outputs are discarded anyway.
        prev = jnp.clip(prev, 0, vocab - 1)
        pos = (prompt_lens + i - 1)[:, None]
        step_logits, cache = model(
            prev, positions=pos, attention_mask=jnp.ones((b, 1), bool), cache=cache
        )
        cache = _constrain_cache(cache, cache_sh)
        bufs = record(bufs, i, step_logits[:, 0].astype(jnp.float32))
        return i + 1, cache, bufs

    steps, cache, bufs = jax.lax.while_loop(cond, body, (jnp.int32(1), cache, bufs))
    toks, lps, lpfs, lengths, _, finished = bufs
    # Returning the cache lets XLA alias it to the donated input: the loop updates it in place.
    return (toks, lengths, lps, lpfs, finished, steps), cache


def _mesh_context(mesh):
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _resolve_mesh(mesh):
    if mesh is None:
        current = jax.sharding.get_mesh()
        mesh = None if current.empty else current
    if mesh is not None and jax.sharding.AxisType.Explicit in mesh.axis_types:
        # The model relies on XLA's sharding propagation (Auto axes), not sharding-in-types.
        raise ValueError(
            f"generate: mesh axis types {mesh.axis_types} include Explicit; build the mesh "
            "with mapfjax.parallel.make_mesh (Auto axes)"
        )
    return mesh


def _shardings(mesh, config, batch: int, cache_len: int):
    """(batch [B, ...] sharding, (cache k/v sharding, cache valid sharding)) on `mesh`."""
    rules = parallel.RULES["sample"]
    kv_shape = (config.num_layers, batch, cache_len, config.num_kv_heads, config.head_dim)
    batch_sh = parallel.logical_to_sharding(("batch", None), mesh, rules, (batch, cache_len))
    kv = parallel.logical_to_sharding(KV_CACHE_AXES, mesh, rules, kv_shape)
    valid = parallel.logical_to_sharding(("batch", "cache_seq"), mesh, rules, (batch, cache_len))
    return batch_sh, (kv, valid)


def _batch_shards(mesh) -> int:
    """How many ways the sampling rules split the batch on `mesh`."""
    spec = parallel.logical_to_spec(("batch",), mesh, parallel.RULES["sample"])
    return _num_shards(jax.sharding.NamedSharding(mesh, spec), 0)


def _num_shards(sharding, dim: int) -> int:
    axes = sharding.spec[dim] if dim < len(sharding.spec) else None
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(sharding.mesh.shape[a] for a in axes)


def _place_state(state, mesh):
    """Replicate onto `mesh` the leaves that live elsewhere (a model not yet sharded)."""
    devices = set(mesh.devices.flat)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def place(x):
        if isinstance(x, jax.Array) and x.sharding.device_set == devices:
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(place, state)


def _default_cache_dtype(model, state):
    dtype = getattr(model, "dtype", None)
    if dtype is not None:
        return jnp.dtype(dtype)
    floats = [x.dtype for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.dtype(floats[0]) if floats else jnp.dtype(jnp.bfloat16)


def _check_args(prompts, max_new_tokens, temperature, top_p, top_k, buckets, vocab):
    if len(prompts) == 0:
        raise ValueError("generate: `prompts` is empty; pass at least one token-id list")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens}; it must be >= 1")
    if temperature < 0:
        raise ValueError(f"generate: temperature={temperature}; it must be >= 0 (0 = greedy)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"generate: top_p={top_p}; it must be in (0, 1] (1 = off)")
    if not 0 <= top_k <= vocab:
        raise ValueError(f"generate: top_k={top_k}; it must be in [0, {vocab}] (0 = off)")
    for name, value in buckets.items():
        if value not in BUCKETS:
            raise ValueError(f"generate: {name}={value!r}; allowed: {sorted(BUCKETS)}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"generate: prompt {i} is empty; every prompt needs >= 1 token")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"generate: prompt {i} has token ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )


def generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_tokens: Sequence[int] = DEFAULT_STOP_TOKENS,
    key: jax.Array | None = None,
    pad_id: int = DEFAULT_PAD_ID,
    cache_dtype: Any = None,
    bucket: str = "pow2",
    batch_bucket: str = "pow2",
    max_cache_len: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> SampleOutput:
    """Sample up to `max_new_tokens` tokens after each prompt (lists of token ids).

    Prompts are left-padded to a `bucket` length P (and the batch to a `batch_bucket`
    size); the KV cache holds P + max_new_tokens slots, at most `max_cache_len` (default:
    the model's max_position_embeddings). temperature == 0 is greedy; otherwise tokens are
    drawn from softmax(logits / temperature) filtered by `top_k` (0 = off) then `top_p`
    (1 = off), see `filter_logits`. A row stops after emitting one of `stop_tokens`.
    `key` (required when temperature > 0) makes sampling deterministic. `cache_dtype`
    defaults to the model's activation dtype. With a mesh (passed or set by `jax.set_mesh`),
    batch rows of tokens and cache are sharded as `parallel.RULES["sample"]` says; place the
    model first with `parallel.shard_model(model, mesh, "sample")`, else weights that are
    not on the mesh are replicated onto it on every call.
    """
    config = model.config
    buckets = {"bucket": bucket, "batch_bucket": batch_bucket}
    _check_args(prompts, max_new_tokens, temperature, top_p, top_k, buckets, config.vocab_size)
    greedy = temperature == 0.0
    if not greedy and key is None:
        raise ValueError("generate: temperature > 0 needs key=jax.random.key(seed)")
    limit = config.max_position_embeddings if max_cache_len is None else max_cache_len
    room = limit - max_new_tokens
    lens = [len(p) for p in prompts]
    too_long = [i for i, n in enumerate(lens) if n > room]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"generate: prompt {i} has {lens[i]} tokens; with max_new_tokens={max_new_tokens} "
            f"the cache needs {lens[i] + max_new_tokens} slots but holds at most {limit} "
            f"(max_cache_len, default max_position_embeddings); prompts too long: {too_long}"
        )
    prompt_len = min(BUCKETS[bucket](max(lens)), room)

    mesh = _resolve_mesh(mesh)
    rows = len(prompts)
    batch = BUCKETS[batch_bucket](rows)
    if mesh is not None:
        shards = _batch_shards(mesh)
        batch = shards * math.ceil(batch / shards)
    cache_len = prompt_len + max_new_tokens
    shardings = _shardings(mesh, config, batch, cache_len) if mesh is not None else None

    # Left padding with token 0 (masked out; pad_id may exceed a small test vocabulary).
    # Padding rows get one visible token (an all-masked row has no key to attend to) and
    # start out done so they never delay the early exit.
    tokens = np.zeros((batch, prompt_len), np.int32)
    mask = np.zeros((batch, prompt_len), bool)
    for i, p in enumerate(prompts):
        tokens[i, prompt_len - len(p) :] = p
        mask[i, prompt_len - len(p) :] = True
    mask[rows:, -1] = True
    prompt_lens = np.asarray(lens + [1] * (batch - rows), np.int32)
    done = np.arange(batch) >= rows

    graphdef, state = nnx.split(model)
    if cache_dtype is None:
        cache_dtype = _default_cache_dtype(model, state)
    arrays = (tokens, mask, prompt_lens, done)
    if mesh is not None:
        state = _place_state(state, mesh)
        arrays = tuple(
            jax.device_put(x, shardings[0] if x.ndim == 2 else _vector(shardings[0]))
            for x in arrays
        )
    tokens, mask, prompt_lens, done = arrays

    # Under the mesh the model's own activation constraints apply too (no-ops without one).
    with _mesh_context(mesh):
        logits, cache = _prefill(
            graphdef,
            state,
            tokens,
            mask,
            config=config,
            cache_len=cache_len,
            cache_dtype=jnp.dtype(cache_dtype),
            shardings=shardings,
        )
        key = jax.random.key(0) if key is None else key
        out, _ = _decode(
            graphdef,
            state,
            cache,
            logits,
            prompt_lens,
            done,
            key,
            jnp.float32(temperature if not greedy else 1.0),
            jnp.float32(top_p),
            max_new_tokens=max_new_tokens,
            greedy=greedy,
            top_k=int(top_k),
            use_top_p=top_p < 1.0,
            stop_tokens=tuple(int(t) for t in stop_tokens),
            pad_id=int(pad_id),
            shardings=shardings,
        )
    toks, lengths, lps, lpfs, finished, steps = out
    if batch != rows:
        toks, lengths, lps, lpfs, finished = (
            x[:rows] for x in (toks, lengths, lps, lpfs, finished)
        )
    return SampleOutput(toks, lengths, lps, lpfs, finished, steps)


@functools.partial(jax.jit, static_argnames=("graphdef", "prefill_kw", "decode_kw"))
def _prefill_and_decode(
    graphdef, state, tokens, mask, prompt_lens, done, key, temp, top_p, *, prefill_kw, decode_kw
):
    """Both stages in one computation, for ahead-of-time memory analysis only."""
    logits, cache = _prefill(graphdef, state, tokens, mask, **dict(prefill_kw))
    return _decode(
        graphdef, state, cache, logits, prompt_lens, done, key, temp, top_p, **dict(decode_kw)
    )[0]


def lower_generate(
    graphdef,
    state,
    *,
    batch: int,
    prompt_len: int,
    max_new_tokens: int,
    mesh: jax.sharding.Mesh | None = None,
    cache_dtype: Any = jnp.bfloat16,
    top_k: int = 0,
    top_p: bool = True,
) -> jax.stages.Lowered:
    """Lowers prefill + decode for `batch` rows of `prompt_len` tokens (sampling with
    temperature, `top_k`, and top-p when `top_p`) without running it: feed an abstract
    (ShapeDtypeStruct) `state` to plan memory, e.g. with `parallel.memory_per_device`."""
    config = nnx.merge(graphdef, state).config
    cache_len = prompt_len + max_new_tokens
    shardings = _shardings(mesh, config, batch, cache_len) if mesh is not None else None
    batch_sh = None if shardings is None else shardings[0]

    def spec(shape, dtype):
        sharding = batch_sh if len(shape) == 2 else _vector(batch_sh)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    prefill_kw = dict(
        config=config, cache_len=cache_len, cache_dtype=jnp.dtype(cache_dtype), shardings=shardings
    )
    decode_kw = dict(
        max_new_tokens=max_new_tokens,
        greedy=False,
        top_k=top_k,
        use_top_p=top_p,
        stop_tokens=DEFAULT_STOP_TOKENS,
        pad_id=DEFAULT_PAD_ID,
        shardings=shardings,
    )
    with _mesh_context(mesh):
        return _prefill_and_decode.lower(
            graphdef,
            state,
            spec((batch, prompt_len), jnp.int32),
            spec((batch, prompt_len), bool),
            spec((batch,), jnp.int32),
            spec((batch,), bool),
            jax.random.key(0),
            jnp.float32(1.0),
            jnp.float32(0.95),
            prefill_kw=tuple(sorted(prefill_kw.items())),
            decode_kw=tuple(sorted(decode_kw.items())),
        )


def _vector(sharding):
    """The batch sharding restricted to a [B] vector (None stays None)."""
    if sharding is None:
        return None
    spec = jax.sharding.PartitionSpec(sharding.spec[0] if len(sharding.spec) else None)
    return jax.sharding.NamedSharding(sharding.mesh, spec)


def _host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        # Multi-process: rows live on other hosts; gather the global array everywhere.
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def to_lists(output: SampleOutput) -> list[list[int]]:
    """The completions as Python token lists (stop token included, padding dropped)."""
    toks, lengths = _host(output.tokens), _host(output.lengths)
    return [toks[i, : lengths[i]].tolist() for i in range(toks.shape[0])]


def logprob_gap(output: SampleOutput) -> float:
    """Mean |logprobs - logprobs_full| over generated tokens: the cost of top-k/top-p
    truncation as seen by a trainer that recomputes untruncated log-probs."""
    n = output.tokens.shape[1]
    live = np.arange(n)[None, :] < _host(output.lengths)[:, None]
    gap = np.abs(_host(output.logprobs) - _host(output.logprobs_full))
    return float(gap[live].mean()) if live.any() else 0.0
