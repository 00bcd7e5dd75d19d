"""What the go / no-go arms change in a GRPO phase (`driver.PhaseHooks`), named in an arm's
run config as `phase_hooks.factory = "projects.go_no_go.hooks:arm"` with the options below:

- screen: 0 draws the sampled puzzles in the problem stream's order; s >= 1 takes
  ceil(s x drawn_per_step) candidates from the stream each step, decodes each greedily with
  the current weights and samples the groups on those whose greedy plan fails first (the
  decode counts in the step's time; logged as screened, screen_failed, screen_seconds);
- greedy_member: each group's first member is the greedy answer
  (`rollout.SamplingConfig.greedy_member`);
- placebo: each group's advantages shuffled among its samples: updates of GRPO's size and
  noise that carry no information on which sample was valid (a control arm);
- max_minutes: 0 runs every step; m > 0 ends the phase after the step past which one more
  step as long would take it beyond m minutes (its logged seconds, a resumed phase's earlier
  steps included): a budget in time rather than updates; the first step always runs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from mapfjax.checks import is_finite_real, require
from mapfjax.env.types import Problem
from mapfjax.rl import driver, rollout

FACTORY = "projects.go_no_go.hooks:arm"


def screen_problems(
    policy, tokenizer, candidates: Sequence[Problem], n: int, sampling, reward_cfg
) -> tuple[list[Problem], int]:
    """(`n` problems, how many candidates failed): each candidate answered greedily by
    `policy` (the sampling settings at temperature 0), those whose greedy plan is not valid
    first, then the others, each in drawn order."""
    if n > len(candidates):
        raise ValueError(f"{n} problems wanted from {len(candidates)} candidates")
    greedy = dataclasses.replace(sampling, temperature=0.0)
    model = rollout.policy_model(policy)
    samples = rollout.sample(model, tokenizer, candidates, 1, greedy, None)
    verdict, _ = rollout.score(candidates, 1, samples.texts, reward_cfg)
    valid = np.asarray(verdict.valid, bool)
    order = np.concatenate([np.flatnonzero(~valid), np.flatnonzero(valid)])[:n]
    return [candidates[i] for i in order], int((~valid).sum())


def shuffle_advantages(batch, rng: np.random.Generator, g: int):
    """`batch` with each group's advantages permuted among its `g` samples (one permutation per
    group from `rng`). Each group keeps its set of advantages (zero mean, the same spread), so
    the update has GRPO's size and noise, but which sample gets which advantage no longer
    depends on its reward."""
    adv = np.asarray(batch.advantages, np.float32)
    groups = adv.reshape(-1, g)
    shuffled = np.stack([row[rng.permutation(g)] for row in groups])
    return batch.replace(advantages=shuffled.reshape(adv.shape))


def over_budget(elapsed: float, last: float, max_minutes: float) -> bool:
    """Whether one more step as long as the `last` one would take a phase that has run
    `elapsed` seconds beyond `max_minutes` (0: no budget)."""
    return max_minutes > 0 and elapsed + last > 60 * max_minutes


def screened_draw(screen: float):
    """A `PhaseHooks.draw` that screens ceil(screen x drawn_per_step) candidates greedily."""

    def draw(trainer, tokenizer, problems, step: int, settings, seed):
        t0 = time.perf_counter()
        n = settings.drawn_per_step
        candidates = driver.step_problems(problems, math.ceil(screen * n), step, [*seed, 1])
        drawn, failed = screen_problems(
            trainer, tokenizer, candidates, n, settings.sampling, settings.reward
        )
        seconds = time.perf_counter() - t0
        return drawn, {"screened": len(candidates), "screen_failed": failed,
                       "screen_seconds": seconds}  # fmt: skip

    return draw


def placebo_batch(batch, settings, step_seed):
    """A `PhaseHooks.batch`: the placebo arm's shuffled advantages (the same step shuffles the
    same way on a resume)."""
    return shuffle_advantages(batch, np.random.default_rng([*step_seed, 2]), settings.group_size)


def arm(
    screen: float = 0.0,
    greedy_member: bool = False,
    placebo: bool = False,
    max_minutes: float = 0.0,
) -> driver.PhaseHooks:
    """The hooks of an arm with these options (see the module docstring); ValueError naming
    the option, its value and what is allowed."""
    ok = is_finite_real(screen) and (screen == 0 or screen >= 1)
    require("phase_hooks.screen", screen, ok, "0 (off) or a number >= 1")
    require("phase_hooks.greedy_member", greedy_member, isinstance(greedy_member, bool),
            "True or False")  # fmt: skip
    require("phase_hooks.placebo", placebo, isinstance(placebo, bool), "True or False")
    ok = is_finite_real(max_minutes) and (max_minutes == 0 or max_minutes >= 1 / 60)
    require("phase_hooks.max_minutes", max_minutes, ok,
            "0 (no time budget) or at least a second (1/60 minutes)")  # fmt: skip
    on = [
        *([f"screen {screen:g}"] if screen else []),
        *(["greedy member"] if greedy_member else []),
        *(["placebo"] if placebo else []),
        *([f"time budget of {max_minutes:g} minutes"] if max_minutes else []),
    ]
    return driver.PhaseHooks(
        draw=screened_draw(screen) if screen else driver.PhaseHooks.draw,
        sampling=(lambda s: dataclasses.replace(s, greedy_member=True)) if greedy_member else None,
        batch=placebo_batch if placebo else None,
        stop=(lambda elapsed, last: over_budget(elapsed, last, max_minutes))
        if max_minutes
        else None,
        name=", ".join(on),
    )
