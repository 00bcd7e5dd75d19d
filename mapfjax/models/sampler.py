"""KV-cached batch sampler for `Qwen3`: bucketed left-padded prefill, then one jitted
`lax.while_loop` decode (greedy, temperature, top-k, top-p) with per-row stops."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mapfjax import parallel
from mapfjax.models.qwen3 import LAYER_KV_AXES, Prefix
from mapfjax.models.tokenizer import PAD_ID, STOP_IDS

# Qwen3's `<|im_end|>` (end of turn) and `<|endoftext|>` (pad), declared in tokenizer.py.
DEFAULT_STOP_TOKENS = STOP_IDS
DEFAULT_PAD_ID = PAD_ID


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
def _pow2_mid(n: int) -> int:
    """The smallest of 2^k and 3 * 2^(k-1) (1, 2, 3, 4, 6, 8, 12, 16, 24, ...) >= n: at most
    a third of padding, at twice as many shapes as "pow2"."""
    p = _next_pow2(n)
    return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


BUCKETS: dict[str, Callable[[int], int]] = {
    "pow2": _next_pow2,
    "pow2_mid": _pow2_mid,
    "x8": lambda n: 8 * math.ceil(n / 8),  # little padding, more shapes (cheap compiles on CPU)
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


def _pick(logits, key, temperature, top_p, *, greedy, top_k, row_ids=None, bias=None):
    """One token per row from `logits` f32 [B, V] -> (token [B], logprob [B], logprob_full [B]).
    row_ids: int32 [B] or None. None draws all rows from `key` at once; given, row r draws from
    fold_in(key, row_ids[r]), so its token does not depend on which other rows are in the batch
    (the draws `compact` needs to drop finished rows without changing the others). bias: f32
    [V] or None, added to every row's logits first (`generate(logit_bias=...)`)."""
    if bias is not None:
        logits = logits + bias
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        lp = jax.nn.log_softmax(logits, axis=-1)
        lp = jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]
        return token, lp, lp
    scaled = logits / temperature
    masked = filter_logits(scaled, top_k, top_p)
    if row_ids is None:
        token = jax.random.categorical(key, masked, axis=-1).astype(jnp.int32)
    else:
        keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row_ids)
        token = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)

    def at(x):
        return jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), token[:, None], axis=-1)[:, 0]

    return token, at(masked), at(scaled)


def _constrain(x, sharding):
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _constrain_tree(tree, shardings):
    """Constrains every leaf of `tree` to the matching leaf of `shardings` (None: no-op)."""
    return tree if shardings is None else jax.tree.map(_constrain, tree, shardings)


@flax.struct.dataclass
class _Shardings:
    """Where the sampler's arrays live on a mesh (None leaves without one). groups: [Bg, ...]
    prompt arrays; rows: [B, ...] per-completion arrays; kv: one layer's [B|Bg, K, S, D]."""

    groups: Any
    group_vec: Any
    rows: Any
    row_vec: Any
    kv: Any


def _split_prefix(k, v, valid, lengths) -> Prefix:
    """Stacked [L, ...] prefix keys/values -> a Prefix of per-layer tuples (read in the
    unrolled decode step without slicing the stack at every step)."""
    n = k.shape[0]
    return Prefix(tuple(k[i] for i in range(n)), tuple(v[i] for i in range(n)), valid, lengths)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_dtype", "shardings"))
def _prefill(graphdef, state, tokens, mask, *, cache_dtype, shardings):
    """tokens int32 [Bg, P], mask bool [Bg, P] -> (last-position logits f32 [Bg, V], Prefix
    with per-layer [Bg, K, P, D] keys/values in `cache_dtype`)."""
    _TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    sh = shardings
    if sh is not None:
        tokens, mask = _constrain(tokens, sh.groups), _constrain(mask, sh.groups)
    hidden, prefix = model.prefix(tokens, mask)
    # Only the last prompt slot predicts the first new token: skip the [Bg, P, V] logits.
    logits = model.lm_head(hidden[:, -1:])[:, 0].astype(jnp.float32)
    k, v = prefix.k.astype(cache_dtype), prefix.v.astype(cache_dtype)
    prefix = _split_prefix(k, v, prefix.valid, prefix.lengths)
    if sh is not None:
        prefix = Prefix(
            k=tuple(_constrain(x, sh.kv) for x in prefix.k),
            v=tuple(_constrain(x, sh.kv) for x in prefix.v),
            valid=_constrain(prefix.valid, sh.groups),
            lengths=_constrain(prefix.lengths, sh.group_vec),
        )
    return logits, prefix


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _split_layers(graphdef, state):
    """Per-layer copies of the stacked layer parameters (once per `generate` call)."""
    return nnx.merge(graphdef, state).split_layers()


