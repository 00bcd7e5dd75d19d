"""The closed loop in a job of two processes on localhost joined by jax.distributed (4 CPU
devices each, one mesh over all 8): one round of generate -> GRPO -> validate, the final
benchmark answered by both processes together, one shared work directory."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.test_distributed import _free_port

WORKER = pathlib.Path(__file__).with_name("distributed_loop_worker.py")
ROOT = WORKER.parent.parent


def _start(pid, nproc, port, local, model, workdir):
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(local), str(model),
         str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def _result(proc):
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_one_round_of_the_loop_in_two_processes(tiny_model_dir, tmp_path):
    work = tmp_path / "run"
    port = _free_port()
    procs = [_start(i, 2, port, 4, tiny_model_dir, work) for i in range(2)]
    results = [_result(p) for p in procs]
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["processes"] == 2 and r["devices"] == 8 for r in results)
    # one global computation: both processes end with the same round record
    assert results[0]["records"] == results[1]["records"] and len(results[0]["records"]) == 1
    for name in ("DONE", "record.json", "validation.json", "metrics.jsonl", "model/config.json"):
        assert (work / "round_0" / name).exists(), name
    steps = {json.loads(x)["step"] for x in (work / "round_0" / "metrics.jsonl").open()}
    assert steps == {1, 2, 3, 4}
    # the benchmark's answers were appended once (by process 0), each puzzle answered once
    for name in ("start", "round_0"):
        lines = (work / "benchmark" / name / "answers.jsonl").read_text().splitlines()
        assert len(lines) == 3 and len({json.loads(x)["id"] for x in lines}) == 3
    assert (work / "benchmark" / "comparison.md").exists()
    phases = [json.loads(x)["phase"] for x in (work / "phases.jsonl").open()]
    assert phases.count("round 0 GRPO") == 1  # logged by process 0 alone
