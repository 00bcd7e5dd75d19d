"""Accelerator fast paths checked against the reference on CPU: fused attention
(`jax.nn.dot_product_attention`) against the einsum path, and remat policies against no remat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.models import qwen3
from mapfjax.models.qwen3 import PRESETS, Qwen3

# GQA: 4 query heads over 2 KV heads.
CFG = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=False)
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)
# float32 on CPU: the fused XLA path computes the same products in another order.
ATOL = 1e-5


def _pair(**kw):
    """(einsum model, fused model) with the same weights."""
    ref = Qwen3(CFG, **F32, rngs=nnx.Rngs(3), **kw)
    fused = Qwen3(CFG, **F32, rngs=nnx.Rngs(3), attention_impl="fused", **kw)
    return ref, fused


def _tokens(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, shape), jnp.int32)


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts traced calls of the fused implementation (so a test fails if it is bypassed)."""
    calls = []
    impl = qwen3.ATTENTION_IMPLS["fused"]

    def counted(*args):
        calls.append(1)
        return impl(*args)

    monkeypatch.setitem(qwen3.ATTENTION_IMPLS, "fused", counted)
    return calls


def _close_trees(a, b, atol):
    for (p, x), (_, y) in zip(nnx.to_flat_state(a), nnx.to_flat_state(b), strict=True):
        np.testing.assert_allclose(np.asarray(x[...]), np.asarray(y[...]), atol=atol, err_msg=p)


@pytest.mark.parametrize("chunk", [1024, 4])
def test_fused_attention_equals_einsum_with_causal_and_left_padding(chunk, fused_calls):
    ref, fused = _pair(attention_chunk=chunk)
    tokens = _tokens((3, 12))
    mask = jnp.arange(12)[None, :] >= jnp.array([[0], [5], [11]])  # left padding

    def loss(m):
        logits = m(tokens, attention_mask=mask)[0]
        return jnp.sum(jnp.where(mask, jax.nn.log_softmax(logits)[..., 1], 0.0)), logits

    (_, lr), gr = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(ref)
    (_, lf), gf = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(fused)
    assert fused_calls
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(lf)[real], np.asarray(lr)[real], atol=ATOL)
    _close_trees(gf, gr, ATOL)


def test_fused_attention_equals_einsum_on_shared_prefix(fused_calls):
    """prefix + extend: the prompt's keys as a shared segment beside each row's own keys."""
    ref, fused = _pair()
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
    assert fused_calls
    real = np.asarray(cmask)
    np.testing.assert_allclose(np.asarray(hf)[real], np.asarray(hr)[real], atol=ATOL)
    _close_trees(gf, gr, 1e-4)  # a sum of squares over 30 rows: gradients of size ~1e2


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
