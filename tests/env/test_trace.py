"""The reasoning trace: written from a plan and read back into the same plan (property-based),
checked line by line, scored by the answer only, and parse errors (never a crash, never a
reward) for a cut-off trace, a think block with no answer, or an answer inside an unclosed
think block."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.env import oracle, simulate, text, trace
from mapfjax.env.reward import RewardConfig
from mapfjax.env.types import DOWN, FAILURES, LEFT, RIGHT, UP, WAIT, Problem
from mapfjax.rl import rollout
from tests.env.test_text import problems as problem_strategy
from tests.models.test_bpe import random_problems

HAND = Problem(
    id="hand",
    grid=("FFF", "FHF", "FFF"),
    starts=((0, 0), (2, 0)),
    goals=((0, 2), (1, 0)),
)


def test_hand_example_exact_lines():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    assert trace.render_trace(HAND, plans).splitlines() == [
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
    lines = trace.render_trace(p, [[RIGHT], [LEFT]]).splitlines()
    # Agent 0 goes to (0, 1), written first: agent 1's LEFT would enter it too (vertex).
    assert lines[5] == "A1 (0, 2) UP off DOWN off LEFT (0, 1) taken RIGHT off = LEFT (0, 1)"
    swap = Problem(id="e", grid=("FF",), starts=((0, 0), (0, 1)), goals=((0, 1), (0, 0)))
    lines = trace.render_trace(swap, [[RIGHT], [LEFT]]).splitlines()
    assert "LEFT (0, 0) taken" in lines[5]  # agent 0 stands there and comes to (0, 1): a swap
    assert trace.render_trace(Problem("n", ("F",), ((0, 0),), ((0, 0),)), [[]]) == (
        "H: none\nA0 S (0, 0) G (0, 0)"
    )


def test_map_styles_exact_lines():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    rows = trace.render_trace(HAND, plans, "rows").splitlines()
    assert rows[:3] == ["r0: S F G | none", "r1: g H F | (1, 1)", "r2: s F F | none"]
    grid = trace.render_trace(HAND, plans, "grid").splitlines()
    assert grid[:3] == [
        "r0: (0, 0) S (0, 1) F (0, 2) G",
        "r1: (1, 0) g (1, 1) H (1, 2) F",
        "r2: (2, 0) s (2, 1) F (2, 2) F",
    ]
    holes = trace.render_trace(HAND, plans).splitlines()
    assert rows[3:] == grid[3:] == holes[1:]  # the agent and move lines are the same
    with pytest.raises(ValueError, match="trace style 'cells'"):
        trace.render_trace(HAND, plans, "cells")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem_strategy(max_size=6), st.data(), st.sampled_from(trace.STYLES))
def test_any_plan_round_trips_and_checks_clean(p, data, style):
    k = p.num_agents
    plans = data.draw(st.lists(st.lists(st.integers(0, 4), max_size=8), min_size=k, max_size=k))
    tr = trace.render_trace(p, plans, style)
    assert trace.parse_trace(tr, k) == (plans, None)
    assert trace.detect_style(tr) == style
    assert trace.read_holes(tr) == set(trace.hole_cells(p))
    response = trace.render_thinking(p, plans, style) + text.render_answer(plans)
    want_lines = len(tr.splitlines())
    assert trace.check_trace(p, response) == (want_lines, None)


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
    good = trace.render_thinking(HAND, plans, style) + text.render_answer(plans)
    bad = good.replace(old, new, 1)
    assert bad != good
    line = 0 if style == "holes" else int(old[1])
    assert trace.check_trace(HAND, bad) == (line, "holes")
    assert trace.read_holes(trace.thinking_text(bad)) == holes
    assert trace.read_holes("t1\nA0 (0, 0) = UP (0, 0)") is None  # no map lines


def test_oracle_plans_round_trip_on_generated_puzzles():
    for p in random_problems(40, seed=11, sizes=(3, 4, 5, 6)):
        plans = oracle.answer_actions(oracle.solve(p))
        response = trace.render_thinking(p, plans) + text.render_answer(plans)
        assert trace.parse_trace(trace.thinking_text(response), 2) == (plans, None)
        got, _ = text.parse_answer(response, 2)
        assert got == plans and simulate.simulate(p, got)["valid"]
        # Every cell a valid plan enters holds no hole and is on the map.
        assert " = " in response and "H (" not in response.split("</think>")[0].split("t1")[-1]


def test_check_trace_names_the_first_wrong_lookup():
    plans = [[RIGHT, RIGHT], [WAIT, UP]]
    good = trace.render_thinking(HAND, plans) + text.render_answer(plans)

    def edit(old, new):
        assert old in good
        return good.replace(old, new, 1)

    assert trace.check_trace(HAND, edit("H: (1, 1)", "H: (1, 2)")) == (0, "holes")
    assert trace.check_trace(HAND, edit("G (0, 2)", "G (0, 1)"))[1] == "agents"
    assert trace.check_trace(HAND, edit("A1 (2, 0) UP", "A1 (2, 1) UP")) == (5, "position")
    assert trace.check_trace(HAND, edit("DOWN (1, 0) g", "DOWN (1, 1) g")) == (4, "cell")
    assert trace.check_trace(HAND, edit("(1, 1) H", "(1, 1) F")) == (7, "content")
    assert trace.check_trace(HAND, edit("= RIGHT (0, 1)", "= RIGHT (1, 1)")) == (4, "target")
    assert trace.check_trace(HAND, text.render_answer(plans)) == (0, "no_trace")
    assert trace.check_trace(HAND, "<think>\nt1\nA0 ???\n</think>") == (0, "unreadable")


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
    plans, why = trace.parse_trace(bad, 2)
    assert plans is None and reason in why


def test_render_trace_rejects_bad_plans():
    with pytest.raises(ValueError, match="1 plans for 2 agents"):
        trace.render_trace(HAND, [[UP]])
    with pytest.raises(ValueError, match="action code 9"):
        trace.render_trace(HAND, [[9], []])


def _scores(problem, responses):
    verdict, rewards = rollout.score([problem] * len(responses), 1, responses, RewardConfig())
    return np.asarray(verdict.valid).tolist(), np.asarray(rewards).tolist()


def test_the_answer_alone_is_scored():
    right = [[RIGHT, RIGHT], [WAIT, UP]]
    wrong = [[DOWN, DOWN], []]  # legal moves that end away from agent 0's goal
    right_trace = trace.render_thinking(HAND, right)
    wrong_trace = trace.render_thinking(HAND, wrong)
    garbage = "<think>\nH: everywhere\nt1\nA0 fly away\n</think>\n\n"
    valid, rewards = _scores(
        HAND,
        [
            right_trace + text.render_answer(wrong),  # a correct trace, a wrong answer
            wrong_trace + text.render_answer(right),  # a wrong trace, a right answer
            garbage + text.render_answer(right),  # a malformed trace, a right answer
        ],
    )
    assert valid == [False, True, True]
    assert rewards[0] == 0.0 and rewards[1] == rewards[2] > 0.0


@pytest.mark.parametrize(
    "response",
    [
        # a trace cut off by the token budget: no closing tag, no answer
        "<think>\nH: (1, 1)\nA0 S (0, 0) G (0, 2)\nt1\nA0 (0, 0) UP off DO",
        # a think block with no answer after it
        "<think>\nH: (1, 1)\n</think>\n\n",
        # an answer inside an unclosed think block
        "<think>\nH: (1, 1)\n<answer>\nAgent 0: RIGHT, RIGHT\nAgent 1: WAIT, UP\n</answer>",
    ],
)
def test_cut_off_or_unanswered_traces_are_parse_errors(response):
    plans, reason = text.parse_answer(response, 2)
    assert plans is None and reason
    verdict, rewards = rollout.score([HAND], 1, [response], RewardConfig())
    assert not bool(verdict.valid[0]) and float(rewards[0]) == 0.0
    assert FAILURES[int(verdict.failure[0])] == "parse_error"


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
    plans, reason = trace.parse_trace(response, k)
    assert (plans is None) != (reason is None)
    p = Problem(
        "f", ("FFF", "FHF", "FFF"), ((0, 0), (2, 0), (2, 2))[:k], ((0, 2), (1, 0), (2, 1))[:k]
    )
    lines, kind = trace.check_trace(p, response)
    assert lines >= 0 and (kind is None or kind in trace.ERROR_KINDS)


def test_trace_plan_outcome_compares_the_answer_with_the_traces_plan():
    good, bad = [[RIGHT, RIGHT], [WAIT, UP]], [[DOWN], [UP]]  # bad: agent 0 into agent 1's goal
    assert simulate.simulate(HAND, good)["valid"] and not simulate.simulate(HAND, bad)["valid"]
    think = lambda plans: trace.render_thinking(HAND, plans, "grid")
    cases = {
        think(good) + text.render_answer(good): ("copied", True),
        think(bad) + text.render_answer(bad): ("copied", False),
        think(good) + text.render_answer(bad): ("differs", True),
        think(bad) + text.render_answer(good): ("differs", False),
        think(good) + "<answer>\nAgent 0: FLY\n</answer>": ("differs", True),
        think(good) + "no answer block": ("differs", True),
        text.render_answer(good): ("no_plan", None),  # no think block
        "<think>\n\n</think>\n\n" + text.render_answer(good): ("no_plan", None),  # empty block
        "<think>\nt1\nA0 nonsense\n</think>\n" + text.render_answer(good): ("no_plan", None),
    }
    for response, want in cases.items():
        assert trace.trace_plan_outcome(HAND, response) == want, response


def test_plan_table_counts_outcomes_and_the_copy_rate():
    rows = [
        {"valid": True, "trace_plan": "copied", "trace_plan_valid": True},
        {"valid": False, "trace_plan": "differs", "trace_plan_valid": True},
        {"valid": False, "trace_plan": "differs", "trace_plan_valid": False},
        {"valid": True, "trace_plan": "no_plan", "trace_plan_valid": None},
    ]
    lines = rollout.plan_table(rows).splitlines()
    assert lines[2:5] == [
        "| copied | 1 | 1 | 1 |",
        "| differs | 2 | 1 | 0 |",
        "| no_plan | 1 | - | 1 |",
    ]
    assert lines[-1] == (
        "Valid % of all 4 if every answer copied its trace's plan: 50.0 [15, 85]; "
        "the answers as written: 50.0 [15, 85]."
    )
