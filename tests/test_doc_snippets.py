"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs on its own, in a fresh interpreter (one CPU device, the working directory an
empty temporary folder), so it needs its own imports and may write files. A block that cannot
run on a laptop (a large checkpoint, a GPU, a package the project does not install) is left out
only by a marker on the line just before its fence that says why:

    <!-- snippet: skip (needs a Qwen3-4B checkpoint) -->
    ```python
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # per block; each takes a few seconds to half a minute on 2 CPU cores

# An opening fence (indented as a list item may indent it), its language and the body up to the
# closing fence of the same indentation.
_FENCE = re.compile(r"^([ \t]*)(```+|~~~+)[ \t]*([\w+-]*)[^\n]*\n(.*?)^\1\2[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*snippet:(.*?)-->")
_SKIP = re.compile(r"^\s*skip\s*\((?P<reason>[^()]*\S[^()]*)\)\s*$")

# What runs each block: its source, laid out so that the traceback's line numbers are the page's
# and its file name is the page, run as a script's main module would be.
_RUNNER = """\
import sys
page, first, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
source = "\\n" * (first - 1) + open(path, encoding="utf-8").read()
exec(compile(source, page, "exec"), {"__name__": "__main__", "__file__": page})
"""


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # the opening fence's line (1-based)
    code: str  # dedented; its first line is the page's line `line + 1`
    skip: str | None  # the marker's reason, or None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class MarkerError(ValueError):
    """A snippet marker that does not say `skip (reason)` or does not precede a python fence."""


def pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets(text: str, page: str) -> list[Snippet]:
    """The ```python blocks of a Markdown page, with the reason of a skip marker placed on the
    line just before the fence. Raises MarkerError for a marker without a reason and for one
    that is not on the line just before a python fence (it would skip nothing)."""
    lines = text.splitlines()
    out, used = [], set()
    for m in _FENCE.finditer(text):
        indent, _, lang, body = m.groups()
        if lang.lower() not in ("python", "py"):
            continue
        line = text.count("\n", 0, m.start()) + 1
        skip = None
        if line >= 2 and (marker := _MARKER.search(lines[line - 2])):
            used.add(line - 1)
            found = _SKIP.match(marker.group(1))
            if not found:
                raise MarkerError(
                    f"{page}:{line - 1}: marker {marker.group(0)!r} is not "
                    "'<!-- snippet: skip (the reason it cannot run here) -->'"
                )
            skip = found["reason"].strip()
        code = "\n".join(x[len(indent) :] if x.startswith(indent) else x for x in body.split("\n"))
        out.append(Snippet(page, line, textwrap.dedent(code), skip))
    for n, text_line in enumerate(lines, start=1):
        if _MARKER.search(text_line) and n not in used:
            raise MarkerError(f"{page}:{n}: snippet marker not on the line just before ```python")
    return out


def all_snippets() -> list[Snippet]:
    out = []
    for path in pages():
        out += snippets(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return out


SNIPPETS = all_snippets()


def run_snippet(snippet: Snippet, tmp: pathlib.Path, env: dict) -> subprocess.CompletedProcess:
    """Runs one block in a fresh interpreter whose working directory is the empty folder
    tmp/cwd; its traceback names the page and line."""
    path, cwd = tmp / "snippet.txt", tmp / "cwd"
    path.write_text(snippet.code, encoding="utf-8")
    cwd.mkdir()
    argv = [sys.executable, "-c", _RUNNER, snippet.page, str(snippet.line + 1), str(path)]
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet, tmp_path, one_device_env):
    if snippet.skip:
        pytest.skip(f"{snippet.where}: {snippet.skip}")
    env = {**one_device_env, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    done = run_snippet(snippet, tmp_path, env)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        pytest.fail(
            f"the ```python block at {snippet.where} raised (exit {done.returncode}):\n{tail}",
            pytrace=False,
        )


def test_pages_have_snippets_and_most_run():
    """The scan finds the docs' python blocks, and a skip is the exception, not the rule."""
    assert len(SNIPPETS) >= 6, [s.where for s in SNIPPETS]
    skipped = [s for s in SNIPPETS if s.skip]
    assert len(skipped) * 3 <= len(SNIPPETS), [f"{s.where}: {s.skip}" for s in skipped]


def test_scan_reads_fences_markers_and_reasons():
    page = (
        "text\n"
        "```python\nx = 1\n```\n"
        "```bash\necho no\n```\n"
        "<!-- snippet: skip (needs a GPU) -->\n"
        "```python\nimport gpu\n```\n"
        "- an item\n"
        "  ```python\n  if True:\n      y = 2\n  ```\n"
    )
    found = snippets(page, "page.md")
    assert [(s.line, s.skip) for s in found] == [(2, None), (9, "needs a GPU"), (13, None)]
    assert found[0].code.strip() == "x = 1"
    assert found[2].code.strip() == "if True:\n    y = 2"
    compile(found[2].code, "page.md", "exec")  # the list item's indentation is removed


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- snippet: skip -->",  # no reason
        "<!-- snippet: skip () -->",  # an empty one
        "<!-- snippet: ignore (why) -->",  # not a skip
    ],
)
def test_a_marker_needs_a_reason(marker):
    with pytest.raises(MarkerError, match="page.md:2"):
        snippets(f"text\n{marker}\n```python\nx = 1\n```\n", "page.md")


def test_a_marker_away_from_a_fence_is_refused():
    with pytest.raises(MarkerError, match="page.md:1: snippet marker not on the line just"):
        snippets("<!-- snippet: skip (why) -->\n\n```python\nx = 1\n```\n", "page.md")
    with pytest.raises(MarkerError, match="page.md:1"):
        snippets("<!-- snippet: skip (why) -->\n```bash\nls\n```\n", "page.md")


def test_a_failing_block_names_its_page_and_line(tmp_path, one_device_env):
    snippet = snippets("# t\n\n```python\nx = 1\nraise KeyError('boom')\n```\n", "docs/t.md")[0]
    done = run_snippet(snippet, tmp_path, one_device_env)
    assert done.returncode != 0
    assert 'File "docs/t.md", line 5' in done.stderr, done.stderr
    assert "KeyError: 'boom'" in done.stderr
