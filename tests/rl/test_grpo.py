"""GRPO math against plain NumPy transcriptions of the formulas (float64 loops)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mapfjax.rl import grpo
from mapfjax.rl.grpo import GRPOConfig

AGG_NAMES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


# ----------------------------------------------------------------- NumPy references (loops)


def np_advantages(rewards, group_size, scale_by_std, eps, ddof):
    flat = np.asarray(rewards, np.float64).reshape(-1)
    out = np.zeros_like(flat)
    for start in range(0, flat.size, group_size):
        group = [float(v) for v in flat[start : start + group_size]]
        if max(group) == min(group):
            continue  # constant group: advantage 0
        mean = sum(group) / len(group)
        var = sum((g - mean) ** 2 for g in group) / (len(group) - ddof)
        for i, g in enumerate(group):
            a = g - mean
            out[start + i] = a / (math.sqrt(var) + eps) if scale_by_std else a
    return out.reshape(np.shape(rewards))


def np_logp_entropy(logits, targets, temperature):
    b, t, _ = logits.shape
    logp = np.zeros((b, t))
    ent = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            z = logits[i, j].astype(np.float64) / temperature
            m = z.max()
            lse = m + math.log(sum(math.exp(v - m) for v in z))
            lp = z - lse
            logp[i, j] = lp[targets[i, j]]
            ent[i, j] = -sum(math.exp(v) * v for v in lp)
    return logp, ent


def np_aggregate(name, per_token, mask, budget):
    b, t = mask.shape
    lengths = [int(sum(mask[i])) for i in range(b)]
    n_seq = max(sum(1 for n in lengths if n > 0), 1)
    if name == "token_mean":
        total = sum(per_token[i, j] for i in range(b) for j in range(t) if mask[i, j])
        return total / max(sum(lengths), 1)
    if name == "seq_mean_token_mean":
        acc = 0.0
        for i in range(b):
            if lengths[i]:
                acc += sum(per_token[i, j] for j in range(t) if mask[i, j]) / lengths[i]
        return acc / n_seq
    if name == "seq_mean_token_sum_norm":
        total = sum(per_token[i, j] for i in range(b) for j in range(t) if mask[i, j])
        return total / (n_seq * (budget or t))
    raise KeyError(name)


def np_k3(logp, ref):
    d = ref - logp
    return math.exp(d) - d - 1.0


def np_grpo(logp, old, adv, mask, cfg, ref=None):
    """Returns (loss, metrics) by explicit loops over tokens."""
    b, t = mask.shape
    per_token = np.zeros((b, t))
    pg = np.zeros((b, t))
    toks = [(i, j) for i in range(b) for j in range(t) if mask[i, j]]
    ratios, lows, highs, kls, dlogs = [], [], [], [], []
    for i, j in toks:
        r = math.exp(float(logp[i, j]) - float(old[i, j]))
        a = float(adv[i])
        rc = min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
        pg[i, j] = -min(r * a, rc * a)
        per_token[i, j] = pg[i, j]
        if ref is not None:
            k = np_k3(float(logp[i, j]), float(ref[i, j]))
            kls.append(k)
            if cfg.kl_coef > 0:
                per_token[i, j] += cfg.kl_coef * k
        ratios.append(r)
        lows.append(a < 0 and r < 1 - cfg.clip_low)
        highs.append(a > 0 and r > 1 + cfg.clip_high)
        dlogs.append(float(old[i, j]) - float(logp[i, j]))
    n = max(len(toks), 1)
    seq_adv = [float(adv[i]) for i in range(b) if mask[i].any()]
    adv_mean = sum(seq_adv) / max(len(seq_adv), 1)
    metrics = {
        "pg_loss": np_aggregate(cfg.aggregation, pg, mask, cfg.max_response_tokens),
        "clip_frac_low": sum(lows) / n,
        "clip_frac_high": sum(highs) / n,
        "clip_frac": sum(lo or hi for lo, hi in zip(lows, highs)) / n,
        "ratio_mean": sum(ratios) / n,
        "ratio_max": max(ratios, default=0.0),
        "approx_kl_old": sum(dlogs) / n,
        "adv_mean": adv_mean,
        "adv_std": math.sqrt(sum((a - adv_mean) ** 2 for a in seq_adv) / max(len(seq_adv), 1)),
        "num_tokens": float(len(toks)),
    }
    if ref is not None:
        metrics["kl"] = sum(kls) / n
    loss = np_aggregate(cfg.aggregation, per_token, mask, cfg.max_response_tokens)
    metrics["loss"] = loss
    return loss, metrics


# ----------------------------------------------------------------- random inputs


def random_batch(seed, b=8, t=9, extreme=True):
    """Log-probs, old log-probs, ref log-probs, advantages, mask with empty and full rows.

    Masked-out positions hold inf/NaN garbage, which must be ignored.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, t + 1, size=b)
    lengths[0], lengths[1] = 0, t  # one empty row, one full row
    mask = np.arange(t)[None, :] < lengths[:, None]
    logp = -rng.exponential(2.0, size=(b, t))
    delta = rng.normal(0.0, 0.3, size=(b, t))
    if extreme:  # ratios up to e^30 and down to e^-30
        pick = rng.random((b, t)) < 0.15
        delta = np.where(pick, rng.choice([-30.0, -8.0, 8.0, 30.0], size=(b, t)), delta)
        delta[1, :4] = [30.0, -30.0, 8.0, -8.0]  # row 1 is full, so these are in the loss
    old = logp - delta
    ref = logp + rng.normal(0.0, 0.5, size=(b, t))
    adv = rng.normal(size=b)
    adv[2] = 0.0
    garbage = rng.choice([np.inf, -np.inf, np.nan, 1e30], size=(b, t))
    old = np.where(mask, old, garbage)
    ref = np.where(mask, ref, garbage[::-1])
    f32 = lambda x: np.asarray(x, np.float32)
    return f32(logp), f32(old), f32(ref), f32(adv), mask


