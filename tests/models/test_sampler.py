"""The sampler against transformers' generate/logits and exact top-k/top-p distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from mapfjax import parallel
from mapfjax.models import qwen3, sampler
from mapfjax.models.hf import from_pretrained
from tests.models import hf_fixtures

N_NEW = 32
# Different lengths, spread over two power-of-two buckets (8 and 16).
PROMPTS = [[5, 17, 3], [9, 1, 44, 2, 7, 100, 31, 8, 12, 60, 7], [200], [3, 3, 3, 3, 3, 90, 1]]

# (tie, num_heads, num_kv_heads): tied and untied heads, GQA ratios 2, 4 and 1.
ARCHS = [(True, 4, 2), (False, 8, 2), (True, 4, 4)]


def checkpoint(path, *, tie, **kw):
    """A random tiny checkpoint. Tied ones get embeddings shrunk 10x: with O(1) embeddings the
    residual stream is dominated by the input embedding, so a tied head just repeats the last
    token, and a test comparing such constant continuations would prove little."""
    hf_fixtures.make_tiny_checkpoint(path, tie=tie, **kw)
    if tie:
        ref = hf_fixtures.load_reference(path)
        with torch.no_grad():
            ref.get_input_embeddings().weight.mul_(0.1)
        ref.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: f"tie{a[0]}-h{a[1]}-kv{a[2]}")
def pair(request, tmp_path_factory):
    """(our fp32 model, transformers fp32 model) loaded from one random checkpoint."""
    tie, heads, kv = request.param
    path = tmp_path_factory.mktemp("ckpt")
    checkpoint(path, tie=tie, num_heads=heads, num_kv_heads=kv, seed=1)
    return from_pretrained(path, dtype=jnp.float32), hf_fixtures.load_reference(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two fp32 models of one architecture (different weights) and the reference of the first."""
    out = []
    for seed in (0, 1):
        path = tmp_path_factory.mktemp(f"seed{seed}")
        checkpoint(path, tie=False, seed=seed)
        out.append((from_pretrained(path, dtype=jnp.float32), hf_fixtures.load_reference(path)))
    return out


def hf_greedy(ref, prompt, n):
    """transformers' greedy continuation of one unpadded prompt (no stop token)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = ref.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def hf_log_softmax(ref, seq):
    """log_softmax of transformers' logits [T, V] for one unpadded sequence."""
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor([seq])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def np_filtered_probs(logits, temperature, top_k, top_p):
    """Reference distribution [V]: softmax(logits / T), keep top-k, renormalise, keep the
    smallest descending prefix with mass >= top_p, renormalise."""
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(p.shape, bool)
    keep[order[: top_k or len(p)]] = True
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    mass = 0.0
    nucleus = np.zeros(p.shape, bool)
    for i in order:
        if not keep[i] or mass >= top_p:
            break
        nucleus[i] = True
        mass += q[i]
    q = np.where(nucleus, q, 0.0)
    return q / q.sum()


def test_greedy_matches_transformers(pair):
    ours, ref = pair
    out = sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=(), cache_dtype=jnp.float32)
    assert out.tokens.shape == (len(PROMPTS), N_NEW) and out.tokens.dtype == jnp.int32
    np.testing.assert_array_equal(out.lengths, N_NEW)
    assert not np.asarray(out.finished).any()
    for i, prompt in enumerate(PROMPTS):
        assert np.asarray(out.tokens[i]).tolist() == hf_greedy(ref, prompt, N_NEW), i
    assert len(np.unique(out.tokens)) > 8  # not a degenerate constant continuation


