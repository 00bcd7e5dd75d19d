"""env.relay, the plan the shipped trace writes: the docstring's example line for line, every
action written is the one its own line and the distances decide (read from the text, not from
the planner), the plan is valid (plain-Python simulator) and reads back through the parser and
the line checker, a run that fails is written and the next order tried, and where every order
fails the trace ends on `no order left` and the oracle answers."""

import re

import pytest

from mapfjax.env import forms, relay, simulate, text, trace
from mapfjax.env.types import Problem
from mapfjax.rl import data
from tests.models.test_bpe import random_problems

DOC = Problem(id="doc", grid=("FFH", "FFF", "FFF"), starts=((1, 2), (0, 1)), goals=((1, 1), (2, 1)))
_LINE = re.compile(r"^t(\d+) A(\d+) \((\d+), (\d+)\)( taken)? (.*) = ([A-Z]+) \((\d+), (\d+)\)$")
_CELLS = re.compile(r"(UP|DOWN|LEFT|RIGHT) (off|\((\d+), (\d+)\) (\S+))")


def _doc_lines() -> list[str]:
    return [
        re.split(r"\s{3,}", x.strip())[0]
        for x in relay.__doc__.splitlines()
        if x.startswith("    ") and x.strip()
    ]


def test_the_docstring_example_is_what_the_planner_writes():
    order, plans, tries, tried = relay.retry(DOC)
    assert (order, tries, tried) == ((0, 1), (), 1)
    assert trace.render_relay(DOC, plans, order).splitlines() == _doc_lines()
    assert relay.rule_trace(DOC).splitlines() == _doc_lines()
    assert simulate.simulate(DOC, plans)["valid"]


def _bfs(problem: Problem, goal, walls) -> dict:
    """Plain BFS over the grid's free cells to `goal`, `walls` impassable."""
    free = {(r, c) for r, row in enumerate(problem.grid) for c, ch in enumerate(row) if ch != "H"}
    d, frontier = {tuple(goal): 0}, [tuple(goal)]
    while frontier:
        nxt = []
        for r, c in frontier:
            for q in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if q in free and q not in walls and q not in d:
                    d[q] = d[(r, c)] + 1
                    nxt.append(q)
        frontier = nxt
    return d


def _nbrs(rc):
    r, c = rc
    return ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))


def decided(problem: Problem, runs: str, line_re=_LINE, groups=(5, 6, 7)) -> list[bool]:
    """For each move line of `runs` (one attempt's lines, matched by `line_re`, whose groups 2-4
    are the agent and its cell and `groups` the `taken` mark, the four cells and the action):
    is its action the rule's, read from the line's own text (its cells, `taken` marks, the
    map's holes) and the distances to the agent's goal with the goals of the agents written
    before it as walls?"""
    taken_at, cells_at, action_at = groups
    out, seen = [], []
    for line in runs.splitlines():
        m = line_re.match(line)
        if m is None:
            continue
        i = int(m.group(2))
        if i not in seen:
            seen.append(i)
        walls = {tuple(problem.goals[j]) for j in seen[:-1]}
        d = _bfs(problem, problem.goals[i], walls)
        plain = _bfs(problem, problem.goals[i], set())
        inf = float("inf")
        here = (int(m.group(3)), int(m.group(4)))
        dh = d.get(here, min((d.get(q, inf) for q in _nbrs(here)), default=inf) + 1)
        if here in walls:
            dh = min((d.get(q, inf) for q in _nbrs(here) if q not in walls), default=inf) + 1
        open_ = []
        for name, _, r, c, what in _CELLS.findall(m.group(cells_at)):
            if r and what not in ("H", "taken"):
                open_.append((name, (int(r), int(c))))
        closer = [n for n, q in open_ if q not in walls and d.get(q, inf) == dh - 1]
        if closer:
            want = closer[0]
        elif not m.group(taken_at) and dh < inf:
            want = "WAIT"
        else:
            want = min(open_, key=lambda nq: (nq[1] in walls, d.get(nq[1], inf), plain[nq[1]]))[0]
        out.append(m.group(action_at) == want)
    return out