def assert_metrics_close(got, want, rtol=2e-5, atol=1e-6):
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        np.testing.assert_allclose(float(got[k]), want[k], rtol=rtol, atol=atol, err_msg=k)


# ----------------------------------------------------------------- advantages


@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("shape2d", [False, True])
def test_group_advantages_match_numpy(scale_by_std, ddof, shape2d):
    rng = np.random.default_rng(ddof + 2 * scale_by_std)
    g = 4
    rewards = rng.choice([0.0, 0.1, 1.0, 1.5], size=(6, g)).astype(np.float32)
    rewards[0] = 0.1  # constant groups, with a value whose mean is inexact in fp32
    rewards[1] = 1.0
    rewards[2] = rng.normal(size=g) * 1e3
    if not shape2d:
        rewards = rewards.reshape(-1)
    got = grpo.group_advantages(rewards, g, scale_by_std, 1e-6, ddof)
    assert got.shape == rewards.shape and got.dtype == jnp.float32
    want = np_advantages(rewards, g, scale_by_std, 1e-6, ddof)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    flat = np.asarray(got).reshape(-1, g)
    assert np.all(flat[:2] == 0.0)  # exactly zero, not NaN
    assert np.all(np.isfinite(flat))


@pytest.mark.parametrize("group_size", [3, 8])
@pytest.mark.parametrize("jit", [False, True])
def test_constant_groups_are_exactly_zero(group_size, jit):
    # fp32 mean of 0.1 repeated 3 or 8 times is not exactly 0.1: the centring alone leaves a
    # residue that the std division would blow up to about +-1.
    rewards = jnp.full((2 * group_size,), 0.1, jnp.float32)
    fn = grpo.group_advantages
    if jit:
        fn = jax.jit(fn, static_argnums=(1, 2, 3, 4))
    assert np.all(np.asarray(fn(rewards, group_size, True, 1e-6, 0)) == 0.0)


def test_group_advantages_ddof0_unit_rms_and_jit():
    rewards = jnp.array([0.0, 1.0, 1.0, 1.0, 3.0, 5.0], jnp.float32)
    adv = jax.jit(grpo.group_advantages, static_argnums=(1, 2, 3, 4))(rewards, 2, True, 1e-6, 0)
    np.testing.assert_allclose(np.asarray(adv), [-1, 1, 0, 0, -1, 1], atol=1e-5)


def test_group_advantages_bad_shape_names_group_size():
    with pytest.raises(ValueError, match="group_size=4"):
        grpo.group_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size=4"):
        grpo.group_advantages(jnp.zeros((2, 3)), 4)
    with pytest.raises(ValueError, match="ddof=2"):
        grpo.group_advantages(jnp.zeros(4), 2, ddof=2)


