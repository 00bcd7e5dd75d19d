"""The shipped reasoning trace: written from a plan and read back into the same plan
(property-based), checked line by line, scored by the answer only, and parse errors (never a
crash, never a reward) for a cut-off trace, a think block with no answer, or an answer inside
an unclosed think block."""

import re

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
PLANS = [[RIGHT, RIGHT], [UP]]


def _thinking(problem, plans, order=(0, 1)) -> str:
    return trace.think_block(trace.render_relay(problem, plans, order))


def test_the_docstring_example_is_what_render_relay_writes():
    doc = [x.strip() for x in trace.__doc__.splitlines() if x.startswith("    ") and x.strip()]
    assert trace.render_relay(HAND, PLANS, (0, 1)).splitlines() == doc
    assert trace.render_header(HAND) == doc[:5]
    assert trace.map_lines(HAND)[1] == "r1: (1, 0) g (1, 1) H (1, 2) F"


def test_taken_marks_where_an_earlier_agent_stands_or_swaps():
    p = Problem(id="c", grid=("FFF",), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0)))
    lines = trace.render_relay(p, [[RIGHT], [LEFT]], (0, 1)).splitlines()
    # Agent 0 stands on (0, 1) after step 1, written first: agent 1's LEFT would enter it.
    assert lines[-1] == "t1 A1 (0, 2) UP off DOWN off LEFT (0, 1) taken RIGHT off = LEFT (0, 1)"
    swap = Problem(id="e", grid=("FF",), starts=((0, 0), (0, 1)), goals=((0, 1), (0, 0)))
    lines = trace.render_relay(swap, [[RIGHT], [LEFT]], (0, 1)).splitlines()
    # agent 0 comes into agent 1's cell (marked after it) from the cell agent 1 would enter
    want = "t1 A1 (0, 1) taken UP off DOWN off LEFT (0, 0) taken RIGHT off = LEFT (0, 0)"
    assert lines[-1] == want
    one = Problem("n", ("F",), ((0, 0),), ((0, 0),))
    assert trace.render_relay(one, [[]], (0,)) == "r0: (0, 0) S\nA0 S (0, 0) G (0, 0)"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem_strategy(max_size=6), st.data())
def test_any_plan_in_any_order_round_trips_and_checks_clean(p, data):
    k = p.num_agents
    plans = data.draw(st.lists(st.lists(st.integers(0, 4), max_size=8), min_size=k, max_size=k))
    # an agent whose run is empty writes no line: the order reads back with it last
    order = sorted(data.draw(st.permutations(range(k))), key=lambda i: not plans[i])
    tr = trace.render_relay(p, plans, order)
    assert trace.parse_trace(tr, k) == (plans, None)
    written = [i for i in order if plans[i]]
    assert trace.parse_relay(tr, k) == ((plans, written) if written else (None, ""))
    response = trace.think_block(tr) + text.render_answer(plans)
    assert trace.check_trace(p, response) == (len(tr.splitlines()), None)


def test_a_wrong_map_line_is_a_holes_error_and_a_wrong_agent_line_an_agents_error():
    good = _thinking(HAND, PLANS) + text.render_answer(PLANS)

    def edit(old, new):
        assert old in good
        return good.replace(old, new, 1)

    assert trace.check_trace(HAND, edit("(1, 1) H (1, 2) F", "(1, 1) F (1, 2) H")) == (1, "holes")
    assert trace.check_trace(HAND, edit("r2: (2, 0) s", "r2: (2, 0) F")) == (2, "holes")
    assert trace.check_trace(HAND, edit("g (1, 0)\nt1", "g (1, 1)\nt1")) == (4, "agents")


def test_oracle_plans_round_trip_on_generated_puzzles():
    for p in random_problems(40, seed=11, sizes=(3, 4, 5, 6)):
        plans = oracle.answer_actions(oracle.solve(p))
        response = _thinking(p, plans) + text.render_answer(plans)
        assert trace.parse_trace(trace.thinking_text(response), 2) == (plans, None)
        got, _ = text.parse_answer(response, 2)
        assert got == plans and simulate.simulate(p, got)["valid"]
        # Every cell a valid plan enters holds no hole and is on the map.
        targets = re.findall(r" = [A-Z]+ \((-?\d+), (-?\d+)\)$", response, re.M)
        assert len(targets) == sum(map(len, plans))
        free = {rc for rc, ch in np.ndenumerate(np.array([list(r) for r in p.grid])) if ch != "H"}
        assert all((int(r), int(c)) in free for r, c in targets)


