"""The relay layouts the gate tried and their diagnostics (`relay_checks`, `layouts`): the
relay that takes the first valid order, with or without `where` fields, every action written
the one its own line and the distances decide (read from the text, not from the planner), the
plan valid (plain-Python simulator) and read back through the parser and the line checker in
any layout and map style; where a policy's relay trace first goes wrong and which field; the
relay forms leave out of SFT data the puzzles they have no plan for; and the scripts that
count them."""

import pathlib
import re

import pytest

from mapfjax.env import relay, simulate, text, trace
from mapfjax.env.types import ACTION_NAMES, Problem
from mapfjax.rl import data
from projects.go_no_go import layouts, lookahead, relay_checks, traces
from tests.env.test_relay import BROKEN_RETRIES, _doc_lines, decided
from tests.models.test_bpe import random_problems

ROOT = pathlib.Path(__file__).resolve().parents[3]

DOC = Problem(id="doc", grid=("FFH", "FFF", "FFF"), starts=((1, 2), (0, 1)), goals=((1, 1), (2, 1)))
_LINE = re.compile(
    r"^t(\d+) A(\d+) \((\d+), (\d+)\)((?: (?:t\d+ )?A\d+ \(\d+, \d+\))*)( taken)? "
    r"(.*) = ([A-Z]+) \((\d+), (\d+)\)$"
)
_WHO = re.compile(r" (t\d+ )?A(\d+) \((\d+), (\d+)\)")


def test_the_package_docstring_example_is_the_first_valid_order_in_any_map_style():
    order, plans, tried = relay_checks.relay(DOC)
    assert (order, tried) == ((0, 1), 1)
    assert layouts.render_trace(DOC, plans, "grid", order=order).splitlines() == _doc_lines()
    holes = layouts.render_trace(DOC, plans, "holes", order=order).splitlines()
    assert holes[0] == "H: (0, 2)" and holes[1:] == _doc_lines()[3:]
    assert simulate.simulate(DOC, plans)["valid"]


def _decided(problem: Problem, tr: str) -> list[bool]:
    """`tests.env.test_relay.decided` on relay lines that may also write where earlier agents
    stand (the `where` field: one more group before `taken`)."""
    return decided(problem, tr, _LINE, (6, 7, 8))


def test_a_later_agent_s_lines_mark_where_earlier_agents_stand():
    order, plans, _ = relay_checks.relay(DOC)
    lines = layouts.render_trace(DOC, plans, "holes", order=order).splitlines()
    # A0 rests on (1, 1) from t1: every later A1 line next to it shows it taken
    a1 = [x for x in lines if " A1 " in x]
    assert "DOWN (1, 1) taken" in a1[0] and "RIGHT (1, 1) taken" in a1[2]
    # in the step layout the same plan shows (1, 1) as A0's goal at t2 and later
    steps = layouts.render_trace(DOC, plans, "holes").splitlines()
    assert "RIGHT (1, 1) G" in steps[steps.index("t3") + 1]
    # an earlier agent coming into a later one's cell is written after that cell, and a swap
    swap = Problem(id="swap", grid=("FFF",), starts=((0, 0), (0, 1)), goals=((0, 2), (0, 0)))
    tr = layouts.render_trace(swap, [[4, 4], [0, 3]], "holes", order=(0, 1))
    assert "t1 A1 (0, 1) taken UP off DOWN off LEFT (0, 0) taken RIGHT (0, 2) G" in tr


