"""Python config files (ml-collections `get_config(arg)` modules) loaded by path, for configs that
compose other config files and for the sweep driver."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import types

import ml_collections

from mapfjax.checks import did_you_mean

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


def load_object(spec: str, key: str):
    """The object a config names as "package.module:attribute" (an experiment's extension,
    e.g. "projects.go_no_go.hooks:arm"), imported from the installed packages or from the
    checkout root or the working directory; ValueError naming `key`, the value and what is
    allowed when it is malformed or does not resolve."""
    module_name, sep, attr = str(spec).partition(":")
    allowed = "'package.module:attribute' importable from the checkout or the working directory"
    if not sep or not module_name or not all(a.isidentifier() for a in attr.split(".")):
        raise ValueError(f"{key} = {spec!r}; allowed: {allowed}")
    for root in (str(ROOT), str(pathlib.Path.cwd())):
        if root not in sys.path:
            sys.path.append(root)  # after the installed packages: they win
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{key} = {spec!r}: {e}; allowed: {allowed}") from None
    found = module
    for part in attr.split("."):  # "module:Class.method" too
        if not hasattr(found, part):
            raise ValueError(f"{key} = {spec!r}: module {module_name!r} has no {attr!r}")
        found = getattr(found, part)
    return found


def get_config(path, *arg):
    """`get_config(*arg)` of the config file `path` (see `load_module`)."""
    module = load_module(path)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"config file {str(path)!r} defines no get_config(arg)")
    return module.get_config(*arg)


def key_path(cfg: ml_collections.ConfigDict, dotted: str) -> tuple[ml_collections.ConfigDict, str]:
    """(the ConfigDict holding it, its last part) of a dotted key such as 'train.group_size';
    ValueError naming the first part that is not there, the keys allowed at that level and the
    closest of them to a typo."""
    node, parts = cfg, dotted.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            allowed = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            where = ".".join(parts[:i]) or "<top>"
            hint = did_you_mean([part], allowed)
            raise ValueError(f"no key {part!r} under {where}; allowed: {allowed}{hint}")
        if i < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def _bad_override(argv, flag: str) -> str | None:
    """The first --<flag>.KEY=... of argv whose KEY the config file lacks, as a message."""
    args = list(argv[1:])
    spec = None
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            spec = a.split("=", 1)[1]
        elif a == f"--{flag}" and i + 1 < len(args):
            spec = args[i + 1]
    if spec is None:
        return None
    path, _, arg = spec.partition(":")
    try:
        cfg = get_config(path, arg) if arg else get_config(path)
    except Exception:  # the file itself is broken: absl's own message says so
        return None
    for a in args:
        if a.startswith(f"--{flag}."):
            key = a[len(flag) + 3 :].split("=", 1)[0]
            try:
                key_path(cfg, key)
            except ValueError as e:
                return f"--{flag}.{key}: {path}{':' + arg if arg else ''} has {e}"
    return None


def _check_config_spec(argv, flag: str) -> None:
    """Load the `--flag=path[:arg]` config file once, so that its own refusal (an unknown
    variant after the colon, a bad value) is one line and exit 2, not absl's traceback."""
    args = list(argv[1:])
    specs = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    specs += [b for a, b in zip(args, args[1:], strict=False) if a == f"--{flag}"]
    for spec in specs[-1:]:
        path, _, arg = spec.partition(":")
        try:
            get_config(path, arg)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except Exception:  # noqa: BLE001  a missing or broken file: absl's message says so
            pass


def quiet_backend_probe() -> None:
    """Keep JAX's INFO line about the backends it probed and did not find (`Unable to
    initialize backend 'tpu'` on a CPU machine) out of a launch script's output: absl's
    `app.run` shows INFO records, and JAX logs that one while it looks for accelerators. Call
    before JAX picks its backend (`parse_flags` does; the other entry points call it before
    `app.run`); JAX's warnings and errors still show."""
    import logging

    logging.getLogger("jax").setLevel(logging.WARNING)


def parse_flags(argv, flag: str = "config"):
    """absl's flag parsing for launch scripts (`app.run(main, flags_parser=parse_flags)`): a
    config file that refuses its argument (`configs/tiny_cpu.py:nosuch`) and an override of a
    key the config does not have (`--config.train.step=4`) are each reported in one line naming
    what is allowed, instead of a traceback. It also keeps JAX's INFO line about the backends
    it probed and did not find out of their output (`quiet_backend_probe`)."""
    from absl import app

    quiet_backend_probe()
    _check_config_spec(argv, flag)
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as e:
        message = _bad_override(argv, flag) or f"{type(e).__name__}: {e}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
