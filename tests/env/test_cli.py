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
        want = {"agents": 3, "size": p.height, "hole_ratio": 0.1, "wait_ratio": 0.5}
        assert p.meta == want
    assert sum(p.needs_wait for p in probs) == 3  # 0.5 of 2 per cell


def test_solve_then_verify_is_optimal(bench_file, tmp_path):
    code, out, err = run("solve", "--instances", str(bench_file), "--processes", "1")
    assert code == 0, err
    solved = [json.loads(line) for line in out.splitlines()]
    assert all(r["status"] == "optimal" for r in solved)
    answers = tmp_path / "answers.jsonl"
    rows = [{"id": r["id"], "text": "Sure!\n" + r["text"]} for r in solved]
    rows.append({"id": solved[0]["id"], "text": "<answer>\nAgent 0: UP\n</answer>"})
    io.save_jsonl(answers, rows)
    args = ("verify", "--instances", str(bench_file), "--answers", str(answers))
    code, out, err = run(*args, "--duplicates", "all")  # two samples of one instance
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


def test_generate_solve_then_render_and_verify_the_oracles_plans(tmp_path):
    """What `solve` prints is an answer file: `verify --answers` and `render --answers` read it
    as it is, and the verifier finds every plan of the oracle valid and optimal."""
    inst, plans = tmp_path / "train.jsonl", tmp_path / "plans.jsonl"
    code, _, err = run("generate", "--out", inst, "--n", "6", "--sizes", "3-5", "--wait_ratio",
                       "0.5", "--seed", "3")  # fmt: skip
    assert code == 0, err
    problems = io.load_instances(inst)
    code, out, err = run("solve", "--instances", inst, "--processes", "1")
    assert code == 0, err
    plans.write_text(out)
    solved = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in solved] == [p.id for p in problems]
    assert all(r["status"] == "optimal" and r["text"].startswith("<answer>") for r in solved)
    assert [r["puzzle_hash"] for r in solved] == [io.puzzle_hash(p) for p in problems]
    code, out, err = run("verify", "--instances", inst, "--answers", plans)
    assert code == 0, err
    verdicts = [json.loads(line) for line in out.splitlines()]
    assert [v["id"] for v in verdicts] == [p.id for p in problems]
    assert all(v["valid"] is True and v["optimal"] is True for v in verdicts), verdicts
    assert [v["soc"] for v in verdicts] == [p.optimal_soc for p in problems]
    for name, magic in (("plan.png", b"\x89PNG"), ("plan.gif", b"GIF")):
        code, _, err = run("render", "--instances", inst, "--id", problems[-1].id,
                           "--out", tmp_path / name, "--answers", plans)  # fmt: skip
        assert code == 0, err
        assert (tmp_path / name).read_bytes()[: len(magic)] == magic


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


# --- in-process checks of bad input (no subprocess, no generation) ----------------------------

EASY = types.Problem("easy", ("FFF",), ((0, 0),), ((0, 2),), optimal_soc=2, optimal_makespan=2)
SWAP = types.Problem("swap", ("FFF", "HFH"), ((0, 0), (0, 2)), ((0, 2), (0, 0)))
STUCK = types.Problem("stuck", ("FF",), ((0, 0), (0, 1)), ((0, 1), (0, 0)))