def test_the_next_field_is_copied_from_after_its_key():
    # Where the earlier agent still has a line for step K+1, the later line's `t<K+1> A<j>`
    # is followed by the very cell that agent's own `t<K+1> A<j>` line starts with; where its
    # run has ended, by the cell it ended on.
    copies = ended = 0
    for p in random_problems(40, seed=17, sizes=(3, 4, 5, 6)):
        order, plans, _ = relay_checks.relay(p)
        if plans is None:
            continue
        lines = layouts.render_trace(p, plans, "grid", order=order, where="next").splitlines()
        starts = {" ".join(x.split(" ")[:2]): x.split(" A", 1)[1].split(" ", 1)[1] for x in lines
                  if _LINE.match(x)}  # fmt: skip
        first = order[0]
        for x in lines:
            if (m := _LINE.match(x)) is None or int(m.group(2)) == first:
                continue
            for key, j, r, c in _WHO.findall(m.group(5)):
                assert key, x
                own = starts.get(f"{key.strip()} A{j}")
                if own is None:
                    ended += 1
                    last = trace.cells_by_time(p.starts[int(j)], plans[int(j)])[-1]
                    assert (int(r), int(c)) == last, x
                else:
                    copies += 1
                    assert own.startswith(f"({r}, {c})"), (x, own)
    assert copies > 20 and ended > 20
    # the same plan with and without the field reads back the same; bad fields are named
    order, plans, _ = relay_checks.relay(DOC)
    tr = layouts.render_trace(DOC, plans, "holes", order=order, where="next")
    assert "\nt1 A1 (0, 1) t2 A0 (1, 1) UP off DOWN (1, 1) taken" in tr  # A0 ended at t1
    assert trace.parse_relay(tr, 2) == (plans, [0, 1])
    with pytest.raises(ValueError, match=r"where = 'before': allowed \('', 'after', 'next'\)"):
        layouts.render_trace(DOC, plans, "holes", order=order, where="before")
    with pytest.raises(ValueError, match="a field only with order"):
        layouts.render_trace(DOC, plans, "holes", where="next")


def test_check_trace_names_a_wrong_relay_mark():
    order, plans, _ = relay_checks.relay(DOC)
    good = layouts.render_thinking(DOC, plans, "holes", order=order) + text.render_answer(plans)
    bad = good.replace("DOWN (1, 1) taken", "DOWN (1, 1) G", 1)
    assert layouts.check_trace(DOC, bad) == (4, "content")
    moved = good.replace("= LEFT (0, 0)", "= LEFT (0, 1)", 1)
    assert layouts.check_trace(DOC, moved) == (4, "target")


def test_relay_sft_data_leaves_out_puzzles_without_a_plan():
    # A1 starts in a dead end behind A0's goal: no order has a relay plan
    stuck = Problem(id="stuck", grid=("FFF",), starts=((0, 0), (0, 2)), goals=((0, 1), (0, 0)))
    assert relay_checks.relay(stuck)[1] is None
    assert relay_checks.plan_from(stuck, 0) is None and relay_checks.plan_from(stuck, 1) is None
    # DOC: either agent may run first (A1 first, A0 waits a step), each order's own plan
    assert relay_checks.plan_from(DOC, 0) == relay_checks.relay(DOC)[1]
    later = relay_checks.plan_from(DOC, 1)
    assert (
        later == relay_checks.plan_in_order(DOC, (1, 0)) and simulate.simulate(DOC, later)["valid"]
    )
    assert lookahead.LOOKAHEADS["relay"](stuck).opened == 2
    turns = data.responses([DOC, stuck], form=traces.form("relay", "holes"))
    assert turns[1] is None and turns[0].endswith(text.render_answer(relay_checks.relay(DOC)[1]))
    assert "\nt4 A1 (2, 0)" in turns[0] and "\nt1\n" not in turns[0]
    with pytest.raises(ValueError, match=r"'stuck': the projects\.go_no_go\.traces:relay trace"):
        data.response(stuck, None, traces.relay)
    with pytest.raises(ValueError, match="no look-ahead block"):
        lookahead.first_wrong(DOC, turns[0], "relay")
    assert ACTION_NAMES[0] == "WAIT"


