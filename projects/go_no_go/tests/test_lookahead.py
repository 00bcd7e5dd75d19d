"""projects/go_no_go/lookahead.py: the search written as trace lines. Paths are the first shortest
ones under their constraints (against a plain space-time breadth-first search), the plan is
optimal (against the CBS oracle) and valid (against the plain-Python simulator), the block reads
back through the trace's parser, and a search that gives up is a named error for SFT data."""

import collections
import itertools
import pathlib
import re

import numpy as np
import pytest

from mapfjax.env import oracle, simulate, text, trace
from mapfjax.env.joint import GridMap
from mapfjax.env.types import ACTION_DELTAS, Problem
from mapfjax.rl import data
from projects.go_no_go import layouts, locality, lookahead, traces
from projects.go_no_go.lookahead import Constraint
from tests.models.test_bpe import random_problems

CROSS = Problem(id="cross", grid=("FFF", "HFH"), starts=((0, 0), (1, 1)), goals=((0, 2), (0, 1)))


def _doc_examples() -> list[list[str]]:
    """The module docstring's two examples: its indented lines without their comments."""
    code = [re.split(r"\s{3,}", x.strip())[0] for x in lookahead.__doc__.splitlines()]
    indented = [x.startswith("    ") for x in lookahead.__doc__.splitlines()]
    blocks, current = [], []
    for line, inside in zip(code, indented, strict=True):
        if inside:
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    return blocks


def test_the_hand_examples_are_the_docstring_s():
    search_doc, priority_doc = _doc_examples()
    found = lookahead.search(CROSS)
    assert list(found.lines) == search_doc
    assert found.opened == 3 and found.plans == [[4, 4], [0, 1]]  # RIGHT RIGHT; WAIT UP
    quick = lookahead.priority(CROSS)
    assert list(quick.lines) == priority_doc and quick.plans == found.plans


def _bfs_length(grid, start, goal, cons, limit=30):
    """Least arrival time under `cons` by plain breadth-first search over (time, cell)."""
    m = GridMap(grid)
    vertex = {(c.t, c.cells[0]) for c in cons if len(c.cells) == 1}
    edge = {(c.t, *c.cells) for c in cons if len(c.cells) == 2}
    later = max((t for t, q in vertex if q == tuple(goal)), default=-1)
    layer = {tuple(start)}
    for t in range(limit):
        if tuple(goal) in layer and t > later:
            return t
        nxt = set()
        for u in layer:
            for v in m.nbrs[m.cell(u)]:
                q = m.rc(v)
                if (t + 1, q) not in vertex and (t + 1, u, q) not in edge:
                    nxt.add(q)
        layer = nxt
    return None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_path_is_a_shortest_one_that_keeps_its_constraints(seed):
    rng = np.random.default_rng(seed)
    for p in random_problems(25, seed, sizes=(3, 4)):
        m = GridMap(p.grid)
        free = [m.rc(u) for u in range(m.n) if m.nbrs[u]]
        cons = []
        for _ in range(int(rng.integers(0, 4))):
            a = free[int(rng.integers(len(free)))]
            t = int(rng.integers(1, 5))
            nbrs = [m.rc(v) for v in m.nbrs[m.cell(a)] if m.rc(v) != a]
            if nbrs and rng.random() < 0.3:
                cons.append(Constraint(0, t, (a, nbrs[int(rng.integers(len(nbrs)))])))
            else:
                cons.append(Constraint(0, t, (a,)))
        got = lookahead.path(m, p.starts[0], p.goals[0], cons, limit=30)
        want = _bfs_length(p.grid, p.starts[0], p.goals[0], cons)
        assert (None if got is None else len(got) - 1) == want, (p, cons, got)
        if got is None:
            continue
        steps = {tuple(d) for d in ACTION_DELTAS.tolist()}
        for t, (u, v) in enumerate(itertools.pairwise(got), 1):
            assert (v[0] - u[0], v[1] - u[1]) in steps and m.nbrs[m.cell(v)]
            assert all(not (c.t == t and c.cells in ((v,), (u, v))) for c in cons)


def test_without_constraints_each_step_is_the_first_move_closer_to_the_goal():
    for p in random_problems(20, 5, sizes=(4, 5)):
        m = GridMap(p.grid)
        walk = lookahead.path(m, p.starts[0], p.goals[0], ())
        solo = Problem("solo", p.grid, p.starts[:1], p.goals[:1])
        plan = [oracle.path_actions(walk)]
        assert locality.explained(solo, plan) == [[True] * len(plan[0])]
        assert locality.greedy_plans(solo) == plan  # the rule's first choice, every step


