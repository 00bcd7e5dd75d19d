"""Diagnostics of relay traces the gate's scripts read (`lookahead_check.py`,
`relay_orders.py`, `loop_count.py`): the relay that takes the first valid order without a
retry (`relay`), how index order ends, where a policy's relay trace first goes wrong and which
field of that line, and how often its runs go back and forth. The rule itself is the shipped
trace's (`mapfjax.env.relay`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from mapfjax import stats
from mapfjax.env import relay as env_relay
from mapfjax.env.trace import (
    FAILED_LINE,
    LOOP,
    NO_ORDER,
    RELAY_LINE,
    RETRY_LINE,
    TAKEN,
    THINK_CLOSE,
    parse_relay,
    step,
    thinking_text,
)
from mapfjax.env.types import Problem
from projects.go_no_go import layouts, styles

MAX_ORDERS = env_relay.MAX_ORDERS


def agent_plan(
    problem: Problem, agent: int, earlier: Sequence[tuple[int, Sequence[int]]], horizon: int
) -> list[int] | None:
    """One agent's actions by the rule (`agent_run`); None unless it settles on its goal."""
    actions, outcome = env_relay.agent_run(problem, agent, earlier, horizon)
    return actions if outcome == "settled" else None


def plan_in_order(problem: Problem, order: Sequence[int]) -> list[list[int]] | None:
    """Every agent's actions by the rule, planned in `order`; None when one of them finds none
    or the plan is not valid (`attempt` says how)."""
    return env_relay.attempt(problem, order)[0]


def relay(problem: Problem) -> tuple[tuple[int, ...] | None, list[list[int]] | None, int]:
    """(order, plans, orders tried): the first order of the agents (`itertools.permutations`,
    index order first; at most MAX_ORDERS) whose relay plan is valid; order and plans are None
    when none is."""
    tried = 0
    for order in env_relay.orders(problem.num_agents):
        tried += 1
        plans = plan_in_order(problem, order)
        if plans is not None:
            return order, plans, tried
    return None, None, tried


_CELL_LINE = re.compile(r"^t\d{1,4} A(\d{1,2}) (\(\d{1,2}, \d{1,2}\))")


def most_lines_on_a_cell(response: str) -> int:
    """The most lines a relay trace writes for one agent on one cell within one attempt (the
    text between `retry` lines): 2 where an agent waits once or comes back once, 3 or more
    where it goes back and forth. 0 without a relay line. Reads the text only (the trace need
    not close or parse)."""
    count: dict = {}
    best = attempt_no = 0
    for line in (thinking_text(response) or response).splitlines():
        line = line.strip()
        if RETRY_LINE.match(line):
            attempt_no += 1
        elif m := _CELL_LINE.match(line):
            key = (attempt_no, m.group(1), m.group(2))
            count[key] = count.get(key, 0) + 1
            best = max(best, count[key])
    return best


LOOP_COLUMNS = ("answers", "trace never closes", "of which an agent on a cell 3+ times",
                "answers with a loop line", "answers with a retry")  # fmt: skip


def loop_counts(responses: Sequence[str]) -> list[int]:
    """Per LOOP_COLUMNS, how many of `responses` (a policy's answers): all, those whose
    think block never closes, those of them with an agent on one cell on 3 or more lines of
    one attempt (`most_lines_on_a_cell`), and those writing a `= loop tJ` line or a `retry`."""
    cut = [r for r in responses if THINK_CLOSE not in r]
    lines = [[x.strip() for x in r.splitlines()] for r in responses]
    return [
        len(responses),
        len(cut),
        sum(most_lines_on_a_cell(r) >= 3 for r in cut),
        sum(any(FAILED_LINE.match(x) and f"= {LOOP} t" in x for x in ls) for ls in lines),
        sum(any(RETRY_LINE.match(x) for x in ls) for ls in lines),
    ]


