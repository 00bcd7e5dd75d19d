"""Where one decode step's time goes: `benchmarks/accelerator.py --profile`.

Each part of a sampler decode step is timed on its own, as a jitted function of the exact
shapes of one step (batch B, the prompts' P shared keys and values, an own-token cache of W
slots written at the middle of the largest budget), through the model's own modules and the
sampler's own functions. A part runs `REPEATS` times in one jitted loop (each iteration's
input nudged by the previous result, so that nothing is hoisted out of it; caches and buffers
carried and updated in place, as in the sampler's loop), so the call's dispatch is shared;
the best of several calls after a warm-up, each waited for with `jax.block_until_ready`,
divided by `REPEATS`, less the time of an empty iteration. The whole step runs the same way
in a `while_loop` with the sampler's predicate. Parts inside a layer are multiplied by the
number of layers. The sum of the parts is set against the whole step; their difference is
what the parts do not see (fusion across parts, the residual adds, scheduling),
"overlap/other".
"""

from __future__ import annotations

import functools
import time

# What each part is, in the order of the table (name, what was timed).
PARTS = (
    ("embedding", "the token's embedding row (Qwen3._embed)"),
    ("attention projections", "q, k, v and o matrix-vector products of one layer, x layers"),
    ("MLP", "gate, up, SiLU and down of one layer (DecoderLayer.mlp), x layers"),
    ("RMS norms", "input, post-attention, q and k norms of one layer, x layers"),
    ("rope", "rotary embedding of q and k of one layer, x layers"),
    (
        "attention over the cache",
        "the model's decode attention (as Qwen3.decode_attention picks it) over "
        "P + W slots, after its slot's write, whose time is taken off; x layers",
    ),
    ("cache write", "one slot's keys and values into one layer's cache, x layers"),
    ("lm head", "final norm and output projection to f32 logits"),
    ("sampling", "sampler._record: sampler._pick (greedy) and the buffers' writes"),
    ("loop", "one iteration of a lax.while_loop with a trivial body, the sampler's predicate"),
)
# Iterations of each timing loop: the call's own overhead is shared by this many.
REPEATS = 32


def _best(call, calls: int) -> float:
    """Seconds of the fastest of `calls` timed calls of call() after one warm-up call (the
    compile); each call is waited for. call() returns what to wait for."""
    import jax

    jax.block_until_ready(call())
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(call())
        best = min(best, time.perf_counter() - start)
    return best