def main(capsys, *argv):
    """(exit status, stdout, stderr) of `python -m mapfjax.env ARGV`, in process."""
    from mapfjax.env.__main__ import main as env_main

    try:
        code = env_main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["generate", "--out", "o.jsonl", "--n", "-5"], ["--n", "-5", ">= 1"]),
        (["generate", "--out", "o.jsonl", "--seed", "-1"], ["--seed", "-1"]),
        (["generate", "--out", "o.jsonl", "--agents", "9"], ["--agents", "9", "[1, 5]"]),
        (["generate", "--out", "o.jsonl", "--hole_ratio", "0.9"], ["--hole_ratio", "0.9"]),
        (["generate", "--out", "o.jsonl", "--sizes", "10-3"], ["--sizes", "10-3"]),
        (["generate", "--out", "o.jsonl", "--set", "seed=3"], ["--set", "seed"]),
        (["benchmark", "--out", "o.jsonl", "--per_cell", "0"], ["--per_cell", "0"]),
        (["benchmark", "--out", "o.jsonl", "--agents", "x"], ["--agents", "'x'"]),
        (["benchmark", "--out", "o.jsonl", "--agents", "5", "--sizes", "3,4"], ["--agents 5"]),
        (["benchmark", "--out", "o.jsonl", "--wait_ratios", "0.5,2"], ["--wait_ratios", "2"]),
        (["solve", "--instances", "i.jsonl", "--max_nodes", "-1"], ["--max_nodes", "-1"]),
        (["solve", "--instances", "i.jsonl", "--time_limit", "-1"], ["--time_limit", "-1"]),
        (["solve", "--instances", "i.jsonl", "--time_limit", "nan"], ["--time_limit", "nan"]),
        (["render", "--instances", "i.jsonl", "--id", "a", "--out", "p.jpg"], ["p.jpg", ".png"]),
        (["render", "--instances", "i.jsonl", "--id", "a", "--out", "p.gif"], ["--answers"]),
        (["solve", "--instances", "dir"], ["dir: is a directory"]),
        (["solve", "--instances", "deep.jsonl"], ["deep.jsonl:1", "nested too deeply"]),
        (["solve", "--instances", "nope.jsonl"], ["nope.jsonl: no such file"]),
        (["generate", "--out", "dir"], ["--out dir", "is a directory"]),
        (["benchmark", "--out", "file/b.jsonl"], ["--out file/b.jsonl", "file is a file"]),
        (["label", "--instances", "i.jsonl", "--out", "dir"], ["--out dir", "directory"]),
    ],
)
def test_nonsense_is_refused_in_one_line(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "\n")
    io.save_instances(tmp_path / "i.jsonl", [EASY])
    code, out, err = main(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    for w in words:
        assert w in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.jsonl", "dir", "file", "i.jsonl"]


def _answers(path, rows):
    path.write_text("".join(("" if r is None else json.dumps(r)) + "\n" for r in rows))
    return path


def test_verify_reports_missing_answers(capsys, tmp_path):
    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [EASY, SWAP, STUCK])
    ans = _answers(
        tmp_path / "a.jsonl", [{"id": "easy", "text": "<answer>Agent 0: RIGHT, RIGHT</answer>"}]
    )
    code, out, err = main(capsys, "verify", "--instances", inst, "--answers", ans)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and [r["id"] for r in rows] == ["easy", "swap", "stuck"]
    assert rows[0]["valid"] and rows[0]["optimal"]
    assert rows[1] == {"id": "swap", "valid": False, "optimal": None, "failure": "missing",
                       "soc": None, "makespan": None}  # fmt: skip
    assert "no answer for 2 of 3 instance(s)" in err and "'swap', 'stuck'" in err
    code, out, err = main(capsys, "verify", "--instances", inst, "--answers", ans,
                          "--allow_missing")  # fmt: skip
    assert code == 0 and len(out.splitlines()) == 3 and err.startswith("warning: ")