@pytest.mark.parametrize("seed", [0, 1])
def test_the_plan_is_optimal_valid_and_reads_back_through_the_trace(seed):
    outcomes = collections.Counter()
    for p in random_problems(30, seed, sizes=(3, 4, 5), hole_ratio=0.25):
        found = lookahead.search(p)
        if found.plans is None:
            outcomes["gave up"] += 1
            assert found.opened == lookahead.MAX_OPEN
            continue
        outcomes["wait" if p.needs_wait else "none"] += 1
        r = simulate.simulate(p, found.plans)
        assert r["valid"] and r["soc"] == oracle.solve(p).soc, (p, found)
        response = layouts.render_thinking(p, found.plans, "grid", found.lines) + "x"
        body = trace.thinking_text(response)
        assert layouts.parse_trace(body, 2) == (found.plans, None)
        assert layouts.check_trace(p, response)[1] is None
        assert lookahead.search(p) == found  # deterministic
        quick = lookahead.priority(p)
        if quick.plans is None:
            outcomes["priority: none"] += 1
            continue
        r = simulate.simulate(p, quick.plans)
        assert r["valid"] and r["soc"] >= found_soc(found), (p, quick)  # valid, maybe not optimal
        response = layouts.render_thinking(p, quick.plans, "grid", quick.lines) + "x"
        assert layouts.parse_trace(trace.thinking_text(response), 2) == (quick.plans, None)
        assert layouts.check_trace(p, response)[1] is None
        outcomes["priority: optimal"] += r["soc"] == found_soc(found)
    assert outcomes["wait"] and outcomes["none"] and outcomes["priority: optimal"], outcomes


def found_soc(found) -> int:
    return sum(len(a) for a in found.plans)


def test_the_priority_form_takes_two_agents():
    three = Problem("three", ("FFF",) * 3, ((0, 0), (1, 1), (2, 2)), ((2, 2), (0, 0), (1, 1)))
    with pytest.raises(ValueError, match="'three': 3 agents; the priority look-ahead takes 2"):
        lookahead.priority(three)


def test_sft_data_with_a_lookahead_uses_the_search_s_plan_and_names_a_search_that_gives_up(
    monkeypatch,
):
    turn = data.response(CROSS, None, "projects.go_no_go.traces:search")
    found = lookahead.search(CROSS)
    assert "\nopen n2\n" in turn and turn.endswith(text.render_answer(found.plans))
    monkeypatch.setattr(lookahead, "MAX_OPEN", 1)
    assert lookahead.search(CROSS).plans is None and data.responses(
        [CROSS], form=traces.search
    ) == [None]
    with pytest.raises(ValueError, match=r"'cross': the projects\.go_no_go\.traces:search trace"):
        data.response(CROSS, None, traces.search)
    allowed = (
        r"allowed \['priority', 'relay', 'relay_next', 'relay_retry', 'relay_retry_end', "
        r"'relay_where', 'search'\]"
    )
    with pytest.raises(ValueError, match=r"lookahead 'cbs': " + allowed):
        traces.form("cbs")
    with pytest.raises(ValueError, match=r"trace style 'cells'"):
        traces.form("search", "cells")


def _with_block(problem, lines) -> str:
    found = lookahead.priority(problem)
    return layouts.render_thinking(problem, found.plans, "grid", lines) + text.render_answer(
        found.plans
    )


def test_first_wrong_names_the_part_of_the_block_that_departs():
    right = list(lookahead.priority(CROSS).lines)
    assert lookahead.first_wrong(CROSS, _with_block(CROSS, right), "priority") is None
    bad_path = ["P0 (0, 0) (1, 0) (0, 2)", *right[1:]]
    assert lookahead.first_wrong(CROSS, _with_block(CROSS, bad_path), "priority") == "paths"
    bad_meet = [*right[:2], "meet none", *right[3:]]
    assert lookahead.first_wrong(CROSS, _with_block(CROSS, bad_meet), "priority") == "conflict"
    assert lookahead.first_wrong(CROSS, _with_block(CROSS, right[:-1]), "priority") == "re-plan"
    assert lookahead.first_wrong(CROSS, _with_block(CROSS, []), "priority") == "missing"


def test_the_check_script_counts_where_blocks_go_wrong(tmp_path):
    import json
    import subprocess
    import sys

    from mapfjax.env import io

    probs = [oracle.label(CROSS)[0], *random_problems(3, 7)]
    inst = tmp_path / "inst.jsonl"
    io.save_instances(inst, probs)
    ev = tmp_path / "eval"
    ev.mkdir()
    rows, answers = [], []
    for i, p in enumerate(probs):
        found = lookahead.priority(p)
        lines = list(found.lines) if i % 2 == 0 else []
        answers.append({"id": p.id, "text": _with_block(p, lines)})
        rows.append({"id": p.id, "valid": True})
    (ev / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    (ev / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = pathlib.Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.lookahead_check", f"--instances={inst}",
         f"--eval={ev}"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    table = [[c.strip() for c in x.split("|")[1:-1]] for x in out.stdout.strip().splitlines()[2:]]
    right = sum(int(r[2]) for r in table)
    missing = sum(int(r[6]) for r in table)
    assert (right, missing) == (2, 2) and sum(int(r[1]) for r in table) == 4
