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
    "configfile.py": (),
    "stats.py": ("mapfjax.checks",),
    "models/tokenizer.py": ("mapfjax.files",),
    "models/bpe.py": ("mapfjax.files", "mapfjax.checks", "mapfjax.models.tokenizer"),
    "models/hf.py": ("mapfjax.parallel", "mapfjax.files", "mapfjax.models.qwen3"),
    "env/io.py": ("mapfjax.files", "mapfjax.checks", "mapfjax.env"),
    "env/benchmark.py": ("mapfjax.stats", "mapfjax.env"),
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
