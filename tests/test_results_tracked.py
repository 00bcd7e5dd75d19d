"""Every file that the README or an experiment's page names under an experiment's results/
(projects/<name>/results/) is tracked by git, so an ignore rule (or a forgotten `git add`)
cannot silently drop committed results."""

import fnmatch
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown link or image target
_CODE = re.compile(r"`([^`\s]+)`")
# A backticked name counts as a file when it ends like the small files results/ holds.
_FILE = re.compile(r"^[\w./<>*-]+\.(?:json|jsonl|jsonl\.gz|gz|csv|png|md)$")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "projects", "README.md"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.stdout.split()


def _pattern(name: str) -> str:
    """A path with placeholders ('runs/<run>.json') as a glob ('runs/*.json')."""
    return re.sub(r"<[^>]*>", "*", name)


def _is_result(rel: str) -> bool:
    """Whether a path from the root names something in an experiment's results folder."""
    parts = rel.split("/")
    return len(parts) >= 3 and parts[0] == "projects" and parts[2] == "results"


def _named(page: pathlib.Path, text: str) -> list[tuple[str, str]]:
    """(what the page says, the glob it must match) for the results files a page names:
    relative links resolved from the page, and backticked file names under its experiment."""
    base = page.parent.relative_to(ROOT).as_posix()
    out = []
    for target in _LINK.findall(text):
        target = target.split("#")[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        path = (page.parent / target).resolve()
        try:
            rel = path.relative_to(ROOT).as_posix()
        except ValueError:
            continue
        if _is_result(rel):
            out.append((target, _pattern(rel)))
    for name in _CODE.findall(text):  # a results path written out in full, from the root
        if _is_result(name) and "*" not in name:
            out.append((name, _pattern(name)))
    if base.startswith("projects/") and base.count("/") >= 1:
        experiment = "/".join(base.split("/")[:2]) + "/results"
        for name in _CODE.findall(text):
            # A '*' written out is a family of work-directory files, not one result; a path
            # from another top-level folder (mapfjax/assets/...) is not under results/.
            if not _FILE.match(name) or "*" in name or name.startswith(("/", "runs/", "~")):
                continue
            if (ROOT / name.split("/")[0]).is_dir() and "/" in name:
                continue
            out.append((name, f"{experiment}/**{_pattern(name)}"))
    return out


def _matches(pattern: str, tracked: list[str]) -> bool:
    if "**" in pattern:  # a name anywhere below the experiment's folder
        head, tail = pattern.split("**", 1)
        return any(t.startswith(head) and fnmatch.fnmatch(t, f"*{tail}") for t in tracked)
    # a folder counts when it holds a tracked file
    folder = pattern.rstrip("/") + "/"
    return any(fnmatch.fnmatch(t, pattern) or t.startswith(folder) for t in tracked)


def test_named_result_files_are_tracked():
    tracked = _tracked()
    pages = [ROOT / "README.md"] + [ROOT / t for t in tracked if t.endswith(".md")]
    checked, missing = 0, []
    for page in dict.fromkeys(pages):
        for said, pattern in _named(page, page.read_text(encoding="utf-8")):
            checked += 1
            if not _matches(pattern, tracked):
                missing.append(f"{page.relative_to(ROOT)}: {said!r} (no tracked file {pattern})")
    assert checked > 20, checked  # the pages do name results; a broken scan would find none
    assert not missing, "named but not tracked by git:\n" + "\n".join(missing)


def test_results_are_not_ignored():
    """The ignore rule for run directories is anchored at the root: an experiment's
    results/runs/ is kept."""
    out = subprocess.run(
        ["git", "check-ignore", "-q", "projects/some_experiment/results/runs/run.json"], cwd=ROOT
    )
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.returncode == 1, "projects/*/results/runs/ files are ignored by .gitignore"
    assert subprocess.run(["git", "check-ignore", "-q", "runs/tiny/x"], cwd=ROOT).returncode == 0