def test_check_trace_names_the_first_wrong_lookup():
    good = _thinking(HAND, PLANS) + text.render_answer(PLANS)

    def edit(old, new):
        assert old in good
        return good.replace(old, new, 1)

    assert trace.check_trace(HAND, good) == (8, None)
    assert trace.check_trace(HAND, edit("t1 A1 (2, 0) UP", "t1 A1 (2, 1) UP")) == (7, "position")
    assert trace.check_trace(HAND, edit("DOWN (1, 0) g LEFT", "DOWN (1, 1) g LEFT")) == (5, "cell")
    assert trace.check_trace(HAND, edit("(1, 1) H LEFT", "(1, 1) F LEFT")) == (6, "content")
    assert trace.check_trace(HAND, edit("= RIGHT (0, 1)", "= RIGHT (1, 1)")) == (5, "target")
    assert trace.check_trace(HAND, text.render_answer(PLANS)) == (0, "no_trace")
    assert trace.check_trace(HAND, "<think>\nt1 A0 ???\n</think>") == (0, "holes")  # no run
    twice = "<think>\nt1 A0 (0, 0) = UP (0, 0)\nt1 A0 (0, 0) = UP (0, 0)\n</think>"
    assert trace.check_trace(HAND, twice) == (0, "unreadable")
    step_layout = "<think>\nt1\nA0 (0, 0) UP off = RIGHT (0, 1)\n</think>"  # not this form's
    assert trace.check_trace(HAND, step_layout) == (0, "unreadable")


def test_a_trace_without_a_run_is_its_header_alone():
    """No move line: every plan is empty, so the header alone is checked (right for the empty
    plans it writes; an empty think block stops short of it, a line after it is one too many);
    a move line without its step label is another layout's and not read."""
    header = "\n".join(trace.render_header(HAND))
    assert trace.parse_trace(header, 2) == ([[], []], None)
    assert trace.check_trace(HAND, f"<think>\n{header}\n</think>") == (5, None)
    assert trace.check_trace(HAND, f"<think>\n{header}\nt1\n</think>") == (5, "length")
    assert trace.check_trace(HAND, "<think>\n\n</think>\n\n<answer>\n</answer>") == (0, "length")
    bad = header.replace("r1: (1, 0) g", "r1: (1, 0) F")
    assert trace.check_trace(HAND, f"<think>\n{bad}\n</think>") == (1, "holes")
    plans, why = trace.parse_trace("t1\nA0 (0, 0) UP off = RIGHT (0, 1)", 2)
    assert plans is None and "line 2: a move line without its step label" in why


@pytest.mark.parametrize(
    "bad,reason",
    [
        ("t1 A0 (0, 0) = UP (0, 0)\nt1 A1 (0, 0) = UP (0, 0)\nt2 A0 (0, 0) = UP (0, 0)", "resume"),
        ("t1 A0 (0, 0) = UP (0, 0)\nt3 A0 (0, 0) = UP (0, 0)", "step 3 after step 1"),
        ("t1 A0 (0, 0) = UP (0, 0)\nA1 (0, 0) = UP (0, 0)", "not a relay line"),
        ("t1 A4 (0, 0) = UP (0, 0)", "agent 4"),
        ("t1 A0 (0, 0) = JUMP (0, 0)", "'JUMP'"),
        ("A0 (0, 0) = UP (0, 0)", "without its step label"),
    ],
)
def test_parse_trace_reasons(bad, reason):
    plans, why = trace.parse_trace(bad, 2)
    assert plans is None and reason in why


def test_render_relay_rejects_bad_plans_orders_and_endings():
    with pytest.raises(ValueError, match="1 plans for 2 agents"):
        trace.render_relay(HAND, [[UP]], (0, 1))
    with pytest.raises(ValueError, match="agent 1: action code 9 out of range"):
        trace.render_relay(HAND, [[9], [9]][::-1], (1, 0))
    with pytest.raises(ValueError, match=r"order \[0, 0, 1\]: not an order of the 2 agents"):
        trace.render_relay(HAND, PLANS, (0, 0))
    with pytest.raises(ValueError, match="ended: a trace that ends on NO_ORDER has tries"):
        trace.render_relay(HAND, PLANS, None, ended=True)
    with pytest.raises(ValueError, match="order None: a relay trace names its order"):
        trace.render_relay(HAND, PLANS, None)


def _scores(problem, responses):
    verdict, rewards = rollout.score([problem] * len(responses), 1, responses, RewardConfig())
    return np.asarray(verdict.valid).tolist(), np.asarray(rewards).tolist()


