"""The shell scripts that chain hours of planned runs: every one parses, and the helpers they
share (`launch/arms.sh`) tell a NO-GO verdict from a failure and refuse bad update counts."""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "launch").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _bash(tmp_path, body: str) -> subprocess.CompletedProcess:
    """`body` run by bash in tmp_path with launch/arms.sh sourced and `python` a stub that
    exits with $RC, writes verdict.md into its last argument when $WRITE is set and appends
    its arguments to calls.txt."""
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(
        '#!/usr/bin/env bash\necho "$*" >> calls.txt\n'
        '[ -n "${WRITE:-}" ] && touch "${@: -1}/verdict.md"\nexit "${RC:-0}"\n'
    )
    stub.chmod(0o755)
    script = f"set -euo pipefail\nsource {ROOT / 'launch' / 'arms.sh'}\n{body}\n"
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    cmd = ["bash", "-c", script]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "rc, write, ok",
    [(0, True, True), (1, True, True), (1, False, False), (2, True, False), (0, False, False)],
)
def test_gate_counts_a_written_verdict_with_exit_0_or_1(tmp_path, rc, write, ok):
    (tmp_path / "out").mkdir()
    env = f"RC={rc} " + ("WRITE=1 " if write else "")
    out = _bash(tmp_path, f"export {env}\nif gate --flag out; then echo ok; else echo failed; fi")
    assert out.stdout.strip() == ("ok" if ok else "failed"), out.stderr


@pytest.mark.parametrize("value, ok", [("12", True), ("1", True), ("0", False), ("", False),
                                       ("3x", False), (None, False)])  # fmt: skip
def test_check_counts_refuses_what_is_not_a_count(tmp_path, value, ok):
    assign = "" if value is None else f"N={value}\n"
    out = _bash(tmp_path, f"{assign}check_counts pilots.txt N\necho passed")
    assert (out.returncode == 0 and out.stdout.strip() == "passed") == ok
    if not ok:
        assert out.returncode == 2 and "pilots.txt holds N=" in out.stderr


@pytest.mark.parametrize("built", [0, 2, 3])
def test_build_start_runs_the_recipe_steps_not_built_yet_with_extra_flags(tmp_path, built):
    """build_start skips each step whose export holds VALIDATION.md and passes EXTRA's flags
    to the others, in the recipe's order."""
    exports = [
        "tiny_trace_grid/export_aw10_6000",
        "tiny_trace_long/export",
        "tiny_trace_wait/export",
    ]
    for d in exports[:built]:
        (tmp_path / "runs" / d).mkdir(parents=True)
        (tmp_path / "runs" / d / "VALIDATION.md").touch()
    out = _bash(tmp_path, 'EXTRA="--config.processes=14 --config.x=1" build_start\necho done')
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    log = tmp_path / "calls.txt"
    calls = log.read_text().splitlines() if log.exists() else []
    variants = [":trace ", ":trace_long ", ":trace_wait "][built:]
    assert len(calls) == len(variants), calls
    for call, variant in zip(calls, variants, strict=True):
        assert call.startswith("launch/train_tiny.py --config configs/tiny_model.py" + variant)
        assert call.endswith("--config.processes=14 --config.x=1"), call
    if built == 0:
        assert "--config.out_dir=runs/tiny_trace_grid/export_aw10_6000" in calls[0]