# ----------------------------------------------------------------- log-probs and entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_token_logprobs_and_entropy_match_numpy(temperature):
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(3, 5, 11)) * 4).astype(np.float32)
    logits[0, 0, 3] = 80.0  # large logit: needs the stable logsumexp
    targets = rng.integers(0, 11, size=(3, 5)).astype(np.int32)
    want_lp, want_ent = np_logp_entropy(logits, targets, temperature)
    got_lp = grpo.token_logprobs(jnp.asarray(logits), jnp.asarray(targets), temperature)
    got_ent = grpo.token_entropy(jnp.asarray(logits), temperature)
    assert got_lp.dtype == jnp.float32 and got_lp.shape == (3, 5)
    np.testing.assert_allclose(np.asarray(got_lp), want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_ent), want_ent, rtol=1e-5, atol=1e-5)


def test_temperature_is_applied():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 4, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, size=(2, 4))
    at2 = grpo.token_logprobs(jnp.asarray(logits), jnp.asarray(targets), 2.0)
    z = logits.astype(np.float64) / 2.0
    ls = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = np.take_along_axis(ls, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(at2), want, rtol=1e-5, atol=1e-6)
    at1 = grpo.token_logprobs(jnp.asarray(logits), jnp.asarray(targets), 1.0)
    assert not np.allclose(np.asarray(at1), want, atol=1e-3)


def test_bf16_logits_are_upcast():
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(1, 3, 5)), jnp.bfloat16)
    lp = grpo.token_logprobs(logits, jnp.zeros((1, 3), jnp.int32))
    assert lp.dtype == jnp.float32


def _shapes_in_jaxpr(jaxpr):
    """Every intermediate shape in a (closed) jaxpr, sub-jaxprs included."""
    shapes = set()
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            shapes.add(tuple(getattr(v.aval, "shape", ())))
        for param in eqn.params.values():
            subs = param if isinstance(param, list | tuple) else [param]
            for sub in subs:
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    shapes |= _shapes_in_jaxpr(sub)
    return shapes


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
def test_chunked_equals_unchunked(chunk):
    rng = np.random.default_rng(4)
    b, t, h, v = 2, 13, 6, 17
    hidden = jnp.asarray(rng.normal(size=(b, t, h)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(h, v)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    temp = 0.8
    c1 = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    c2 = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

    def full(hidden, w):
        logits = jnp.einsum("bth,hv->btv", hidden, w)
        lp = grpo.token_logprobs(logits, targets, temp)
        return lp, grpo.token_entropy(logits, temp)

    def chunked(hidden, w):
        head = lambda x: jnp.einsum("bth,hv->btv", x, w)
        return grpo.chunked_token_logprobs(hidden, head, targets, temp, chunk=chunk)

    (lp_f, ent_f), (lp_c, ent_c) = jax.jit(full)(hidden, w), jax.jit(chunked)(hidden, w)
    assert lp_c.shape == ent_c.shape == (b, t)
    np.testing.assert_allclose(np.asarray(lp_c), np.asarray(lp_f), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent_f), rtol=1e-5, atol=1e-5)

    def scalar(fn):
        return lambda hd, ww: jnp.sum(fn(hd, ww)[0] * c1 + fn(hd, ww)[1] * c2)

    g_f = jax.jit(jax.grad(scalar(full), argnums=(0, 1)))(hidden, w)
    g_c = jax.jit(jax.grad(scalar(chunked), argnums=(0, 1)))(hidden, w)
    for a, bb in zip(g_c, g_f):
        np.testing.assert_allclose(np.asarray(a), np.asarray(bb), rtol=1e-4, atol=1e-5)

    if chunk < t:  # neither the forward nor the backward holds the whole [B, T, V] logits
        jaxpr = jax.make_jaxpr(jax.grad(scalar(chunked), argnums=(0, 1)))(hidden, w)
        shapes = _shapes_in_jaxpr(jaxpr)
        assert (b, chunk, v) in shapes  # logits of one chunk exist ...
        # ... but no logits-like array (rank >= 3, vocab last) larger than one chunk does.
        big = [s for s in shapes if len(s) >= 3 and s[-1] == v and np.prod(s) > b * chunk * v]
        assert not big, big


# ----------------------------------------------------------------- masks and KL


def test_response_mask_counts_end_of_turn():
    lengths = jnp.array([0, 3, 5, 1], jnp.int32)
    got = np.asarray(grpo.response_mask(lengths, 5))
    want = np.array([[j < n for j in range(5)] for n in [0, 3, 5, 1]])
    np.testing.assert_array_equal(got, want)
    # tokens "a b <|im_end|> pad pad" with length 3: the end-of-turn position is trained on
    assert got[1, 2] and not got[1, 3]


def test_k3_matches_numpy_and_is_nonnegative():
    rng = np.random.default_rng(5)
    logp = rng.normal(size=(4, 6)) * 5
    ref = rng.normal(size=(4, 6)) * 5
    got = np.asarray(grpo.k3_kl(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32)))
    want = np.vectorize(np_k3)(logp, ref)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.all(got >= 0)
    assert np.all(np.asarray(grpo.k3_kl(jnp.asarray(logp), jnp.asarray(logp))) == 0)


