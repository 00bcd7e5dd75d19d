"""MAPF-FrozenLake: types, generator, jitted dynamics and verifier, text interface, oracle, I/O."""

from mapfjax.env.config import ConfigError, default_config, project, validate
from mapfjax.env.dynamics import EnvState, Verdict, reset, step, verdict_rows, verify
from mapfjax.env.generator import Generated, GenerationReport, generate
from mapfjax.env.io import JsonlError, load_answers, load_instances, save_instances
from mapfjax.env.reward import RewardConfig, rewards
from mapfjax.env.text import ParsedAnswers, parse_answers, render_answer, render_prompt
from mapfjax.env.types import (
    ACTION_NAMES,
    FAILURE_NAMES,
    Instance,
    Problem,
    ProblemError,
    to_instances,
    to_problems,
)

__all__ = [
    "ACTION_NAMES",
    "FAILURE_NAMES",
    "ConfigError",
    "EnvState",
    "Generated",
    "GenerationReport",
    "Instance",
    "JsonlError",
    "ParsedAnswers",
    "Problem",
    "ProblemError",
    "RewardConfig",
    "Verdict",
    "default_config",
    "generate",
    "load_answers",
    "load_instances",
    "parse_answers",
    "project",
    "render_answer",
    "render_prompt",
    "reset",
    "rewards",
    "save_instances",
    "step",
    "to_instances",
    "to_problems",
    "validate",
    "verdict_rows",
    "verify",
]
