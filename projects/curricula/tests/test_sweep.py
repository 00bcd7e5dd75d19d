"""The curriculum comparison end to end on a tiny random model: two engineers, two seeds,
each run from its seed's random round 0, and the comparison's files."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_two_engineers_two_seeds_end_to_end(tmp_path, tiny_model_dir, one_device_env):
    work, results = tmp_path / "runs", tmp_path / "results"
    cmd = [
        sys.executable, str(ROOT / "launch" / "sweep.py"),
        f"--config={ROOT / 'projects/curricula/configs/laptop_effect.py'}", f"--workdir={work}",
        "--config.train_arg=curricula_smoke", "--config.seeds=(0,1)",
        "--config.groups.curricula.engineers=('fixed','learnability')",
        f"--config.results={results}",
        f"--config.overrides=model.path={tiny_model_dir},validation.sizes=(3,4),"
        "train.max_new_tokens=16,validation.max_new_tokens=16,validation.per_size=2,"
        "train.instances=8,train.problems_per_step=4,train.group_size=4",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=ROOT, env=one_device_env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    md = (results / "summary.md").read_text()
    assert "4 of 4 runs finished" in md and "| learnability | 2 | 2 |" in md
    assert len(list((results / "runs").glob("*.json"))) == 4
    # Round 0 trains on the seed's random config: the same for both engineers of a seed.
    start = lambda run: json.loads((work / run / "round_0" / "config.json").read_text())
    assert start("fixed_s0") == start("learnability_V6_Tbookkeeping_s0") != start("fixed_s1")
    assert start("fixed_s0")["sizes"]["s3"]["wait_ratio"] != 0.5  # not c.env's
    report = (work / "fixed_s0" / "report.md").read_text()  # greedy only: no sampled column
    assert "## Held-out validation (greedy, 95 % intervals)" in report
    assert "| model | n | greedy valid % | change vs start (points) |" in report