def test_greedy_logprobs_match_transformers(pair):
    ours, ref = pair
    out = sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=(), cache_dtype=jnp.float32)
    toks = np.asarray(out.tokens)
    for i, prompt in enumerate(PROMPTS):
        seq = prompt + toks[i].tolist()
        lsm = hf_log_softmax(ref, seq)[len(prompt) - 1 : -1]  # predicts each generated token
        want = lsm[np.arange(N_NEW), toks[i]]
        np.testing.assert_allclose(out.logprobs[i], want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(out.logprobs_full[i], want, atol=1e-4, rtol=0)


def test_filter_logits_matches_numpy_reference():
    logits = np.asarray(jax.random.normal(jax.random.key(3), (6, 50)) * 3.0)
    for top_k, top_p in [(0, None), (1, None), (7, None), (0, 0.5), (0, 0.999), (10, 0.6)]:
        got = np.asarray(sampler.filter_logits(jnp.asarray(logits), top_k, top_p))
        for row, lg in zip(got, logits):
            want = np_filtered_probs(lg, 1.0, top_k, 1.0 if top_p is None else top_p)
            q = np.exp(row - row.max())
            np.testing.assert_allclose(q / q.sum(), want, atol=1e-6)
            assert np.array_equal(np.isfinite(row), want > 0), (top_k, top_p)


@pytest.mark.parametrize(
    # The random fixtures have peaked logits (std ~10): high temperatures spread them out.
    "temperature,top_k,top_p",
    [(15.0, 0, 1.0), (15.0, 12, 1.0), (20.0, 0, 0.8), (20.0, 20, 0.7)],
)
def test_first_step_frequencies_match_distribution(models, temperature, top_k, top_p):
    (ours, ref), _ = models
    prompt, draws = [5, 17, 3, 9], 4096
    out = sampler.generate(
        ours,
        [prompt] * draws,
        1,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        key=jax.random.key(7),
        stop_tokens=(),
    )
    lsm = hf_log_softmax(ref, prompt)[-1]  # any monotone shift of the logits is fine here
    want = np_filtered_probs(lsm, temperature, top_k, top_p)
    toks = np.asarray(out.tokens[:, 0])
    counts = np.bincount(toks, minlength=want.size)
    # Support is exact: nothing outside top-k / the nucleus is ever drawn.
    assert counts[want == 0].sum() == 0
    # Frequencies: every token within 5 binomial standard deviations (+1 for tiny p).
    sd = np.sqrt(draws * want * (1 - want))
    assert np.all(np.abs(counts - draws * want) <= 5 * sd + 1), np.abs(counts - draws * want)
    assert (counts > 0).sum() > 3  # the test would be vacuous on a one-token distribution
    # Log-probs are those of the renormalised and of the untruncated distribution.
    np.testing.assert_allclose(out.logprobs[:, 0], np.log(want[toks]), atol=1e-4)
    full = lsm / temperature
    full = full - np.log(np.exp(full - full.max()).sum()) - full.max()
    np.testing.assert_allclose(out.logprobs_full[:, 0], full[toks], atol=1e-4)


def test_top_k_1_and_tiny_top_p_equal_greedy(models):
    (ours, _), _ = models
    greedy = sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=())
    key = jax.random.key(11)
    top1 = sampler.generate(ours, PROMPTS, N_NEW, temperature=1.0, top_k=1, key=key, stop_tokens=())
    nucleus = sampler.generate(
        ours, PROMPTS, N_NEW, temperature=1.0, top_p=1e-6, key=key, stop_tokens=()
    )
    for out in (top1, nucleus):
        np.testing.assert_array_equal(out.tokens, greedy.tokens)
        np.testing.assert_allclose(out.logprobs, 0.0, atol=1e-6)  # prob 1 after truncation
        np.testing.assert_allclose(out.logprobs_full, greedy.logprobs, atol=1e-5)  # T = 1
    assert sampler.logprob_gap(top1) > 0.0