def test_check_says_where_a_relay_trace_goes_wrong():
    order, plans, _ = relay_checks.relay(DOC)
    good = layouts.render_thinking(DOC, plans, "holes", order=order) + text.render_answer(plans)
    assert relay_checks.check(DOC, good) == "right" and relay_checks.first_agent(good) == 0
    assert relay_checks.first_departure(DOC, plans, order) is None
    assert relay_checks.check(DOC, good.replace("H: (0, 2)", "H: (0, 1)")) == "header"
    assert relay_checks.check(DOC, good.replace("LEFT (1, 1) G", "LEFT (1, 1) F")) == "first run"
    assert (
        relay_checks.check(DOC, good.replace("DOWN (1, 1) taken", "DOWN (1, 1) G")) == "later run"
    )
    # lines true to the plan they write, but A1 waits at t1 where the rule moves it
    slow = [plans[0], [0, *plans[1]]]
    assert relay_checks.first_departure(DOC, slow, order) == (1, 1)
    lazy = layouts.render_thinking(DOC, slow, "holes", order=order) + text.render_answer(slow)
    assert relay_checks.check(DOC, lazy) == "rule"
    # A1 first: its run is the rule's alone, A0's then departs where it meets A1's
    swapped = layouts.render_thinking(DOC, plans, "holes", order=(1, 0)) + text.render_answer(plans)
    assert relay_checks.first_agent(swapped) == 1 and relay_checks.check(DOC, swapped) == "rule"
    assert relay_checks.check(DOC, text.render_answer(plans)) == "missing"
    assert relay_checks.check(DOC, "<think>\nH: (0, 2)\n</think>") == "missing"
    resumed = "t1 A0 (1, 2) = LEFT (1, 1)\nt1 A1 (0, 1) = LEFT (0, 0)\nt2 A0 (1, 1) = UP (0, 1)"
    assert relay_checks.check(DOC, f"<think>\n{resumed}\n</think>") == "unreadable"
    assert relay_checks.first_agent("no think") is None


def test_line_error_names_the_field_of_the_first_wrong_line():
    order, plans, _ = relay_checks.relay(DOC)
    good = layouts.render_thinking(DOC, plans, "holes", order=order) + text.render_answer(plans)
    assert relay_checks.line_error(DOC, good) is None
    cases = {
        ("DOWN (1, 1) taken", "DOWN (1, 1) G"): ("later run", "mark missed"),
        ("DOWN (1, 0) F", "DOWN (1, 0) taken"): ("later run", "mark added"),
        ("t2 A1 (0, 0) UP", "t2 A1 (0, 0) taken UP"): ("later run", "own mark"),
        ("t2 A1 (0, 0)", "t2 A1 (0, 1)"): ("later run", "cell"),
        ("LEFT (0, 0) F", "LEFT (0, 0) H"): ("later run", "content"),
        ("= DOWN (2, 0)", "= DOWN (2, 1)"): ("later run", "target"),
        ("LEFT (1, 1) G", "LEFT (1, 1) F"): ("first run", "content"),
        ("H: (0, 2)", "H: (0, 1)"): None,  # the header is no run
    }
    for (old, new), want in cases.items():
        assert old in good, old
        assert relay_checks.line_error(DOC, good.replace(old, new, 1)) == want, (old, new)
    # a where field: the earlier agent's cell copied wrong, in both layouts
    for where in ("after", "next"):
        tr = layouts.render_thinking(DOC, plans, "holes", order=order, where=where)
        bad = tr.replace("A0 (1, 1) UP off", "A0 (1, 2) UP off", 1) + text.render_answer(plans)
        assert relay_checks.line_error(DOC, bad) == ("later run", "where"), where
    # a blank line inside a run: a line left over; a run that stops early is the rule's error
    blank = good.replace("\nt3 A1", "\n\nt3 A1", 1)
    assert relay_checks.check(DOC, blank) == "later run"
    assert relay_checks.line_error(DOC, blank) == ("later run", "length")
    last = "\nt4 A1 (2, 0) UP (1, 0) F DOWN off LEFT off RIGHT (2, 1) g = RIGHT (2, 1)"
    short = good.replace(last, "")
    assert relay_checks.check(DOC, short) == "rule" and relay_checks.line_error(DOC, short) is None