def test_an_instance_solve_has_no_plan_for_counts_as_unanswered(capsys, tmp_path):
    """`solve` writes text null where the oracle has no plan (here: unsolvable); verify and
    render read that line as no answer for the id, not as a bad line or an empty answer."""
    inst, plans = tmp_path / "i.jsonl", tmp_path / "plans.jsonl"
    io.save_instances(inst, [EASY, STUCK])
    code, out, err = main(capsys, "solve", "--instances", inst, "--processes", 1)
    assert code == 0, err
    plans.write_text(out)
    easy, stuck = (json.loads(line) for line in out.splitlines())
    assert easy["text"] == "<answer>\nAgent 0: RIGHT, RIGHT\n</answer>"
    assert stuck["status"] == "unsolvable" and stuck["text"] is None
    code, out, err = main(capsys, "verify", "--instances", inst, "--answers", plans)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and "no answer for 1 of 2 instance(s)" in err and "'stuck'" in err
    assert (rows[0]["valid"], rows[0]["optimal"]) == (True, True)
    assert rows[1]["id"] == "stuck" and rows[1]["failure"] == "missing"
    code, _, err = main(capsys, "render", "--instances", inst, "--id", "stuck",
                        "--out", tmp_path / "p.png", "--answers", plans)  # fmt: skip
    assert code == 2 and f"--id 'stuck' has no answer in {plans}" in err
    bad = _answers(tmp_path / "bad.jsonl", [{"id": "easy", "text": 7}])
    code, _, err = main(capsys, "verify", "--instances", inst, "--answers", bad)
    assert code == 2 and "bad.jsonl:1: field 'text': 7 is not a string" in err and "or null" in err


def test_verify_flags_a_label_above_a_valid_plan(capsys, tmp_path):
    import dataclasses

    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [dataclasses.replace(EASY, optimal_soc=5)])
    ans = _answers(
        tmp_path / "a.jsonl", [{"id": "easy", "text": "<answer>Agent 0: RIGHT, RIGHT</answer>"}]
    )
    code, out, err = main(capsys, "verify", "--instances", inst, "--answers", ans)
    assert code == 1 and json.loads(out)["valid"] is True
    assert "field 'optimal_soc' is wrong for 1 instance(s)" in err
    assert "'easy': soc 2 < optimal_soc 5" in err and "mapfjax.env label" in err


def test_verify_names_the_file_line_and_refuses_other_puzzles(capsys, tmp_path):
    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [EASY])
    ok = {"id": "easy", "text": "", "puzzle_hash": io.puzzle_hash(EASY)}
    ans = _answers(tmp_path / "a.jsonl", [None, ok, None, {"id": "nope", "text": ""}])
    code, _, err = main(capsys, "verify", "--instances", inst, "--answers", ans)
    assert code == 2 and "a.jsonl:4: field 'id': 'nope'" in err
    stale = {**ok, "puzzle_hash": io.puzzle_hash(SWAP)}
    ans = _answers(tmp_path / "a.jsonl", [None, ok, stale])
    code, _, err = main(capsys, "verify", "--instances", inst, "--answers", ans)
    assert code == 2 and "another puzzle with the same id (line 3 'easy')" in err


def test_label_command_labels_and_reports_budget(capsys, tmp_path):
    import dataclasses

    inst = tmp_path / "mine.jsonl"
    wrong = dataclasses.replace(EASY, optimal_soc=7, meta={"set": "mine"})
    io.save_instances(inst, [wrong, dataclasses.replace(SWAP), STUCK])
    out_path = tmp_path / "labelled.jsonl"
    code, out, err = main(capsys, "label", "--instances", inst, "--out", out_path,
                          "--processes", 1, "--time_limit", 5)  # fmt: skip
    assert code == 0
    easy, swap, stuck = io.load_instances(out_path)
    assert (easy.optimal_soc, easy.optimal_makespan, easy.needs_wait) == (2, 2, False)
    assert easy.meta == {"set": "mine"}
    assert swap.optimal_soc == 7 and swap.needs_wait is not None
    assert stuck.optimal_soc is None and stuck.needs_wait is None
    summary = json.loads(out)
    assert summary["unsolvable"] == ["stuck"] and summary["relabelled"] == ["easy"]
    assert summary["max_nodes"] == 50_000 and summary["time_limit"] == 5
    assert "labelled 2 of 3" in err and "max_nodes=50000, time_limit=5 s" in err
    # A budget too small: the instance is written without labels and counted as a timeout.
    code, out, err = main(capsys, "label", "--instances", inst, "--out", out_path,
                          "--processes", 1, "--max_nodes", 1)  # fmt: skip
    assert code == 0 and json.loads(out)["timeout"] == ["swap", "stuck"]
    assert io.load_instances(out_path)[1].optimal_soc is None and "2 timed out" in err


