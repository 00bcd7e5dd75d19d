"""Pure-Python scoring (NumPy-free, no JAX): answer text + puzzle -> reward, for any trainer.

`score` parses an answer (`answer.parse_answer`), simulates it (`simulate.simulate`) and applies
the reward definition (`RewardConfig`, `combine`: the one formula the jitted `reward.rewards`
uses too). `compute_score` is verl's custom reward function, `reward` a TRL reward function.
"""

# No `from __future__ import annotations`: verl loads a reward file by path, and a loader that
# does not register the module in sys.modules leaves dataclasses unable to read string annotations.
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from mapfjax.checks import did_you_mean
from mapfjax.env import answer, simulate

DATA_SOURCE = "mapf_frozenlake"  # verl's `data_source` column for this environment
PARSE_ERROR = "parse_error"  # the failure label of an answer that does not parse


MAX_AGENTS = 5  # the prompt's start symbols S s A B C
# Rewards beyond this size say a typo (1e300) more often than a scale: GRPO normalises them.
MAX_REWARD = 1e6


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
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or abs(v) > MAX_REWARD:
                raise ValueError(
                    f"reward.{f.name} = {v!r}; allowed: a finite number in "
                    f"[-{MAX_REWARD:g}, {MAX_REWARD:g}]"
                )


def combine(valid, optimal, parse_error, config: RewardConfig, agent_share=0.0):
    """The reward formula on 0/1 indicators (Python floats or arrays of one shape [B]):
    valid, optimal, parse_error; agent_share is `agent_success` (used when agent_credit != 0)."""
    return (
        valid * (config.valid_reward + config.optimal_bonus * optimal)
        + (1.0 - valid) * config.invalid_reward
        - parse_error * config.format_penalty
        + ((1.0 - valid) * config.agent_credit * agent_share if config.agent_credit else 0.0)
    )


DEFAULT_REWARD = RewardConfig()


class Puzzle(NamedTuple):
    """The puzzle a score needs, from plain JSON data: grid rows of 'F'/'H', one (row, col)
    start and goal per agent, and the oracle's optimal sum-of-costs (None when unknown)."""

    grid: tuple[str, ...]
    starts: tuple[tuple[int, int], ...]
    goals: tuple[tuple[int, int], ...]
    optimal_soc: int | None = None


class Score(NamedTuple):
    """One scored answer: reward, valid, optimal (False without an optimal_soc), failure (None
    or a name of `types.FAILURE_NAMES`), reason (why it did not parse), soc (None if invalid)."""

    reward: float
    valid: bool
    optimal: bool
    failure: str | None
    reason: str | None
    soc: int | None


def _cells(value, field: str) -> tuple[tuple[int, int], ...]:
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(c, (list, tuple))
        and len(c) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in c)
        for c in value
    )
    if not ok or not value:
        allowed = "a non-empty list of [row, col] integer pairs"
        raise ValueError(f"ground truth: field {field!r} = {value!r:.80}; allowed: {allowed}")
    return tuple((int(r), int(c)) for r, c in value)


def puzzle(ground_truth) -> Puzzle:
    """The Puzzle of a ground truth: a JSON string or a mapping with `grid`, `starts`, `goals`
    and optional `optimal_soc` (a dataset entry's metadata), or a dataset entry itself (its
    `metadata`). Raises ValueError naming the field that is missing or malformed."""
    if isinstance(ground_truth, Puzzle):
        return ground_truth
    if isinstance(ground_truth, (str, bytes)):
        try:
            ground_truth = json.loads(ground_truth)
        except (ValueError, RecursionError) as e:
            raise ValueError(
                f"ground truth is not JSON ({e!s:.80}): {ground_truth!r:.80}"
            ) from None
    if isinstance(ground_truth, Mapping) and "metadata" in ground_truth:
        ground_truth = ground_truth["metadata"]
    if not isinstance(ground_truth, Mapping):
        raise ValueError(
            f"ground truth is a {type(ground_truth).__name__}; allowed: a JSON object with "
            "'grid', 'starts', 'goals' (and 'optimal_soc')"
        )
    for field in ("grid", "starts", "goals"):
        if field not in ground_truth:
            raise ValueError(f"ground truth: field {field!r} is missing")
    grid = ground_truth["grid"]
    if (
        not isinstance(grid, (list, tuple))
        or not grid
        or not all(isinstance(r, str) and r and set(r) <= {"F", "H"} for r in grid)
        or len({len(r) for r in grid}) != 1
    ):
        raise ValueError(f"ground truth: field 'grid' = {grid!r:.80}; allowed: equal rows of F/H")
    starts, goals = _cells(ground_truth["starts"], "starts"), _cells(ground_truth["goals"], "goals")
    if len(starts) != len(goals):
        raise ValueError(f"ground truth: {len(starts)} starts but {len(goals)} goals")
    if len(starts) > MAX_AGENTS:
        raise ValueError(f"ground truth: {len(starts)} agents; allowed: 1 to {MAX_AGENTS}")
    for field, cells in (("starts", starts), ("goals", goals)):
        for r, c in cells:
            if not (0 <= r < len(grid) and 0 <= c < len(grid[0])):
                raise ValueError(
                    f"ground truth: field {field!r} has {[r, c]}, off the {len(grid)}x"
                    f"{len(grid[0])} grid; allowed: cells [row, col] on the grid"
                )
            if grid[r][c] == "H":
                raise ValueError(f"ground truth: field {field!r} has {[r, c]} on a hole")
        if len(set(cells)) != len(cells):
            raise ValueError(f"ground truth: field {field!r} = {cells!r:.80}; allowed: "
                             "distinct cells, one per agent")  # fmt: skip
    soc = ground_truth.get("optimal_soc")
    if soc is not None and (not isinstance(soc, int) or isinstance(soc, bool) or soc < 0):
        raise ValueError(f"ground truth: field 'optimal_soc' = {soc!r}; allowed: an int >= 0")
    return Puzzle(tuple(grid), starts, goals, soc)


