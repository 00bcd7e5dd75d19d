"""The experiments in projects/ are products too: each folder has a README that says the
question, the plan, the result and the commands that regenerate it; those commands name
scripts, configs and files that exist, and every script they run answers --help; the index
lists every experiment; the committed results stay small."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.test_docs import _FENCE, _MODULE, commands, module_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "projects"
NAMES = sorted(p.parent.name for p in PROJECTS.glob("*/README.md"))
SECTIONS = ("**Question.**", "**Plan", "**Result", "**Regenerate", "**Files.**")
# Paths a command reads (outputs go under runs/ or data/, which the commands create).
_READ = re.compile(r"(?<![\w/.$-])((?:projects|configs|launch|benchmarks|mapfjax)/[\w./-]+)")
# A script a command runs: `python launch/x.py`, `python -m projects.p.x`, `bash p/x.sh`.
_SCRIPT = re.compile(r"python3? ((?:launch|benchmarks)/\w+\.py)")


def _front(name: str) -> str:
    """A project README up to its details (the part that holds its regenerating commands)."""
    return (PROJECTS / name / "README.md").read_text(encoding="utf-8").split("\n## Details")[0]


def test_every_experiment_has_a_readme_with_its_question_plan_result_and_commands():
    assert len(NAMES) >= 8, NAMES
    for name in NAMES:
        front = _front(name)
        missing = [s for s in SECTIONS if s not in front]
        assert not missing, f"projects/{name}/README.md lacks {missing}"
        assert any(lang.lower() == "bash" for _, _, lang, _ in _FENCE.findall(front)), name


def test_the_index_lists_every_experiment_and_nothing_else():
    index = (PROJECTS / "README.md").read_text(encoding="utf-8")
    linked = sorted(set(re.findall(r"\]\((\w+)/README\.md\)", index)))
    assert linked == NAMES


def _commands() -> list[tuple[str, str]]:
    return [(name, line) for name in NAMES for line in commands(_front(name))]


def test_commands_name_files_that_exist():
    """Every path a regenerating command reads exists (an output folder under projects/ is
    the committed results folder it rewrites, so it exists too); every module exists."""
    missing, named = [], 0
    for name, line in _commands():
        for path in _READ.findall(line):
            named += 1
            if not (ROOT / path.rstrip(".,;")).exists():
                missing.append(f"projects/{name}: {path} (in: {line})")
        for module in _MODULE.findall(line):
            named += 1
            if module_file(module) is None:
                missing.append(f"projects/{name}: -m {module} (in: {line})")
    assert named > 30, named
    assert not missing, "\n".join(missing)


def _scripts() -> list[list[str]]:
    """Each script the experiments' commands run, as the argv that asks it for help."""
    out = set()
    for _, line in _commands():
        out |= {("-m", m) for m in _MODULE.findall(line) if m.startswith("projects.")}
        out |= {(s,) for s in _SCRIPT.findall(line)}
    return [list(s) for s in sorted(out)]


SCRIPTS = _scripts()


def test_the_experiments_run_scripts_of_their_own_and_the_entry_points():
    assert any(s[0] == "-m" for s in SCRIPTS) and any(s[0].startswith("launch/") for s in SCRIPTS)


@pytest.mark.e2e
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s[-1])
def test_every_script_an_experiment_runs_answers_help(script, one_device_env):
    out = subprocess.run(
        [sys.executable, *script, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**one_device_env, "PYTHONPATH": str(ROOT)},
    )
    text = out.stdout + out.stderr
    assert out.returncode in (0, 1), text[-2000:]  # absl's --help exits 1
    assert "Traceback" not in text and ("usage" in text.lower() or "--" in text), text[-2000:]


def test_committed_results_stay_small():
    """Run directories and checkpoints are not committed: no tracked file under projects/ over
    1 MB, and all of them together under 60 MB (per-puzzle files are compact JSON, plots
    palette PNGs)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "projects"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / p for p in listed.decode().split("\0") if p]
    sizes = {p: os.path.getsize(p) for p in paths if p.is_file()}
    big = [f"{p.relative_to(ROOT)}: {s / 1e6:.1f} MB" for p, s in sizes.items() if s > 1_000_000]
    assert not big, big
    assert sum(sizes.values()) < 60e6, sum(sizes.values())
    assert not [p for p in sizes if p.suffix in (".safetensors", ".msgpack") or "ckpt" in p.name]
