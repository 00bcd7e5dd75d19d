"""Learning-rate schedules (never 0, per-cycle restarts) and the weight-decay mask."""

import jax
import jax.numpy as jnp
import numpy as np
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