def _nbytes(tree) -> int:
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _shape(n: int, prompt_len: int):
    """(column sampled, the cache window W of the sampler's segment that samples it): the
    middle of an n-token budget; the step feeds slot column - 1."""
    from mapfjax.models import sampler

    column = max(1, n // 2)
    window = next(w for w in sampler._windows(n, sampler.FIRST_WINDOW) if w > column - 1)
    return column, window


def profile_batch(model, batch: int, prompt_len: int, new_tokens: int, calls: int = 5):
    """The parts of one decode step at `batch` rows: a dict with the shapes, the whole step's
    and each part's seconds (per call and per step) and bytes read per step."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax import lax

    from mapfjax.models import qwen3, sampler

    cfg = model.config
    graphdef, state = nnx.split(model)
    dt = jnp.dtype(model.dtype)
    b, p, n_layers = batch, prompt_len, cfg.num_layers
    kh, g, d, h = cfg.num_kv_heads, cfg.num_groups, cfg.head_dim, cfg.hidden_size
    column, window = _shape(new_tokens, prompt_len)
    index = column - 1  # the slot this step writes
    keys = iter(jax.random.split(jax.random.key(0), 2 * n_layers + 16))

    def rand(shape, dtype=dt):
        return jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)

    # The sampler's state at this column: each row its own prompt (one sample per prompt, as
    # the benchmark's sampling), prompt keys split per layer, the own cache filled to index.
    kv = (n_layers, b, kh, p, d)
    prefix = sampler._split_prefix(
        rand(kv), rand(kv), jnp.ones((b, p), bool), jnp.full((b,), p, jnp.int32)
    )
    own = (b, kh, window, d)
    cache = (tuple(rand(own) for _ in range(n_layers)), tuple(rand(own) for _ in range(n_layers)))
    n = new_tokens
    tokens = jax.random.randint(next(keys), (b, n), 0, cfg.vocab_size, jnp.int32)

    def buffers():  # a fresh copy: the step and the sampling part donate theirs
        return sampler.Buffers(
            tokens=jnp.copy(tokens),
            logprobs=jnp.zeros((b, n), jnp.float32),
            logprobs_full=jnp.zeros((b, n), jnp.float32),
            lengths=jnp.full((b,), column, jnp.int32),
            done=jnp.zeros((b,), bool),
            finished=jnp.zeros((b,), bool),
        )

    # As `generate`: per-layer parameter copies on CPU, the stacked ones sliced elsewhere.
    split = jax.default_backend() == "cpu"
    layer_params = sampler._split_layers(graphdef, state) if split else None
    layer_def, stacked = nnx.split(model.layers)
    layer0 = layer_params[0] if split else jax.tree.map(lambda a: a[0], stacked)
    draw = (jax.random.key(0), jnp.float32(1.0))
    stops = jnp.zeros((0,), jnp.int32)  # no stop tokens, as the benchmark's sampling
    i = jnp.int32(column)
    eps = jnp.float32(0.0)  # a runtime zero: XLA cannot fold the dependence it creates
    reps = REPEATS

    def nudge(tree, acc):
        """tree + acc * eps, leaf by leaf: makes an input depend on the previous iteration,
        so that the part is not hoisted out of the timing loop (the same values)."""
        return jax.tree.map(lambda a: a + (acc * eps).astype(a.dtype), tree)

    def timed(f):
        """f(varying, fixed) repeated `reps` times in one jitted loop, `varying` nudged by
        the previous result: the time per iteration is the part's (call overhead / reps)."""

        @jax.jit
        def run(varying, fixed, eps):
            def body(_, acc):
                outs = f(nudge(varying, acc), fixed)
                return acc + sum(o.ravel()[0].astype(jnp.float32) for o in jax.tree.leaves(outs))

            return lax.fori_loop(0, reps, body, jnp.float32(0.0))

        return run

    def carried(f, carry, fixed):
        """f(carry, fixed) -> carry repeated `reps` times in one jitted loop, the carry
        donated (updated in place, as the sampler's loop does)."""

        @functools.partial(jax.jit, donate_argnums=0)
        def run(c, fixed):
            return lax.fori_loop(0, reps, lambda _, c: f(c, fixed), c)

        held = [carry]

        def call():
            held[0] = run(held[0], fixed)
            return held[0]

        return call

    # ---- the whole step, as the body of sampler._decode runs it (greedy, no stop tokens), in
    # a while_loop with the sampler's predicate; the column (the slot written) stays fixed
    def body(s, fixed):
        count, cache, out = s
        state, layer_params, prefix = fixed
        model = nnx.merge(graphdef, state)
        lengths = jnp.repeat(prefix.lengths, out.tokens.shape[0] // prefix.lengths.shape[0])
        prev = lax.dynamic_index_in_dim(out.tokens, i - 1, axis=1, keepdims=True)
        prev = jnp.clip(prev, 0, model.config.vocab_size - 1)
        pos = (lengths + i - 1)[:, None]
        logits, cache = model.decode_step(prev, pos, prefix, cache, i - 1, layer_params)
        out = sampler._record(
            out, i, logits.astype(jnp.float32), *draw, None, greedy=True, top_k=0,
            stops=stops, pad_id=0,
        )  # fmt: skip
        return count + 1, cache, out

    def cond(s):
        return (s[0] < reps) & ~jnp.all(s[2].done)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(s, fixed):
        return lax.while_loop(cond, lambda s: body(s, fixed), s)

    held = [(jnp.int32(0), cache, buffers())]

    def whole():
        held[0] = step((jnp.int32(0), *held[0][1:]), (state, layer_params, prefix))
        return held[0]

    # ---- the parts, each through the model's own modules at the step's shapes
    x = rand((b, 1, h))
    q = rand((b, 1, cfg.num_heads, d))
    k = rand((b, 1, kh, d))
    o_in = rand((b, 1, cfg.num_heads, d))
    positions = jnp.full((b, 1), p + index, jnp.int32)
    first = tokens[:, :1]

    def embed(tok, state):
        return nnx.merge(graphdef, state)._embed(tok)

    def projections(act, params):
        x, o_in = act
        attn = nnx.merge(layer_def, params).attn
        x = x.astype(dt)
        q, k, v = (qwen3._dense(x, w[...].astype(dt)) for w in (attn.q, attn.k, attn.v))
        return q, k, v, qwen3._dense(o_in, attn.o[...].astype(dt), contract=2)

    def mlp(x, params):
        return nnx.merge(layer_def, params).mlp(x)

    def norms(act, params):
        x, q, k = act
        layer = nnx.merge(layer_def, params)
        a = layer.attn
        return layer.input_norm(x), layer.post_attn_norm(x), a.q_norm(q), a.k_norm(k)

    def rope(act, positions):
        q, k = act
        return qwen3.rope(q, positions, cfg.rope_theta), qwen3.rope(k, positions, cfg.rope_theta)

    def write(kv, k):  # as Qwen3.decode_step's attend
        at = (0, 0, index, 0)
        ks, vs = kv
        ks = lax.dynamic_update_slice(ks, qwen3._heads_first(k).astype(ks.dtype), at)
        return ks, lax.dynamic_update_slice(vs, qwen3._heads_first(k).astype(vs.dtype), at)

    def attend(c, fixed):
        # As Qwen3.decode_step's attend: the slot's write, then attention over the prompt's
        # keys and the updated own cache (group size 1); the next query depends on the output.
        q, (ks, vs) = c
        k, kp, vp, valid = fixed
        ks, vs = write((ks, vs), k)
        rows = q.shape[0]
        allowed = jnp.arange(window) <= index
        res = decode_attend(q.reshape(rows, 1, kh, g, d), (kp, vp, valid), (ks, vs), allowed)
        return res.reshape(q.shape).astype(q.dtype), (ks, vs)

    def head(x, state):
        model = nnx.merge(graphdef, state)
        return model.lm_head(model.final_norm(x)[:, 0])

    def record(out, logits):
        # Column i's logits, nudged by the buffers so that the pick stays in the loop.
        scores = logits + eps * out.lengths[:, None].astype(jnp.float32)
        return sampler._record(
            out, i, scores, *draw, None, greedy=True, top_k=0, stops=stops, pad_id=0
        )

    # The model's decode attention as Qwen3.decode_step picks it (its attention_impl; on CPU
    # the compiled kernel where it is usable).
    decode_attend = model.decode_attention(
        jnp.int32(index), (jnp.zeros((), dt), prefix.k[0], cache[0][0], cache[1][0])
    )

    @jax.jit
    def loop(done, stop):
        def cond(s):
            return (s[0] < stop) & ~jnp.all(s[1])

        return lax.while_loop(cond, lambda s: (s[0] + 1, s[1]), (jnp.int32(0), done))[0]

    layer_bytes = _nbytes(layer0)
    attn_w = _nbytes([layer0["attn"][w] for w in ("q", "k", "v", "o")])
    mlp_w = _nbytes([layer0["mlp"][w] for w in ("gate", "up", "down")])
    norm_w = layer_bytes - attn_w - mlp_w
    logits = rand((b, cfg.vocab_size), jnp.float32)
    head_w = model.embedding[...] if cfg.tie_word_embeddings else model.unembedding[...]
    done = jnp.zeros((b,), bool)

    row = b * dt.itemsize
    kv_read = 2 * (b * kh * p * d + b * kh * window * d) * dt.itemsize + b * p
    empty = timed(lambda v, f: v)
    fns = {
        "embedding": (timed(embed), (first, state)),
        "attention projections": (timed(projections), ((x, o_in), layer0)),
        "MLP": (timed(mlp), (x, layer0)),
        "RMS norms": (timed(norms), ((x, q, k), layer0)),
        "rope": (timed(rope), ((q, k), positions)),
        "lm head": (timed(head), (x, state)),
    }
    calls_of = {name: (lambda f=f, a=a: f(*a, eps)) for name, (f, a) in fns.items()}
    fixed = (k, prefix.k[0], prefix.v[0], prefix.valid)
    calls_of["attention over the cache"] = carried(attend, (q, (rand(own), rand(own))), fixed)
    calls_of["cache write"] = carried(write, (rand(own), rand(own)), k)
    calls_of["sampling"] = carried(record, buffers(), logits)
    calls_of["loop"] = lambda: loop(done, jnp.int32(reps))
    count = {n: n_layers for n in ("attention projections", "MLP", "RMS norms", "rope",
                                   "attention over the cache", "cache write")}  # fmt: skip
    nbytes = {
        "embedding": row * h + 4 * b,
        "attention projections": attn_w + row * (h + cfg.num_heads * d),
        "MLP": mlp_w + row * h,
        "RMS norms": norm_w + row * (h + (cfg.num_heads + kh) * d),
        "rope": row * (cfg.num_heads + kh) * d + 4 * b,
        "attention over the cache": kv_read + row * cfg.num_heads * d,
        "cache write": 2 * row * kh * d,
        "lm head": _nbytes(head_w) + row * h,
        "sampling": 4 * b * cfg.vocab_size + 12 * b * n,
        "loop": b,
    }
    # Per iteration: a timing loop's own cost (an empty body) is taken off every part but the
    # whole step and the loop, which are loops themselves.
    floor = _best(lambda: empty(x, None, eps), calls) / reps
    full = _best(whole, calls) / reps
    per_call = {}
    for name, _ in PARTS:
        t = _best(calls_of[name], calls) / reps
        per_call[name] = t if name == "loop" else max(0.0, t - floor)
    # The attention loop writes its slot first, as the step does: that write is its own part.
    per_call["attention over the cache"] = max(
        0.0, per_call["attention over the cache"] - per_call["cache write"]
    )
    parts = {}
    for name, what in PARTS:
        c = count.get(name, 1)
        parts[name] = {"what": what, "count": c, "per_call_s": per_call[name],
                       "s": c * per_call[name], "bytes": c * nbytes[name]}  # fmt: skip
    return {
        "batch": b,
        "prompt_len": p,
        "new_tokens": n,
        "column": column,
        "window": window,
        "full_step_s": full,
        "call_overhead_s": floor,
        "parts": parts,
    }


def profile(model, cfg, opts, shapes, device: dict, report, name: str, batches) -> list[dict]:
    """The decode profile at each of `batches` (rows of the table), with each part's ms, its
    share of the whole step, and its bytes against the peak bandwidth where known. A batch
    that cannot be measured is named in `report` and left out."""
    n = max(shapes.new_tokens)
    bw = device.get("peak_bandwidth")
    rows = []
    for b in batches:
        field = f"models.{name}.profile.b{b}"
        try:
            r = profile_batch(model, b, shapes.prompt_len, n, calls=3 + opts.repeats)
        except Exception as e:  # noqa: BLE001 - report it, keep the other batches
            why = str(e).strip().splitlines()
            report.lack(field, f"{type(e).__name__}: {why[0][:200] if why else ''}")
            continue
        full = r["full_step_s"]
        total = 0.0
        out = []
        for j, (part, m) in enumerate(r["parts"].items()):
            total += m["s"]
            if bw and not m["s"]:  # as the JSON's path reads, so that the None is named
                report.lack(f"models.{name}.profile[{len(rows)}].parts[{j}].bandwidth_fraction",
                            f"{part}: no longer than the timing loop's own iteration, which is "
                            "taken off")  # fmt: skip
            out.append({
                "part": part, "measured": m["what"], "layers": m["count"],
                "ms": 1e3 * m["s"], "per_call_ms": 1e3 * m["per_call_s"],
                "share": m["s"] / full if full else 0.0, "bytes": m["bytes"],
                "bandwidth_fraction": m["bytes"] / bw / m["s"] if bw and m["s"] else None,
            })  # fmt: skip
        if not bw:
            report.lack(f"{field}.bandwidth_fraction", "no peak bandwidth known")
        row = {
            "batch": b, "prompt_len": r["prompt_len"], "new_tokens": n, "column": r["column"],
            "window": r["window"], "full_step_ms": 1e3 * full,
            "call_overhead_ms": 1e3 * r["call_overhead_s"], "parts": out,
            "sum_of_parts_ms": 1e3 * total, "sum_share": total / full if full else 0.0,
            "other_ms": 1e3 * (full - total),
            "other_share": (full - total) / full if full else 0.0,
        }  # fmt: skip
        rows.append(row)
    return rows


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(result: dict) -> list[str]:
    """The profile table's lines (none when no model was profiled)."""
    models = {k: m["profile"] for k, m in result["models"].items() if m.get("profile")}
    if not models:
        return []
    lines = [
        "",
        "Decode step profile: each part timed alone at one step's shapes (batch B, the "
        "prompt's P keys and values, an own-token cache of W slots written at column c - 1), "
        "repeated in one jitted loop, best of several calls, per iteration less an empty "
        "iteration's time; per-layer parts x layers; bytes against the peak bandwidth. "
        "overlap/other = full step - sum of parts (negative: the parts alone cost more "
        "than inside the step).",
        "",
        "| model | batch | P + W @ c | part | ms | share of step | MB read | of peak bandwidth "
        "| measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in models.items():
        for r in rows:
            at = f"{r['prompt_len']} + {r['window']} @ {r['column']}"
            head = f"| {name} | {r['batch']} | {at} |"
            for p in r["parts"]:
                lines.append(
                    f"{head} {p['part']} | {p['ms']:.4f} | {p['share']:.1%} | "
                    f"{p['bytes'] / 1e6:.3g} | {_fmt(p['bandwidth_fraction'], '.1%')} | "
                    f"{p['measured']} |"
                )
            lines.append(f"{head} sum of parts | {r['sum_of_parts_ms']:.4f} | "
                         f"{r['sum_share']:.1%} | | | |")  # fmt: skip
            lines.append(f"{head} overlap/other | {r['other_ms']:.4f} | "
                         f"{r['other_share']:.1%} | | | full step - sum of parts |")  # fmt: skip
            lines.append(f"{head} **full step** | {r['full_step_ms']:.4f} | 100.0% | | | "
                         f"the sampler's decode body in a while_loop with its predicate "
                         f"(empty iteration: {r['call_overhead_ms']:.4f} ms, taken off "
                         "the parts but the loop) |")  # fmt: skip
    return lines
