"""The accelerator loop check in its CPU form: the same command a GPU call runs, at the tiny
shapes (`projects.accelerator.loop_check --shapes tiny --step_model tiny`)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_cpu_form_runs_two_rounds_and_the_step_and_writes_the_plan_beside(
    tmp_path, one_device_env
):
    cmd = [sys.executable, "-m", "projects.accelerator.loop_check", "--shapes", "tiny",
           "--step_model", "tiny", "--out", str(tmp_path)]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, env=one_device_env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    loop = json.loads((tmp_path / "loop_cpu.json").read_text())
    assert loop["rounds_finished"] == 2 and loop["device"] == "cpu"
    phases = [p["phase"] for p in loop["phases"]]
    for phase in ("start validation", "start benchmark", "round 0 GRPO", "round 0 engineer",
                  "round 1 GRPO", "final benchmark"):  # fmt: skip
        assert phase in phases, phases
    assert all(p["seconds"] >= 0 for p in loop["phases"])
    planned = {p["phase"]: p["total"] for p in loop["plan"]}
    assert set(planned) == {"rollout", "update", "validation", "engineer", "benchmark"}
    assert all(v > 0 for v in planned.values())
    text = (tmp_path / "loop_cpu.md").read_text()
    assert "| round 0 engineer |" in text and "| update |" in text
    step = json.loads((tmp_path / "step" / "cpu.json").read_text())["models"]["tiny"]["grpo"]
    assert (step["prompts"], step["group"], step["completion_len"]) == (2, 2, 8)
    assert step["rollout_s"] > 0 and step["update_s"] > 0
    # the scratch run directory and checkpoint are gone: only the figures stay
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop_cpu.json", "loop_cpu.md", "step"]


def test_bad_arguments_are_one_line(tmp_path):
    cmd = [sys.executable, "-m", "projects.accelerator.loop_check", "--out", str(tmp_path)]
    res = subprocess.run([*cmd, "--shapes", "qwen9"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "--shapes qwen9: allowed: tiny, qwen3-" in res.stderr
    res = subprocess.run([*cmd, "--parts", "loop,x"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "--parts loop,x: allowed" in res.stderr