def agent_success(p: Puzzle, plans: Sequence[Sequence[int]] | None) -> float:
    """The share of agents whose own plan, simulated with the other agents removed, is legal,
    avoids holes and ends on its goal; 0 for an unparseable answer (`reward.agent_success`)."""
    if plans is None:
        return 0.0
    alone = [
        simulate.simulate(Puzzle(p.grid, (s,), (g,)), [plans[i]])["valid"]
        for i, (s, g) in enumerate(zip(p.starts, p.goals))
    ]
    return sum(alone) / len(alone)


def score(
    text: Any,
    ground_truth,
    config: RewardConfig = DEFAULT_REWARD,
    max_steps: int = answer.MAX_STEPS,
) -> Score:
    """Score one answer against one puzzle (see `puzzle` for the ground truth's forms).

    Never raises on the answer: one that is not a string (None, bytes, a dict, a list of chat
    messages, a number) is a parse_error whose reason names its type. A malformed ground truth
    raises ValueError (a data error, not the model's).
    """
    p = puzzle(ground_truth)
    if isinstance(text, str):
        plans, reason = answer.parse_answer(text, len(p.starts), max_steps)
    else:
        plans, reason = None, f"answer is a {type(text).__name__}, expected a string"
    result = simulate.simulate(p, plans)
    valid = result["valid"]
    optimal = valid and p.optimal_soc is not None and result["soc"] == p.optimal_soc
    failure = result["failure"]
    share = agent_success(p, plans) if config.agent_credit else 0.0
    value = combine(float(valid), float(optimal), float(failure == PARSE_ERROR), config, share)
    return Score(float(value), valid, optimal, failure, reason, result["soc"])


def score_answer(answer_text: Any, entry: Mapping) -> float:
    """Reasoning Gym's scorer: the reward (default `RewardConfig`) of an answer to a dataset
    entry (a dict whose `metadata` holds the puzzle)."""
    return score(answer_text, entry).reward


_REWARD_FIELDS = tuple(f.name for f in dataclasses.fields(RewardConfig))


def _reward_config(kwargs: Mapping) -> RewardConfig:
    unknown = sorted(set(kwargs) - set(_REWARD_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown reward setting(s) {unknown}; allowed: {list(_REWARD_FIELDS)}"
            + did_you_mean(unknown, _REWARD_FIELDS)
        )
    return RewardConfig(**kwargs)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs):
    """verl's custom reward function (`custom_reward_function.name=compute_score`): the reward
    of `solution_str` for the puzzle in `ground_truth` (the `reward_model.ground_truth` column).
    `reward_kwargs` (verl's `custom_reward_function.reward_kwargs`) are RewardConfig fields."""
    del data_source, extra_info  # one environment; the puzzle is all in ground_truth
    return score(solution_str, ground_truth, _reward_config(reward_kwargs)).reward


def completion_text(completion: Any) -> Any:
    """A completion as text: a string as it is, a list of chat messages as the content of its
    last assistant message (TRL's conversational format); anything else unchanged, for `score`
    to reject."""
    if isinstance(completion, (list, tuple)) and completion:
        said = [m for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"]
        last = (said or list(completion))[-1]
        if isinstance(last, Mapping) and "content" in last:
            return last["content"]
    return completion


# Dataset columns that hold the puzzle, tried in order: verl's export, a plain column, Reasoning
# Gym's entries.
_GROUND_TRUTH_COLUMNS = ("reward_model", "ground_truth", "metadata")


def _ground_truth_of(reward_model) -> Any:
    """verl's `reward_model` column entry ({"style": ..., "ground_truth": ...}, or its JSON)
    -> its ground truth; ValueError naming the field otherwise."""
    if isinstance(reward_model, (str, bytes)):
        try:
            reward_model = json.loads(reward_model)
        except (ValueError, RecursionError):
            pass
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise ValueError(
            f"column 'reward_model' = {reward_model!r:.80}; allowed: an object with a "
            "'ground_truth' field (as MapfDataset.write exports it)"
        )
    return reward_model["ground_truth"]


def reward_function(config: RewardConfig = DEFAULT_REWARD):
    """A TRL reward function (GRPOTrainer(reward_funcs=...)) with these reward settings."""

    def mapf_reward(completions, **columns) -> list[float]:
        """TRL calls this with the completions (strings, or lists of chat messages) and every
        other dataset column as a keyword list, one item per completion."""
        column = next((c for c in _GROUND_TRUTH_COLUMNS if c in columns), None)
        if column is None:
            raise KeyError(
                f"no ground-truth column among {sorted(columns)}; expected one of "
                f"{list(_GROUND_TRUTH_COLUMNS)} (export the dataset with MapfDataset.write)"
            )
        truths = columns[column]
        if column == "reward_model":
            truths = [_ground_truth_of(t) for t in truths]
        return [
            score(completion_text(c), t, config).reward
            for c, t in zip(completions, truths, strict=True)
        ]

    return mapf_reward


reward = reward_function()
reward.__doc__ = "TRL reward function with the default RewardConfig (see `reward_function`)."