def test_sampling_is_deterministic_given_key(models):
    (ours, _), _ = models
    kw = dict(temperature=1.0, stop_tokens=())
    a = sampler.generate(ours, PROMPTS, 16, key=jax.random.key(1), **kw)
    b = sampler.generate(ours, PROMPTS, 16, key=jax.random.key(1), **kw)
    c = sampler.generate(ours, PROMPTS, 16, key=jax.random.key(2), **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.tokens, c.tokens)
    # temperature and top_p are traced values: changing them does not recompile.
    before = sampler.trace_counts()
    d = sampler.generate(ours, PROMPTS, 16, key=jax.random.key(1), temperature=3.0, stop_tokens=())
    assert sampler.trace_counts() == before
    assert not np.array_equal(a.logprobs_full, d.logprobs_full)


def test_stop_tokens_pad_and_count(models):
    (ours, _), _ = models
    free = np.asarray(sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=()).tokens)
    # Stop on row 0's 6th token; other rows stop wherever that token first appears, if at all.
    stop = int(free[0, 5])
    pad = 251
    out = sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=(stop,), pad_id=pad)
    hits = [np.flatnonzero(row == stop) for row in free]
    assert hits[0][0] <= 5
    for i, row in enumerate(free):
        n = hits[i][0] + 1 if hits[i].size else N_NEW
        assert int(out.lengths[i]) == n, i
        assert bool(out.finished[i]) == bool(hits[i].size), i
        np.testing.assert_array_equal(out.tokens[i, :n], row[:n])
        np.testing.assert_array_equal(out.tokens[i, n:], pad)
        assert np.all(np.asarray(out.logprobs[i, n:]) == 0.0)
    assert sampler.to_lists(out)[0] == free[0, : hits[0][0] + 1].tolist()
    want_steps = N_NEW if not all(h.size for h in hits) else max(h[0] for h in hits) + 1
    assert int(out.steps) == want_steps


def test_early_exit_when_all_rows_stop(models):
    (ours, _), _ = models
    free = np.asarray(sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=()).tokens)
    stops = tuple(sorted({int(row[3]) for row in free}))  # every row stops by its 4th token
    out = sampler.generate(ours, PROMPTS, N_NEW, stop_tokens=stops)
    first = [int(np.flatnonzero(np.isin(row, stops))[0]) for row in free]
    assert max(first) <= 3
    assert int(out.steps) == max(first) + 1 < N_NEW
    np.testing.assert_array_equal(out.lengths, np.asarray(first) + 1)
    assert np.asarray(out.finished).all()


def test_bucketing_bounds_compiles_and_weights_are_arguments(models):
    (m0, _), (m1, _) = models
    rng = np.random.default_rng(0)
    # Prompt lengths 17..32 share bucket 32, batch sizes 3..4 share bucket 4.
    batches = [
        [rng.integers(0, 256, int(rng.integers(17, 33))).tolist() for _ in range(3 + i % 2)]
        for i in range(10)
    ]
    before = sampler.trace_counts()
    for b in batches:
        sampler.generate(m0, b, 5, stop_tokens=())
    mid = sampler.trace_counts()
    for name in ("prefill", "decode"):
        assert mid.get(name, 0) - before.get(name, 0) <= 1, (name, before, mid)
    # Other weights, same architecture: no retrace, and the result follows the new weights,
    # so the weights are traced arguments, not constants baked into the executable.
    a = sampler.generate(m0, batches[0], 5, stop_tokens=())
    b = sampler.generate(m1, batches[0], 5, stop_tokens=())
    assert sampler.trace_counts() == mid
    assert not np.array_equal(a.tokens, b.tokens)


