"""`python -m mapfjax.env` end to end: solve -> verify, benchmark, demo, render, bad input."""

import json
import subprocess
import sys

import pytest

from mapfjax.env import benchmark, io, types


def run(*args, timeout=600):
    res = subprocess.run(
        [sys.executable, "-m", "mapfjax.env", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return res.returncode, res.stdout, res.stderr


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "bench.jsonl"
    code, _, err = run(
        "benchmark",
        "--out",
        str(path),
        "--per_cell",
        "2",
        "--agents",
        "3",
        "--sizes",
        "3-5",
        "--wait_ratios",
        "0.5",
    )
    assert code == 0, err
    return path


def test_benchmark_writes_labelled_cells(bench_file):
    probs = io.load_instances(bench_file)
    assert len(probs) == 3 * 2
    for p in probs:
        fields = benchmark.parse_id(p.id)
        assert fields["agents"] == p.num_agents == 3 and fields["height"] == p.height
        assert p.optimal_soc is not None and p.needs_wait is not None
    assert sum(p.needs_wait for p in probs) == 3  # 0.5 of 2 per cell


def test_solve_then_verify_is_optimal(bench_file, tmp_path):
    code, out, err = run("solve", "--instances", str(bench_file), "--processes", "1")
    assert code == 0, err
    solved = [json.loads(line) for line in out.splitlines()]
    assert all(r["status"] == "optimal" for r in solved)
    answers = tmp_path / "answers.jsonl"
    rows = [{"id": r["id"], "text": "Sure!\n" + r["answer"]} for r in solved]
    rows.append({"id": solved[0]["id"], "text": "<answer>\nAgent 0: UP\n</answer>"})
    io.save_jsonl(answers, rows)
    code, out, err = run("verify", "--instances", str(bench_file), "--answers", str(answers))
    assert code == 0, err
    verdicts = [json.loads(line) for line in out.splitlines()]
    assert len(verdicts) == len(rows)
    for v, s in zip(verdicts[:-1], solved, strict=True):
        assert v == {
            "id": s["id"],
            "valid": True,
            "optimal": True,
            "failure": None,
            "soc": s["soc"],
            "makespan": s["makespan"],
        }
    assert verdicts[-1]["failure"] == "parse_error" and verdicts[-1]["soc"] is None


def test_bad_input_is_one_clear_line(tmp_path, bench_file):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "grid": ["FF"], "starts": [[0, 0]], "goals": [[0, 1]]}\n'
        '{"id": "b", "grid": ["FX"], "starts": [[0, 0]], "goals": [[0, 1]]}\n'
    )
    code, _, err = run("solve", "--instances", str(bad))
    assert code == 2 and "bad.jsonl:2" in err and "grid" in err and "Traceback" not in err
    answers = tmp_path / "a.jsonl"
    io.save_jsonl(answers, [{"id": "nope", "text": ""}])
    code, _, err = run("verify", "--instances", str(bench_file), "--answers", str(answers))
    assert code == 2 and "a.jsonl:1" in err and "nope" in err


def test_render_png_and_gif(bench_file, tmp_path):
    p = io.load_instances(bench_file)[0]
    code, _, err = run(
        "render", "--instances", str(bench_file), "--id", p.id, "--out", str(tmp_path / "p.png")
    )
    assert code == 0, err
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    answers = tmp_path / "ans.jsonl"
    io.save_jsonl(
        answers, [{"id": p.id, "text": "<answer>Agent 0: UP\nAgent 1:\nAgent 2:</answer>"}]
    )
    code, _, err = run(
        "render",
        "--instances",
        str(bench_file),
        "--id",
        p.id,
        "--out",
        str(tmp_path / "p.gif"),
        "--answers",
        str(answers),
    )
    assert code == 0, err
    assert (tmp_path / "p.gif").read_bytes()[:3] == b"GIF"


def test_independent_baseline_plan_is_per_agent_shortest():
    from mapfjax.env import cli, oracle

    p = types.Problem("x", ("FFF", "FHF", "FFF"), ((0, 0), (2, 2)), ((0, 2), (2, 0)))
    plan = cli.independent_plan(p)
    assert [len(a) for a in plan] == oracle.shortest_path_lengths(p) == [2, 2]
