"""MAPF-FrozenLake: types, generator, jitted dynamics and verifier, text interface, oracle, I/O.

Names are imported on first use, so that the pure-Python scorer (`mapfjax.env.score`) loads
without JAX.
"""

import importlib

# public name -> the submodule that defines it
_EXPORTS = {
    "config": ("ConfigError", "default_config", "project", "validate"),
    "dynamics": ("EnvState", "Verdict", "reset", "step", "verdict_rows", "verify"),
    "generator": ("Generated", "GenerationReport", "generate"),
    "io": ("JsonlError", "load_answers", "load_instances", "save_instances"),
    "reward": ("RewardConfig", "rewards"),
    "text": ("ParsedAnswers", "parse_answers", "render_answer", "render_prompt"),
    "types": (
        "ACTION_NAMES",
        "FAILURE_NAMES",
        "Instance",
        "Problem",
        "ProblemError",
        "to_instances",
        "to_problems",
    ),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    """A public name from its submodule, or a submodule (`env.dynamics`), imported on first use."""
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