def test_input_errors_are_clear(models):
    (ours, _), _ = models
    with pytest.raises(ValueError, match=r"prompt 1 has 20 tokens.*36 slots.*at most 32"):
        sampler.generate(ours, [[1] * 5, [1] * 20], 16, max_cache_len=32)
    with pytest.raises(ValueError, match="prompt 0 has 4090 tokens.*4096"):
        sampler.generate(ours, [[1] * 4090], 16)
    with pytest.raises(ValueError, match="needs key"):
        sampler.generate(ours, PROMPTS, 4, temperature=1.0)
    with pytest.raises(ValueError, match="bucket='pow3'"):
        sampler.generate(ours, PROMPTS, 4, bucket="pow3")
    with pytest.raises(ValueError, match=r"prompt 2 has token ids \[256, -1\] outside"):
        sampler.generate(ours, [[1], [2], [3, 256, 4, -1]], 4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate(ours, [[1], []], 4)
    with pytest.raises(ValueError, match="top_p=0"):
        sampler.generate(ours, PROMPTS, 4, temperature=1.0, top_p=0.0, key=jax.random.key(0))


def test_sharded_equals_unsharded(models):
    (ours, _), _ = models
    assert len(jax.devices()) == 8
    prompts = PROMPTS + [[7, 8, 9, 10, 11], [1, 2], [42] * 9, [250, 4, 4]]
    plain = sampler.generate(ours, prompts, 16, stop_tokens=())
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tp": 2})
    passed = sampler.generate(ours, prompts, 16, stop_tokens=(), mesh=mesh)
    with jax.set_mesh(mesh):
        ambient = sampler.generate(ours, prompts, 16, stop_tokens=())
    explicit = jax.make_mesh((2, 2, 2), parallel.AXES)  # jax's default: Explicit axes
    with pytest.raises(ValueError, match="Explicit; build the mesh with"):
        sampler.generate(ours, prompts, 16, mesh=explicit)
    for out in (passed, ambient):
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        np.testing.assert_allclose(out.logprobs, plain.logprobs, atol=1e-5)
        # 8 rows split 4 ways over ("data", "fsdp"), replicated over "tp".
        shard_rows = {s.data.shape[0] for s in out.tokens.addressable_shards}
        assert shard_rows == {2}, shard_rows


def test_lower_generate_is_the_sampling_computation(models):
    (ours, _), _ = models
    graphdef, state = nnx.split(ours)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    key = jax.random.key(5)
    want = sampler.generate(ours, prompts, 8, temperature=1.0, top_p=0.95, key=key)
    lowered = sampler.lower_generate(
        graphdef, state, batch=2, prompt_len=8, max_new_tokens=8, cache_dtype=jnp.float32
    )
    tokens = np.zeros((2, 8), np.int32)
    mask = np.zeros((2, 8), bool)
    for i, p in enumerate(prompts):
        tokens[i, 8 - len(p) :], mask[i, 8 - len(p) :] = p, True
    got = lowered.compile()(
        state,
        tokens,
        mask,
        np.zeros(2, bool),
        key,
        np.float32(1.0),
        np.float32(0.95),
    )
    toks, logprobs = got[0], got[1]  # the output buffers: tokens, logprobs, ...
    np.testing.assert_array_equal(toks, want.tokens)
    np.testing.assert_allclose(logprobs, want.logprobs, atol=1e-6)


def test_growth_bytes_is_the_cache_the_last_growth_copies(models, monkeypatch):
    # The memory plan adds it to lower_generate's peak: during the last growth the old cache
    # is alive beside the new one (seen on an H200: the rollout's high-water mark).
    (ours, _), _ = models
    grown = []
    real_grow = sampler._grow

    def spy(cache, *, window, shardings):
        grown.append(sum(x.nbytes for x in jax.tree.leaves(cache)))
        return real_grow(cache, window=window, shardings=shardings)

    monkeypatch.setattr(sampler, "_grow", spy)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11]]
    kw = dict(stop_tokens=(), cache_dtype=jnp.bfloat16, window=4)
    sampler.generate(ours, prompts, 20, **kw)  # windows 4, 8, 16, 19
    assert len(grown) == 3
    cfg = ours.config
    want = sampler.growth_bytes(cfg, batch=4, max_new_tokens=20, window=4)
    assert want == grown[-1] == cfg.num_layers * 2 * 4 * cfg.num_kv_heads * 16 * cfg.head_dim * 2
    assert sampler.growth_bytes(cfg, batch=4, max_new_tokens=5, window=4) == 0  # one window
    # Per device under a mesh: rows over data x fsdp (4 ways here), KV heads over tp if they
    # divide.
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tp": 2})
    per_device = sampler.growth_bytes(cfg, batch=8, max_new_tokens=20, window=4, mesh=mesh)
    whole = sampler.growth_bytes(cfg, batch=8, max_new_tokens=20, window=4)
    assert per_device in (whole // 4, whole // 8)


def test_bucket_is_clamped_to_the_cache_limit(models):
    (ours, _), _ = models
    prompts = [list(range(1, 26)), [3, 4]]  # bucket 32, but only 35 - 8 = 27 slots remain
    free = sampler.generate(ours, prompts, 8, stop_tokens=())
    tight = sampler.generate(ours, prompts, 8, stop_tokens=(), max_cache_len=35)
    np.testing.assert_array_equal(tight.tokens, free.tokens)
    np.testing.assert_allclose(tight.logprobs, free.logprobs, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_samples_of_a_shared_prompt_equal_repeated_prompts(models, temperature):
    """num_samples=G prefills each prompt once; rows equal G copies of the prompt sampled
    with the same key (row r draws the same random numbers in both layouts)."""
    (ours, _), _ = models
    key = jax.random.key(3)
    kw = dict(temperature=temperature, key=key, stop_tokens=(7,), window=8)
    shared = sampler.generate(ours, PROMPTS, 20, num_samples=3, **kw)
    repeated = sampler.generate(ours, [p for p in PROMPTS for _ in range(3)], 20, **kw)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(repeated.tokens))
    np.testing.assert_array_equal(np.asarray(shared.lengths), np.asarray(repeated.lengths))
    np.testing.assert_allclose(shared.logprobs, repeated.logprobs, atol=1e-5)
    if temperature:  # the G samples of one prompt differ
        rows = sampler.to_lists(shared)
        assert len({tuple(r) for r in rows[:3]}) > 1


def test_decode_windows_grow_and_stop_early(models):
    """The own-token cache starts at `window` slots and doubles; every window size gives the
    same greedy tokens; all rows stopping ends decoding before the budget."""
    (ours, _), _ = models
    assert sampler._windows(64, 8) == [8, 16, 32, 63] and sampler._windows(1, 64) == [1]
    outs = [sampler.generate(ours, PROMPTS, 40, stop_tokens=(), window=w) for w in (4, 16, 64)]
    for out in outs[1:]:
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(outs[0].tokens))
    first = np.asarray(outs[0].tokens)[:, 0]
    stopped = sampler.generate(ours, PROMPTS, 40, stop_tokens=tuple(int(t) for t in first))
    assert int(stopped.steps) == 1 and np.asarray(stopped.lengths).tolist() == [1] * len(PROMPTS)
    with pytest.raises(ValueError, match="num_samples=0"):
        sampler.generate(ours, PROMPTS, 4, num_samples=0)
    with pytest.raises(ValueError, match="window=0"):
        sampler.generate(ours, PROMPTS, 4, window=0)