class Buffers(NamedTuple):
    """The decode loop's outputs so far, B rows x N = max_new_tokens columns: what
    `SampleOutput` returns, plus `done`.

    tokens: int32 [B, N]; logprobs, logprobs_full: float32 [B, N] (see `SampleOutput`);
    lengths: int32 [B] columns sampled per row; done: bool [B] rows that need no more tokens
    (stopped, or batch padding); finished: bool [B] rows that emitted a stop token.
    """

    tokens: jax.Array
    logprobs: jax.Array
    logprobs_full: jax.Array
    lengths: jax.Array
    done: jax.Array
    finished: jax.Array


class DecodeState(NamedTuple):
    """The decode `while_loop`'s carry. column: int32 [] next column to sample; cache:
    per-layer ([B, K, W, D], ...) keys and values of the rows' own tokens; out: `Buffers`."""

    column: jax.Array
    cache: Any
    out: Buffers


def _record(out: Buffers, i, logits, key, temperature, top_p, *, greedy, top_k, stops, pad_id,
            row_ids=None, bias=None):  # fmt: skip
    """Samples column i of every row from logits f32 [B, V] into `out`; done rows get
    pad_id (and log-prob 0). row_ids, bias: see `_pick`."""
    tok, lp, lpf = _pick(
        logits, jax.random.fold_in(key, i), temperature, top_p,
        greedy=greedy, top_k=top_k, row_ids=row_ids, bias=bias,
    )  # fmt: skip
    live = ~out.done
    tok = jnp.where(live, tok, pad_id)
    stopped = live & jnp.isin(tok, stops)
    return Buffers(
        tokens=out.tokens.at[:, i].set(tok),
        logprobs=out.logprobs.at[:, i].set(jnp.where(live, lp, 0.0)),
        logprobs_full=out.logprobs_full.at[:, i].set(jnp.where(live, lpf, 0.0)),
        lengths=out.lengths + live.astype(jnp.int32),
        done=out.done | stopped,
        finished=out.finished | stopped,
    )


_DECODE_STATIC = (
    "graphdef", "max_new_tokens", "greedy", "top_k", "use_top_p", "stop_tokens", "pad_id",
    "shardings", "row_keys", "steps_per_loop",
)  # fmt: skip


@functools.partial(jax.jit, static_argnames=(*_DECODE_STATIC, "group_size"))
def _first_token(logits, done, key, temperature, top_p, bias=None, *, group_size, **static):
    """`Buffers` with column 0 sampled from the prefill logits [Bg, V] (each of the G rows
    of a group draws its own token)."""
    return _start(logits, done, key, temperature, top_p, bias, group_size=group_size, **static)


def _start(logits, done, key, temperature, top_p, bias=None, *, group_size, max_new_tokens, greedy,
           top_k, use_top_p, stop_tokens, pad_id, shardings, graphdef=None,
           row_keys=False, steps_per_loop=1):  # fmt: skip
    sh = shardings
    b, n = done.shape[0], max_new_tokens
    out = Buffers(
        tokens=jnp.full((b, n), pad_id, jnp.int32),
        logprobs=jnp.zeros((b, n), jnp.float32),
        logprobs_full=jnp.zeros((b, n), jnp.float32),
        lengths=jnp.zeros((b,), jnp.int32),
        done=done,
        finished=jnp.zeros((b,), bool),
    )
    if sh is not None:
        out = jax.tree.map(lambda x: _constrain(x, sh.rows if x.ndim == 2 else sh.row_vec), out)
    rows = jnp.repeat(logits, group_size, axis=0)
    top_p = top_p if use_top_p else None
    stops = jnp.asarray(stop_tokens, jnp.int32)
    return _record(
        out, 0, rows, key, temperature, top_p,
        greedy=greedy, top_k=top_k, stops=stops, pad_id=pad_id,
        row_ids=jnp.arange(b, dtype=jnp.int32) if row_keys else None, bias=bias,
    )  # fmt: skip


