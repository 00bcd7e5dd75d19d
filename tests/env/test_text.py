"""Tests for the prompt renderer, the answer parser and the prompt parser."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.env import text
from mapfjax.env.types import DOWN, LEFT, RIGHT, UP, WAIT, Problem, ProblemError

HAND = Problem(
    id="hand",
    grid=("FFFF", "FHFF", "FFHF"),
    starts=((0, 0), (2, 0), (1, 2)),
    goals=((0, 3), (1, 2), (2, 1)),
)


@st.composite
def problems(draw, max_size=10, max_agents=5):
    h = draw(st.integers(1, max_size))
    w = draw(st.integers(1, max_size))
    cells = [(r, c) for r in range(h) for c in range(w)]
    k = draw(st.integers(1, min(max_agents, len(cells))))
    starts = draw(st.permutations(cells))[:k]
    goals = draw(st.permutations(cells))[:k]
    used = set(starts) | set(goals)
    hole_p = draw(st.floats(0.0, 0.5))
    flips = draw(st.lists(st.floats(0, 1), min_size=h * w, max_size=h * w))
    grid = tuple(
        "".join("H" if (r, c) not in used and flips[r * w + c] < hole_p else "F" for c in range(w))
        for r in range(h)
    )
    return Problem(id="p", grid=grid, starts=tuple(starts), goals=tuple(goals))


plans_strategy = st.lists(st.lists(st.integers(0, 4), max_size=20), min_size=1, max_size=5)


# --- render_prompt ---------------------------------------------------------------------------


def test_render_prompt_hand_example_exact_lines():
    lines = text.render_prompt(HAND).splitlines()
    # Agent 1's goal (1, 2) is agent 2's start: the start symbol 'A' wins.
    assert lines[:12] == [
        "Question:",
        "You are a multi-agent path planning expert.",
        "There is a 3x4 frozen lake map with 3 agents:",
        "S F F G",
        "F H A F",
        "s a H F",
        "Legend:",
        "F: frozen, safe",
        "H: hole, never enter",
        "S, G: start and goal of Agent 0",
        "s, g: start and goal of Agent 1",
        "A, a: start and goal of Agent 2",
    ]
    assert lines[12:15] == [
        "Agent 0 needs to go from (0, 0) to (0, 3)",
        "Agent 1 needs to go from (2, 0) to (1, 2)",
        "Agent 2 needs to go from (1, 2) to (2, 1)",
    ]
    assert lines[15] == "Rules:"
    body = "\n".join(lines)
    for word in ("UP", "DOWN", "LEFT", "RIGHT", "WAIT", "<answer>", "</answer>", "swap"):
        assert word in body
    assert body.endswith(text.ANSWER_EXAMPLE)


def test_render_prompt_is_deterministic_and_square_header():
    p = Problem("sq", ("FF", "FF"), ((0, 0),), ((1, 1),))
    a, b = text.render_prompt(p), text.render_prompt(p)
    assert a == b
    assert "There is a 2x2 frozen lake map with 1 agent:" in a
    assert "H: hole" not in a  # no hole on the map, none explained


def test_render_prompt_rejects_six_agents_and_bad_problems():
    cells = [(0, c) for c in range(6)]
    p = Problem("six", ("F" * 12,), tuple(cells), tuple((0, c + 6) for c in range(6)))
    with pytest.raises(ProblemError, match="at most 5 agents"):
        text.render_prompt(p)
    with pytest.raises(ProblemError, match="hole"):
        text.render_prompt(Problem("h", ("FH",), ((0, 1),), ((0, 0),)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_parse_prompt_inverts_render_prompt(p):
    q = text.parse_prompt(text.render_prompt(p), id=p.id)
    assert (q.grid, q.starts, q.goals) == (p.grid, p.starts, p.goals)


# --- parse_prompt on other formats and errors ------------------------------------------------

PAPER_STYLE = """Question: You are a multi-agent path planning expert. Plan for every agent.
There is a 4x4 frozen lake map with 2 agents:

