"""Learning-rate schedules (never 0, per-cycle restarts), the weight-decay mask, and the
momentum optimiser against a NumPy transcription of its formula."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl.optim import OptimConfig, decay_mask, lr_schedule, make_optimizer


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
@pytest.mark.parametrize("warmup", [0, 1, 5])
def test_no_update_runs_at_lr_zero(schedule, warmup):
    cfg = OptimConfig(lr=3e-4, warmup_steps=warmup, total_steps=40, schedule=schedule)
    lrs = np.array([float(lr_schedule(cfg)(k)) for k in range(40)])
    assert (lrs > 0).all() and lrs.max() == pytest.approx(3e-4)
    ramp = 3e-4 * np.arange(1, warmup + 1) / (warmup + 1)
    np.testing.assert_allclose(lrs[:warmup], ramp, rtol=1e-6)
    if schedule == "constant":
        np.testing.assert_allclose(lrs[warmup:], 3e-4, rtol=1e-6)
    else:  # cosine: non-increasing after the warmup
        assert (np.diff(lrs[warmup:]) <= 1e-12).all()


def test_cycles_restart_the_schedule_every_round():
    cfg = OptimConfig(lr=1.0, warmup_steps=2, schedule="constant", cycle_steps=5, total_steps=9)
    lrs = [round(float(lr_schedule(cfg)(k)), 4) for k in range(10)]
    assert lrs == [0.3333, 0.6667, 1.0, 1.0, 1.0] * 2
    with pytest.raises(ValueError, match="schedule='linear'"):
        OptimConfig(schedule="linear").validate()


def test_weight_decay_skips_norms_and_embeddings():
    params = nnx.state(
        Qwen3(PRESETS["tiny"], dtype=jnp.float32, param_dtype=jnp.float32), nnx.Param
    )
    mask = dict(
        (jax.tree_util.keystr(k), v)
        for k, v in jax.tree_util.tree_leaves_with_path(decay_mask(params))
    )
    decayed = {k for k, v in mask.items() if v}
    assert decayed and all("norm" not in k and "embedding" not in k for k in decayed)
    # Stacked per-layer norm scales are [layers, d]: 2-D, yet never decayed.
    assert not mask["['layers']['input_norm']['scale'].value"]
    assert mask["['layers']['mlp']['up'].value"]
    # One AdamW step with a zero gradient: only decayed parameters move.
    tx = make_optimizer(OptimConfig(lr=0.1, weight_decay=0.5, grad_clip=0.0))
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
    assert jax.tree.leaves(moved) == jax.tree.leaves(decay_mask(params))


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_momentum_matches_numpy_formula(grad_clip):
    """m <- b1 m + (1 - b1) g (g clipped to global norm grad_clip), p <- p - lr_t (m / (1 -
    b1^t) + wd p) on decayed matrices, p - lr_t m / (1 - b1^t) elsewhere."""
    rng = np.random.default_rng(0)
    params = {"mlp": rng.normal(size=(3, 4)), "final_norm": rng.normal(size=(4,))}
    cfg = OptimConfig(
        lr=0.2, optimizer="momentum", b1=0.8, weight_decay=0.1, grad_clip=grad_clip,
        warmup_steps=1, total_steps=5, schedule="constant",
    )  # fmt: skip
    tx = make_optimizer(cfg)
    state = tx.init(jax.tree.map(jnp.asarray, params))
    p = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    ref = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    for t in range(1, 4):
        g = {k: rng.normal(size=v.shape) for k, v in params.items()}
        norm = np.sqrt(sum(np.sum(v**2) for v in g.values()))
        scale = min(1.0, grad_clip / norm) if grad_clip > 0 else 1.0
        lr = float(lr_schedule(cfg)(t - 1))
        for k in ref:
            m[k] = 0.8 * m[k] + 0.2 * scale * g[k]
            decay = 0.1 * ref[k] if k == "mlp" else 0.0
            ref[k] = ref[k] - lr * (m[k] / (1 - 0.8**t) + decay)
        updates, state = tx.update({k: jnp.asarray(v, jnp.float32) for k, v in g.items()}, state, p)
        p = optax.apply_updates(p, updates)
        for k in ref:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} step {t}")


def test_an_unknown_optimizer_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"optimizer='sgd'.*'adamw', 'momentum'"):
        OptimConfig(optimizer="sgd").validate()
