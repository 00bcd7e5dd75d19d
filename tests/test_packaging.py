"""A non-editable install works: the wheel carries the engineer presets, the guideline, the
tiny models and the CPU decode kernel's source, and the package imports and loads them from
outside the repository."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

from mapfjax.presets import engineers, variants

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHECK = """
import json, pathlib, sys
import mapfjax
from mapfjax import configfile
from mapfjax.presets import engineers, variants

package = pathlib.Path(mapfjax.__file__).parent
MODELS = ("tiny", "tiny_think", "tiny_base")
v6 = variants.get_config("V6").modules
print(json.dumps({
    "package": str(package),
    "guideline": pathlib.Path(v6.G.path).read_text(),
    "guideline_in_package": pathlib.Path(v6.G.path).parent == package / "presets",
    "engineers": sorted(engineers.ENGINEERS),
    "policy": engineers.get_config("policy").to_dict(),
    "variants": sorted(variants.VARIANTS),
    "tiny_model": (package / "assets" / "tiny" / "config.json").is_file(),
    "tiny_think": (package / "assets" / "tiny_think" / "model.safetensors").is_file(),
    # The CPU decode kernel's source, compiled on first use.
    "kernel_source": (package / "models" / "kernels" / "decode_attention_cpu.cc").is_file(),
    # Each model's card and chat template (its default prompt mode) ship with it.
    "cards": {n: (package / "assets" / n / "README.md").read_text() for n in MODELS},
    "templates": {n: (package / "assets" / n / "chat_template.jinja").read_text() for n in MODELS},
    # A relative config path is found in the working directory when the package has none.
    "from_cwd": configfile.get_config("configs/here.py"),
}))
"""


def _copy_sources(dest: pathlib.Path) -> None:
    """What the build reads, links kept (mapfjax/presets links into configs/engineer)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("mapfjax", "configs/engineer"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True, ignore=skip)


def test_wheel_installs_and_loads_the_presets_outside_the_repository(tmp_path):
    src, dist, venv, elsewhere = (tmp_path / n for n in ("src", "dist", "venv", "elsewhere"))
    _copy_sources(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = ["wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)]
    subprocess.run(pip + build, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("mapfjax-*.whl")
    # Dependencies come from this interpreter's site-packages; only mapfjax is installed.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    install = ["--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(pip + install, check=True, capture_output=True, timeout=300)

    (elsewhere / "configs").mkdir(parents=True)
    (elsewhere / "configs" / "here.py").write_text("def get_config():\n    return 'found'\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(python), "-c", CHECK], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])

    assert pathlib.Path(got["package"]).is_relative_to(venv)  # the wheel's copy, not ours
    assert not pathlib.Path(got["package"]).is_relative_to(ROOT)
    assert got["guideline"] == (ROOT / "configs" / "engineer" / "guideline.md").read_text()
    assert got["guideline_in_package"] and got["tiny_model"] and got["tiny_think"]
    assert got["kernel_source"]
    for name in ("tiny", "tiny_think", "tiny_base"):
        assets = ROOT / "mapfjax" / "assets" / name
        assert got["cards"][name] == (assets / "README.md").read_text()
        assert got["templates"][name] == (assets / "chat_template.jinja").read_text()
    assert got["engineers"] == sorted(engineers.ENGINEERS)
    assert got["policy"] == engineers.get_config("policy").to_dict()
    assert got["variants"] == sorted(variants.VARIANTS)
    assert got["from_cwd"] == "found"


def _declared(extra: str | None = None) -> set[str]:
    """Normalised distribution names of pyproject's dependencies (or of one extra)."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {re.split(r"[<>=\[; ]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}


def test_every_third_party_import_is_a_declared_dependency():
    """`pip install -e .` alone must run every launch script: each module that mapfjax/ and
    launch/ import (at any depth: lazy imports too) comes from a declared dependency, and
    transformers' chat template needs jinja2, which transformers itself does not install."""
    import ast
    import importlib.metadata

    dists = importlib.metadata.packages_distributions()
    core = _declared()
    optional = _declared("api") | _declared("test") | _declared("logging") | _declared("export")
    missing = {}
    for path in [*ROOT.glob("mapfjax/**/*.py"), *ROOT.glob("launch/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "mapfjax":
                    continue
                owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not owners & core and not owners & optional:
                    missing.setdefault(top, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert "jinja2" in core
