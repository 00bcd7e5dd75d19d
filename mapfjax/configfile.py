"""Python config files (ml-collections `get_config(arg)` modules) loaded by path, for configs that
compose other config files and for the sweep driver."""

from __future__ import annotations

import importlib.util
import pathlib
import types

# The directory holding the mapfjax package: the repository root in a source checkout (and an
# editable install), site-packages when mapfjax is installed from a wheel.
ROOT = pathlib.Path(__file__).resolve().parents[1]


def resolve(path) -> pathlib.Path:
    """An absolute path as it is; a relative one (e.g. 'configs/tiny_cpu.py') under ROOT when it
    exists there, else under the working directory: with a wheel install, configs/ and launch/
    are found in the checkout the command runs from."""
    path = pathlib.Path(path)
    if path.is_absolute():
        return path
    return ROOT / path if (ROOT / path).exists() else pathlib.Path.cwd() / path


def load_module(path) -> types.ModuleType:
    """Execute the Python file `path` (absolute, or relative as in `resolve`) as a fresh
    module; raises FileNotFoundError naming the file when it does not exist and ValueError
    when it is not a .py file."""
    full = resolve(path)
    if not full.is_file():
        where = "" if pathlib.Path(path).is_absolute() else f" (looked under {ROOT} and the cwd)"
        raise FileNotFoundError(f"config file {str(full)!r} does not exist{where}")
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