@pytest.mark.parametrize("agents", [2, 3])
def test_every_action_is_decided_by_its_own_line_and_the_plan_is_valid(agents):
    found = 0
    for p in random_problems(60, seed=5 + agents, sizes=(3, 4, 5, 6)):
        if agents == 3:  # a third agent on a free cell no other start or goal holds
            used = {*map(tuple, p.starts), *map(tuple, p.goals)}
            free = [
                (r, c)
                for r, row in enumerate(p.grid)
                for c, ch in enumerate(row)
                if ch != "H" and (r, c) not in used
            ]
            if len(free) < 2:
                continue
            p = Problem(p.id, p.grid, (*p.starts, free[0]), (*p.goals, free[-1]))
        order, plans, tries, _ = relay.retry(p)
        if plans is None:
            continue
        found += 1
        assert simulate.simulate(p, plans)["valid"]
        tr = relay.rule_trace(p)
        assert tr == trace.render_relay(p, plans, order, tries)
        assert all(decided(p, tr.split("\nretry ")[-1])), tr
        assert trace.parse_trace(tr, agents) == (plans, None)
        response = trace.think_block(tr) + text.render_answer(plans)
        assert relay.check_trace(p, response) == (len(tr.splitlines()), None)
        assert text.parse_answer(response, agents)[0] == plans
        # the orders tried before are those before it, in permutations order
        assert [t.order for t in tries] == list(relay.orders(agents))[: len(tries)]
        assert order == list(relay.orders(agents))[len(tries)]
    assert found >= 40  # most puzzles have a relay plan


def test_a_later_agent_s_lines_mark_where_earlier_agents_stand():
    lines = relay.rule_trace(DOC).splitlines()
    # A0 rests on (1, 1) from t1: every later A1 line next to it shows it taken
    a1 = [x for x in lines if " A1 " in x]
    assert "DOWN (1, 1) taken" in a1[0] and "RIGHT (1, 1) taken" in a1[2]
    # an earlier agent coming into a later one's cell is written after that cell, and a swap
    swap = Problem(id="swap", grid=("FFF",), starts=((0, 0), (0, 1)), goals=((0, 2), (0, 0)))
    tr = trace.render_relay(swap, [[4, 4], [0, 3]], (0, 1))
    assert "t1 A1 (0, 1) taken UP off DOWN off LEFT (0, 0) taken RIGHT (0, 2) G" in tr


def test_check_trace_names_a_wrong_relay_mark():
    _, plans, _, _ = relay.retry(DOC)
    good = trace.think_block(relay.rule_trace(DOC)) + text.render_answer(plans)
    bad = good.replace("DOWN (1, 1) taken", "DOWN (1, 1) G", 1)
    assert relay.check_trace(DOC, bad) == (6, "content")
    moved = good.replace("= LEFT (0, 0)", "= LEFT (0, 1)", 1)
    assert relay.check_trace(DOC, moved) == (6, "target")
    assert relay.check_trace(DOC, good.replace("(0, 2) H", "(0, 2) F", 1)) == (0, "holes")


# A1 starts boxed in by a hole and A0's goal: in index order it is cornered at t1, so the
# trace that retries writes that line and starts again with A1 first (A0 then waits a step).
CORNER = Problem(
    id="corner",
    grid=("FHFF", "FFFF", "FHFF", "FFFF"),
    starts=((2, 0), (0, 0)),
    goals=((1, 0), (1, 1)),
)
CORNER_LINES = [
    "t1 A0 (2, 0) UP (1, 0) G DOWN (3, 0) F LEFT off RIGHT (2, 1) H = UP (1, 0)",
    "t1 A1 (0, 0) UP off DOWN (1, 0) taken LEFT off RIGHT (0, 1) H = cornered",
    "retry A1 A0",
    "t1 A1 (0, 0) UP off DOWN (1, 0) G LEFT off RIGHT (0, 1) H = DOWN (1, 0)",
    "t2 A1 (1, 0) UP (0, 0) s DOWN (2, 0) S LEFT off RIGHT (1, 1) g = RIGHT (1, 1)",
    "t1 A0 (2, 0) UP (1, 0) taken DOWN (3, 0) F LEFT off RIGHT (2, 1) H = WAIT (2, 0)",
    "t2 A0 (2, 0) UP (1, 0) G DOWN (3, 0) F LEFT off RIGHT (2, 1) H = UP (1, 0)",
]


def _response(p: Problem) -> str:
    return forms.GRID_RELAY.response(p)


