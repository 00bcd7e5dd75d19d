"""Checkpoints evaluated on the same instances, compared per size group and paired."""

import json
import subprocess
import sys

import pytest

from mapfjax import stats
from mapfjax.configfile import ROOT
from mapfjax.env import io
from mapfjax.env.types import Problem
from mapfjax.eval import evaluate as ev


def _problem(i: int, n: int) -> Problem:
    grid = tuple("F" * n for _ in range(n))
    return Problem(f"p{i}", grid, ((0, 0), (n - 1, n - 1)), ((n - 1, 0), (0, n - 1)))


def _eval_dir(path, valid: dict[str, bool]):
    path.mkdir()
    rows = [{"id": k, "valid": v, "optimal": v} for k, v in valid.items()]
    (path / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def case(tmp_path):
    problems = [_problem(i, 3 if i < 6 else 7) for i in range(10)]
    a = [True, True, False, False, True, False, True, False, False, False]
    b = [True, False, True, True, True, True, False, False, True, False]
    ids = [p.id for p in problems]
    dirs = [
        _eval_dir(tmp_path / k, dict(zip(ids, v, strict=True))) for k, v in (("a", a), ("b", b))
    ]
    return problems, dirs, a, b


def test_rates_and_paired_changes_per_size_group(case):
    problems, dirs, a, b = case
    table = ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,), (3, 7)])
    lines = table.splitlines()
    assert lines[0].startswith("| model | 3x3-3x3 valid % (n=6) | vs A (points) | discordant |")
    small = stats.paired_proportion_difference(b[:6], a[:6])
    assert small.value == pytest.approx(2 / 6)
    allp = stats.paired_proportion_difference(b, a)
    assert lines[2] == "| A | 50.0 [19, 81] | - | - | 40.0 [17, 69] | - | - |"
    want_small = f"+33.3 [{stats.percent(small.low, 0)}, {stats.percent(small.high, 0)}]"
    want_all = f"+20.0 [{stats.percent(allp.low, 0)}, {stats.percent(allp.high, 0)}]"
    assert lines[3] == f"| B | 83.3 [44, 97] | {want_small} | 4 | 60.0 [31, 83] | {want_all} | 6 |"


def test_mismatched_answers_or_an_empty_group_are_clear_errors(case, tmp_path):
    problems, dirs, a, _ = case
    with pytest.raises(ValueError, match="0 answered puzzles are not in the instances and 1"):
        ev.compare_evaluations(dirs, ["A", "B"], problems + [_problem(99, 3)], [(3,)])
    with pytest.raises(ValueError, match=r"sizes \(5,\): no puzzle of these sizes"):
        ev.compare_evaluations(dirs, ["A", "B"], problems, [(5,)])
    with pytest.raises(ValueError, match=r"2 evaluations but 3 labels \['A \(x', ' y\)', 'B'\]"):
        ev.compare_evaluations(dirs, ["A (x", " y)", "B"], problems, [(3,)])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "verdicts.jsonl").write_text("{")
    with pytest.raises(ValueError, match=r"broken/verdicts.jsonl:1: not JSON"):
        ev.compare_evaluations([dirs[0], tmp_path / "broken"], ["A", "B"], problems, [(3,)])


def test_a_subset_of_the_answered_puzzles_is_compared_on_its_own(case):
    """subset=True: the instances are a part of what the evaluations answered (the first 400
    of a larger held-out set); the table is the one of those puzzles alone."""
    problems, dirs, a, b = case
    part = [p for p in problems if p.height == 3]
    with pytest.raises(ValueError, match=r"not in the instances.*\(or of a part of it, with"):
        ev.compare_evaluations(dirs, ["A", "B"], part, [(3,)])
    table = ev.compare_evaluations(dirs, ["A", "B"], part, [(3,)], subset=True)
    full = ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,)])
    assert table == full
    with pytest.raises(ValueError, match="and 1 instances have no answer"):
        ev.compare_evaluations(dirs, ["A", "B"], part + [_problem(99, 3)], [(3,)], subset=True)