def test_the_check_script_reads_relay_traces(tmp_path):
    import json
    import subprocess
    import sys

    from mapfjax.env import io, oracle

    probs = [
        oracle.label(DOC)[0],
        *(p for p in random_problems(12, 3) if relay_checks.relay(p)[1]),
    ][:5]
    swap = oracle.label(SWAP)[0]  # every order fails: the ending trace, then the oracle's answer
    io.save_instances(tmp_path / "inst.jsonl", [*probs, swap])
    ev = tmp_path / "eval"
    ev.mkdir()
    answers = [{"id": swap.id, "text": _end_response(swap)}]
    rows = [{"id": swap.id, "valid": False}]
    for i, p in enumerate(probs):
        order, plans, _ = relay_checks.relay(p)
        turn = layouts.render_thinking(p, plans, "grid", order=order) + text.render_answer(plans)
        answers.append({"id": p.id, "text": turn if i % 2 == 0 else text.render_answer(plans)})
        rows.append({"id": p.id, "valid": True})
    (ev / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    (ev / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.lookahead_check",
         f"--instances={tmp_path / 'inst.jsonl'}",
         f"--eval={ev}", "--form=relay"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, fields, ends = out.stdout.strip().split("\n\n")
    table = [[c.strip() for c in x.split("|")[1:-1]] for x in first.splitlines()[2:]]
    col = {name: j for j, name in enumerate(first.splitlines()[0].split("|")[1:-1])}
    counts = [(k.strip(), j) for k, j in col.items() if 0 < j < len(col) - 1]
    total = {k: sum(int(r[j]) for r in table) for k, j in counts}
    assert total["puzzles with a plan"] == 5 and total["trace right"] == 3
    assert total["first agent as the rule's order"] == 3 and total["first wrong: missing"] == 2
    assert total["first agent with no plan"] == 0
    # every trace is right: no first wrong line in either run
    assert fields.splitlines()[2:] == [f"| {run} |" + " 0 |" * len(relay_checks.LINE_FIELDS)
                                       for run in ("first run", "later run")]  # fmt: skip
    # SWAP's trace ends right on `no order left`; its verdict here says invalid
    assert ends.splitlines()[2].startswith("| 1 | 1 | 1 | 0.0 ")


def test_a_second_move_closer_to_the_goal_keeps_the_rule():
    open_ = Problem(id="open", grid=("FFF",) * 3, starts=((0, 0), (2, 0)), goals=((2, 2), (0, 2)))
    right_first = [4, 4, 2, 2]  # the rule prefers DOWN; RIGHT is as close
    assert relay_checks.agent_plan(open_, 0, [], 30) == [2, 2, 4, 4]
    second = relay_checks.agent_plan(open_, 1, [(0, right_first)], 30)
    assert relay_checks.first_departure(open_, [right_first, second], (0, 1)) is None
    assert relay_checks.first_departure(open_, [[4, 0, 4, 2, 2], second], (0, 1)) == (0, 2)


def test_a_bad_relay_order_or_action_is_a_named_error():
    with pytest.raises(ValueError, match=r"order \[0, 0, 1\]: not an order of the 2 agents"):
        layouts.render_trace(DOC, [[3], []], order=(0, 0))
    with pytest.raises(ValueError, match="agent 1: action code 9 out of range"):
        layouts.render_trace(DOC, [[3], [9]], order=(0, 1))
    # any text, relay-like or not, is a verdict of `check`, never an exception
    for junk in ("<think>\nt1 A0 (9, 9) = UP (9, 9)\n</think>", "<think>\nt1 A0\n", "</think>"):
        assert relay_checks.check(DOC, junk) in relay_checks.CHECKS


def test_a_run_that_repeats_a_cell_after_the_others_rest_never_settles():
    """`agent_run`'s "loop": on the gate's 400 puzzles, every later agent whose run in index
    order is called a loop also fails when the rule runs on to the horizon (a plain loop over
    `_rule`, no repeat check), and the split the docs cite holds: of the 72 puzzles where index
    order fails, 40 loop (a cell repeats after 3 to 14 of the later agent's lines) and 32
    corner the later agent; the other order saves 41 of them."""
    from mapfjax.configfile import ROOT
    from mapfjax.env import io

    problems = io.load_instances(ROOT / "projects" / "go_no_go" / "results" / "held_out_400.jsonl")
    outcomes, lines, saved = {}, [], 0
    for p in problems:
        if relay_checks.plan_in_order(p, (0, 1)) is not None:
            continue
        first, how = relay.agent_run(p, 0, [], 4 * p.height * p.width)
        assert how == "settled"  # the first agent alone always reaches its goal here
        horizon = 4 * p.height * p.width + len(first)
        actions, how = relay.agent_run(p, 1, [(0, first)], horizon)
        outcomes[how] = outcomes.get(how, 0) + 1
        saved += relay_checks.plan_in_order(p, (1, 0)) is not None
        if how != "loop":
            continue
        lines.append(len(actions))
        (allowed, _), here = relay.rule(p, 1, [(0, first)]), tuple(p.starts[1])
        for k in range(1, horizon + 1):
            choices = allowed(here, k)
            assert choices  # neither settled (None) nor cornered ([]) before the horizon
            here = trace.step(here, choices[0])
    assert outcomes == {"loop": 40, "cornered": 32} and saved == 41
    assert min(lines) == 3 and max(lines) == 14


def test_index_order_outcome_agrees_with_the_order_relay_finds():
    """Index order is "valid" exactly when `relay` takes it first; some order is valid exactly
    when `relay` finds a plan; a failed index order names how its run ended."""
    seen = set()
    for p in random_problems(80, seed=11, sizes=(3, 4, 5, 6)):
        how, other = relay_checks.index_order_outcome(p)
        order, plans, _ = relay_checks.relay(p)
        assert how in relay.OUTCOMES
        assert (how == "valid") == (order == (0, 1))
        assert (how == "valid" or other) == (plans is not None)
        seen.add(how)
    assert "valid" in seen and len(seen) >= 2, seen  # the draw holds failures as well


def test_orders_table_counts_every_puzzle_and_refuses_unlabelled_ones():
    problems = [
        p.with_labels(None, None, k % 2 == 0)
        for k, p in enumerate(random_problems(30, seed=12, sizes=(3, 4, 5)))
    ]
    table = relay_checks.orders_table(problems).splitlines()
    assert table[0].startswith("| needs a wait | puzzles | index order valid |")
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ") for r in table[2:]}
    assert int(rows["all"][1]) == 30 and int(rows["no"][1]) + int(rows["yes"][1]) == 30
    for cells in rows.values():  # the outcomes count every puzzle once
        assert int(cells[2]) + sum(int(c.split(" ")[0]) for c in cells[3:7]) == int(cells[1])
    with pytest.raises(ValueError, match="without a needs_wait label"):
        relay_checks.orders_table([problems[0].with_labels(None, None, None)])


# A1 starts boxed in by a hole and A0's goal: in index order it is cornered at t1, so the
# trace that retries writes that line and starts again with A1 first (A0 then waits a step).
CORNER = Problem(
    id="corner",
    grid=("FHFF", "FFFF", "FHFF", "FFFF"),
    starts=((2, 0), (0, 0)),
    goals=((1, 0), (1, 1)),
)


def _retry_response(p: Problem, form=lookahead.relay_retry_form) -> str:
    found = form(p)
    body = layouts.render_thinking(p, found.plans, "grid", (), found.order, "", found.tries)
    return body + text.render_answer(found.plans)


def test_every_retrying_trace_reads_back_checks_right_and_keeps_relays_plan():
    """Over generated puzzles: the relay that retries ends on relay's own order and plan; its
    trace and answer read back into that plan, every line checks, the attempts fail on a line
    (cornered, or a loop back to the cell of the step it names) and start in index order."""
    retried = 0
    for p in random_problems(120, seed=13, sizes=(3, 4, 5, 6)):
        order, plans, tries, _ = relay.retry(p)
        if plans is None:
            continue
        assert (order, plans) == relay_checks.relay(p)[:2]
        assert not tries or [i for i, _ in tries[0].runs][0] == 0
        for t in tries:
            assert t.outcome in ("cornered", "loop")
            if t.outcome == "loop":
                i, actions = t.runs[-1]
                cells = trace.cells_by_time(p.starts[i], actions)
                assert cells[t.again - 1] == cells[-1] and t.again < len(cells)
        response = _retry_response(p)
        body = trace.thinking_text(response)
        assert layouts.parse_trace(body, 2) == (plans, None)
        assert text.parse_answer(response, 2)[0] == plans
        assert layouts.check_any(p, response) == (len(body.splitlines()), None)
        assert relay_checks.check(p, response) == "right"
        assert body.count("\nretry ") == len(tries)
        if tries:  # without the rule's attempts, the failed ones are not the truth's lines
            assert layouts.check_trace(p, response)[1] is not None
        retried += bool(tries)
    assert retried >= 3  # the draw holds retries (about 1 puzzle in 6)


def test_a_wrong_failure_claim_is_a_retry_error():
    """A trace that gives up on index order where the rule fails it on another line, or names
    the wrong step of a loop, is first wrong in its failed attempt."""
    good = _retry_response(CORNER)
    bad = good.replace("LEFT off RIGHT (0, 1) H = cornered", "LEFT off RIGHT (0, 1) F = cornered")
    assert relay_checks.check(CORNER, bad) == "retry"
    assert layouts.check_any(CORNER, bad)[1] == "content"
    for p in random_problems(120, seed=13, sizes=(3, 4, 5, 6)):
        tries = relay.retry(p)[2]
        if tries and tries[0].outcome == "loop":
            good = _retry_response(p)
            bad = good.replace(f"= loop t{tries[0].again}", f"= loop t{tries[0].again + 1}")
            assert bad != good and relay_checks.check(p, bad) == "retry"
            break
    else:
        pytest.fail("no loop among the generated puzzles")


@pytest.mark.parametrize("cut, reason", BROKEN_RETRIES)
def test_a_broken_retry_is_a_parse_error_not_a_crash(cut, reason):
    body = trace.thinking_text(_retry_response(CORNER))
    plans, why = layouts.parse_trace(cut(body), 2)
    assert plans is None and reason in why
    assert relay_checks.check(CORNER, f"<think>\n{cut(body)}\n</think>\n") in (
        "unreadable",
        "missing",
    )


def test_retry_form_sft_data_and_index_order_outcome_agree():
    """The SFT data's response for the retry form is the rendered retrying trace; the index
    order's outcome is the first attempt's."""
    assert data.responses([CORNER], None, traces.relay_retry)[0] == _retry_response(CORNER)
    assert relay_checks.index_order_outcome(CORNER) == ("cornered", True)


def test_loop_counts_read_a_back_and_forth_from_the_text(tmp_path):
    """`most_lines_on_a_cell` counts one agent's lines on one cell within an attempt (a retry
    starts a new count); `loop_counts` and projects/go_no_go/loop_count.py count traces that never
    close,
    those going back and forth, and loop and retry lines."""
    import json
    import subprocess
    import sys

    good = _retry_response(CORNER)
    assert relay_checks.most_lines_on_a_cell(good) == 2  # A0 waits once, in the attempt after retry
    line = "t{} A1 (1, 1) UP (0, 1) F DOWN (2, 1) F LEFT (1, 0) F RIGHT (1, 2) F = {} ({}, {})"
    pingpong = "<think>\n" + "\n".join(
        line.format(k, "UP", 0, 1) if k % 2 else line.replace("(1, 1) UP", "(0, 1) UP").format(
            k, "DOWN", 1, 1)
        for k in range(1, 8)
    )  # fmt: skip
    assert (
        relay_checks.most_lines_on_a_cell(pingpong) == 4
    )  # t1, t3, t5, t7 on (1, 1); never closes
    assert relay_checks.most_lines_on_a_cell("no trace") == 0
    responses = [good, pingpong, good.replace("retry A1 A0", "")]
    assert relay_checks.loop_counts(responses) == [3, 1, 1, 0, 1]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "text": r}) + "\n"
                            for i, r in enumerate(responses)))  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.loop_count", f"--answers={path}",
         "--labels=start", f"--out={tmp_path / 't.md'}"], capture_output=True, text=True,
        check=True, cwd=ROOT,
    )  # fmt: skip
    assert "| start | 3 | 1 | 1 | 0 | 1 | - |" in out.stdout
    assert (tmp_path / "t.md").read_text().strip() == out.stdout.strip()
    closed = tmp_path / "closed.jsonl"  # the same puzzles, every trace closing
    closed.write_text("".join(json.dumps({"id": f"p{i}", "text": good}) + "\n" for i in range(3)))
    out = subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.loop_count", f"--answers={path},{closed}",
         "--labels=start,later"], capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "| later | 3 | 0 | 0 | 0 | 3 | +33.3 [-20, 87] |" in out.stdout, out.stdout