def _stops_after(free, early: int):
    """Stop tokens under which every row of `free` ([R, N] tokens drawn without stops) but the
    last stops within its first `early` tokens, and the last row never does (a row's draws do
    not depend on the stops, so the same call with them gives these rows cut at their first
    stop token)."""
    stops = {int(t) for row in free[:-1] for t in row[:early]} - set(free[-1].tolist())
    for row in free[:-1]:
        if not np.array_equal(row, free[-1]):  # greedy rows of one prompt are equal
            assert np.isin(row[:early], list(stops)).any(), (row, stops)
    return tuple(sorted(stops))


def test_compact_rows_halves_or_keeps():
    assert sampler._compact_rows(5, 64, 1) == 8
    assert sampler._compact_rows(32, 64, 1) == 32
    assert sampler._compact_rows(33, 64, 1) == 64  # 64 rows would not be half
    assert sampler._compact_rows(0, 16, 1) == 1
    assert sampler._compact_rows(1, 8, 4) == 4  # a multiple of the mesh's batch shards
    assert sampler._compact_rows(5, 8, 4) == 8


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compaction_drops_finished_rows_and_changes_no_row(models, monkeypatch, temperature):
    """With every row but one finished, decoding goes on with the live rows only; each row's
    tokens, log-probs, length and finish are those of the same call decoding every row to the
    end, and each row is still the continuation of its own prompt (transformers' log-probs)."""
    (ours, ref), _ = models
    kw = dict(temperature=temperature, key=jax.random.key(4), num_samples=2, window=4)
    free = sampler.generate(ours, PROMPTS, 40, stop_tokens=(), compact=True, **kw).tokens
    free = np.asarray(free)
    kw["stop_tokens"] = _stops_after(free, early=4)
    kept = []
    take = sampler._take_rows
    monkeypatch.setattr(
        sampler, "_take_rows", lambda *a, **k: kept.append(a[3].shape[0]) or take(*a, **k)
    )
    got = sampler.generate(ours, PROMPTS, 40, compact=True, **kw)
    assert kept and kept[0] <= 2, kept  # 8 rows -> the one or two that go on
    monkeypatch.setattr(sampler, "_compact_rows", lambda live, rows, shards: rows)
    whole = sampler.generate(ours, PROMPTS, 40, compact=True, **kw)
    assert len(kept) == 1  # nothing dropped in the second call
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(whole.tokens))
    np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(whole.lengths))
    np.testing.assert_array_equal(np.asarray(got.finished), np.asarray(whole.finished))
    np.testing.assert_allclose(got.logprobs, whole.logprobs, atol=1e-5)
    assert int(got.steps) == int(whole.steps) == 40
    lengths = np.asarray(got.lengths)
    assert lengths[-1] == 40 and (lengths[:-2] <= 4).all(), lengths
    for r, row in enumerate(sampler.to_lists(got)):
        prompt = PROMPTS[r // 2]
        ls = hf_log_softmax(ref, prompt + row)
        want = [ls[len(prompt) - 1 + j, t] for j, t in enumerate(row)]
        np.testing.assert_allclose(np.asarray(got.logprobs_full)[r, : len(row)], want, atol=1e-4)


@pytest.mark.slow
def test_compaction_on_a_mesh_keeps_a_multiple_of_its_batch_shards(models, monkeypatch):
    (ours, _), _ = models
    prompts = PROMPTS + [[7, 8, 9, 10, 11], [1, 2], [42] * 9, [250, 4, 4]]
    kw = dict(temperature=1.0, key=jax.random.key(6), num_samples=2, window=4, compact=True)
    free = np.asarray(sampler.generate(ours, prompts, 24, stop_tokens=(), **kw).tokens)
    kw["stop_tokens"] = _stops_after(free, early=4)
    plain = sampler.generate(ours, prompts, 24, **kw)
    kept = []
    take = sampler._take_rows
    monkeypatch.setattr(
        sampler, "_take_rows", lambda *a, **k: kept.append(a[3].shape[0]) or take(*a, **k)
    )
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tp": 2})
    sharded = sampler.generate(ours, prompts, 24, mesh=mesh, **kw)
    assert kept == [4], kept  # 16 rows, one live: 4, the rows' shards on data x fsdp
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(sharded.lengths), np.asarray(plain.lengths))
    np.testing.assert_allclose(sharded.logprobs, plain.logprobs, atol=1e-5)