# ----------------------------------------------------------------- aggregation


@pytest.mark.parametrize("name", AGG_NAMES)
@pytest.mark.parametrize("budget", [None, 16])
def test_aggregations_match_numpy(name, budget):
    rng = np.random.default_rng(6)
    per_token = rng.normal(size=(7, 9))
    mask = rng.random((7, 9)) < 0.6
    mask[0] = False  # empty sequence
    mask[3] = True
    cfg = GRPOConfig(aggregation=name, max_response_tokens=budget)
    garbage = np.where(mask, per_token, np.nan)  # masked values must not leak
    got = grpo.AGGREGATIONS[name](jnp.asarray(garbage, jnp.float32), jnp.asarray(mask), cfg)
    want = np_aggregate(name, per_token, mask, budget)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
    empty = grpo.AGGREGATIONS[name](jnp.asarray(garbage), jnp.zeros((7, 9), bool), cfg)
    assert float(empty) == 0.0


def test_dr_grpo_budget_shorter_than_responses_is_an_error():
    cfg = GRPOConfig(aggregation="seq_mean_token_sum_norm", max_response_tokens=4)
    with pytest.raises(ValueError, match="max_response_tokens=4"):
        grpo.AGGREGATIONS[cfg.aggregation](jnp.zeros((2, 5)), jnp.ones((2, 5), bool), cfg)


def test_register_aggregation():
    @grpo.register_aggregation("test_sum_only")
    def _sum(per_token, mask, cfg):
        return grpo.masked_sum(per_token, mask)

    try:
        logp, old, _, adv, mask = random_batch(7, extreme=False)
        cfg = GRPOConfig(aggregation="test_sum_only")
        loss, _ = grpo.grpo_loss(logp, old, adv, mask, cfg)
        ref_cfg = GRPOConfig(aggregation="token_mean")
        mean, _ = grpo.grpo_loss(logp, old, adv, mask, ref_cfg)
        np.testing.assert_allclose(float(loss), float(mean) * mask.sum(), rtol=1e-5)
        with pytest.raises(ValueError, match="already registered"):
            grpo.register_aggregation("test_sum_only")(_sum)
    finally:
        grpo.AGGREGATIONS.pop("test_sum_only")


# ----------------------------------------------------------------- full loss and metrics