@functools.partial(jax.jit, static_argnames=_DECODE_STATIC, donate_argnames=("loop",))
def _decode(
    graphdef, state, layer_params, prefix, loop: DecodeState, key, temperature, top_p,
    bias=None, row_ids=None, *, max_new_tokens, greedy, top_k, use_top_p, stop_tokens, pad_id,
    shardings, row_keys=False, steps_per_loop=1,
):  # fmt: skip
    """Decodes columns loop.column, loop.column + 1, ... until every row is done, column
    `max_new_tokens` or the end of the cache window W (column W, whose token is fed at slot
    W - 1). Returns the `DecodeState` where it stopped. row_ids: given (with `row_keys`, the
    first token's draws), row r draws its tokens as the call's row row_ids[r] (`_pick`).

    steps_per_loop K > 1: each iteration of the loop samples K columns (unrolled), so the
    loop's predicate is evaluated (on a GPU: read back to the host) once per K tokens, while
    K more columns fit before the stop; the last < K columns go one per iteration. Columns
    sampled after every row is done record nothing (`_record`: pad_id, log-prob 0, lengths
    unchanged), and the column returned is the one a single step per iteration stops at."""
    _TRACES["decode"] += 1
    model = nnx.merge(graphdef, state)
    window = loop.cache[0][0].shape[2]
    stop = min(max_new_tokens, window + 1)
    vocab = model.config.vocab_size
    top_p = top_p if use_top_p else None
    stops = jnp.asarray(stop_tokens, jnp.int32)
    rows = loop.out.tokens.shape[0]
    lengths = jnp.repeat(prefix.lengths, rows // prefix.lengths.shape[0])

    def cond(s: DecodeState):
        return (s.column < stop) & ~jnp.all(s.out.done)

    def body(s: DecodeState) -> DecodeState:
        i = s.column
        prev = jax.lax.dynamic_index_in_dim(s.out.tokens, i - 1, axis=1, keepdims=True)  # [B, 1]
        # Finished rows feed pad_id, which may lie outside a small vocabulary (an
        # out-of-range embedding lookup gives NaN); their outputs are discarded anyway.
        prev = jnp.clip(prev, 0, vocab - 1)
        pos = (lengths + i - 1)[:, None]
        logits, cache = model.decode_step(prev, pos, prefix, s.cache, i - 1, layer_params)
        if shardings is not None:
            cache = jax.tree.map(lambda x: _constrain(x, shardings.kv), cache)
        out = _record(
            s.out, i, logits.astype(jnp.float32), key, temperature, top_p,
            greedy=greedy, top_k=top_k, stops=stops, pad_id=pad_id, row_ids=row_ids, bias=bias,
        )  # fmt: skip
        return DecodeState(i + 1, cache, out)

    k = steps_per_loop
    if k == 1:
        # Returning the cache and buffers lets XLA alias them to the donated inputs.
        return jax.lax.while_loop(cond, body, loop)
    first = loop.column
    s = loop
    if k < stop:  # else K columns never fit: the loop starts at column 1 or later
        # Columns i .. i + K - 1 < stop <= W + 1: the last slot fed, i + K - 2 <= W - 1,
        # lies inside the window.
        def cond_k(s: DecodeState):
            return (s.column + k <= stop) & ~jnp.all(s.out.done)

        def body_k(s: DecodeState) -> DecodeState:
            for _ in range(k):
                s = body(s)
            return s

        s = jax.lax.while_loop(cond_k, body_k, s)
    s = jax.lax.while_loop(cond, body, s)
    # A live row's length is the column; a row's last column sampled is its length - 1. When
    # every row is done, one step per iteration stops after the last row's stop token (at
    # the longest length), or where it started when no row was live.
    last = jnp.maximum(first, jnp.minimum(s.column, jnp.max(s.out.lengths)))
    return s._replace(column=jnp.where(jnp.all(s.out.done), last, s.column))


@functools.partial(jax.jit, static_argnames=("window", "shardings"))
def _grow(cache, *, window, shardings):
    """Pads every layer's [B, K, W, D] cache to `window` slots (zeros after the old ones)."""

    def pad(x):
        x = jnp.pad(x, ((0, 0), (0, 0), (0, window - x.shape[2]), (0, 0)))
        return x if shardings is None else _constrain(x, shardings.kv)

    return jax.tree.map(pad, cache)


# The own-token cache's first window (slots) in `generate`; `growth_bytes` plans with the same.
FIRST_WINDOW = 64
# `generate(compact=None)` drops finished rows between decode segments above this budget.
COMPACT_BUDGET = 256


def _windows(max_new_tokens: int, first: int) -> list[int]:
    """Cache window per decode segment: `first`, then doubling, up to the N - 1 slots the
    fed tokens need (column 0 comes from the prefill, so N columns feed N - 1 tokens)."""
    need = max(1, max_new_tokens - 1)
    out = [min(need, first)]
    while out[-1] < need:
        out.append(min(need, 2 * out[-1]))
    return out


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


def _shardings(mesh, config, groups: int, rows: int) -> _Shardings:
    """The sampler's shardings on `mesh` (rows split over data x fsdp, KV heads over tp)."""
    rules = parallel.RULES["sample"]

    def sh(axes, shape):
        return parallel.logical_to_sharding(axes, mesh, rules, shape)

    kv_shape = (rows, config.num_kv_heads, 1, config.head_dim)
    return _Shardings(
        groups=sh(("batch", None), (groups, 1)),
        group_vec=sh(("batch",), (groups,)),
        rows=sh(("batch", None), (rows, 1)),
        row_vec=sh(("batch",), (rows,)),
        kv=sh(LAYER_KV_AXES, kv_shape),
    )


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


def _check_count(where: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name}={value!r}; it must be an int >= 1")


def _check_args(prompts, max_new_tokens, temperature, top_p, top_k, buckets, vocab, samples,
                steps_per_loop=1):  # fmt: skip
    if len(prompts) == 0:
        raise ValueError("generate: `prompts` is empty; pass at least one token-id list")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens}; it must be >= 1")
    _check_count("generate", "num_samples", samples)
    _check_count("generate", "steps_per_loop", steps_per_loop)
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