@pytest.mark.slow
def test_compaction_is_on_by_default_above_its_budget(models):
    """compact=None: rows draw by their own index (compaction's draws) only above
    COMPACT_BUDGET new tokens, so short budgets sample as before."""
    (ours, _), _ = models
    prompts = [[5, 17, 3], [9, 1, 44]]
    n = sampler.COMPACT_BUDGET
    for budget, compact in ((n, False), (n + 1, True)):
        kw = dict(temperature=1.0, key=jax.random.key(2), stop_tokens=(), num_samples=2)
        auto = sampler.generate(ours, prompts, budget, **kw)
        same = sampler.generate(ours, prompts, budget, compact=compact, **kw)
        other = sampler.generate(ours, prompts, budget, compact=not compact, **kw)
        np.testing.assert_array_equal(np.asarray(auto.tokens), np.asarray(same.tokens))
        assert not np.array_equal(np.asarray(auto.tokens), np.asarray(other.tokens))


@pytest.mark.slow
def test_long_windows_match_transformers(models, monkeypatch):
    """Windows of CPU_FUSED_WINDOW slots and more (attention over a row's own cache written as
    multiply-and-sum on CPU): greedy tokens still transformers', log-probs those of the
    batched-matmul form."""
    (ours, ref), _ = models
    n = 300  # windows 64, 128, 256, 299
    prompts = PROMPTS[:2]
    out = sampler.generate(ours, prompts, n, stop_tokens=(), compact=False)
    for i, p in enumerate(prompts):
        assert np.asarray(out.tokens)[i].tolist() == hf_greedy(ref, p, n), i
    monkeypatch.setattr(qwen3, "CPU_FUSED_WINDOW", 10**9)
    sampler._decode.clear_cache()  # the constant is read when the decode loop is traced
    before = sampler.trace_counts()["decode"]
    plain = sampler.generate(ours, prompts, n, stop_tokens=(), compact=False)
    assert sampler.trace_counts()["decode"] > before
    sampler._decode.clear_cache()
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
    np.testing.assert_allclose(out.logprobs, plain.logprobs, atol=1e-5)