@pytest.mark.parametrize("name", AGG_NAMES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_loss_matches_numpy(name, kl_coef, seed):
    logp, old, ref, adv, mask = random_batch(seed)
    cfg = GRPOConfig(aggregation=name, kl_coef=kl_coef, clip_low=0.2, clip_high=0.28)
    fn = jax.jit(grpo.grpo_loss, static_argnames="cfg")
    loss, metrics = fn(logp, old, adv, mask, cfg=cfg, ref_logp=ref)
    want_loss, want_metrics = np_grpo(logp, old, adv, mask, cfg, ref)
    np.testing.assert_allclose(float(loss), want_loss, rtol=2e-5, atol=1e-6)
    assert_metrics_close(metrics, want_metrics)
    assert want_metrics["clip_frac_low"] > 0 and want_metrics["clip_frac_high"] > 0
    assert want_metrics["ratio_max"] > 1e10  # the extreme ratios are really exercised


def test_grpo_loss_without_ref():
    logp, old, ref, adv, mask = random_batch(3)
    cfg = GRPOConfig()
    loss, metrics = grpo.grpo_loss(logp, old, adv, mask, cfg)
    assert "kl" not in metrics
    want_loss, want_metrics = np_grpo(logp, old, adv, mask, cfg)
    np.testing.assert_allclose(float(loss), want_loss, rtol=2e-5, atol=1e-6)
    assert_metrics_close(metrics, want_metrics)
    # A reference with kl_coef = 0 is only reported, never added to the loss.
    loss_ref, metrics_ref = grpo.grpo_loss(logp, old, adv, mask, cfg, ref_logp=ref)
    assert float(loss_ref) == float(loss) and float(metrics_ref["kl"]) > 0


def test_kl_without_ref_is_an_error_at_trace_time():
    logp, old, _, adv, mask = random_batch(4)
    cfg = GRPOConfig(kl_coef=0.05)
    with pytest.raises(ValueError, match="kl_coef=0.05"):
        jax.jit(grpo.grpo_loss, static_argnames="cfg")(logp, old, adv, mask, cfg=cfg)


def test_all_masked_batch_is_finite():
    logp, old, ref, adv, _ = random_batch(5)
    mask = np.zeros_like(logp, bool)
    for name in AGG_NAMES:
        cfg = GRPOConfig(aggregation=name, kl_coef=0.1)
        loss, metrics = grpo.grpo_loss(logp, old, adv, mask, cfg, ref_logp=ref)
        grad = jax.grad(lambda lp, c=cfg: grpo.grpo_loss(lp, old, adv, mask, c, ref)[0])(logp)
        assert float(loss) == 0.0
        assert all(np.isfinite(float(v)) for v in metrics.values())
        assert np.all(np.asarray(grad) == 0.0)


def test_masked_garbage_gives_finite_gradient():
    logp, old, ref, adv, mask = random_batch(6)
    logp = np.where(mask, logp, np.float32(-np.inf))  # even the current log-probs are garbage
    logp[~mask & (np.arange(logp.shape[1]) % 2 == 0)] = np.nan
    cfg = GRPOConfig(kl_coef=0.1)
    grad = jax.grad(lambda lp: grpo.grpo_loss(lp, old, adv, mask, cfg, ref)[0])(logp)
    grad = np.asarray(grad)
    assert np.all(np.isfinite(grad)) and np.all(grad[~mask] == 0.0)
    loss, metrics = grpo.grpo_loss(logp, old, adv, mask, cfg, ref)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())


def test_asymmetric_clip_bands():
    # Ratios on both sides of each band edge; clip_low=0.1 -> 0.9, clip_high=0.3 -> 1.3.
    ratios = np.array([0.7, 0.85, 0.95, 1.05, 1.2, 1.25, 1.35, 1.6], np.float32)
    old = np.zeros((2, 8), np.float32)
    logp = np.log(np.stack([ratios, ratios])).astype(np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.ones((2, 8), bool)
    cfg = GRPOConfig(clip_low=0.1, clip_high=0.3)
    (loss, metrics), grad = jax.value_and_grad(grpo.grpo_loss, has_aux=True)(
        jnp.asarray(logp), old, adv, mask, cfg
    )
    want_loss, want_metrics = np_grpo(logp, old, adv, mask, cfg)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    assert_metrics_close(metrics, want_metrics)
    assert want_metrics["clip_frac_high"] == 2 / 16  # A > 0 and ratio > 1.3
    assert want_metrics["clip_frac_low"] == 2 / 16  # A < 0 and ratio < 0.9
    # Zero gradient exactly where the clipped branch is active, nonzero elsewhere.
    clipped = np.stack([ratios > 1.3, ratios < 0.9])
    grad = np.asarray(grad)
    assert np.all(grad[clipped] == 0.0) and np.all(grad[~clipped] != 0.0)


def _np_weights(name, mask, budget=None):
    """d aggregate / d per_token[b, t], from the NumPy aggregation by unit perturbations."""
    w = np.zeros(mask.shape)
    base = np.zeros(mask.shape)
    for i, j in zip(*np.nonzero(mask)):
        e = base.copy()
        e[i, j] = 1.0
        w[i, j] = np_aggregate(name, e, mask, budget)  # aggregation is linear
    return w


@pytest.mark.parametrize("name", AGG_NAMES)
def test_first_iteration_gradient_is_vanilla_policy_gradient(name):
    rng = np.random.default_rng(8)
    b, t, v = 4, 5, 7
    logits = jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    mask = grpo.response_mask(jnp.array([5, 0, 2, 4]), t)
    adv = jnp.asarray(rng.normal(size=b), jnp.float32)
    cfg = GRPOConfig(aggregation=name)
    old = grpo.token_logprobs(logits, targets)  # old policy == current policy

    def grpo_fn(lg):
        return grpo.grpo_loss(grpo.token_logprobs(lg, targets), old, adv, mask, cfg)

    (loss, metrics), grad = jax.value_and_grad(grpo_fn, has_aux=True)(logits)
    weights = jnp.asarray(_np_weights(name, np.asarray(mask)), jnp.float32)

    def vanilla(lg):  # REINFORCE: -sum_t w_t * A * log pi(token_t)
        return -jnp.sum(weights * adv[:, None] * grpo.token_logprobs(lg, targets))

    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(vanilla)(logits)), atol=1e-6)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0)
    assert float(metrics["clip_frac"]) == 0.0
    assert float(jnp.abs(grad).max()) > 1e-3