def test_render_format_follows_the_extension(capsys, tmp_path):
    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [EASY])
    ans = _answers(
        tmp_path / "a.jsonl", [{"id": "easy", "text": "<answer>Agent 0: RIGHT</answer>"}]
    )
    png = tmp_path / "plan.png"
    code, _, err = main(capsys, "render", "--instances", inst, "--id", "easy", "--out", png,
                        "--answers", ans)  # fmt: skip
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"  # a picture of the plan, not GIF bytes
    gif = tmp_path / "plan.GIF"
    code, _, err = main(capsys, "render", "--instances", inst, "--id", "easy", "--out", gif,
                        "--answers", ans)  # fmt: skip
    assert code == 0 and gif.read_bytes()[:3] == b"GIF"


def test_verify_refuses_duplicate_ids_unless_told_which_and_an_empty_instance_file(
    capsys, tmp_path
):
    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [EASY, SWAP])
    right = {"id": "easy", "text": "<answer>Agent 0: RIGHT, RIGHT</answer>"}
    wrong = {"id": "easy", "text": "<answer>Agent 0: UP</answer>"}
    swap = {"id": "swap", "text": ""}
    ans = _answers(tmp_path / "a.jsonl", [right, swap, wrong])
    code, out, err = main(capsys, "verify", "--instances", inst, "--answers", ans)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "a.jsonl:3: field 'id': 1 id(s) answered more than once ('easy' on lines [1, 3])" in err
    assert "--duplicates=first or --duplicates=last" in err
    for choice, valid in (("first", True), ("last", False)):
        code, out, err = main(capsys, "verify", "--instances", inst, "--answers", ans,
                              "--duplicates", choice)  # fmt: skip
        rows = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [r["id"] for r in rows] == ["easy", "swap"]
        assert rows[0]["valid"] is valid
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for command in (("verify", "--answers", ans), ("solve",)):
        code, out, err = main(capsys, *command, "--instances", empty)
        assert code == 2 and out == ""
        assert (
            err.strip() == f"error: {empty}: no instances (the file is empty); give an "
            "instance JSONL file"
        )


def test_generate_exclude_keeps_n_puzzles_outside_the_excluded_files(capsys, tmp_path):
    """--exclude: a second draw of the same config and seed leaves out every puzzle of the
    first (3x3 with 2 agents repeats often, so the top-up draws are exercised), still writes
    --n of them with distinct ids, and is deterministic."""
    flags = ["--n", "30", "--sizes", "3", "--hole_ratio", "0.2", "--wait_ratio", "0.5"]
    first, again, other = (tmp_path / f"{n}.jsonl" for n in ("first", "again", "other"))
    assert main(capsys, "generate", "--out", first, *flags)[0] == 0
    seen = {io.puzzle_hash(p) for p in io.load_instances(first)}
    for out in (again, other):
        code, _, err = main(capsys, "generate", "--out", out, *flags, "--exclude", first)
        assert code == 0, err
        assert "kept 30 puzzles outside" in err
    kept = io.load_instances(again)
    assert len(kept) == 30 and len({p.id for p in kept}) == 30
    assert not seen & {io.puzzle_hash(p) for p in kept}
    assert [io.puzzle_hash(p) for p in kept] == [
        io.puzzle_hash(p) for p in io.load_instances(other)
    ]


def test_generate_exclude_names_a_missing_file(capsys, tmp_path):
    code, _, err = main(capsys, "generate", "--out", tmp_path / "o.jsonl", "--n", "2",
                        "--sizes", "3", "--exclude", tmp_path / "nope.jsonl")  # fmt: skip
    assert code == 2 and "nope.jsonl" in err and "Traceback" not in err