def test_a_cornered_run_is_written_then_the_other_order():
    order, plans, tries, tried = relay.retry(CORNER)
    assert (order, tried) == ((1, 0), 2) and [t.outcome for t in tries] == ["cornered"]
    assert simulate.simulate(CORNER, plans)["valid"] and plans == [[0, 1], [2, 4]]
    lines = trace.render_relay(CORNER, plans, order, tries).splitlines()
    assert lines[len(trace.render_header(CORNER)) :] == CORNER_LINES
    assert trace.parse_trace("\n".join(lines), 2) == (plans, None)
    assert relay.attempt(CORNER, (0, 1))[2] == "cornered"
    assert relay.every_order_fails(CORNER) is None


def test_every_retrying_trace_reads_back_and_checks_right():
    """Over generated puzzles: the trace and answer read back into the retry's plan, every line
    checks against the rule's attempts, and the attempts fail on a line (cornered, or a loop
    back to the cell of the step it names) and start in index order."""
    retried = 0
    for p in random_problems(120, seed=13, sizes=(3, 4, 5, 6)):
        order, plans, tries, _ = relay.retry(p)
        if plans is None:
            continue
        assert not tries or [i for i, _ in tries[0].runs][0] == 0
        for t in tries:
            assert t.outcome in ("cornered", "loop")
            if t.outcome == "loop":
                i, actions = t.runs[-1]
                cells = trace.cells_by_time(p.starts[i], actions)
                assert cells[t.again - 1] == cells[-1] and t.again < len(cells)
        response = _response(p)
        body = trace.thinking_text(response)
        assert trace.parse_trace(body, 2) == (plans, None)
        assert text.parse_answer(response, 2)[0] == plans
        assert relay.check_trace(p, response) == (len(body.splitlines()), None)
        assert body.count("\nretry ") == len(tries)
        assert relay.retry_truth(p, body) == tries
        if tries:  # without the rule's attempts, the failed ones are not the truth's lines
            assert trace.check_trace(p, response)[1] is not None
        retried += bool(tries)
    assert retried >= 3  # the draw holds retries (about 1 puzzle in 6)


def test_a_wrong_failure_claim_is_an_error_in_the_failed_attempt():
    """A trace that gives up on index order where the rule fails it on another line, or names
    the wrong step of a loop, is first wrong on that line."""
    good = _response(CORNER)
    bad = good.replace("LEFT off RIGHT (0, 1) H = cornered", "LEFT off RIGHT (0, 1) F = cornered")
    header = len(trace.render_header(CORNER))
    assert relay.check_trace(CORNER, bad) == (header + 1, "content")
    for p in random_problems(120, seed=13, sizes=(3, 4, 5, 6)):
        tries = relay.retry(p)[2]
        if tries and tries[0].outcome == "loop":
            good = _response(p)
            claim = f"= loop t{tries[0].again}"
            bad = good.replace(claim, f"= loop t{tries[0].again + 1}")
            at = next(k for k, x in enumerate(trace.thinking_text(good).splitlines()) if claim in x)
            assert bad != good and relay.check_trace(p, bad) == (at, "target")
            break
    else:
        pytest.fail("no loop among the generated puzzles")


# Retrying traces broken in four ways, and what a parser says of each (shared with the
# layouts the experiments tried).
BROKEN_RETRIES = [
    (lambda b: b.split("\nretry")[0], "ends on a failed run"),
    (lambda b: b.replace("retry A1 A0", "try A1 A0"), "no retry line after a failed run"),
    (lambda b: b.split("\nretry A1 A0")[0] + "\nretry A1 A0", "no run after the last retry"),
    (lambda b: b.replace("retry A1 A0", "retry A1 A0\nnow A1"), "not a relay line: 'now A1'"),
]


@pytest.mark.parametrize("cut, reason", BROKEN_RETRIES)
def test_a_broken_retry_is_a_parse_error_not_a_crash(cut, reason):
    body = trace.thinking_text(_response(CORNER))
    plans, why = trace.parse_trace(cut(body), 2)
    assert plans is None and reason in why
    assert relay.check_trace(CORNER, f"<think>\n{cut(body)}\n</think>\n") == (0, "unreadable")