def _bias_vector(logit_bias: Mapping[int, float] | None, vocab: int) -> jax.Array | None:
    """`generate`'s logit_bias as f32 [vocab] (None for none or an empty mapping); a token id
    outside the vocabulary or a value that is not finite raises ValueError naming it."""
    if not logit_bias:
        return None
    bias = np.zeros(vocab, np.float32)
    for t, v in logit_bias.items():
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            raise ValueError(f"generate: logit_bias token {t!r}; allowed: ids in [0, {vocab})")
        if not math.isfinite(float(v)):
            raise ValueError(f"generate: logit_bias[{t}] = {v!r}; it must be a finite number")
        bias[int(t)] = float(v)
    return jnp.asarray(bias)


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
    num_samples: int = 1,
    window: int = FIRST_WINDOW,
    split_layers: bool | None = None,
    timings: dict | None = None,
    compact: bool | None = None,
    logit_bias: Mapping[int, float] | None = None,
    steps_per_loop: int = 1,
) -> SampleOutput:
    """Sample up to `max_new_tokens` tokens after each prompt (lists of token ids),
    `num_samples` times per prompt: rows i * num_samples ... (i + 1) * num_samples - 1 of the
    output continue prompt i.

    Each prompt is prefilled once and its keys and values are shared by its samples. Prompts
    are left-padded to a `bucket` length P (and their number to a `batch_bucket` size); the
    cache holds P + max_new_tokens positions, at most `max_cache_len` (default: the model's
    max_position_embeddings). Decoding runs in segments whose own-token cache window starts
    at `window` slots and doubles up to max_new_tokens, so a step attends over the filled
    part only (one compile per window size); it stops as soon as every row has stopped.
    temperature == 0 is greedy; otherwise tokens are drawn from softmax(logits / temperature)
    filtered by `top_k` (0 = off) then `top_p` (1 = off), see `filter_logits`. A row stops
    after emitting one of `stop_tokens`. `key` (required when temperature > 0) makes sampling
    deterministic. `cache_dtype` defaults to the model's activation dtype. split_layers: copy
    the stacked layer weights into per-layer arrays once per call (default: on CPU, where a
    slice of the stack would otherwise be copied at every step). With a mesh (passed or set
    by `jax.set_mesh`), rows and caches are sharded as `parallel.RULES["sample"]` says; place
    the model first with `parallel.shard_model(model, mesh, "sample")`, else weights that are
    not on the mesh are replicated onto it on every call. timings: a dict that receives the
    seconds of the prefill (first token included) and of the decode loop, "prefill_s" and
    "decode_s" (the call then waits for the prefill before decoding; for benchmarks).
    compact: drop finished rows between decode segments (`_compact_rows`: when the live rows
    fit in half the batch or less), so that a batch whose longest completion runs to the budget
    does not decode every row that long; each row then draws its random numbers by its own
    index (`_pick`), so the tokens drawn do not depend on compaction, but they differ from
    those of `compact=False` for the same key. None (default): on when max_new_tokens >
    `COMPACT_BUDGET`, where segments reach long windows and completion lengths vary most.
    logit_bias: {token id: value} added to those tokens' logits at every step before the pick
    (greedy or sampled; the recorded log-probs are the biased distribution's): a decoding
    intervention for diagnostics, e.g. how much one token's preference alone moves greedy.
    steps_per_loop: decode columns sampled per iteration of the decode loop (unrolled), so
    that the loop's exit test, read back to the host on a GPU, costs once per that many
    tokens; the outputs are those of 1 (the default; log-probs up to float rounding), at the
    cost of up to steps_per_loop - 1 steps computed after every row has stopped and a
    longer compile (the step is unrolled that many times).
    """
    config = model.config
    buckets = {"bucket": bucket, "batch_bucket": batch_bucket}
    _check_args(
        prompts, max_new_tokens, temperature, top_p, top_k, buckets, config.vocab_size,
        num_samples, steps_per_loop,
    )  # fmt: skip
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"generate: window={window!r}; it must be an int >= 1")
    greedy = temperature == 0.0
    if not greedy and key is None:
        raise ValueError("generate: temperature > 0 needs key=jax.random.key(seed)")
    prompt_len = _prompt_len(prompts, max_new_tokens, max_cache_len, config, bucket)
    mesh = _resolve_mesh(mesh)
    layout = _Layout.make(len(prompts), num_samples, batch_bucket, mesh, config)
    tokens, mask, done = _pad_prompts(prompts, prompt_len, layout)

    graphdef, state = nnx.split(model)
    cache_dtype = jnp.dtype(
        _default_cache_dtype(model, state) if cache_dtype is None else cache_dtype
    )
    sh = layout.shardings
    if mesh is not None:
        state = _place_state(state, mesh)
        tokens, mask = (jax.device_put(x, sh.groups) for x in (tokens, mask))
        done = jax.device_put(done, sh.row_vec)
    static = dict(
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        top_k=int(top_k),
        use_top_p=top_p < 1.0,
        stop_tokens=tuple(int(t) for t in stop_tokens),
        pad_id=int(pad_id),
        shardings=sh,
        steps_per_loop=steps_per_loop,
    )
    draw = (
        jax.random.key(0) if key is None else key,
        jnp.float32(temperature if not greedy else 1.0),
        jnp.float32(top_p),
        _bias_vector(logit_bias, config.vocab_size),
    )
    if split_layers is None:
        split_layers = jax.default_backend() == "cpu"
    static["row_keys"] = bool(max_new_tokens > COMPACT_BUDGET if compact is None else compact)

    # Under the mesh the model's own activation constraints apply too (no-ops without one).
    with _mesh_context(mesh):
        start = time.perf_counter()
        logits, prefix = _prefill(
            graphdef, state, tokens, mask, cache_dtype=cache_dtype, shardings=sh
        )
        out = _first_token(logits, done, *draw, group_size=num_samples, **static)
        if timings is not None:
            jax.block_until_ready(out)
            timings["prefill_s"], start = time.perf_counter() - start, time.perf_counter()
        layer_params = _split_layers(graphdef, state) if split_layers else None
        out, steps = _decode_segments(
            graphdef, state, layer_params, prefix, out, draw, layout, cache_dtype, window, static
        )
        if timings is not None:
            jax.block_until_ready(out)
            timings["decode_s"] = time.perf_counter() - start
    n = len(prompts) * num_samples
    if layout.rows != n:
        out = jax.tree.map(lambda x: x[:n], out)
    return SampleOutput(
        tokens=out.tokens,
        lengths=out.lengths,
        logprobs=out.logprobs,
        logprobs_full=out.logprobs_full,
        finished=out.finished,
        steps=jnp.int32(steps),
    )