def index_order_outcome(problem: Problem) -> tuple[str, bool]:
    """(how the relay in index order ends (OUTCOMES), whether another order has a valid plan):
    what a trace that always starts with A0 and writes the other order when a run fails (a
    retry) would meet. The first outcome is "valid" exactly when `relay` returns index order;
    the second is True for a valid index order too when another order is also valid."""
    how = env_relay.attempt(problem, range(problem.num_agents))[2]
    orders = itertools.islice(env_relay.orders(problem.num_agents), 1, None)
    return how, any(plan_in_order(problem, o) is not None for o in orders)


def orders_table(problems: Sequence[Problem]) -> str:
    """Markdown: per whether a puzzle needs a wait (its label, `Problem.needs_wait`), how the
    relay in index order ends (`index_order_outcome`) and how many of its failures another
    order solves, so what a trace that retries would reach against one that must choose its
    first agent. A ValueError names a puzzle without the label."""
    if unlabelled := [p.id for p in problems if p.needs_wait is None]:
        raise ValueError(
            f"{len(unlabelled)} puzzle(s) without a needs_wait label, e.g. {unlabelled[0]!r}: "
            "label them with the oracle first (env.io writes it)"
        )
    needs_wait = [bool(p.needs_wait) for p in problems]
    outcomes = [index_order_outcome(p) for p in problems]
    rows = []
    for label, keep in (("no", False), ("yes", True), ("all", None)):
        got = [o for o, nw in zip(outcomes, needs_wait, strict=True) if keep in (None, nw)]
        n = len(got)
        if not n:
            continue
        cells = [label, str(n)]
        for how in env_relay.OUTCOMES:
            k = sum(o == how for o, _ in got)
            fixed = sum(o == how and b for o, b in got)
            cells.append(str(k) if how == "valid" else f"{k} ({fixed})")
        for hits in ([o == "valid" for o, _ in got], [o == "valid" or b for o, b in got]):
            cells.append(stats.interval_text(stats.proportion(hits)))
        rows.append(cells)
    head = ["needs a wait", "puzzles", "index order valid"]
    head += [f"{how} (another order valid)" for how in env_relay.OUTCOMES[1:]]
    head += ["index order valid %", "with a retry: some order valid %"]
    return stats.markdown_table(head, rows)


def plan_from(problem: Problem, agent: int) -> list[list[int]] | None:
    """The first valid relay plan (as `relay`) among the orders that run `agent` first; None
    when no order starting with it has one (a trace that starts with it cannot be right)."""
    others = [i for i in range(problem.num_agents) if i != agent]
    orders = ((agent, *rest) for rest in itertools.permutations(others))
    for order in itertools.islice(orders, MAX_ORDERS):
        if (plans := plan_in_order(problem, order)) is not None:
            return plans
    return None


def first_departure(
    problem: Problem, plans: Sequence[Sequence[int]], order: Sequence[int]
) -> tuple[int, int] | None:
    """(agent, step) of the first action of `plans`, written in `order`, that the rule does not
    allow given the runs written before it (any move one step closer counts, not only the
    first); a run that stops where the rule goes on, or goes on where it ends, departs at its
    end. None when every run keeps the rule."""
    for n_before, i in enumerate(order):
        allowed, _ = env_relay.rule(problem, i, [(j, list(plans[j])) for j in order[:n_before]])
        here = tuple(int(v) for v in problem.starts[i])
        for k, a in enumerate([*plans[i], None], 1):
            choices = allowed(here, k)
            if a is None:
                if choices is not None:
                    return i, k
                break
            if choices is None or int(a) not in choices:
                return i, k
            here = step(here, int(a))
    return None


def first_agent(response: str) -> int | None:
    """The agent whose run a response's relay trace writes first (None without a relay line):
    the one choice of the trace that no line decides."""
    for line in (thinking_text(response) or "").splitlines():
        if m := RELAY_LINE.match(line.strip()):
            return int(m.group(2))
    return None


