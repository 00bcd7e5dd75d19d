"""Dependencies point down: low-level modules import nothing above them (every import
statement counts, those inside functions too)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "mapfjax"

# module -> the mapfjax modules and packages it may import from.
ALLOWED = {
    "checks.py": (),
    "files.py": (),
    "configfile.py": ("mapfjax.checks",),
    "hostalloc.py": (),  # launch scripts call it before importing JAX
    "stats.py": ("mapfjax.checks",),
    "models/tokenizer.py": ("mapfjax.files",),
    "models/bpe.py": ("mapfjax.files", "mapfjax.checks", "mapfjax.models.tokenizer"),
    "models/hf.py": ("mapfjax.parallel", "mapfjax.files", "mapfjax.checks", "mapfjax.models.qwen3"),
    "env/io.py": ("mapfjax.files", "mapfjax.checks", "mapfjax.env"),
    "env/benchmark.py": ("mapfjax.stats", "mapfjax.streams", "mapfjax.env"),
}


def _mapfjax_imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            # "from mapfjax import files" imports the module mapfjax.files.
            names = [f"{node.module}.{a.name}" for a in node.names]
            out |= set(names) if node.module == "mapfjax" else {node.module}
    return {m for m in out if m == "mapfjax" or m.startswith("mapfjax.")}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_low_level_modules_import_only_below_them(module):
    allowed = ALLOWED[module]
    bad = sorted(
        m
        for m in _mapfjax_imports(PACKAGE / module)
        if not any(m == a or m.startswith(a + ".") for a in allowed)
    )
    assert not bad, f"mapfjax/{module} imports {bad}; allowed: {allowed or 'no mapfjax module'}"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _edges(path: pathlib.Path, modules) -> set[str]:
    """The mapfjax modules a file imports, anywhere in it ("from mapfjax.rl import driver"
    imports mapfjax.rl.driver; "from mapfjax.rl.data import x" imports mapfjax.rl.data)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            if name in modules and modules[name].name != "__init__.py":
                out.add(name)
            elif name.rpartition(".")[0] in modules and name not in modules:
                parent = name.rpartition(".")[0]
                if modules[parent].name != "__init__.py":
                    out.add(parent)
    return out


def test_no_import_cycles():
    """No module imports, directly or through others, a module that imports it back (imports
    inside functions count: a cycle hidden in a function still ties the layers together)."""
    modules = _modules()
    graph = {name: _edges(path, modules) - {name} for name, path in modules.items()}
    cycles, state = [], {}

    def visit(name, stack):
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert len(graph) > 40 and any(graph.values())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


_ONE_BY_ONE = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m == "mapfjax" or m.startswith("mapfjax.")]:
        del sys.modules[m]  # each module imported first, as a user's script would
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_on_its_own():
    import subprocess
    import sys

    names = sorted(_modules())
    out = subprocess.run(
        [sys.executable, "-c", _ONE_BY_ONE, *names],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _imports_anywhere(path: pathlib.Path) -> set[str]:
    """Every module name a file imports (statements inside functions too), and every string
    that `importlib.import_module` or `__import__` is called with literally."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = ast.unparse(node.func)
            if func.endswith(("import_module", "__import__")):
                out.add(str(node.args[0].value))
    return out


def product_files() -> list[pathlib.Path]:
    """The files a user runs or installs: the package, the entry points, the configs and the
    benchmarks."""
    root = PACKAGE.parent
    return [
        p for d in ("mapfjax", "launch", "configs", "benchmarks") for p in root.glob(f"{d}/**/*.py")
    ]


def test_the_product_never_imports_an_experiment():
    """projects/ builds on the package; nothing of the package, the entry points, the configs
    or the benchmarks imports projects/ (an experiment can change or go without breaking them)."""
    files = product_files()
    assert len(files) > 60
    bad = [
        f"{p.relative_to(PACKAGE.parent)}: {m}"
        for p in files
        for m in sorted(_imports_anywhere(p))
        if m == "projects" or m.startswith("projects.")
    ]
    assert not bad, "product files that import an experiment:\n" + "\n".join(bad)


def test_the_import_scan_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import os\ndef g():\n    from projects.x import y\n"
        "    importlib.import_module('projects.z')\n"
    )
    assert {"os", "projects.x", "projects.z"} <= _imports_anywhere(f)