# Two agents swapping ends of a corridor with one side pocket: the oracle sends one into the
# pocket, the relay's rule corners the second agent in either order.
SWAP = Problem(
    id="swap", grid=("FFF", "HFH", "HHH"), starts=((0, 0), (0, 2)), goals=((0, 2), (0, 0))
)
SWAP_TAIL = [
    "t2 A0 (0, 0) taken UP off DOWN (1, 0) H LEFT off RIGHT (0, 1) taken = cornered",
    "no order left",
]


def _end_response(p: Problem) -> str:
    return data.responses([p], None, "grid_relay")[0]


def test_a_trace_ends_when_every_order_fails_and_the_oracle_answers():
    """Both orders of SWAP are cornered: the trace writes both attempts, then `no order left`,
    and closes; the answer after it is the oracle's plan (valid), which the trace does not
    choose. The retry form without the ending has no example for it."""
    order, plans, tries, tried = relay.retry(SWAP)
    assert plans is None and tried == 2 and [t.outcome for t in tries] == ["cornered"] * 2
    assert relay.every_order_fails(SWAP) == tries
    assert data.responses([SWAP], None, traces.relay_retry) == [None]
    response = _end_response(SWAP)
    body = trace.thinking_text(response)
    assert body.splitlines()[-2:] == SWAP_TAIL and body.count("\nretry A1 A0\n") == 1
    assert body == relay.rule_trace(SWAP)
    assert layouts.parse_trace(body, 2) == (None, trace.NO_ORDER)
    answer, _ = text.parse_answer(response, 2)
    assert answer is not None and simulate.simulate(SWAP, answer)["valid"]
    assert relay_checks.check(SWAP, response) == "right"
    assert layouts.check_any(SWAP, response) == (len(body.splitlines()), None)
    assert trace.trace_plan_outcome(SWAP, response) == ("no_plan", None)
    mine = [[4, 4], [3, 3]]  # answers given: the ending trace, then that answer (not the oracle's)
    given = data.responses([SWAP], [mine], "grid_relay")[0]
    assert given == f"<think>\n{body}\n</think>\n\n" + text.render_answer(mine)


