"""env.forms: the shipped trace form writes exactly the traces recorded before it became an
object (tests/env/data/shipped_traces.jsonl), reads them back and checks them right; the
registry resolves names and "module:attribute", and names the key, value and what is allowed
when it cannot."""

import json
import pathlib

import pytest

from mapfjax.env import forms, io, oracle, relay, text, trace
from mapfjax.env.types import Problem
from mapfjax.rl import data

GOLDEN = pathlib.Path(__file__).parent / "data" / "shipped_traces.jsonl"
HAND = Problem("hand", ("FFF", "FHF", "FFF"), ((0, 0), (2, 0)), ((0, 2), (1, 0)))


def _golden():
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    return [io.problem_from_row(r["problem"]) for r in rows], rows


def test_the_shipped_form_writes_the_recorded_traces_byte_for_byte():
    """40-odd generated 2-agent puzzles (3x3-6x6): the SFT turn and its answer-only form, as
    `rl.data` wrote them with the settings the shipped recipe used before the form had a
    name; the file holds puzzles that need a wait, that retry, and where every order fails."""
    problems, rows = _golden()
    assert len(rows) >= 36 and {p.height for p in problems} == {3, 4, 5, 6}
    found = [relay.retry(p) for p in problems]
    assert sum(p.needs_wait for p in problems) >= 10
    assert sum(f[1] is not None and bool(f[2]) for f in found) >= 5  # retries
    assert sum(relay.every_order_fails(p, f) is not None for p, f in zip(problems, found)) >= 5
    got = data.responses(problems, form="grid_relay")
    for p, r, turn in zip(problems, rows, got, strict=True):
        assert turn == r["response"], p.id
        assert forms.GRID_RELAY.response(p) == turn
        assert data.bare_answer(turn) == r["bare"]
    assert data.sft_turns(problems, form=forms.GRID_RELAY, answer_only=1.0) == [
        r["bare"] for r in rows
    ]


def test_the_shipped_form_reads_its_traces_back_and_checks_them_right():
    problems, rows = _golden()
    for p, r in zip(problems, rows, strict=True):
        turn = r["response"]
        body = trace.thinking_text(turn)
        assert forms.GRID_RELAY.check(p, turn) == (len(body.splitlines()), None), p.id
        ended = body.endswith("\n" + trace.NO_ORDER)
        want = ("no_plan", None) if ended else ("copied", True)
        assert forms.GRID_RELAY.plan_outcome(p, turn) == want
        plans, _ = text.parse_answer(turn, 2)
        assert plans == oracle.answer_actions(oracle.solve(p)) or not ended
        # the answer-only turn writes no trace: no plan, and the header is all it lacks
        assert forms.GRID_RELAY.plan_outcome(p, r["bare"]) == ("no_plan", None)
        assert forms.GRID_RELAY.check(p, r["bare"]) == (0, "length")


def _count_moves(problem, plans):
    """A toy form: each agent's number of actions, then the answer."""
    plans = forms.oracle_plans(problem) if plans is None else plans
    return "\n".join(f"A{i} moves {len(a)}" for i, a in enumerate(plans)), plans


COUNTS = forms.TraceForm(
    "counts", _count_moves, lambda body, n: (None, "no plan written"), lambda p, r: (0, "length")
)
NOTHING = forms.TraceForm(
    "nothing", lambda p, plans: None, COUNTS.parse, COUNTS.check, key=("nothing", "v2")
)


def test_an_experiment_names_its_own_form_by_module_and_attribute():
    spec = "tests.env.test_forms:COUNTS"
    assert forms.get(spec) is COUNTS and forms.get(COUNTS) is COUNTS
    assert forms.get("grid_relay") is forms.GRID_RELAY and list(forms.FORMS) == ["grid_relay"]
    turn = data.response(HAND, [[4, 4], [0, 1]], spec)
    assert turn == "<think>\nA0 moves 2\nA1 moves 2\n</think>\n\n" + text.render_answer(
        [[4, 4], [0, 1]]
    )
    assert COUNTS.plan_outcome(HAND, turn) == ("no_plan", None)
    assert COUNTS.cache_key == ("counts",) and NOTHING.cache_key == ("nothing", "v2")
    assert forms.GRID_RELAY.cache_key == ("grid", "lookahead-relay_retry_end")
    assert data.responses([HAND], form=NOTHING) == [None]
    with pytest.raises(ValueError, match=r"problem 'hand': the nothing trace form finds no plan"):
        data.response(HAND, None, NOTHING)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cbs", r"trace_form = 'cbs'; allowed: one of \['grid_relay'\], or 'module:attribute'"),
        ("", r"trace_form = ''; allowed: one of \['grid_relay'\]"),
        (3, r"trace_form = 3; allowed: one of"),
        (
            "no_such_module_x:F",
            r"trace_form = 'no_such_module_x:F': No module named 'no_such_module_x'; "
            r"allowed: 'package.module:attribute'",
        ),  # fmt: skip
        (
            "tests.env.test_forms:MISSING",
            r"module 'tests.env.test_forms' has no "
            r"'MISSING'",
        ),  # fmt: skip
        (
            "tests.env.test_forms:HAND",
            r"trace_form = 'tests.env.test_forms:HAND': a Problem, not a "
            r"TraceForm",
        ),  # fmt: skip
        (":COUNTS", r"trace_form = ':COUNTS'; allowed: 'package.module:attribute'"),
    ],
)
def test_a_form_that_does_not_resolve_is_a_named_error(spec, message):
    with pytest.raises(ValueError, match=message):
        forms.get(spec)


def test_oracle_plans_name_a_puzzle_the_oracle_does_not_solve():
    assert forms.oracle_plans(HAND) == oracle.answer_actions(oracle.solve(HAND))
    walled = Problem(id="walled", grid=("FHF",), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0)))
    with pytest.raises(ValueError, match=r"problem 'walled': oracle status"):
        forms.oracle_plans(walled)
