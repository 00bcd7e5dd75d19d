"""Python config files (ml-collections `get_config(arg)` modules) loaded by path, for configs that
compose other config files and for the sweep driver."""

from __future__ import annotations

import importlib.util
import pathlib
import types

# The repository root: relative config paths are resolved against it.
ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_module(path) -> types.ModuleType:
    """Execute the Python file `path` (absolute, or relative to the repository root) as a
    fresh module; raises FileNotFoundError naming the file when it does not exist and
    ValueError when it is not a .py file."""
    full = pathlib.Path(path)
    full = full if full.is_absolute() else ROOT / full
    if not full.is_file():
        raise FileNotFoundError(f"config file {str(full)!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"mapfjax_config_{full.stem}", full)
    if spec is None:  # not a Python source file: importlib has no loader for it
        raise ValueError(f"config file {str(full)!r}: not loadable as Python (allowed: a .py file)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(path, *arg):
    """`get_config(*arg)` of the config file `path` (see `load_module`)."""
    module = load_module(path)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"config file {str(path)!r} defines no get_config(arg)")
    return module.get_config(*arg)