def _prompt_len(prompts, max_new_tokens, max_cache_len, config, bucket) -> int:
    """The prompts' padded length P (their bucket, at most the cache room left after the
    budget); ValueError naming the prompts that do not fit."""
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
    return min(BUCKETS[bucket](max(lens)), room)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How a call's prompts and rows are laid out: `groups` padded prompts (a bucket, a
    multiple of the mesh's batch shards) of `group_size` rows each."""

    prompts: int
    group_size: int
    groups: int
    shardings: _Shardings | None
    mesh: jax.sharding.Mesh | None = None

    @property
    def rows(self) -> int:
        return self.groups * self.group_size

    @classmethod
    def make(cls, prompts, group_size, batch_bucket, mesh, config) -> _Layout:
        groups = BUCKETS[batch_bucket](prompts)
        if mesh is not None:
            shards = _batch_shards(mesh)
            groups = shards * math.ceil(groups / shards)
        rows = groups * group_size
        sh = _shardings(mesh, config, groups, rows) if mesh is not None else None
        return cls(prompts, group_size, groups, sh, mesh)


def _pad_prompts(prompts, prompt_len: int, layout: _Layout):
    """(tokens int32 [Bg, P] left-padded with 0, mask bool [Bg, P], done bool [B]).

    Token 0 pads (masked out; pad_id may exceed a small test vocabulary). Padding prompts get
    one visible token (an all-masked row has no key to attend to) and their rows start out
    done, so they never delay the early exit."""
    tokens = np.zeros((layout.groups, prompt_len), np.int32)
    mask = np.zeros((layout.groups, prompt_len), bool)
    for i, p in enumerate(prompts):
        tokens[i, prompt_len - len(p) :] = p
        mask[i, prompt_len - len(p) :] = True
    mask[layout.prompts :, -1] = True
    done = np.arange(layout.rows) >= layout.prompts * layout.group_size
    return tokens, mask, done


