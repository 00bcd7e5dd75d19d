"""The frontier notebook is committed executed and reads well, and runs top to bottom in its
folder (it imports the experiment from the checkout)."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_notebooks import _outputs, output_problems

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "frontier.ipynb"


def test_the_stored_notebook_is_executed_and_reads_well():
    assert output_problems(NOTEBOOK) == []


@pytest.mark.slow
def test_the_notebook_runs_in_its_folder(monkeypatch, one_device_env):
    monkeypatch.setenv("XLA_FLAGS", one_device_env["XLA_FLAGS"])
    before = sorted(p.name for p in NOTEBOOK.parent.iterdir())
    nb = nbformat.read(NOTEBOOK, as_version=4)
    path = {"metadata": {"path": str(NOTEBOOK.parent)}}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=path).execute()
    errors = [o for o in _outputs(nb) if o.get("output_type") == "error"]
    assert not errors, [f"{o.get('ename')}: {o.get('evalue')}" for o in errors]
    assert _outputs(nb) and sorted(p.name for p in NOTEBOOK.parent.iterdir()) == before
