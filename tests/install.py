"""Which mapfjax the tests' subprocesses import. The end-to-end tests run the launch scripts as
a user would, in fresh processes that import the installed package: an install made from
another checkout (a moved or copied repository) fails them all with a bare ModuleNotFoundError,
or tests that checkout's code instead of this one."""

import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIND = "import importlib.util as u; s = u.find_spec('mapfjax'); print(s.origin if s else '')"


def installed_mapfjax(env: dict | None = None) -> str:
    """The file a fresh Python process would import as mapfjax ('' if none), found without
    importing it, from a directory outside the repository."""
    out = subprocess.run(
        [sys.executable, "-c", FIND], cwd=tempfile.gettempdir(), env=env,
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def install_problem(origin: str) -> str | None:
    """None when `origin` is this checkout's package, else the one-line reason and the fix."""
    want = ROOT / "mapfjax" / "__init__.py"
    if origin and pathlib.Path(origin).resolve() == want.resolve():
        return None
    return (
        f"the tests' subprocesses would import mapfjax from {origin or 'nowhere'}, not from this "
        f'checkout ({want.parent}): run pip install -e ".[test]" in {ROOT}'
    )
