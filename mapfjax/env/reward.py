"""Reward as a pure, configurable function of a `Verdict` [ours: the paper does not publish one]."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from mapfjax.env import dynamics, types
from mapfjax.env.dynamics import Verdict


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """valid_reward for a valid plan, + optimal_bonus when it is also optimal; invalid plans
    get invalid_reward (+ agent_credit x the share of their agents whose own path is legal and
    ends on its goal, `agent_success`: a shaped reward, off by default), and unparseable
    answers invalid_reward - format_penalty."""

    valid_reward: float = 1.0
    optimal_bonus: float = 0.5
    invalid_reward: float = 0.0
    format_penalty: float = 0.0
    agent_credit: float = 0.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"reward.{f.name} = {v!r}; allowed: a finite number")


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
    verdict: Verdict, config: RewardConfig = RewardConfig(), agent_share=None
) -> jnp.ndarray:
    """float32 [B] rewards for a batch of verdicts; agent_share [B] (`agent_success`) is
    needed when config.agent_credit > 0."""
    if config.agent_credit and agent_share is None:
        raise ValueError("reward.agent_credit > 0 needs agent_share (reward.agent_success)")
    valid = verdict.valid.astype(jnp.float32)
    optimal = verdict.optimal.astype(jnp.float32)
    parse_error = (verdict.failure == types.PARSE_ERROR).astype(jnp.float32)
    return (
        valid * (config.valid_reward + config.optimal_bonus * optimal)
        + (1.0 - valid) * config.invalid_reward
        - parse_error * config.format_penalty
        + (
            (1.0 - valid) * config.agent_credit * jnp.asarray(agent_share, jnp.float32)
            if config.agent_credit
            else 0.0
        )
    )
