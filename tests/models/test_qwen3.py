"""Qwen3 model properties that need no checkpoint: presets, masking, cache, GQA, rope, dtypes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from mapfjax import parallel
from mapfjax.models import qwen3
from mapfjax.models.qwen3 import PRESETS, KVCache, Qwen3, Qwen3Config

TINY = PRESETS["tiny"]
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)


@pytest.fixture(scope="module")
def model():
    return Qwen3(dataclasses.replace(TINY, tie_word_embeddings=False), **F32, rngs=nnx.Rngs(3))


@nnx.jit
def run(m, tokens, mask=None, positions=None, cache=None):
    """Jitted forward: one compile per shape instead of one per primitive in eager mode."""
    return m(tokens, positions=positions, attention_mask=mask, cache=cache)


def _tokens(b, t, seed=0, vocab=TINY.vocab_size):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (b, t)), jnp.int32)


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


# Non-embedding parameter counts published on the Qwen3 model cards (billions).
PUBLISHED_NON_EMBEDDING = {"qwen3-0.6b": 0.44, "qwen3-1.7b": 1.4, "qwen3-4b": 3.6, "qwen3-8b": 6.95}


@pytest.mark.parametrize("name", sorted(PUBLISHED_NON_EMBEDDING))
def test_preset_sizes_match_model_cards(name):
    cfg = PRESETS[name]
    abstract = nnx.eval_shape(lambda: Qwen3(cfg))
    state = nnx.state(abstract, nnx.Param)
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    non_embedding = (_count(state) - embeddings) / 1e9
    assert non_embedding == pytest.approx(PUBLISHED_NON_EMBEDDING[name], rel=0.015)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_round_trips_through_transformers(name):
    cfg = PRESETS[name]
    theirs = transformers.Qwen3Config(**cfg.to_hf())
    assert theirs.rope_parameters["rope_theta"] == cfg.rope_theta
    assert Qwen3Config.from_hf(theirs.to_dict()) == cfg


def test_from_hf_reads_rope_theta_from_either_place():
    hf = PRESETS["qwen3-4b-2507"].to_hf()
    assert Qwen3Config.from_hf(hf).rope_theta == 5e6
    old = {k: v for k, v in hf.items() if k != "rope_parameters"} | {"rope_theta": 123.0}
    assert Qwen3Config.from_hf(old).rope_theta == 123.0
    with pytest.raises(KeyError, match="rope_theta"):
        Qwen3Config.from_hf({k: v for k, v in hf.items() if k != "rope_parameters"})
    with pytest.raises(NotImplementedError, match="yarn"):
        Qwen3Config.from_hf(hf | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})
    with pytest.raises(KeyError, match="hidden_size"):
        Qwen3Config.from_hf({k: v for k, v in hf.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)


def test_every_param_has_logical_axes(model):
    rules = parallel.RULES["train"]
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = var.get_metadata()["logical_axes"]
        assert len(axes) == var[...].ndim, path
        assert all(a in rules for a in axes), path


def test_rmsnorm_matches_numpy():
    norm = qwen3.RMSNorm(8, 1e-6, param_dtype=jnp.float32)
    norm.scale[...] = jnp.arange(1.0, 9.0)
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.arange(1.0, 9.0)
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), want, rtol=1e-5)


def test_rope_is_a_complex_rotation_of_half_split_pairs():
    d, theta = 8, 1e4
    x = np.random.default_rng(0).normal(size=(1, 5, 2, d)).astype(np.float32)
    pos = np.array([[0, 1, 2, 7, 100]])
    z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    freq = theta ** (-np.arange(0, d, 2) / d)
    z = z * np.exp(1j * pos[..., None, None] * freq)
    want = np.concatenate([z.real, z.imag], axis=-1)
    got = np.asarray(qwen3.rope(jnp.asarray(x), jnp.asarray(pos), theta))
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    q, k = np.random.default_rng(1).normal(size=(2, 1, 1, 1, 16)).astype(np.float32)

    def score(m, n):
        rq = qwen3.rope(jnp.asarray(q), jnp.array([[m]]), 1e6)
        rk = qwen3.rope(jnp.asarray(k), jnp.array([[n]]), 1e6)
        return float(jnp.sum(rq * rk))

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_causal(model):
    tokens = _tokens(2, 8)
    changed = tokens.at[:, 5].set((tokens[:, 5] + 1) % TINY.vocab_size)
    a, b = run(model, tokens)[0], run(model, changed)[0]
    np.testing.assert_array_equal(np.asarray(a[:, :5]), np.asarray(b[:, :5]))
    assert np.abs(np.asarray(a[:, 5:] - b[:, 5:])).min(axis=-1).max() > 0


def test_left_padding_matches_unpadded_rows(model):
    tokens = _tokens(3, 8, seed=1)
    lengths = [8, 5, 2]
    mask = jnp.arange(8)[None, :] >= 8 - jnp.array(lengths)[:, None]
    padded = jnp.where(mask, tokens, 0)
    out = np.asarray(run(model, padded, mask)[0])
    assert np.isfinite(out).all()  # pad queries see no key at all; must not produce NaN
    for row, n in enumerate(lengths):
        alone = np.asarray(run(model, tokens[row : row + 1, 8 - n :])[0])[0]
        np.testing.assert_allclose(out[row, 8 - n :], alone, atol=1e-5)


def test_grouped_query_equals_repeated_kv_heads():
    cfg = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2)
    gqa = Qwen3(cfg, **F32, rngs=nnx.Rngs(5))
    mha = Qwen3(dataclasses.replace(cfg, num_kv_heads=4), **F32)
    state = nnx.state(gqa)
    attn = state["layers"]["attn"]
    for name in ("k", "v"):  # [L, H, K, D]; query head n reads KV head n // groups (HF order)
        attn[name] = attn[name].replace(jnp.repeat(attn[name][...], 2, axis=2))
    nnx.update(mha, state)
    tokens = _tokens(2, 6, seed=2)
    np.testing.assert_allclose(
        np.asarray(run(gqa, tokens)[0]), np.asarray(run(mha, tokens)[0]), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("chunks", [(9,), (4, 1, 1, 1, 1, 1), (2, 3, 4)])
def test_cache_chunks_equal_full_forward(model, chunks):
    tokens = _tokens(3, 9, seed=4)
    mask = jnp.arange(9)[None, :] >= jnp.array([0, 3, 6])[:, None]
    full = np.asarray(run(model, tokens, mask)[0])
    cache = KVCache.init(model.config, 3, 12, jnp.float32)
    outs, start = [], 0
    for n in chunks:
        out, cache = run(
            model, tokens[:, start : start + n], mask[:, start : start + n], cache=cache
        )
        outs.append(np.asarray(out))
        start += n
    assert int(cache.index) == 9 and cache.k.shape == (2, 3, 2, 12, 16)
    np.testing.assert_array_equal(
        np.asarray(cache.valid), np.pad(np.asarray(mask), [(0, 0), (0, 3)])
    )
    got = np.concatenate(outs, axis=1)
    np.testing.assert_allclose(got[np.asarray(mask)], full[np.asarray(mask)], atol=1e-5)


def test_cache_explicit_positions_equal_defaults(model):
    tokens, mask = _tokens(2, 5, seed=6), jnp.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
    cache0 = KVCache.init(model.config, 2, 8, jnp.float32)
    _, cache = run(model, tokens, mask, cache=cache0)
    nxt = _tokens(2, 1, seed=7)
    default, _ = run(model, nxt, cache=cache)
    explicit, _ = run(model, nxt, positions=jnp.array([[5], [3]]), cache=cache)
    np.testing.assert_array_equal(np.asarray(default), np.asarray(explicit))
    wrong, _ = run(model, nxt, positions=jnp.array([[5], [5]]), cache=cache)
    assert not np.allclose(np.asarray(wrong[1]), np.asarray(default[1]))


def test_hidden_states_and_lm_head_compose(model):
    tokens = _tokens(2, 4)
    hidden, _ = nnx.jit(lambda m, t: m.hidden_states(t))(model, tokens)
    assert hidden.shape == (2, 4, TINY.hidden_size)
    np.testing.assert_allclose(
        np.asarray(model.lm_head(hidden)), np.asarray(run(model, tokens)[0]), atol=1e-5
    )


def test_tied_head_is_the_embedding():
    m = Qwen3(TINY, **F32)
    assert not hasattr(m, "unembedding")
    hidden = jnp.eye(TINY.hidden_size)[None, :3]
    np.testing.assert_allclose(
        np.asarray(m.lm_head(hidden))[0], np.asarray(m.embedding[...])[:, :3].T, atol=1e-6
    )


def test_bf16_default_policy():
    cfg = TINY
    m16 = Qwen3(cfg, rngs=nnx.Rngs(9))
    m32 = Qwen3(cfg, **F32, rngs=nnx.Rngs(9))
    nnx.update(m32, jax.tree.map(lambda x: x.astype(jnp.float32), nnx.state(m16)))
    assert m16.layers.mlp.up[...].dtype == jnp.bfloat16
    tokens = _tokens(2, 6)
    lo16, lo32 = run(m16, tokens)[0], run(m32, tokens)[0]
    assert lo16.dtype == jnp.float32 and m16.hidden_states(tokens)[0].dtype == jnp.bfloat16
    err = np.abs(np.asarray(lo16 - lo32)).max()
    assert 0 < err < 0.05 * np.abs(np.asarray(lo32)).max()


def test_remat_same_values_and_grads(model):
    rematted = Qwen3(model.config, **F32, remat=True)
    nnx.update(rematted, nnx.state(model))
    tokens = _tokens(2, 5)

    def loss(m):
        return jnp.mean(jax.nn.log_softmax(m(tokens)[0])[..., 0])

    g1 = nnx.jit(nnx.grad(loss))(model)
    g2 = nnx.jit(nnx.grad(loss))(rematted)
    for (p, a), (_, b) in zip(nnx.to_flat_state(g1), nnx.to_flat_state(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-6, err_msg=p)


def test_chunked_attention_equals_full(model):
    chunked = Qwen3(model.config, **F32, attention_chunk=4)
    nnx.update(chunked, nnx.state(model))
    tokens = _tokens(2, 12, seed=8)
    mask = jnp.arange(12)[None, :] >= jnp.array([[0], [5]])
    real = np.asarray(mask)  # padding positions attend to nothing: their outputs are arbitrary
    np.testing.assert_allclose(
        np.asarray(run(chunked, tokens, mask)[0])[real],
        np.asarray(run(model, tokens, mask)[0])[real],
        atol=1e-5,
    )

    def loss(m):
        return jnp.sum(
            jnp.where(mask, jax.nn.log_softmax(m(tokens, attention_mask=mask)[0])[..., 1], 0)
        )

    grads = [nnx.jit(nnx.grad(loss))(m) for m in (chunked, model)]
    for (p, a), (_, b) in zip(*(nnx.to_flat_state(g) for g in grads), strict=True):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-5, err_msg=p)


@pytest.mark.parametrize("chunk", [4, 5])
def test_cpu_row_blocks_and_query_chunks_equal_whole_rows(model, monkeypatch, chunk):
    """CPU's default attention layout (blocks of rows, each in query chunks) against one block
    of whole rows: logits and gradients of a left-padded causal batch, and hidden states of a
    shared prefix + extend batch. Chunk 5 divides neither length: causal inputs are then cut
    with a shorter last chunk."""
    monkeypatch.setattr(qwen3, "CPU_QUERY_CHUNK", chunk)
    monkeypatch.setattr(qwen3, "CPU_SCORE_BLOCK", 64)
    assert qwen3._cpu_query_chunk(12, None) == (4 if chunk == 4 else 0)
    assert qwen3._cpu_query_chunk(12, None, causal=True) == chunk
    assert qwen3._cpu_query_chunk(12, 0, causal=True) == 0
    assert qwen3._cpu_query_chunk(9, None, causal=True) == (chunk if chunk == 4 else 0)
    chunked, blocks = [], []  # what the paths under test were called with / returned
    real_chunks, real_blocks = qwen3._query_chunks, qwen3._row_blocks

    def spy_chunks(q, *args):
        chunked.append(q.shape[2])
        return real_chunks(q, *args)

    def spy_blocks(*args):
        blocks.append(real_blocks(*args))
        return blocks[-1]

    monkeypatch.setattr(qwen3, "_query_chunks", spy_chunks)
    monkeypatch.setattr(qwen3, "_row_blocks", spy_blocks)
    whole = Qwen3(model.config, **F32, attention_block=0)
    nnx.update(whole, nnx.state(model))
    tokens = _tokens(3, 12, seed=5)
    mask = jnp.arange(12)[None, :] >= jnp.array([[0], [5], [2]])

    def loss(m):
        logits = m(tokens, attention_mask=mask)[0]
        return jnp.sum(jnp.where(mask, jax.nn.log_softmax(logits)[..., 1], 0)), logits

    (_, lb), gb = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
    (_, lw), gw = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(whole)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(lb)[real], np.asarray(lw)[real], atol=1e-5)
    for (p, a), (_, b) in zip(*(nnx.to_flat_state(g) for g in (gb, gw)), strict=True):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-5, err_msg=p)

    prompts = _tokens(2, 6, seed=6)
    pmask = jnp.arange(6)[None, :] >= jnp.array([[0], [2]])
    conts = _tokens(2, 8, seed=7).reshape(2, 1, 8).repeat(3, axis=1)
    cmask = jnp.arange(8)[None, None, :] < jnp.array([[8, 3, 1], [2, 8, 5]])[..., None]

    def extended(m):
        return m.extend(conts, m.prefix(prompts, pmask)[1], cmask)

    hb, hw = (np.asarray(nnx.jit(extended)(m)) for m in (model, whole))
    np.testing.assert_allclose(hb[np.asarray(cmask)], hw[np.asarray(cmask)], atol=1e-5)
    # the paths under test ran (8 queries are under two chunks of 5: whole rows)
    assert 12 in chunked and (8 in chunked) == (chunk == 4) and max(blocks) > 1
