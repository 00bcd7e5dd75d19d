"""env.locality: which actions the trace's move lines decide, the optimal plan with the fewest
undecided ones (against the CBS oracle's cost and the plain-Python simulator), the rule as a
planner, and projects/go_no_go/trace_locality.py's table."""

import json
import pathlib
import subprocess
import sys

import pytest

from mapfjax.env import io, oracle, simulate
from mapfjax.env.types import DOWN, RIGHT, UP, WAIT, Problem
from projects.go_no_go import locality
from tests.models.test_bpe import random_problems

ROOT = pathlib.Path(__file__).resolve().parents[3]

# A0 must cross (0, 1), A1's goal, before A1 settles there: A1 waits while A0's line says A0
# goes to (0, 1), so its UP cell reads `taken` and the wait is decided by its own line.
CROSS = Problem(
    id="cross",
    grid=("FFF", "HFH"),
    starts=((0, 0), (1, 1)),
    goals=((0, 2), (0, 1)),
)


def test_a_wait_behind_a_taken_cell_is_decided_and_a_wait_beside_a_free_progress_move_is_not():
    assert locality.explained(CROSS, [[RIGHT, RIGHT], [WAIT, UP]]) == [[True, True], [True, True]]
    # A0 waiting first: its RIGHT cell is free and closer to its goal (A1 is written after it)
    got = locality.explained(CROSS, [[WAIT, RIGHT, RIGHT], [UP]])
    assert got[0][0] is False and got[1] == [True]
    assert locality.unexplained_count(CROSS, [[WAIT, RIGHT, RIGHT], [UP]]) == 1
    # a move away from the goal is never decided
    assert locality.explained(CROSS, [[DOWN], []])[0] == [False]


def test_the_rule_as_a_planner_and_the_search_find_the_decided_plan():
    assert locality.greedy_plans(CROSS) == [[RIGHT, RIGHT], [WAIT, UP]]
    plans, soc, miss = locality.most_explained_optimal(CROSS)
    assert (plans, soc, miss) == ([[RIGHT, RIGHT], [WAIT, UP]], 4, 0)
    assert simulate.simulate(CROSS, plans)["valid"]


def test_writing_the_yielding_agent_last_decides_its_wait():
    mirror = Problem("mirror", CROSS.grid, CROSS.starts[::-1], CROSS.goals[::-1])
    plans, soc, miss = locality.most_explained_optimal(mirror)
    assert (plans, soc, miss) == ([[WAIT, UP], [RIGHT, RIGHT]], 4, 1)  # A0 waits unprompted
    assert locality.most_explained_optimal(mirror, any_order=True)[1:] == (4, 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_search_is_optimal_and_never_leaves_more_undecided_than_the_oracle(seed):
    wait_seen = 0
    for p in random_problems(30, seed, sizes=(3, 4, 5), hole_ratio=0.25):
        sol = oracle.solve(p)
        plans, soc, miss = locality.most_explained_optimal(p)
        assert soc == sol.soc, p  # the CBS oracle's optimum, found independently
        r = simulate.simulate(p, plans)
        assert r["valid"] and r["soc"] == soc, (p, plans, r)
        assert locality.unexplained_count(p, plans) == miss
        orc = oracle.answer_actions(sol)
        assert miss <= locality.unexplained_count(p, orc)
        free = locality.most_explained_optimal(p, any_order=True)
        assert free[1] == soc and free[2] <= miss
        if not p.needs_wait:
            # every agent walks a shortest path without a conflict: each move is progress
            assert locality.unexplained_count(p, orc) == 0, p
        wait_seen += bool(p.needs_wait)
    assert wait_seen  # the draw exercised puzzles that need a wait


def test_the_search_refuses_too_many_agents_and_reports_an_unsolvable_puzzle():
    four = Problem("four", ("FFFF",) * 4, ((0, 0), (0, 1), (0, 2), (0, 3)),
                   ((3, 0), (3, 1), (3, 2), (3, 3)))  # fmt: skip
    with pytest.raises(ValueError, match=r"'four': 4 agents; the joint search takes 3"):
        locality.most_explained_optimal(four)
    cut = Problem("cut", ("FHF",), ((0, 0), (0, 2)), ((0, 2), (0, 0)))
    with pytest.raises(ValueError, match="'cut': no plan reaches every goal"):
        locality.most_explained_optimal(cut)


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.trace_locality", *args], cwd=ROOT,
        capture_output=True,
        text=True,
    )  # fmt: skip


def test_the_script_splits_a_policy_by_whether_the_plan_is_decided(tmp_path):
    probs = [oracle.label(p)[0] for p in (CROSS, *random_problems(5, 3))]
    inst = tmp_path / "inst.jsonl"
    io.save_instances(inst, probs)
    ev_dir = tmp_path / "eval"
    ev_dir.mkdir()
    rows = [{"id": p.id, "valid": i % 2 == 0} for i, p in enumerate(probs)]
    (ev_dir / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _run(f"--instances={inst}", f"--evals={ev_dir}", "--labels=pol")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    cells = lambda line: [c.strip() for c in line.split("|")[1:-1]]
    decided = [
        locality.unexplained_count(p, oracle.answer_actions(oracle.solve(p))) == 0 for p in probs
    ]
    all_row = cells(next(x for x in lines if x.startswith("| all")))
    assert all_row[:2] == ["all", str(len(probs))]
    nodes = sorted(oracle.solve(p).nodes for p in probs)
    assert all_row[-1] == f"{nodes[len(nodes) // 2]} / {nodes[int(0.9 * len(nodes))]} / {nodes[-1]}"
    header, row = cells(lines[-3]), cells(lines[-1])
    assert header[1] == f"plan decided (n={sum(decided)}): valid %"
    assert header[3] == f"not decided (n={len(probs) - sum(decided)}): valid %"
    want = [rows[i]["valid"] for i, d in enumerate(decided) if d]
    assert row[0] == "pol" and row[1].startswith(f"{100 * sum(want) / len(want):.1f} [")
    # a second policy is paired against the first on the same puzzles
    two = _run(f"--instances={inst}", f"--evals={ev_dir},{ev_dir}", "--labels=a,b")
    a, b = (cells(x) for x in two.stdout.strip().splitlines()[-2:])
    assert a[2] == "-" and b[2].startswith("0.0 [") and b[1] == a[1], two.stdout
    # a run's validation.json reads the same
    val = tmp_path / "validation.json"
    val.write_text(json.dumps({"rows": rows}))
    again = _run(f"--instances={inst}", f"--evals={val}", "--labels=pol")
    assert again.returncode == 0 and again.stdout == out.stdout, again.stderr
    # a verdict file that misses a puzzle, and mismatched labels: one line naming the problem
    (ev_dir / "verdicts.jsonl").write_text(json.dumps(rows[0]) + "\n")
    bad = _run(f"--instances={inst}", f"--evals={ev_dir}", "--labels=pol")
    assert bad.returncode == 2 and "no verdict for" in bad.stderr and str(ev_dir) in bad.stderr
    bad = _run(f"--instances={inst}", f"--evals={ev_dir}", "--labels=a,b")
    assert bad.returncode == 2 and "--labels names 2 evaluations, --evals 1" in bad.stderr