def test_every_ending_trace_reads_back_and_other_puzzles_keep_the_retry_trace():
    """Over generated puzzles: where every order fails on a line the ending trace checks right
    against the rule and its answer is a valid plan; elsewhere the form writes exactly the
    retrying trace (or, as it, no example)."""
    ended = 0
    for p in random_problems(300, seed=13, sizes=(3, 4, 5, 6)):
        (got,) = data.responses([p], None, "grid_relay")
        if relay.every_order_fails(p) is None:
            assert got == data.responses([p], None, traces.relay_retry)[0]
            continue
        ended += 1
        body = trace.thinking_text(got)
        assert body.endswith("\n" + trace.NO_ORDER) and relay_checks.check(p, got) == "right"
        assert layouts.check_any(p, got) == (len(body.splitlines()), None)
        assert simulate.simulate(p, text.parse_answer(got, 2)[0])["valid"]
    assert ended >= 2  # about 1 puzzle in 60 of this draw


def test_a_wrong_ending_is_a_retry_error_and_a_broken_one_a_parse_error():
    """`no order left` after CORNER's first failed attempt, where the next order has a plan,
    is first wrong there; text after it, or the line with no failed run before it, is a parse
    error with its reason, never a crash; render_trace refuses an ending without attempts."""
    good = trace.thinking_text(_retry_response(CORNER))
    early = good.split("\nretry A1 A0")[0] + "\nno order left"
    response = f"<think>\n{early}\n</think>\n\n" + text.render_answer([[0, 1], [2, 4]])
    assert layouts.parse_trace(early, 2) == (None, trace.NO_ORDER)
    assert relay_checks.check(CORNER, response) == "retry"
    assert layouts.check_any(CORNER, response)[1] is not None
    ended = trace.thinking_text(_end_response(SWAP))
    for bad, reason in [
        (ended + "\nt1 A0 (0, 0)", "a line after 'no order left'"),
        (good.replace("retry A1 A0", "no order left\nretry A1 A0"), "a line after"),
        (good + "\nno order left", "not a relay line: 'no order left'"),
    ]:
        plans, why = layouts.parse_trace(bad, 2)
        assert plans is None and reason in why
        assert relay_checks.check(SWAP, f"<think>\n{bad}\n</think>\n") == "unreadable"
    tries = relay.retry(SWAP)[2]
    with pytest.raises(ValueError, match="ended: a trace that ends on NO_ORDER has tries"):
        layouts.render_trace(SWAP, [[], []], "grid", ended=True)
    with pytest.raises(ValueError, match="ended: a trace that ends on NO_ORDER has tries"):
        layouts.render_trace(SWAP, [[], []], "grid", order=(0, 1), tries=tries, ended=True)
