"""projects/go_no_go/layouts.py: every layout the gate tried (the step blocks, the map in each
style, relay runs with `where` fields) written from a plan and read back into the same plan
(property-based), and checked line by line in any layout."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.env import oracle, simulate, text, trace
from mapfjax.env.types import LEFT, RIGHT, UP, WAIT, Problem
from projects.go_no_go import layouts, styles
from tests.env.test_text import problems as problem_strategy
from tests.env.test_trace import assert_parse_and_check_never_raise
from tests.models.test_bpe import random_problems

HAND = Problem(
    id="hand",
    grid=("FFF", "FHF", "FFF"),
    starts=((0, 0), (2, 0)),
    goals=((0, 2), (1, 0)),
)


def test_hand_example_exact_lines():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    assert layouts.render_trace(HAND, plans).splitlines() == [
        "H: (1, 1)",
        "A0 S (0, 0) G (0, 2)",
        "A1 s (2, 0) g (1, 0)",
        "t1",
        "A0 (0, 0) UP off DOWN (1, 0) g LEFT off RIGHT (0, 1) F = RIGHT (0, 1)",
        "A1 (2, 0) UP (1, 0) g DOWN off LEFT off RIGHT (2, 1) F = WAIT (2, 0)",
        "t2",
        "A0 (0, 1) UP off DOWN (1, 1) H LEFT (0, 0) S RIGHT (0, 2) G = RIGHT (0, 2)",
        "A1 (2, 0) UP (1, 0) g DOWN off LEFT off RIGHT (2, 1) F = UP (1, 0)",
    ]


def test_taken_marks_vertex_and_edge_conflicts_with_agents_written_earlier():
    p = Problem(id="c", grid=("FFF",), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0)))
    lines = layouts.render_trace(p, [[RIGHT], [LEFT]]).splitlines()
    # Agent 0 goes to (0, 1), written first: agent 1's LEFT would enter it too (vertex).
    assert lines[5] == "A1 (0, 2) UP off DOWN off LEFT (0, 1) taken RIGHT off = LEFT (0, 1)"
    swap = Problem(id="e", grid=("FF",), starts=((0, 0), (0, 1)), goals=((0, 1), (0, 0)))
    lines = layouts.render_trace(swap, [[RIGHT], [LEFT]]).splitlines()
    assert "LEFT (0, 0) taken" in lines[5]  # agent 0 stands there and comes to (0, 1): a swap
    assert layouts.render_trace(Problem("n", ("F",), ((0, 0),), ((0, 0),)), [[]]) == (
        "H: none\nA0 S (0, 0) G (0, 0)"
    )


def test_map_styles_exact_lines():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    rows = layouts.render_trace(HAND, plans, "rows").splitlines()
    assert rows[:3] == ["r0: S F G | none", "r1: g H F | (1, 1)", "r2: s F F | none"]
    grid = layouts.render_trace(HAND, plans, "grid").splitlines()
    assert grid[:3] == [
        "r0: (0, 0) S (0, 1) F (0, 2) G",
        "r1: (1, 0) g (1, 1) H (1, 2) F",
        "r2: (2, 0) s (2, 1) F (2, 2) F",
    ]
    holes = layouts.render_trace(HAND, plans).splitlines()
    assert rows[3:] == grid[3:] == holes[1:]  # the agent and move lines are the same
    with pytest.raises(ValueError, match="trace style 'cells'"):
        layouts.render_trace(HAND, plans, "cells")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem_strategy(max_size=6), st.data(), st.sampled_from(styles.STYLES))
def test_any_plan_round_trips_and_checks_clean(p, data, style):
    k = p.num_agents
    plans = data.draw(st.lists(st.lists(st.integers(0, 4), max_size=8), min_size=k, max_size=k))
    tr = layouts.render_trace(p, plans, style)
    assert layouts.parse_trace(tr, k) == (plans, None)
    assert styles.detect_style(tr) == style
    assert styles.read_holes(tr) == set(trace.hole_cells(p))
    response = layouts.render_thinking(p, plans, style) + text.render_answer(plans)
    want_lines = len(tr.splitlines())
    assert layouts.check_trace(p, response) == (want_lines, None)


@pytest.mark.parametrize(
    "style,old,new,holes",
    [
        ("holes", "H: (1, 1)", "H: (1, 2)", {(1, 2)}),
        ("rows", "r1: g H F | (1, 1)", "r1: g F F | none", set()),
        ("rows", "r2: s F F | none", "r2: s F H | (2, 2)", {(1, 1), (2, 2)}),
        ("grid", "(1, 1) H (1, 2) F", "(1, 1) F (1, 2) H", {(1, 2)}),
    ],
)
def test_a_wrong_map_line_is_a_holes_error_in_every_style(style, old, new, holes):
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    good = layouts.render_thinking(HAND, plans, style) + text.render_answer(plans)
    bad = good.replace(old, new, 1)
    assert bad != good
    line = 0 if style == "holes" else int(old[1])
    assert layouts.check_trace(HAND, bad) == (line, "holes")
    assert styles.read_holes(trace.thinking_text(bad)) == holes
    assert styles.read_holes("t1\nA0 (0, 0) = UP (0, 0)") is None  # no map lines


def test_oracle_plans_round_trip_on_generated_puzzles():
    for p in random_problems(40, seed=11, sizes=(3, 4, 5, 6)):
        plans = oracle.answer_actions(oracle.solve(p))
        response = layouts.render_thinking(p, plans) + text.render_answer(plans)
        assert layouts.parse_trace(trace.thinking_text(response), 2) == (plans, None)
        got, _ = text.parse_answer(response, 2)
        assert got == plans and simulate.simulate(p, got)["valid"]
        # Every cell a valid plan enters holds no hole and is on the map.
        assert " = " in response and "H (" not in response.split("</think>")[0].split("t1")[-1]


def test_check_trace_names_the_first_wrong_lookup():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    good = layouts.render_thinking(HAND, plans) + text.render_answer(plans)

    def edit(old, new):
        assert old in good
        return good.replace(old, new, 1)

    assert layouts.check_trace(HAND, edit("H: (1, 1)", "H: (1, 2)")) == (0, "holes")
    assert layouts.check_trace(HAND, edit("G (0, 2)", "G (0, 1)"))[1] == "agents"
    assert layouts.check_trace(HAND, edit("A1 (2, 0) UP", "A1 (2, 1) UP")) == (5, "position")
    assert layouts.check_trace(HAND, edit("DOWN (1, 0) g", "DOWN (1, 1) g")) == (4, "cell")
    assert layouts.check_trace(HAND, edit("(1, 1) H", "(1, 1) F")) == (7, "content")
    assert layouts.check_trace(HAND, edit("= RIGHT (0, 1)", "= RIGHT (1, 1)")) == (4, "target")
    assert layouts.check_trace(HAND, text.render_answer(plans)) == (0, "no_trace")
    assert layouts.check_trace(HAND, "<think>\nt1\nA0 ???\n</think>") == (0, "unreadable")


@pytest.mark.parametrize(
    "bad,reason",
    [
        ("t2\nA0 (0, 0) = UP (0, 0)", "step 2 after step 0"),
        ("t1\nA0 (0, 0) = FLY (0, 0)", "action 'FLY'"),
        ("t1\nA7 (0, 0) = UP (0, 0)", "agent 7"),
        ("t1\nA0 x = UP (0, 0)\nA0 x = UP (0, 0)", "two at t1"),
        ("t1\nnonsense", "not a move line"),
        # the relay layout (`render_trace` with order): each agent's lines in one run
        ("t1 A0 (0, 0) = UP (0, 0)\nt1 A1 (0, 0) = UP (0, 0)\nt2 A0 (0, 0) = UP (0, 0)", "resume"),
        ("t1 A0 (0, 0) = UP (0, 0)\nt3 A0 (0, 0) = UP (0, 0)", "step 3 after step 1"),
        ("t1 A0 (0, 0) = UP (0, 0)\nA1 (0, 0) = UP (0, 0)", "not a relay line"),
        ("t1 A4 (0, 0) = UP (0, 0)", "agent 4"),
        ("t1 A0 (0, 0) = JUMP (0, 0)", "'JUMP'"),
    ],
)
def test_parse_trace_reasons(bad, reason):
    plans, why = layouts.parse_trace(bad, 2)
    assert plans is None and reason in why


def test_render_trace_rejects_bad_plans():
    with pytest.raises(ValueError, match="1 plans for 2 agents"):
        layouts.render_trace(HAND, [[UP]])
    with pytest.raises(ValueError, match="action code 9"):
        layouts.render_trace(HAND, [[9], []])


_trace_soup = st.lists(
    st.sampled_from(
        [
            "t1",
            "t2",
            "A0 (0, 0) = UP (0, 1)",
            "A1 x = WAIT (2, 0)",
            "A0 = LEFT (-1, 0)",
            "H: none",
            "<think>",
            "</think>",
            "\n",
            "A9 = UP (0, 0)",
            "= FLY (0, 0)",
            "garbage",
        ]  # fmt: skip
    ),
    max_size=30,
).map("\n".join)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=400), _trace_soup), st.integers(1, 3))
def test_parse_and_check_never_raise_on_any_text(response, k):
    assert_parse_and_check_never_raise(layouts.parse_trace, layouts.check_trace, response, k)