def test_logit_bias_moves_the_pick_by_exactly_the_reference_margin(models):
    """A bias on the runner-up of transformers' first-step logits just above the margin makes
    it the first greedy token, just below leaves the leader; an empty or zero bias changes no
    token; a huge bias on one token makes it every token, sampled too."""
    (ours, ref), _ = models
    prompt = PROMPTS[1]
    with torch.no_grad():
        logits = ref(torch.tensor([prompt])).logits[0, -1].double().numpy()
    lead, second = np.argsort(logits)[::-1][:2]
    margin = float(logits[lead] - logits[second])
    plain = sampler.generate(ours, [prompt], 8, stop_tokens=())
    assert int(plain.tokens[0, 0]) == lead
    for bias in ({}, {int(second): 0.0}):
        same = sampler.generate(ours, [prompt], 8, stop_tokens=(), logit_bias=bias)
        np.testing.assert_array_equal(same.tokens, plain.tokens)
    up, low = (
        sampler.generate(ours, [prompt], 1, stop_tokens=(), logit_bias={int(second): margin + d})
        for d in (0.01, -0.01)
    )
    assert int(up.tokens[0, 0]) == second and int(low.tokens[0, 0]) == lead
    forced = {7: 1e4}
    for kw in ({}, {"temperature": 1.0, "key": jax.random.key(3)}):
        out = sampler.generate(ours, PROMPTS, 6, stop_tokens=(), logit_bias=forced, **kw)
        assert (np.asarray(out.tokens) == 7).all()


@pytest.mark.parametrize(
    "bias, words", [({-1: 1.0}, ["-1", "[0,"]), ({3: float("nan")}, ["logit_bias[3]", "nan"])]
)
def test_logit_bias_errors_name_the_token_or_value(models, bias, words):
    (ours, _), _ = models
    with pytest.raises(ValueError) as e:
        sampler.generate(ours, PROMPTS, 4, logit_bias=bias)
    assert all(w in str(e.value) for w in words)


