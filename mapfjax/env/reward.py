"""Reward as a pure, configurable function of a `Verdict` [ours: the paper does not publish one].

The formula and its settings (`RewardConfig`, `combine`) live in score.py, shared with the
pure-Python scorer."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mapfjax.env import dynamics, types
from mapfjax.env.dynamics import Verdict
from mapfjax.env.score import DEFAULT_REWARD, RewardConfig, combine

__all__ = ["RewardConfig", "agent_success", "rewards"]  # RewardConfig lives in score.py


def agent_success(instances, parsed) -> np.ndarray:
    """float64 [B]: the share of each answer's agents whose own plan, checked alone (the other
    agents removed, so no conflicts), is legal, avoids holes and ends on its goal; 0 for an
    unparseable answer. instances: a batch; parsed: `text.parse_answers` output."""
    active = np.asarray(instances.agent_mask)
    hits = np.zeros(active.shape, bool)
    for i in range(active.shape[1]):
        alone = active & (np.arange(active.shape[1]) == i)[None, :]
        if alone.any():
            v = dynamics.verify(instances.replace(agent_mask=alone), parsed)
            hits[:, i] = np.asarray(v.valid) & alone[:, i]
    share = hits.sum(1) / np.maximum(active.sum(1), 1)
    return share * np.asarray(parsed.ok)


def rewards(
    verdict: Verdict, config: RewardConfig = DEFAULT_REWARD, agent_share=None
) -> jnp.ndarray:
    """float32 [B] rewards for a batch of verdicts; agent_share [B] (`agent_success`) is
    needed when config.agent_credit > 0."""
    if config.agent_credit and agent_share is None:
        raise ValueError("reward.agent_credit > 0 needs agent_share (reward.agent_success)")
    valid = verdict.valid.astype(jnp.float32)
    optimal = verdict.optimal.astype(jnp.float32)
    parse_error = (verdict.failure == types.PARSE_ERROR).astype(jnp.float32)
    share = jnp.asarray(agent_share, jnp.float32) if config.agent_credit else 0.0
    return combine(valid, optimal, parse_error, config, share)