def _decode_segments(graphdef, state, layer_params, prefix, out: Buffers, draw, layout, dtype,
                     window, static):  # fmt: skip
    """Runs `_decode` once per cache window (`_windows`), growing the rows' cache between
    segments, until every row is done or the budget is used. With static["row_keys"] (the
    call's `compact`), each segment after the first starts by dropping finished rows when
    that halves the batch or more (`_compact_rows`): the live rows go on with their own copy
    of their prompt's keys and values, and their buffers are written back into the whole
    batch's at the end. Returns (`Buffers`, columns sampled)."""
    config = nnx.merge(graphdef, state).config
    n, sh = static["max_new_tokens"], layout.shardings
    compact = static["row_keys"]
    i, cache = 1, None
    group_size = layout.group_size
    rows = layout.rows
    # With `compact`: where each current row lives in the whole batch (rows: padding), and
    # the whole batch's buffers once rows have been dropped.
    where, whole = np.arange(rows), None
    for w in _windows(n, window):
        if i >= n:
            break
        done = np.asarray(out.done)
        if done.all():
            break
        if compact and cache is not None:
            keep = _compact_rows(int((~done).sum()), done.shape[0], _batch_shards_of(layout))
            # Each kept row gets its own copy of its prompt's P keys and values: compact only
            # when that and the kept rows' W-slot caches take less room than the batch's now.
            groups, p = prefix.valid.shape
            if keep < done.shape[0] and keep * (p + w) <= done.shape[0] * w + groups * p:
                whole = out if whole is None else _put_rows(whole, out, where)
                pick = np.flatnonzero(~done)
                pad = np.full(keep - pick.size, np.flatnonzero(done)[0])
                pick = np.concatenate([pick, pad]).astype(np.int32)
                where = np.concatenate([where[pick[: keep - pad.size]], np.full(pad.size, rows)])
                if layout.mesh is not None:
                    sh = _shardings(layout.mesh, config, keep, keep)
                    static = {**static, "shardings": sh}
                cache, prefix, out = _take_rows(
                    cache, prefix, out, jnp.asarray(pick), group_size=group_size, shardings=sh
                )
                group_size = 1
        if cache is None:
            cache = _empty_cache(rows, w, config, dtype)
            if sh is not None:
                cache = jax.device_put(cache, sh.kv)
        else:
            cache = _grow(cache, window=w, shardings=sh)
        loop = DecodeState(jnp.int32(i), cache, out)
        row_ids = jnp.asarray(np.minimum(where, rows - 1), jnp.int32) if compact else None
        loop = _decode(graphdef, state, layer_params, prefix, loop, *draw, row_ids, **static)
        i, cache, out = int(loop.column), loop.cache, loop.out
    if whole is not None:
        out = _put_rows(whole, out, where)
    return out, max(1, min(i, n))


