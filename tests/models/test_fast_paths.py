"""Accelerator fast paths checked against the reference on CPU: fused attention
(`jax.nn.dot_product_attention`) and the TPU splash kernel (in Pallas interpret mode) against
the einsum path, and remat policies against no remat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models import qwen3, splash
from mapfjax.models.qwen3 import PRESETS, KVCache, Qwen3

# GQA: 4 query heads over 2 KV heads.
CFG = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=False)
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)
# float32 on CPU: the fused XLA path computes the same products in another order, the splash
# kernel in blocks with an online softmax (measured: at most 2e-7 on logits, 4e-6 on gradients
# of size ~40).
ATOL = 1e-5


def _pair(impl="fused", **kw):
    """(einsum model, `impl` model) with the same weights."""
    ref = Qwen3(CFG, **F32, rngs=nnx.Rngs(3), **kw)
    fast = Qwen3(CFG, **F32, rngs=nnx.Rngs(3), attention_impl=impl, **kw)
    return ref, fast


def _tokens(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, shape), jnp.int32)


def _count(monkeypatch, impl):
    """A list that grows by one at each traced call of `impl`'s kernel (so a test fails if it
    is bypassed): the registry entry for "fused", the kernel itself for "splash" (whose entry
    falls back to einsum on segments it cannot express)."""
    calls = []
    owner, name = (splash, "causal_attention") if impl == "splash" else (None, impl)
    fn = getattr(owner, name) if owner else qwen3.ATTENTION_IMPLS[name]

    def counted(*args):
        calls.append(1)
        return fn(*args)

    if owner:
        monkeypatch.setattr(owner, name, counted)
    else:
        monkeypatch.setitem(qwen3.ATTENTION_IMPLS, name, counted)
    return calls


def _close_trees(a, b, atol):
    for (p, x), (_, y) in zip(nnx.to_flat_state(a), nnx.to_flat_state(b), strict=True):
        np.testing.assert_allclose(np.asarray(x[...]), np.asarray(y[...]), atol=atol, err_msg=p)


# splash ignores the query chunk (it takes whole sequences): one chunk length is enough.
@pytest.mark.parametrize("impl, chunk", [("fused", 1024), ("fused", 4), ("splash", 4)])
def test_fast_attention_equals_einsum_with_causal_and_left_padding(impl, chunk, monkeypatch):
    calls = _count(monkeypatch, impl)
    ref, fused = _pair(impl, attention_chunk=chunk)
    tokens = _tokens((3, 12))
    mask = jnp.arange(12)[None, :] >= jnp.array([[0], [5], [11]])  # left padding

    def loss(m):
        logits = m(tokens, attention_mask=mask)[0]
        return jnp.sum(jnp.where(mask, jax.nn.log_softmax(logits)[..., 1], 0.0)), logits

    (_, lr), gr = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(ref)
    (_, lf), gf = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(fused)
    assert calls
    real = np.asarray(mask)
    assert np.isfinite(np.asarray(lf)).all()  # padding queries too (splash: never fully masked)
    np.testing.assert_allclose(np.asarray(lf)[real], np.asarray(lr)[real], atol=ATOL)
    _close_trees(gf, gr, ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["fused", "splash"])
def test_fast_attention_equals_einsum_on_shared_prefix(impl, monkeypatch):
    """prefix + extend: the prompt's keys as a shared segment beside each row's own keys."""
    calls = _count(monkeypatch, impl)
    ref, fused = _pair(impl)
    b, g, p, t = 2, 3, 6, 5
    prompts = _tokens((b, p), seed=1)
    pmask = jnp.arange(p)[None, :] >= jnp.array([[0], [2]])
    conts = _tokens((b, g, t), seed=2)
    cmask = jnp.arange(t)[None, None, :] < jnp.array([[5, 3, 1], [2, 5, 4]])[..., None]

    def loss(m):
        _, prefix = m.prefix(prompts, pmask)
        hidden = m.extend(conts, prefix, cmask)
        return jnp.sum(jnp.where(cmask[..., None], hidden, 0.0) ** 2), hidden

    (_, hr), gr = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(ref)
    (_, hf), gf = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(fused)
    assert calls
    real = np.asarray(cmask)
    np.testing.assert_allclose(np.asarray(hf)[real], np.asarray(hr)[real], atol=ATOL)
    # A sum of squares over 30 rows: gradients up to ~80; measured differences up to 1.0e-4
    # (fused) and 1.4e-4 (splash), on the embedding rows of tokens used most.
    _close_trees(gf, gr, 3e-4)


def _reference(q, k, v, valid, scale):
    """Causal attention written out: q [R, N, C, D] in the last C of k, v [R, K, S, D]'s slots."""
    r, n, c, _ = q.shape
    kh, s = k.shape[1], k.shape[2]
    qg = q.reshape(r, kh, n // kh, c, -1)
    scores = jnp.einsum("rkqcd,rksd->rkqcs", qg, k) * scale
    allowed = (jnp.arange(c)[:, None] + s - c >= jnp.arange(s)) & valid[:, None, None, None, :]
    probs = jax.nn.softmax(jnp.where(allowed, scores, -1e30), axis=-1)
    return jnp.einsum("rkqcs,rksd->rkqcd", probs, v).reshape(q.shape)


# (queries, keys): one block each after padding to 128; three query and key blocks of 128.
@pytest.mark.parametrize("c, s", [(5, 13), (260, 260)])
def test_splash_kernel_equals_reference_with_prefix_padding_and_gqa(c, s):
    r, n, kh, d = 2, 4, 2, 16  # 4 query heads over 2 KV heads
    q, k, v, w = (
        jax.random.normal(key, shape)
        for key, shape in zip(
            jax.random.split(jax.random.key(0), 4),
            [(r, n, c, d), (r, kh, s, d), (r, kh, s, d), (r, n, c, d)],
            strict=True,
        )
    )
    slot = jnp.arange(s)
    valid = jnp.stack([slot >= 3, slot < s - 2])  # row 0 left-padded, row 1 right-padded
    real_q = valid[:, None, s - c :, None]  # [R, 1, C, 1]
    scale = d**-0.5

    def loss(fn, q, k, v):
        out = fn(q, k, v, valid, scale)
        return jnp.sum(jnp.where(real_q, out * w, 0.0)), out

    grad = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)
    (_, out), grads = jax.jit(grad, static_argnums=0)(splash.causal_attention, q, k, v)
    (_, want), wants = jax.jit(grad, static_argnums=0)(_reference, q, k, v)
    assert np.isfinite(np.asarray(out)).all()
    real = np.broadcast_to(np.asarray(real_q), out.shape)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(want)[real], atol=ATOL)
    for got, ref in zip(grads, wants, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=ATOL)