def test_command_line(case, tmp_path):
    problems, dirs, _, _ = case
    io.save_instances(tmp_path / "inst.jsonl", problems)
    argv = [sys.executable, "launch/compare_evals.py", f"--instances={tmp_path / 'inst.jsonl'}",
            f"--evals={dirs[0]},{dirs[1]}", "--sizes=3", "--sizes=3-7",
            f"--out={tmp_path / 't.md'}"]  # fmt: skip
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "t.md").read_text().strip() == out.stdout.strip()
    assert "| b | 83.3 [44, 97] | +33.3" in out.stdout
    bad = subprocess.run([*argv[:3], f"--evals={dirs[0]},{tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ")


def test_trace_comparison_counts_copies_and_valid_trace_plans(tmp_path):
    """Per answers file: readable traces, answers equal to their trace's plan, and the valid
    rates of the trace plans and of the answers; a missing answer is no trace."""
    from mapfjax.env import simulate, text, trace
    from mapfjax.env.types import DOWN, RIGHT, UP

    p = [_problem(i, 3) for i in range(3)]  # agent 0 (0,0)->(2,0); agent 1 (2,2)->(0,2)
    good, bad = [[DOWN, DOWN], [UP, UP]], [[RIGHT], [UP, UP]]
    assert simulate.simulate(p[0], good)["valid"] and not simulate.simulate(p[0], bad)["valid"]
    think = lambda q, plans: trace.think_block(trace.render_relay(q, plans, (0, 1)))
    rows = [  # copied and valid; trace valid but the answer another (invalid) plan; none for p2
        {"id": "p0", "text": think(p[0], good) + text.render_answer(good)},
        {"id": "p1", "text": think(p[1], good) + text.render_answer(bad)},
    ]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ev.trace_comparison([path], ["T"], p).splitlines()
    assert lines[2] == "| T | 3 | 2 | 1 | 66.7 [21, 94] | 33.3 [6, 79] |"
    with pytest.raises(ValueError, match="1 answer files but 2 labels"):
        ev.trace_comparison([path], ["T", "U"], p)
    with pytest.raises(ValueError, match="no answers"):
        ev.trace_comparison([tmp_path / "none.jsonl"], ["T"], p)


def test_seeds_joined_by_plus_compare_per_puzzle_means(case, tmp_path):
    problems, dirs, a, b = case
    ids = [p.id for p in problems]
    # A second sample of each side: B's second sample fails everywhere.
    a2 = _eval_dir(tmp_path / "a2", dict(zip(ids, a, strict=True)))
    b2 = _eval_dir(tmp_path / "b2", dict.fromkeys(ids, False))
    specs = [f"{dirs[0]}+{a2}", f"{dirs[1]}+{b2}"]
    table = ev.compare_evaluations(specs, ["A", "B"], problems, [(3, 7)])
    lines = table.splitlines()
    assert lines[0].startswith("| model | 3x3-7x7 mean valid % (n=10) | vs A (points) |")
    mean_b = [v / 2 for v in b]
    assert lines[2].startswith(f"| A | {stats.interval_text(stats.bounded_mean(a))} | - |")
    change = stats.paired_difference(mean_b, [float(x) for x in a])
    assert lines[3] == (
        f"| B | {stats.interval_text(stats.bounded_mean(mean_b))} | "
        f"{stats.interval_text(change, signed=True)} | {sum(x != y for x, y in zip(mean_b, a))} |"
    )
    assert change.value == pytest.approx((sum(b) / 2 - sum(a)) / 10)
    # A joined directory that answered other puzzles is named.
    other = _eval_dir(tmp_path / "other", {"p0": True})
    with pytest.raises(ValueError, match="other: 0 answered puzzles are not in the instances"):
        ev.compare_evaluations([f"{dirs[0]}+{other}"], ["A"], problems, [(3,)])


def test_split_by_waits_adds_both_halves_of_each_size_group(case):
    problems, dirs, a, b = case
    with pytest.raises(ValueError, match="10 instances .* have no needs_wait label"):
        ev.compare_evaluations(dirs, ["A", "B"], problems, [(3, 7)], split_wait=True)
    labelled = [p.with_labels(None, None, i % 2 == 0) for i, p in enumerate(problems)]
    table = ev.compare_evaluations(dirs, ["A", "B"], labelled, [(3, 7)], split_wait=True)
    header, _, row_a, row_b = table.splitlines()
    assert "3x3-7x7 needs a wait valid % (n=5)" in header
    assert "3x3-7x7 needs none valid % (n=5)" in header
    even = stats.paired_proportion_difference(b[::2], a[::2])
    odd = stats.paired_proportion_difference(b[1::2], a[1::2])
    cells = [c.strip() for c in row_b.strip("|").split("|")]
    assert cells[5] == stats.interval_text(even, signed=True)
    assert cells[8] == stats.interval_text(odd, signed=True)
    assert cells[1] == stats.interval_text(stats.proportion(b))


def test_pass_at_k_counts_a_puzzle_solved_when_any_sample_is_valid(case, tmp_path):
    """solved_by="any": a joined evaluation scores 1 on a puzzle any of its samples solves,
    with proportion intervals, paired against a greedy evaluation on the same puzzles."""
    problems, dirs, a, b = case
    ids = [p.id for p in problems]
    b2 = _eval_dir(tmp_path / "b2", dict(zip(ids, a, strict=True)))  # B's second sample = A
    table = ev.compare_evaluations(
        [dirs[0], f"{dirs[1]}+{b2}"], ["greedy", "pass@2"], problems, [(3, 7)], solved_by="any"
    )
    header, _, row_a, row_b = table.splitlines()
    assert "3x3-7x7 pass@k valid % (n=10)" in header
    solved = [x or y for x, y in zip(a, b, strict=True)]
    assert sum(solved) == 8
    change = stats.paired_proportion_difference(solved, a)
    assert row_b == (
        f"| pass@2 | {stats.interval_text(stats.proportion(solved))} | "
        f"{stats.interval_text(change, signed=True)} | 4 |"
    )
    # the same joined evaluation read as mean@2 differs: it is the default
    mean = ev.compare_evaluations([dirs[0], f"{dirs[1]}+{b2}"], ["g", "m"], problems, [(3, 7)])
    assert "mean valid %" in mean.splitlines()[0] and mean != table
    with pytest.raises(ValueError, match="solved_by = 'all': allowed mean, any"):
        ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,)], solved_by="all")


