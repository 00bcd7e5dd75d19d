"""Reward as a pure, configurable function of a `Verdict` [ours: the paper does not publish one]."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from mapfjax.env import types
from mapfjax.env.dynamics import Verdict


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """valid_reward for a valid plan, + optimal_bonus when it is also optimal; invalid plans
    get invalid_reward, and unparseable answers invalid_reward - format_penalty."""

    valid_reward: float = 1.0
    optimal_bonus: float = 0.5
    invalid_reward: float = 0.0
    format_penalty: float = 0.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"reward.{f.name} = {v!r}; allowed: a finite number")


def rewards(verdict: Verdict, config: RewardConfig = RewardConfig()) -> jnp.ndarray:
    """float32 [B] rewards for a batch of verdicts."""
    valid = verdict.valid.astype(jnp.float32)
    optimal = verdict.optimal.astype(jnp.float32)
    parse_error = (verdict.failure == types.PARSE_ERROR).astype(jnp.float32)
    return (
        valid * (config.valid_reward + config.optimal_bonus * optimal)
        + (1.0 - valid) * config.invalid_reward
        - parse_error * config.format_penalty
    )
