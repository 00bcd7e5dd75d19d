"""The notebooks in notebooks/: each runs top to bottom without errors (executed here), and each
is stored executed, with outputs that read well on a repository page (checked without running)."""

import pathlib
import re
import shutil
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Notebooks the execution test leaves out, each with the reason (none at present).
NOT_EXECUTED: dict[str, str] = {}
EXECUTED = [p for p in NOTEBOOKS if p.name not in NOT_EXECUTED]
OUT_DIR = "out"  # the one folder a notebook may write to, next to it (ignored by git)
MAX_BYTES = 600_000  # a stored notebook's size limit: modest figures, no huge printed arrays
# Paths of a particular machine, which mean nothing on a repository page.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|tmp|home|Users|private|var/folders)/")
_MD_TABLE = re.compile(r"^\s*\|.*\|\s*\n\s*\|(?:\s*:?-+:?\s*\|)+\s*$", re.M)


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _outputs(nb) -> list[dict]:
    return [o for c in _code_cells(nb) for o in c.get("outputs", [])]


def _texts(output: dict) -> list[str]:
    """The readable text of an output (stream text, text/* data, an error's traceback); images'
    base64 data is left out."""
    out = [output.get("text", "")]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith("json"):
            out.append(value if isinstance(value, str) else "".join(map(str, value)))
    out += [output.get("ename", ""), output.get("evalue", ""), *output.get("traceback", [])]
    return [t if isinstance(t, str) else "".join(t) for t in out if t]


def _shows_picture_or_table(output: dict) -> bool:
    data = output.get("data", {})
    return (
        "image/png" in data
        or "<table" in str(data.get("text/html", ""))
        or bool(_MD_TABLE.search(str(data.get("text/markdown", ""))))
    )


def output_problems(path: pathlib.Path) -> list[str]:
    """What is wrong with a stored notebook's outputs: a code cell not executed or executed out of
    order (a fresh top-to-bottom run numbers them 1, 2, 3, ...), no outputs, no picture
    (image/png) or table (HTML or Markdown), an error output, a file over MAX_BYTES, or an output
    naming a path of the machine that ran it."""
    nb = nbformat.read(path, as_version=4)
    problems = []
    counts = [c.get("execution_count") for c in _code_cells(nb)]
    if not counts:
        problems.append("no code cells")
    if any(n is None for n in counts):
        problems.append(f"code cells {[i for i, n in enumerate(counts) if n is None]} not run")
    elif counts != list(range(1, len(counts) + 1)):
        problems.append(f"execution counts {counts}: not one run from the top (1, 2, 3, ...)")
    outputs = _outputs(nb)
    if not outputs:
        problems.append("no outputs")
    elif not any(_shows_picture_or_table(o) for o in outputs):
        problems.append("no image/png, HTML table or Markdown table among the outputs")
    for o in outputs:
        if o.get("output_type") == "error":
            problems.append(f"an error output: {o.get('ename')}: {o.get('evalue')}")
        for text in _texts(o):
            if m := MACHINE_PATH.search(text):
                line = next(x for x in text[m.start() :].splitlines() if x)
                problems.append(f"an output names a path of this machine: {line[:120]!r}")
    size = path.stat().st_size
    if size > MAX_BYTES:
        problems.append(f"{size:,} bytes, over the {MAX_BYTES:,}-byte limit")
    return problems


def test_there_are_notebooks_and_every_exclusion_says_why():
    assert len(NOTEBOOKS) >= 4, [p.name for p in NOTEBOOKS]
    names = {p.name for p in NOTEBOOKS}
    for name, reason in NOT_EXECUTED.items():
        assert name in names, f"NOT_EXECUTED names {name}, which is not in notebooks/"
        assert reason.strip(), f"NOT_EXECUTED[{name!r}] gives no reason"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_notebook_is_executed_and_reads_well(path):
    problems = output_problems(path)
    assert not problems, (
        f"notebooks/{path.name}: " + "; ".join(problems) + ". Execute it from notebooks/ with "
        "one CPU device (XLA_FLAGS=--xla_force_host_platform_device_count=1) and save it."
    )


def _notebook(tmp_path, cells, counts, outputs) -> pathlib.Path:
    nb = nbformat.v4.new_notebook()
    for source, count, out in zip(cells, counts, outputs):
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        cell.outputs = [nbformat.from_dict(o) for o in out]
        nb.cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


TABLE = {"output_type": "display_data", "data": {"text/markdown": "| a |\n|---|\n| 1 |"}}
TEXT = {"output_type": "stream", "name": "stdout", "text": "fine\n"}


def test_output_check_finds_each_problem(tmp_path):
    good = _notebook(tmp_path, ["x = 1", "x"], [1, 2], [[TEXT], [TABLE]])
    assert output_problems(good) == []
    cases = {
        "not run": ([None, 2], [[TEXT], [TABLE]]),
        "not one run from the top": ([2, 1], [[TEXT], [TABLE]]),
        "no outputs": ([1, 2], [[], []]),
        "no image/png": ([1, 2], [[TEXT], [TEXT]]),
        "an error output: KeyError": (
            [1, 2],
            [
                [TABLE],
                [{"output_type": "error", "ename": "KeyError", "evalue": "x", "traceback": []}],
            ],
        ),  # fmt: skip
        "a path of this machine: '/tmp/": (
            [1, 2],
            [[TABLE], [{"output_type": "stream", "name": "stderr", "text": "see /tmp/x.png\n"}]],
        ),
    }
    for expected, (counts, outputs) in cases.items():
        problems = output_problems(_notebook(tmp_path, ["x = 1", "x"], counts, outputs))
        assert any(expected in p for p in problems), (expected, problems)
    png = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" + "A" * MAX_BYTES}}
    problems = output_problems(_notebook(tmp_path, ["x = 1", "x"], [1, 2], [[TEXT], [png]]))
    assert any("over the" in p for p in problems), problems
    assert not any("path" in p for p in problems), problems  # image data is not text


def test_the_output_folder_is_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    probe = f"notebooks/{OUT_DIR}/picture.png"
    done = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT, check=False)
    assert done.returncode == 0, f"{probe} is not ignored by git: add /notebooks/{OUT_DIR}/"


@pytest.mark.parametrize("path", EXECUTED, ids=[p.name for p in EXECUTED])
def test_notebook_executes(path, tmp_path, monkeypatch, one_device_env):
    # The kernel runs as a user's notebook would: one CPU device, in the notebook's folder
    # (here an empty one).
    monkeypatch.setenv("XLA_FLAGS", one_device_env["XLA_FLAGS"])
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for o in _outputs(nb) if o.get("output_type") == "error"]
    assert not errors, [f"{o.get('ename')}: {o.get('evalue')}" for o in errors]
    assert _outputs(nb), "no outputs"
    written = sorted(p.name for p in tmp_path.iterdir())
    assert set(written) <= {OUT_DIR}, f"files written outside {OUT_DIR}/: {written}"