def test_the_answer_alone_is_scored():
    right = [[RIGHT, RIGHT], [WAIT, UP]]
    wrong = [[DOWN, DOWN], []]  # legal moves that end away from agent 0's goal
    garbage = "<think>\nH: everywhere\nt1\nA0 fly away\n</think>\n\n"
    valid, rewards = _scores(
        HAND,
        [
            _thinking(HAND, right) + text.render_answer(wrong),  # a right trace, a wrong answer
            _thinking(HAND, wrong) + text.render_answer(right),  # a wrong trace, a right answer
            garbage + text.render_answer(right),  # a malformed trace, a right answer
        ],
    )
    assert valid == [False, True, True]
    assert rewards[0] == 0.0 and rewards[1] == rewards[2] > 0.0


@pytest.mark.parametrize(
    "response",
    [
        # a trace cut off by the token budget: no closing tag, no answer
        "<think>\nr0: (0, 0) S (0, 1) F (0, 2) G\nA0 S (0, 0) G (0, 2)\nt1 A0 (0, 0) UP off DO",
        # a think block with no answer after it
        "<think>\nr0: (0, 0) S (0, 1) F (0, 2) G\n</think>\n\n",
        # an answer inside an unclosed think block
        "<think>\nr0: (0, 0) S\n<answer>\nAgent 0: RIGHT, RIGHT\nAgent 1: WAIT, UP\n</answer>",
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
            "t1 A0 (0, 0) UP off = UP (0, 1)",
            "t2 A0 (0, 1) = RIGHT (0, 2)",
            "t1 A1 x = WAIT (2, 0)",
            "t1 A1 (2, 0) = cornered",
            "t2 A1 (2, 0) = loop t1",
            "retry A1 A0",
            "no order left",
            "A0 = LEFT (-1, 0)",
            "r0: (0, 0) S",
            "<think>",
            "</think>",
            "\n",
            "t1 A9 = UP (0, 0)",
            "= FLY (0, 0)",
            "garbage",
        ]  # fmt: skip
    ),
    max_size=30,
).map("\n".join)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=400), _trace_soup), st.integers(1, 3))
def test_parse_and_check_never_raise_on_any_text(response, k):
    assert_parse_and_check_never_raise(trace.parse_trace, trace.check_trace, response, k)


def assert_parse_and_check_never_raise(parse, check, response: str, k: int) -> None:
    """`parse(response, k)` gives plans or a reason, `check(problem, response)` a line count
    and an error kind, on any text: a property test's body, shared with the layouts the
    experiments tried."""
    plans, reason = parse(response, k)
    assert (plans is None) != (reason is None)
    p = Problem(
        "f", ("FFF", "FHF", "FFF"), ((0, 0), (2, 0), (2, 2))[:k], ((0, 2), (1, 0), (2, 1))[:k]
    )
    lines, kind = check(p, response)
    assert lines >= 0 and (kind is None or kind in trace.ERROR_KINDS)


def test_trace_plan_outcome_compares_the_answer_with_the_traces_plan():
    good, bad = [[RIGHT, RIGHT], [WAIT, UP]], [[DOWN], [UP]]  # bad: agent 0 into agent 1's goal
    assert simulate.simulate(HAND, good)["valid"] and not simulate.simulate(HAND, bad)["valid"]
    cases = {
        _thinking(HAND, good) + text.render_answer(good): ("copied", True),
        _thinking(HAND, bad) + text.render_answer(bad): ("copied", False),
        _thinking(HAND, good) + text.render_answer(bad): ("differs", True),
        _thinking(HAND, bad) + text.render_answer(good): ("differs", False),
        _thinking(HAND, good) + "<answer>\nAgent 0: FLY\n</answer>": ("differs", True),
        _thinking(HAND, good) + "no answer block": ("differs", True),
        text.render_answer(good): ("no_plan", None),  # no think block
        "<think>\n\n</think>\n\n" + text.render_answer(good): ("no_plan", None),  # empty block
        "<think>\nt1 A0 nonsense = UP (0, 0)\nx\n</think>\n" + text.render_answer(good): (
            "no_plan",
            None,
        ),
    }
    for response, want in cases.items():
        assert trace.trace_plan_outcome(HAND, response) == want, response
    # another reading of the trace: the answer is compared with the plan it returns
    always = lambda body, n: (good, None)  # noqa: E731
    response = "<think>\nanything\n</think>\n\n" + text.render_answer(good)
    assert trace.trace_plan_outcome(HAND, response, always) == ("copied", True)


def test_header_end_and_answer_start_cut_a_response():
    response = "<think>\nr0: (0, 0) S\nt1\nt1 A0 x\n</think>\n\n<answer>\n</answer>"
    assert response[trace.header_end(response) :].startswith("t1\nt1 A0")
    assert trace.header_end(_thinking(HAND, PLANS)) == 0  # a relay trace has no `t1` line
    assert response[trace.answer_start(response) :].startswith("</think>")
    assert trace.answer_start("<think>\nnever closes") == len("<think>\nnever closes")


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