# Two agents swapping ends of a corridor with one side pocket: the oracle sends one into the
# pocket, the relay's rule corners the second agent in either order.
SWAP = Problem(
    id="swap", grid=("FFF", "HFH", "HHH"), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0))
)
SWAP_TAIL = [
    "t2 A0 (0, 0) taken UP off DOWN (1, 0) H LEFT off RIGHT (0, 1) taken = cornered",
    "no order left",
]


def test_a_trace_ends_when_every_order_fails_and_the_oracle_answers():
    """Both orders of SWAP are cornered: the trace writes both attempts, then `no order left`,
    and closes; the answer after it is the oracle's plan (valid), which the trace does not
    choose, or the plan given."""
    order, plans, tries, tried = relay.retry(SWAP)
    assert plans is None and tried == 2 and [t.outcome for t in tries] == ["cornered"] * 2
    assert relay.every_order_fails(SWAP) == tries
    response = _response(SWAP)
    body = trace.thinking_text(response)
    assert body.splitlines()[-2:] == SWAP_TAIL and body.count("\nretry A1 A0\n") == 1
    assert body == relay.rule_trace(SWAP)
    assert trace.parse_trace(body, 2) == (None, trace.NO_ORDER)
    answer, _ = text.parse_answer(response, 2)
    assert answer is not None and simulate.simulate(SWAP, answer)["valid"]
    assert relay.check_trace(SWAP, response) == (len(body.splitlines()), None)
    assert trace.trace_plan_outcome(SWAP, response) == ("no_plan", None)
    mine = [[4, 4], [3, 3]]  # answers given: the ending trace, then that answer (not the oracle's)
    given = data.responses([SWAP], [mine], "grid_relay")[0]
    assert given == f"<think>\n{body}\n</think>\n\n" + text.render_answer(mine)


def test_every_ending_trace_reads_back_and_checks_right():
    """Over generated puzzles: where every order fails on a line the ending trace checks right
    against the rule and its answer is a valid plan; elsewhere the form writes the retry's
    plan, or no trace where an order fails in a way no line shows."""
    ended = 0
    for p in random_problems(300, seed=13, sizes=(3, 4, 5, 6)):
        got = _response(p)
        found = relay.retry(p)
        if relay.every_order_fails(p, found) is None:
            want = None if found[1] is None else relay.rule_trace(p)
            assert got == (None if want is None else trace.think_block(want)
                           + text.render_answer(found[1]))  # fmt: skip
            continue
        ended += 1
        body = trace.thinking_text(got)
        assert body.endswith("\n" + trace.NO_ORDER)
        assert relay.check_trace(p, got) == (len(body.splitlines()), None)
        assert simulate.simulate(p, text.parse_answer(got, 2)[0])["valid"]
    assert ended >= 2  # about 1 puzzle in 60 of this draw


def test_a_wrong_ending_is_an_error_and_a_broken_one_a_parse_error():
    """`no order left` after CORNER's first failed attempt, where the next order has a plan,
    is first wrong there; text after it, or the line with no failed run before it, is a parse
    error with its reason, never a crash; render_relay refuses an ending without attempts."""
    good = trace.thinking_text(_response(CORNER))
    early = good.split("\nretry A1 A0")[0] + "\nno order left"
    response = f"<think>\n{early}\n</think>\n\n" + text.render_answer([[0, 1], [2, 4]])
    assert trace.parse_trace(early, 2) == (None, trace.NO_ORDER)
    header = len(trace.render_header(CORNER))
    assert relay.check_trace(CORNER, response) == (header + 2, "position")  # not the retry
    ended = trace.thinking_text(_response(SWAP))
    for bad, reason in [
        (ended + "\nt1 A0 (0, 0)", "a line after 'no order left'"),
        (good.replace("retry A1 A0", "no order left\nretry A1 A0"), "a line after"),
        (good + "\nno order left", "not a relay line: 'no order left'"),
    ]:
        plans, why = trace.parse_trace(bad, 2)
        assert plans is None and reason in why
        assert relay.check_trace(SWAP, f"<think>\n{bad}\n</think>\n") == (0, "unreadable")
    tries = relay.retry(SWAP)[2]
    with pytest.raises(ValueError, match="ended: a trace that ends on NO_ORDER has tries"):
        trace.render_relay(SWAP, [[], []], None, ended=True)
    with pytest.raises(ValueError, match="ended: a trace that ends on NO_ORDER has tries"):
        trace.render_relay(SWAP, [[], []], (0, 1), tries, ended=True)