def _compact_rows(live: int, rows: int, shards: int) -> int:
    """How many rows to decode on with when `live` of `rows` are unfinished: the power of
    two at or above `live` (a multiple of the mesh's batch shards), or `rows` when that is
    not at most half of it (few row counts, so few compiled decode loops)."""
    keep = shards * math.ceil(_next_pow2(max(live, 1)) / shards)
    return keep if 2 * keep <= rows else rows


def _batch_shards_of(layout) -> int:
    return 1 if layout.mesh is None else _batch_shards(layout.mesh)


@functools.partial(jax.jit, static_argnames=("group_size", "shardings"))
def _take_rows(cache, prefix: Prefix, out: Buffers, pick, *, group_size, shardings):
    """Rows `pick` of the own-token cache and the buffers, each with its own copy of its
    group's prefix (one row per group after this)."""
    groups = pick // group_size

    def take(x, idx, sharding=None):
        x = jnp.take(x, idx, axis=0)
        return x if sharding is None else _constrain(x, sharding)

    kv = None if shardings is None else shardings.kv
    cache = jax.tree.map(lambda x: take(x, pick, kv), cache)
    prefix = Prefix(
        tuple(take(k, groups, kv) for k in prefix.k),
        tuple(take(v, groups, kv) for v in prefix.v),
        take(prefix.valid, groups, None if shardings is None else shardings.groups),
        take(prefix.lengths, groups, None if shardings is None else shardings.group_vec),
    )
    vec = None if shardings is None else shardings.row_vec
    mat = None if shardings is None else shardings.rows
    out = jax.tree.map(lambda x: take(x, pick, mat if x.ndim == 2 else vec), out)
    return cache, prefix, out


@jax.jit
def _put_rows(whole: Buffers, out: Buffers, where) -> Buffers:
    """`whole` with row where[r] replaced by row r of `out` (rows where[r] out of range,
    padding, are dropped)."""
    return jax.tree.map(lambda a, b: a.at[where].set(b, mode="drop"), whole, out)


def _empty_cache(rows: int, window: int, config, dtype):
    """Zero per-layer ([rows, K, window, D], ...) keys and values."""
    shape = (rows, config.num_kv_heads, window, config.head_dim)
    ks = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
    return ks, tuple(jnp.zeros(shape, dtype) for _ in ks)


