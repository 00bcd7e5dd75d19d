"""The Pallas decode-attention path (`attention_impl="pallas_decode"`, the GPU kernel in Pallas
interpret mode on CPU) against the einsum decode path: one step's attention and the sampler's
greedy tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.models import decode_attention, qwen3, sampler
from mapfjax.models.qwen3 import PRESETS, Qwen3
from tests.models.decode_inputs import decode_inputs

# float32: the kernel sums in blocks with an online softmax, the reference in one softmax.
RTOL, ATOL = 1e-4, 1e-6


def _inputs(b, g, kh, h, d, p, w, pads, right=False, seed=0):
    """q [B, G, K, H, D], prefix (kp, vp [B, K, P, D], valid [B, P]) with pads[b] padding
    slots on the left (right: on the right) of group b, own (k, v [B, G, K, W, D])."""
    return decode_inputs(b, g, kh, h, d, p, w, pads, "right" if right else "left", seed)


# (B, G, K, H, D, P, W, left padding per group): GQA (H > 1 query heads per KV head), left
# padding, groups of G > 1 samples sharing a prefix, lengths that are and are not multiples
# of 16 (padded for the kernel), several key splits (P = 256: 16 splits of 16; W = 64).
CASES = [
    (2, 3, 2, 2, 16, 24, 32, [5, 0]),
    (1, 1, 1, 4, 32, 16, 16, [3]),
    (3, 2, 2, 4, 32, 256, 64, [0, 100, 255]),
    (2, 4, 1, 1, 16, 7, 9, [6, 2]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_decode_attend_matches_the_einsum_path(case):
    """Every own-cache column (the slot written at this step is the last one read)."""
    *shape, pads = case
    q, prefix, own = _inputs(*shape, pads)
    w = shape[-1]
    step = jax.jit(decode_attention.decode_attend)
    for index in sorted({0, 1, w // 2, w - 1}):
        want = qwen3._decode_attend(q, prefix, own, jnp.arange(w) <= index)
        got = step(q, prefix, own, jnp.int32(index))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"index {index}")


def test_right_padding_and_an_empty_prefix_match_the_einsum_path():
    """Any contiguous valid range of the prefix, also none (a padding group of the batch)."""
    b, g, kh, h, d, p, w = 3, 2, 2, 2, 16, 32, 16
    q, (kp, vp, valid), own = _inputs(b, g, kh, h, d, p, w, [4, 0, 32], right=True)
    assert not bool(valid[2].any())
    for index in (0, 9):
        allowed = jnp.arange(w) <= index
        want = qwen3._decode_attend(q, (kp, vp, valid), own, allowed)
        got = decode_attention.decode_attend(q, (kp, vp, valid), own, jnp.int32(index))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_interpret_mode_is_chosen_on_cpu(monkeypatch):
    seen = []
    real = decode_attention.pallas_decode.gqa

    def spy(*args, **kw):
        seen.append(kw["interpret"])
        return real(*args, **kw)

    monkeypatch.setattr(decode_attention.pallas_decode, "gqa", spy)
    q, prefix, own = _inputs(1, 2, 1, 2, 16, 16, 16, [0])
    decode_attention.decode_attend(q, prefix, own, jnp.int32(3))
    assert seen == [jax.default_backend() == "cpu"] * 2  # the prefix and the own cache


# GQA: 4 query heads over 2 KV heads, head_dim 16, 2 layers.
CFG = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=False)
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)
# Different lengths (left padding to a bucket of 8), one of them at the bucket's length.
PROMPTS = [[5, 17, 3], [9, 1, 44, 2, 7, 100, 31, 8], [200]]


def test_generate_greedy_equals_the_einsum_path(monkeypatch):
    """Greedy tokens from `sampler.generate` with 2 samples per prompt over growing own-cache
    windows (4, 8, 16, 17 slots) are those of attention_impl="einsum", and every decode step
    went through the kernel."""
    calls = []
    real = decode_attention.decode_attend

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(decode_attention, "decode_attend", counted)
    ref = Qwen3(CFG, **F32, rngs=nnx.Rngs(5))
    fast = Qwen3(CFG, **F32, rngs=nnx.Rngs(5), attention_impl="pallas_decode")
    kw = dict(num_samples=2, window=4, stop_tokens=(), compact=False)
    want = sampler.generate(ref, PROMPTS, 18, **kw)
    got = sampler.generate(fast, PROMPTS, 18, **kw)
    assert calls  # traced once per layer and window
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
    assert len({tuple(r) for r in np.asarray(want.tokens).tolist()}) > 1  # not one constant row


def test_prefill_is_the_einsum_path():
    """ "pallas_decode" changes decode steps only: a prefill gives the einsum model's logits."""
    ref = Qwen3(CFG, **F32, rngs=nnx.Rngs(5))
    fast = Qwen3(CFG, **F32, rngs=nnx.Rngs(5), attention_impl="pallas_decode")
    tokens = jnp.asarray([[0, 0, 5, 17, 3], [9, 1, 44, 2, 7]], jnp.int32)
    mask = tokens > 0
    np.testing.assert_array_equal(
        ref(tokens, attention_mask=mask)[0], fast(tokens, attention_mask=mask)[0]
    )


def test_layout_splits_into_power_of_two_blocks():
    """Each split a power of two of at least 16 slots (Triton's blocks), at most 16 splits,
    no padding for multiples of 16 whose odd factor is at most 15."""
    for n in [1, 9, 16, 17, 48, 63, 64, 80, 240, 241, 272, 400, 1000, 1024, 8192]:
        length, splits, block = decode_attention._layout(n)
        per_split = length // splits
        assert length >= n and length == splits * per_split and splits <= 16
        assert per_split >= 16 and per_split & (per_split - 1) == 0
        assert 16 <= block <= 128 and per_split % block == 0
    assert [decode_attention._layout(n)[0] for n in (48, 64, 240, 256, 272)] == [
        48,
        64,
        240,
        256,
        288,
    ]