def _same_output(got, want):
    """Two `SampleOutput`s of one call's rows: equal tokens, lengths, finishes and steps,
    log-probs equal up to float rounding."""
    for field in ("tokens", "lengths", "finished", "steps"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        )
    for field in ("logprobs", "logprobs_full"):
        np.testing.assert_allclose(getattr(got, field), getattr(want, field), atol=1e-5)


# 23 new tokens at a first window of 4: windows 4, 8, 16, 22, and no K below divides 22 or 23.
STEPS_BUDGET = 23


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_steps_per_loop_greedy_equals_one_step(models, steps):
    """K columns per loop iteration give one step's greedy output: rows to the budget, rows
    stopping early beside one that goes on, and every row stopping (the loop's extra steps
    after that record nothing, and `steps` is where one step per iteration ends)."""
    (ours, _), _ = models
    n, kw = STEPS_BUDGET, dict(window=4)
    free = sampler.generate(ours, PROMPTS, n, stop_tokens=(), **kw)
    _same_output(
        sampler.generate(ours, PROMPTS, n, stop_tokens=(), steps_per_loop=steps, **kw), free
    )
    assert int(free.steps) == n
    kw["stop_tokens"] = _stops_after(np.asarray(free.tokens), early=6)
    for prompts in (PROMPTS, PROMPTS[:-1]):  # the last prompt's row runs to the budget
        one = sampler.generate(ours, prompts, n, **kw)
        _same_output(sampler.generate(ours, prompts, n, steps_per_loop=steps, **kw), one)
    lengths = np.asarray(one.lengths)
    assert int(one.steps) == lengths.max() < n and (lengths <= 6).all(), (one.steps, lengths)
    # Every row stops in a later window, at different columns.
    late = tuple(sorted({int(t) for t in np.asarray(free.tokens)[:, 9]}))
    one = sampler.generate(ours, PROMPTS, n, stop_tokens=late, window=4)
    _same_output(
        sampler.generate(ours, PROMPTS, n, stop_tokens=late, window=4, steps_per_loop=steps), one
    )
    assert np.asarray(one.finished).all() and 4 < int(one.steps) <= 10


@pytest.mark.slow
@pytest.mark.parametrize("steps", [2, 3, 4])
def test_steps_per_loop_sampled_groups_with_compaction_equal_one_step(models, monkeypatch, steps):
    """Temperature sampling with top-p, groups of samples per prompt and compaction (rows
    dropped between windows once most have stopped): K columns per loop iteration draw the
    same tokens as one, and drop the same rows."""
    (ours, _), _ = models
    n = STEPS_BUDGET
    kw = dict(temperature=1.0, top_p=0.9, key=jax.random.key(5), num_samples=3, window=4,
              compact=True)  # fmt: skip
    free = np.asarray(sampler.generate(ours, PROMPTS, n, stop_tokens=(), **kw).tokens)
    kw["stop_tokens"] = _stops_after(free, early=4)
    kept = []
    take = sampler._take_rows
    monkeypatch.setattr(
        sampler, "_take_rows", lambda *a, **k: kept.append(a[3].shape[0]) or take(*a, **k)
    )
    one = sampler.generate(ours, PROMPTS, n, **kw)
    got = sampler.generate(ours, PROMPTS, n, steps_per_loop=steps, **kw)
    assert kept and kept[: len(kept) // 2] == kept[len(kept) // 2 :], kept  # same drops
    _same_output(got, one)
    assert int(got.steps) == n and np.asarray(got.lengths)[-1] == n


def test_steps_per_loop_must_be_a_positive_int(models):
    (ours, _), _ = models
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"steps_per_loop=.*it must be an int >= 1"):
            sampler.generate(ours, PROMPTS, 4, steps_per_loop=bad)
    graphdef, state = nnx.split(ours)
    with pytest.raises(ValueError, match="lower_generate: steps_per_loop=0"):
        sampler.lower_generate(graphdef, state, batch=2, prompt_len=4, max_new_tokens=4,
                               steps_per_loop=0)  # fmt: skip