@functools.partial(jax.jit, static_argnames=("graphdef", "prefill_kw", "decode_kw"))
def _prefill_and_decode(
    graphdef, state, tokens, mask, done, key, temp, top_p, *, prefill_kw, decode_kw
):
    """Prefill, first token and one decode segment over the whole window in one
    computation, for ahead-of-time memory analysis only."""
    decode_kw = dict(decode_kw)
    g, window = decode_kw.pop("group_size"), decode_kw.pop("window")
    logits, prefix = _prefill(graphdef, state, tokens, mask, **dict(prefill_kw))
    out = _start(logits, done, key, temp, top_p, group_size=g, **decode_kw)
    cfg = nnx.merge(graphdef, state).config
    cache = _empty_cache(done.shape[0], window, cfg, dict(prefill_kw)["cache_dtype"])
    loop = DecodeState(jnp.int32(1), cache, out)
    return _decode(graphdef, state, None, prefix, loop, key, temp, top_p, **decode_kw).out


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
    num_samples: int = 1,
    steps_per_loop: int = 1,
) -> jax.stages.Lowered:
    """Lowers prefill + decode for `batch` rows (`batch / num_samples` prompts of
    `prompt_len` tokens; sampling with temperature, `top_k`, and top-p when `top_p`) without
    running it: feed an abstract (ShapeDtypeStruct) `state` to plan memory, e.g. with
    `parallel.memory_per_device`. The decode segment is the last, whole-budget window.
    steps_per_loop: as in `generate`."""
    config = nnx.merge(graphdef, state).config
    _check_count("lower_generate", "steps_per_loop", steps_per_loop)
    if batch % num_samples:
        raise ValueError(f"lower_generate: batch={batch} not divisible by num_samples")
    groups = batch // num_samples
    sh = _shardings(mesh, config, groups, batch) if mesh is not None else None

    def spec(shape, dtype, sharding):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    prefill_kw = dict(cache_dtype=jnp.dtype(cache_dtype), shardings=sh)
    decode_kw = dict(
        max_new_tokens=max_new_tokens,
        greedy=False,
        top_k=top_k,
        use_top_p=top_p,
        stop_tokens=DEFAULT_STOP_TOKENS,
        pad_id=DEFAULT_PAD_ID,
        shardings=sh,
        group_size=num_samples,
        window=max(1, max_new_tokens - 1),
        steps_per_loop=steps_per_loop,
    )
    with _mesh_context(mesh):
        return _prefill_and_decode.lower(
            graphdef,
            state,
            spec((groups, prompt_len), jnp.int32, None if sh is None else sh.groups),
            spec((groups, prompt_len), bool, None if sh is None else sh.groups),
            spec((batch,), bool, None if sh is None else sh.row_vec),
            jax.random.key(0),
            jnp.float32(1.0),
            jnp.float32(0.95),
            prefill_kw=tuple(sorted(prefill_kw.items())),
            decode_kw=tuple(sorted(decode_kw.items())),
        )


def growth_bytes(
    config,
    *,
    batch: int,
    max_new_tokens: int,
    window: int = FIRST_WINDOW,
    mesh: jax.sharding.Mesh | None = None,
    cache_dtype: Any = jnp.bfloat16,
    num_samples: int = 1,
) -> int:
    """Bytes per device of the rows' KV cache before its last growth (0 when the budget fits
    the first window). `generate` grows the cache between decode segments by copying it into
    one twice as long, so during the last growth the old cache is alive beside everything the
    last segment holds: add this to `lower_generate`'s peak (which plans the last segment
    only) for the sampler's high-water mark."""
    windows = _windows(max_new_tokens, window)
    if len(windows) < 2:
        return 0
    shape = (batch, config.num_kv_heads, windows[-2], config.head_dim)
    if mesh is not None:
        shape = _shardings(mesh, config, batch // num_samples, batch).kv.shard_shape(shape)
    per_layer = 2 * math.prod(shape) * jnp.dtype(cache_dtype).itemsize  # keys and values
    return config.num_layers * per_layer


def _vector(sharding):
    """The batch sharding restricted to a [B] vector (None stays None)."""
    if sharding is None:
        return None
    spec = jax.sharding.PartitionSpec(sharding.spec[0] if len(sharding.spec) else None)
    return jax.sharding.NamedSharding(sharding.mesh, spec)


def to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        # Multi-process: rows live on other hosts; gather the global array everywhere.
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def to_lists(output: SampleOutput) -> list[list[int]]:
    """The completions as Python token lists (stop token included, padding dropped)."""
    toks, lengths = to_host(output.tokens), to_host(output.lengths)
    return [toks[i, : lengths[i]].tolist() for i in range(toks.shape[0])]


def logprob_gap(output: SampleOutput) -> float:
    """Mean |logprobs - logprobs_full| over generated tokens: the cost of top-k/top-p
    truncation as seen by a trainer that recomputes untruncated log-probs."""
    n = output.tokens.shape[1]
    live = np.arange(n)[None, :] < to_host(output.lengths)[:, None]
    gap = np.abs(to_host(output.logprobs) - to_host(output.logprobs_full))
    return float(gap[live].mean()) if live.any() else 0.0