# Where a response's relay trace first goes wrong (`check`).
CHECKS = ("right", "header", "retry", "first run", "later run", "rule", "unreadable", "missing")
# What the first wrong line of a relay run gets wrong (`line_error`): the agent's cell (or the
# step label), a `where` field, the `taken` mark after its own cell, a neighbour's `taken`
# mark left out or written where the cell is free, what a neighbour holds otherwise, the
# action's target, or a line missing, left over or cut short.
LINE_FIELDS = ("cell", "where", "own mark", "mark missed", "mark added", "content", "target",
               "length")  # fmt: skip


def _first_wrong_line(problem: Problem, response: str):
    """(verdict, got, want) for a response's relay trace: verdict one of CHECKS; got and want
    are the first line that differs from the true line and that true line in "header", "first
    run" and "later run", else ""."""
    body = thinking_text(response)
    if body is None:
        return "missing", "", ""
    plans, order = parse_relay(body, problem.num_agents)
    if plans is None and order != NO_ORDER:
        return ("unreadable" if order else "missing"), "", ""
    tries, truth = layouts.truths(problem, body)
    lines = layouts.true_lines(problem, body, tries=tries, truth=truth)
    if lines is None:  # ends on `no order left` where the rule fails in a way no line shows
        return "retry", NO_ORDER, ""
    got, want = lines
    header = len(styles.render_header(problem, styles.detect_style(body)))
    # a retrying trace's failed attempts end on the truth's last retry line
    final = max((k + 1 for k, x in enumerate(want) if RETRY_LINE.match(x)), default=header)
    for k, (a, b) in enumerate(zip([*got, ""], [*want, ""], strict=False)):
        if a != b:
            if k < header:
                return "header", a, b
            if k < final or plans is None:
                return "retry", a, b
            run = "first run" if k - final < len(plans[order[0]]) else "later run"
            return run, a, b
    if plans is None:  # every order failed, as the rule's did
        return "right", "", ""
    order = [*order, *(i for i in range(problem.num_agents) if i not in order)]
    return ("right" if first_departure(problem, plans, order) is None else "rule"), "", ""


def check(problem: Problem, response: str) -> str:
    """Where a response's relay trace first goes wrong (see CHECKS): "missing" (no think block
    or no relay line), "unreadable" (`trace.parse_relay` fails), a line that is not the true
    line of the plan it writes: in the map and agents' lines ("header"), a failed attempt of a
    trace that retries or its retry line ("retry", against the rule's attempts), the run of
    the agent written first ("first run") or a later one ("later run"); "rule" when every line
    is right but an action is not the rule's (`first_departure`); else "right"."""
    return _first_wrong_line(problem, response)[0]


def line_error(problem: Problem, response: str) -> tuple[str, str] | None:
    """(run, field) where a relay trace's first wrong line is in a run ("first run" or "later
    run", as `check` says) and the first field of it that differs from the true line (see
    LINE_FIELDS); None when `check` finds no wrong line in a run."""
    run, got, want = _first_wrong_line(problem, response)
    if run not in ("first run", "later run"):
        return None
    g, w = got.split(" "), want.split(" ")
    j = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), None)
    if j is None or not got or not want:  # a line missing or left over (a blank one counts)
        return run, "length"
    # the own cell's mark stands just before the first move (UP, or = when none is written)
    mark = next((k for k, x in enumerate(w) if x in ("UP", "=")), len(w))
    mark -= w[mark - 1] == TAKEN
    taken = TAKEN in (g[j], w[j])
    if j < 4:  # tK A<i> (r, c)
        field = "cell"
    elif j < mark:
        field = "where"
    elif j == mark and taken:
        field = "own mark"
    elif taken:
        field = "mark missed" if w[j] == TAKEN else "mark added"
    else:
        field = "target" if "=" in w[:j] else "content"
    return run, field