def test_splash_runs_per_device_under_a_mesh(monkeypatch):
    """Under a data x fsdp x tp mesh the kernel runs through shard_map (rows over data x fsdp,
    KV heads over tp) and gives the single-device result."""
    calls, shard_maps = _count(monkeypatch, "splash"), []
    shard_map = jax.shard_map
    monkeypatch.setattr(
        jax, "shard_map", lambda *a, **kw: shard_maps.append(1) or shard_map(*a, **kw)
    )
    ref, fast = _pair("splash")
    tokens = _tokens((4, 9), seed=5)
    mask = jnp.arange(9)[None, :] >= jnp.array([[0], [2], [8], [4]])
    want = nnx.jit(lambda m: m(tokens, attention_mask=mask)[0])(ref)
    with jax.set_mesh(parallel.make_mesh({"data": 2, "fsdp": 2, "tp": 2})):
        got = nnx.jit(lambda m: m(tokens, attention_mask=mask)[0])(fast)
    assert calls and shard_maps
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=ATOL)


def test_splash_takes_the_einsum_path_against_a_kv_cache(monkeypatch):
    """A prefill into a KV cache (its causal offset is a traced index) is not a splash shape:
    the einsum path runs, with the same result."""
    calls = _count(monkeypatch, "splash")
    ref, fast = _pair("splash")
    tokens = _tokens((2, 6), seed=6)

    def run(m):
        cache = KVCache.init(CFG, 2, 10, jnp.float32)
        logits, cache = m(tokens[:, :4], cache=cache)
        return logits, m(tokens[:, 4:], cache=cache)[0]

    got, want = nnx.jit(run)(fast), nnx.jit(run)(ref)
    assert not calls
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_splash_block_sizes_come_from_the_padded_lengths():
    sizes = splash.block_sizes(384, 1024)
    assert (sizes.block_q, sizes.block_kv, sizes.block_q_dkv, sizes.block_kv_dq) == (
        128, 512, 128, 512,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"q_len=100 \(queries 100, keys 256\).*multiple of 128"):
        splash.block_sizes(100, 256)


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_policies_give_the_same_gradients(policy):
    ref = Qwen3(CFG, **F32, rngs=nnx.Rngs(5))
    other = Qwen3(CFG, **F32, rngs=nnx.Rngs(5), remat=policy)
    tokens = _tokens((2, 7), seed=4)

    def loss(m):
        return jnp.mean(jax.nn.log_softmax(m(tokens)[0])[..., 3])

    _close_trees(nnx.jit(nnx.grad(loss))(other), nnx.jit(nnx.grad(loss))(ref), 1e-6)


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="attention_impl='flash'.*einsum"):
        Qwen3(CFG, attention_impl="flash")
    with pytest.raises(ValueError, match="remat='some'.*dots_saveable"):
        Qwen3(CFG, remat="some")
    assert qwen3.remat_policy_name(True) == "full" and qwen3.remat_policy_name(False) == "none"


def test_cudnn_is_chosen_for_half_precision_on_gpu_only(monkeypatch):
    # cuDNN's fused kernel takes fp16/bf16 only: float32 on a GPU (e.g. an fp32 reference
    # model beside a bf16 one) goes to XLA's implementation instead of failing.
    assert qwen3._fused_implementation(jnp.bfloat16) is None  # CPU: XLA everywhere
    monkeypatch.setattr(qwen3.jax, "default_backend", lambda: "gpu")
    assert qwen3._fused_implementation(jnp.bfloat16) == "cudnn"
    assert qwen3._fused_implementation(jnp.float16) == "cudnn"
    assert qwen3._fused_implementation(jnp.float32) is None
