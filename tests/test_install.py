"""The install check of tests/conftest.py: which mapfjax a fresh process imports."""

import os

from tests.install import ROOT, install_problem, installed_mapfjax


def test_this_checkout_is_what_subprocesses_import():
    assert install_problem(installed_mapfjax()) is None


def test_another_checkout_first_on_the_path_is_named_with_the_fix(tmp_path):
    other = tmp_path / "mapfjax"
    other.mkdir()
    (other / "__init__.py").write_text("")
    origin = installed_mapfjax({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert origin == str(other / "__init__.py")
    problem = install_problem(origin)
    assert str(other / "__init__.py") in problem and str(ROOT / "mapfjax") in problem
    assert 'pip install -e ".[test]"' in problem
    assert "nowhere" in install_problem("")