S F F F
F H H F
F F g G
s F F F
Legend:
- S: the start of Agent 1; G: the goal of Agent 1
- s: the start of Agent 2; g: the goal of Agent 2
- F: frozen cell; H: hole
Agent 1 needs to go from (0, 0) to (2, 3).
Agent 2 needs to go from (3, 0) to (2, 2).
Please think step by step and give the final plan.
"""


def test_parse_prompt_paper_style_one_based_agents():
    p = text.parse_prompt(PAPER_STYLE, id="paper")
    assert p.grid == ("FFFF", "FHHF", "FFFF", "FFFF")
    assert p.starts == ((0, 0), (3, 0))
    assert p.goals == ((2, 3), (2, 2))
    assert p.id == "paper"


def test_parse_prompt_unspaced_rows():
    prompt = (
        "There is a 2x3 frozen lake map with 1 agents:\nSHF\nFFG\n"
        "Agent 0 needs to go from (0, 0) to (1, 2)"
    )
    p = text.parse_prompt(prompt)
    assert p.grid == ("FHF", "FFF")


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda s: s.replace("There is a 3x4 frozen lake map", "A map"), "no 'There is a HxW"),
        (lambda s: s.replace("s a H F\n", ""), "grid row"),
        (lambda s: s.replace("S F F G", "S F F"), "row 0 has 3 cells"),
        (lambda s: s.replace("Agent 2 needs to go", "Agent 7 needs to go"), "agent lines for"),
        (lambda s: s.replace("(0, 0) to (0, 3)", "(0, 1) to (0, 3)"), "symbol 'S' at \\(0, 0\\)"),
        (lambda s: s + "\nAgent 0 needs to go from (0, 0) to (0, 3)", "two 'Agent 0"),
        (lambda s: s.replace("(0, 0) to (0, 3)", "(0, 0) to (9, 3)"), "outside"),
    ],
)
def test_parse_prompt_errors(mutate, match):
    prompt = mutate(text.render_prompt(HAND))
    with pytest.raises(ProblemError, match=match):
        text.parse_prompt(prompt)


def test_parse_prompt_start_on_hole_is_an_error():
    prompt = text.render_prompt(HAND).replace("(2, 0) to (1, 2)", "(1, 1) to (1, 2)")
    with pytest.raises(ProblemError, match="on a hole"):
        text.parse_prompt(prompt)


# --- render_answer / parse_answers -----------------------------------------------------------


def test_render_answer_exact():
    assert text.render_answer([[UP, RIGHT, WAIT], []]) == (
        "<answer>\nAgent 0: UP, RIGHT, WAIT\nAgent 1:\n</answer>"
    )


@settings(max_examples=100, deadline=None)
@given(plans_strategy)
def test_answer_round_trip(plans):
    parsed = text.parse_answers([text.render_answer(plans)], len(plans))
    assert parsed.ok.tolist() == [True]
    longest = max(len(p) for p in plans)
    t = parsed.plans.shape[2]
    assert t % 8 == 0 and t >= max(8, longest) and t < max(8, longest) + 8
    for i, p in enumerate(plans):
        assert parsed.lengths[0, i] == len(p)
        assert parsed.plans[0, i, : len(p)].tolist() == p
        assert (parsed.plans[0, i, len(p) :] == WAIT).all()


MESSY_VALID = [
    "<answer>agent 0: up, right\nAGENT 1: Wait Left</answer>",
    "<think>Let me try <answer>Agent 0: DOWN\nAgent 1: DOWN</answer> no...</think>\n"
    "Final:\n<answer>\nAgent 0:UP,RIGHT\nAgent 1 :  stay ,  left\n</answer> done.",
    "I think the plan is below.\n<answer>\n  Agent 0: [UP, RIGHT]\n"
    "  Agent 1: ['WAIT', 'LEFT']\n</answer>",
    '<answer>\n- **Agent 0**: `UP RIGHT`\n- **Agent 1**: "STAY","LEFT".\n</answer>',
    "<answer>Agent 1: WAIT LEFT\nAgent 0: UP RIGHT\nTotal: 4 steps</answer>",
    "reasoning without an opening tag</think>"
    "<answer>Agent 0: UP, RIGHT\nAgent 1: WAIT, LEFT</answer>",
    "<answer>draft</answer>\n<ANSWER>\nAgent 0: up,right\nAgent 1: wait,left\n</ANSWER>",
]


@pytest.mark.parametrize("response", MESSY_VALID)
def test_messy_but_valid_answers_parse(response):
    plans, reason = text.parse_answer(response, 2)
    assert reason is None
    assert plans == [[UP, RIGHT], [WAIT, LEFT]]


PARSE_ERRORS = [
    ("Agent 0: UP\nAgent 1: LEFT", "no <answer>"),
    ("<answer>Agent 0: UP\nAgent 1: LEFT", "no <answer>"),
    ("<think>I will answer <answer>Agent 0: UP\nAgent 1: LEFT</answer>", "unterminated"),
    ("<answer>Agent 0: UP</answer>", "missing line"),
    ("<answer>Agent 0: UP\nAgent 0: UP\nAgent 1: LEFT</answer>", "duplicate"),
    ("<answer>Agent 0: UP\nAgent 1: LEFT\nAgent 2: UP</answer>", "out of range"),
    ("<answer>Agent 0: UP, JUMP\nAgent 1: LEFT</answer>", "unknown action 'JUMP'"),
    ("<answer>Agent 0: " + "UP " * 300 + "\nAgent 1: LEFT</answer>", "longer than max_steps"),
    ("<answer>Agent zero: UP\nAgent 1: LEFT</answer>", "malformed agent line"),
    ("<answer>Agent 99999999999999: UP\nAgent 1: LEFT</answer>", "out of range"),
    (
        "<answer>\nAgent 0: UP\nAgent 1: LEFT\n</answer>\n<think>x</think><answer></answer>",
        "missing",
    ),
]


@pytest.mark.parametrize("response, reason", PARSE_ERRORS)
def test_parse_errors_are_caught(response, reason):
    plans, why = text.parse_answer(response, 2)
    assert plans is None
    assert reason in why
    parsed = text.parse_answers([response], 2)
    assert parsed.ok.tolist() == [False]
    assert (parsed.lengths == 0).all() and (parsed.plans == WAIT).all()


def test_parse_answers_batch_shapes_and_mixed_agent_counts():
    texts = [
        text.render_answer([[RIGHT] * 9, [DOWN]]),
        "garbage",
        text.render_answer([[LEFT], [UP], [DOWN, DOWN]]),
    ]
    parsed, reasons = text.parse_answers_with_reasons(texts, [2, 2, 3])
    assert parsed.plans.shape == (3, 3, 16) and parsed.plans.dtype == np.int32
    assert parsed.lengths.tolist() == [[9, 1, 0], [0, 0, 0], [1, 1, 2]]
    assert parsed.ok.tolist() == [True, False, True]
    assert reasons[0] is None and reasons[2] is None and "no <answer>" in reasons[1]
    assert parsed.plans[0, 0, :9].tolist() == [RIGHT] * 9
    assert parsed.plans[2, 2, :3].tolist() == [DOWN, DOWN, WAIT]
    empty = text.parse_answers(["nothing"], 4)
    assert empty.plans.shape == (1, 4, 8)


def test_parse_answers_rejects_bad_num_agents():
    with pytest.raises(ValueError, match="entries"):
        text.parse_answers(["a", "b"], [2])
    with pytest.raises(ValueError, match=">= 1"):
        text.parse_answers(["a"], 0)


tag_soup = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "Agent ",
            "0",
            "1",
            ":",
            ",",
            "\n",
            "UP",
            "stay",
            "[",
            "'",
            "9" * 30,
            "ß",
            "İ",
            "\u0000",
            "\u202e",
        ]
    )
    | st.text(max_size=20),
    max_size=60,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=2000), tag_soup), st.integers(1, 5))
def test_parse_answers_never_raises(response, k):
    parsed = text.parse_answers([response], k)
    assert parsed.ok.shape == (1,)
    plans, reason = text.parse_answer(response, k)
    assert (plans is None) != (reason is None)


def test_parse_answers_huge_input():
    huge = "<think>" + "x" * 2_000_000 + "</think>" + "<answer>Agent 0: UP</answer>"
    assert text.parse_answer(huge, 1) == ([[UP]], None)
    spam = "<answer>" * 200_000 + "Agent 0: " + "LEFT " * 100_000
    parsed = text.parse_answers([spam, huge], 1, max_steps=64)
    assert parsed.ok.tolist() == [False, True]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500), problems(max_size=4))
def test_parse_prompt_raises_only_problem_error(noise, p):
    prompt = text.render_prompt(p)
    cut = len(noise) % (len(prompt) + 1)
    for candidate in (noise, prompt[:cut] + noise + prompt[cut:]):
        try:
            q = text.parse_prompt(candidate)
        except ProblemError:
            continue
        assert q.num_agents >= 1 and q.height >= 1