@pytest.mark.parametrize("name", AGG_NAMES)
def test_gradient_wrt_logits_matches_finite_differences(name):
    rng = np.random.default_rng(9)
    b, t, v, temp = 4, 3, 5, 1.3
    logits = rng.normal(size=(b, t, v))
    targets = rng.integers(0, v, size=(b, t))
    mask = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], bool)
    adv = np.array([1.2, -0.7, 0.4, -1.5])
    lp0, _ = np_logp_entropy(logits, targets, temp)
    # Log-ratios well inside or well outside [log 0.8, log 1.2]: no kink within the FD step,
    # and both clipped (zero-gradient) and unclipped tokens occur.
    old = lp0 - rng.choice([-0.5, -0.05, 0.05, 0.5], size=(b, t))
    ref = lp0 + rng.normal(0.0, 0.3, size=(b, t))
    cfg = GRPOConfig(aggregation=name, kl_coef=0.2, max_response_tokens=4)

    def np_loss(lg):
        lp, _ = np_logp_entropy(lg, targets, temp)
        return np_grpo(lp, old, adv, mask, cfg, ref)[0]

    fd = np.zeros_like(logits)
    h = 1e-5
    for idx in np.ndindex(logits.shape):
        up, dn = logits.copy(), logits.copy()
        up[idx] += h
        dn[idx] -= h
        fd[idx] = (np_loss(up) - np_loss(dn)) / (2 * h)

    f32 = lambda x: jnp.asarray(x, jnp.float32)

    def jax_loss(lg):
        lp = grpo.token_logprobs(lg, jnp.asarray(targets), temp)
        return grpo.grpo_loss(lp, f32(old), f32(adv), jnp.asarray(mask), cfg, f32(ref))[0]

    grad = np.asarray(jax.grad(jax_loss)(f32(logits)))
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=2e-5)
    assert np.abs(fd).max() > 1e-2
    assert np.all(grad[2] == 0.0)  # empty sequence


# ----------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    "field,value",
    [
        ("group_size", 1),
        ("group_size", 2.0),
        ("clip_low", 0.0),
        ("clip_low", 1.0),
        ("clip_high", -0.1),
        ("kl_coef", -1e-3),
        ("aggregation", "sequence_sum"),
        ("scale_by_std", "yes"),
        ("std_eps", 0.0),
        ("std_ddof", 8),
        ("max_response_tokens", 0),
        ("temperature", 0.0),
    ],
)
def test_validate_names_field_and_value(field, value):
    cfg = dataclasses.replace(GRPOConfig(), **{field: value})
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}={value!r}") as err:
        cfg.validate()
    assert "allowed" in str(err.value)
    if field == "aggregation":
        for name in AGG_NAMES:
            assert name in str(err.value)


def test_defaults_are_valid_and_hashable():
    cfg = GRPOConfig().validate()
    assert cfg.group_size == 8 and cfg.clip_low == cfg.clip_high == 0.2 and cfg.kl_coef == 0.0
    assert cfg.std_ddof == 0 and cfg.aggregation == "token_mean" and cfg.temperature == 1.0
    assert hash(cfg) == hash(GRPOConfig())


def test_sharded_batch_gives_the_same_loss():
    # The trainer shards the batch axis; aggregations must still be global sums/means.
    logp, old, ref, adv, mask = random_batch(10, b=8)
    mesh = jax.make_mesh((8,), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    sharded = [jax.device_put(x, rows) for x in (logp, old, adv, mask, ref)]
    for name in AGG_NAMES:
        cfg = GRPOConfig(aggregation=name, kl_coef=0.1)
        fn = jax.jit(grpo.grpo_loss, static_argnames="cfg")
        loss, metrics = fn(*sharded[:4], cfg=cfg, ref_logp=sharded[4])
        want_loss, want_metrics = np_grpo(logp, old, adv, mask, cfg, ref)
        np.testing.assert_allclose(float(loss), want_loss, rtol=2e-5, atol=1e-6)
        assert_metrics_close(metrics, want_metrics)
