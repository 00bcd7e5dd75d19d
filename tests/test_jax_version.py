"""The installed jax lies inside the range pyproject.toml declares, and every accelerator extra
pins the same range (a GPU image's jax 0.11 must not be refused by one of them)."""

import importlib.metadata
import pathlib
import re
import tomllib

import jax
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _core_jax() -> Requirement:
    (req,) = [Requirement(r) for r in _project()["dependencies"] if re.match(r"jax\b[<>=]", r)]
    return req


def test_installed_jax_is_inside_the_declared_range():
    spec = _core_jax().specifier
    installed = importlib.metadata.version("jax")
    assert installed == jax.__version__
    assert spec.contains(installed), f"jax {installed} is outside pyproject's range {spec}"
    assert spec.contains("0.10.0") and spec.contains("0.11.5") and not spec.contains("0.12.0")


def test_accelerator_extras_pin_the_same_range():
    extras = _project()["optional-dependencies"]
    for name in ("cuda", "cuda12", "cuda13", "tpu"):
        (req,) = [Requirement(r) for r in extras[name]]
        assert req.name == "jax" and req.specifier == _core_jax().specifier, name
    assert Requirement(extras["cuda13"][0]).extras == {"cuda13"}