def test_the_optimal_metric_counts_only_valid_plans_of_optimal_cost(tmp_path):
    """metric="optimal": a valid but longer plan counts 0 (a row's optimal flag is only read
    when its plan is valid); the header names the metric."""
    problems = [_problem(i, 3) for i in range(4)]
    rows = {
        "a": [(True, True), (True, True), (True, False), (False, False)],
        "b": [(True, True), (True, False), (True, False), (True, True)],
    }
    dirs = []
    for name, flags_ in rows.items():
        d = tmp_path / name
        d.mkdir()
        lines = [
            json.dumps({"id": p.id, "valid": v, "optimal": o})
            for p, (v, o) in zip(problems, flags_, strict=True)
        ]
        (d / "verdicts.jsonl").write_text("\n".join(lines) + "\n")
        dirs.append(d)
    table = ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,)], metric="optimal")
    header, _, row_a, row_b = table.splitlines()
    assert "3x3-3x3 optimal % (n=4)" in header
    assert row_a.startswith("| A | 50.0 ")  # 2 of 4 optimal, though 3 are valid
    change = stats.paired_proportion_difference([1, 0, 0, 1], [1, 1, 0, 0])
    assert row_b == (
        f"| B | {stats.interval_text(stats.proportion([1, 0, 0, 1]))} | "
        f"{stats.interval_text(change, signed=True)} | 2 |"
    )
    valid = ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,)])
    assert "valid % (n=4)" in valid.splitlines()[0] and "| A | 75.0 " in valid
    with pytest.raises(ValueError, match="metric = 'cost': allowed valid, optimal"):
        ev.compare_evaluations(dirs, ["A", "B"], problems, [(3,)], metric="cost")


def test_wait_usage_counts_answers_that_write_a_wait_per_kind_of_puzzle(tmp_path):
    """Per answers file: the share of answers with at least one WAIT on the puzzles that need a
    wait and on those that need none; an unparsable answer writes none; a missing one or an
    unlabelled puzzle is a clear error."""
    import dataclasses

    from mapfjax.env import text
    from mapfjax.env.types import DOWN, UP, WAIT

    p = [dataclasses.replace(_problem(i, 3), needs_wait=i < 2) for i in range(4)]
    plain, waiting = [[DOWN, DOWN], [UP, UP]], [[WAIT, DOWN, DOWN], [UP, UP]]
    answers = {  # needs a wait: one waits, one does not; needs none: one waits, one unparsable
        "p0": text.render_answer(waiting),
        "p1": text.render_answer(plain),
        "p2": text.render_answer(waiting),
        "p3": "<answer>\nAgent 0: WAIT, FLY\n</answer>",
    }
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in answers.items()))
    lines = ev.wait_usage([path], ["W"], p).splitlines()
    assert lines[0] == (
        "| model | needs a wait: answers with a WAIT % (n=2) "
        "| needs none: answers with a WAIT % (n=2) |"
    )
    assert lines[2] == "| W | 50.0 [9, 91] | 50.0 [9, 91] |"
    with pytest.raises(ValueError, match="1 answer files but 2 labels"):
        ev.wait_usage([path], ["W", "X"], p)
    with pytest.raises(ValueError, match=r"no answer for 1 puzzles \(e\.g\. p4\)"):
        ev.wait_usage([path], ["W"], [*p, dataclasses.replace(_problem(4, 3), needs_wait=False)])
    with pytest.raises(ValueError, match="have no needs_wait"):
        ev.wait_usage([path], ["W"], [_problem(0, 3)])
