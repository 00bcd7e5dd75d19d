"""Every trace layout the gate tried, rendered, read back and checked line by line, on top of
the shipped trace's pieces (`mapfjax.env.trace`): the map in any style (`styles`), a look-ahead
block before the moves (`lookahead`), and the moves in step blocks or in relay runs, a relay
run's lines optionally writing where the earlier agents stand.

The step layout writes a block `t<k>` per step, one line per agent whose plan still has an
action then, in index order, with no step label on the line; `taken` there marks a cell an
agent written earlier in this step goes to, or the cell of one that stands there and comes to
this agent's cell (a vertex or an edge conflict):

    H: (1, 1)
    A0 S (0, 0) G (0, 2)
    A1 s (2, 0) g (1, 0)
    t1
    A0 (0, 0) UP off DOWN (1, 0) g LEFT off RIGHT (0, 1) F = RIGHT (0, 1)
    A1 (2, 0) UP (1, 0) g DOWN off LEFT off RIGHT (2, 1) F = WAIT (2, 0)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mapfjax.env import relay, trace
from mapfjax.env.trace import (
    NO_ORDER,
    RELAY_LINE,
    Attempt,
    cell,
    cells_by_time,
    parse_relay,
    thinking_text,
)
from mapfjax.env.types import ACTION_DELTAS, ACTION_NAMES, Problem
from projects.go_no_go import styles

# What a relay trace's later lines write of the earlier agents (`render_trace`'s where).
WHERE_FIELDS = ("", "after", "next")
# The lines of a look-ahead block (`lookahead`): paths, a conflict, a node, an opened node.
LOOKAHEAD_LINE = re.compile(
    r"^(P\d{1,2} \(|(meet|swap) |n\d+ A\d{1,2} (not|ends) |open n\d+$"
    r"|A\d{1,2} around P\d{1,2} = |plan A\d{1,2} around P\d{1,2}$)"
)
_STEP = re.compile(r"^t(\d{1,4})$")
_MOVE = re.compile(r"^A(\d{1,2}) .* = ([A-Z]+) \(-?\d+, -?\d+\)$")
# A relay line with a `where` field after its cell: "after" (`A0 (r, c)`), "next" (`t5 A0 ...`).
_WHERE = re.compile(r"^t\d{1,4} A\d{1,2} \(\d{1,2}, \d{1,2}\) (t\d{1,4} )?A\d{1,2} \(", re.M)


def taken_cells(
    moved: dict[int, tuple[int, int]], pos: Sequence[tuple[int, int]], agent: int
) -> set[tuple[int, int]]:
    """The cells agent `agent`'s step-layout move line marks `taken`: each cell an agent
    written earlier in this step goes to (`moved`: agent -> its next cell), and the cell of one
    that stands there and comes to `agent`'s cell (`pos`: every agent's cell before the step)."""
    out = set(moved.values())
    out.update(pos[j] for j, goes in moved.items() if goes == pos[agent])
    return out


def _steps(problem: Problem, plans, lines: list[str]) -> None:
    """Append the step blocks of `plans` to `lines`."""
    marks = trace.symbols(problem)
    pos = [tuple(int(v) for v in s) for s in problem.starts]
    for t in range(max((len(p) for p in plans), default=0)):
        lines.append(f"t{t + 1}")
        moved: dict[int, tuple[int, int]] = {}  # agents written earlier this step -> target
        for i in range(problem.num_agents):
            if t >= len(plans[i]):
                continue
            a = int(plans[i][t])
            taken = taken_cells(moved, pos, i)
            try:
                lines.append(trace.move_line(problem, marks, i, pos[i], taken, a))
            except ValueError as e:
                raise ValueError(f"{e}, step {t + 1}") from None
            dr, dc = ACTION_DELTAS[a]
            moved[i] = (pos[i][0] + int(dr), pos[i][1] + int(dc))
        for i, goes in moved.items():
            pos[i] = goes


def _with_where(problem: Problem, plans, order, where: str, lines: list[str]) -> list[str]:
    """Relay `lines` with each later agent's line also writing, after its cell, each earlier
    agent's cell after that step: "after" as `A0 (1, 2)`, "next" as `t5 A0 (1, 2)` at step 4."""
    n = problem.num_agents
    order = [*order, *(i for i in range(n) if i not in order)]
    cells = {i: cells_by_time(problem.starts[i], plans[i]) for i in order}
    out = []
    for line in lines:
        if m := RELAY_LINE.match(line):
            k, i = int(m.group(1)), int(m.group(2))
            key = f"t{k + 1} " if where == "next" else ""
            who = [
                f" {key}A{j} {cell(cells[j][min(k, len(cells[j]) - 1)])}"
                for j in order[: order.index(i)]
            ]
            cut = line.index(")") + 1  # the end of the agent's own cell
            line = line[:cut] + "".join(who) + line[cut:]
        out.append(line)
    return out


def render_trace(
    problem: Problem,
    plans: Sequence[Sequence[int]],
    style: str = "holes",
    plan_lines: Sequence[str] = (),
    order: Sequence[int] | None = None,
    where: str = "",
    tries: Sequence[Attempt] = (),
    ended: bool = False,
) -> str:
    """The trace of `plans` (per-agent action codes) on `problem`, its map in `style`
    (`styles.STYLES`). plan_lines: a look-ahead block written between the header and the
    first move (`lookahead`); the moves do not read it. Without order, the step layout (module
    docstring); with order, the relay layout (`trace.render_relay`). where (with order;
    WHERE_FIELDS): a later agent's line also writes, after its cell, each earlier agent's cell
    after step K: "after" as `A0 (1, 2)`, "next" as `t5 A0 (1, 2)` at K = 4 (an agent whose
    run has ended stays on its last cell). tries and ended (with order, without where; ended
    without order): a retrying trace's failed attempts and its ending, as
    `trace.render_relay` writes them."""
    n = problem.num_agents
    if len(plans) != n:
        raise ValueError(f"{len(plans)} plans for {n} agents")
    if where not in WHERE_FIELDS or (where and order is None):
        raise ValueError(f"where = {where!r}: allowed {WHERE_FIELDS}, a field only with order")
    if ended and (not tries or order is not None):
        raise ValueError("ended: a trace that ends on NO_ORDER has tries and no order")
    if tries and ((order is None and not ended) or where):
        raise ValueError("tries: failed relay attempts come only with an order, without where")
    header = styles.render_header(problem, style) + list(plan_lines)
    if order is not None or ended:
        lines = trace.render_relay(problem, plans, order, tries, ended, header).split("\n")
        return "\n".join(_with_where(problem, plans, order, where, lines) if where else lines)
    lines = list(header)
    _steps(problem, plans, lines)
    return "\n".join(lines)


def render_thinking(problem: Problem, plans, *args, **kwargs) -> str:
    """`trace.think_block` of `render_trace(problem, plans, ...)`."""
    return trace.think_block(render_trace(problem, plans, *args, **kwargs))


def parse_trace(text: str, num_agents: int) -> tuple[list[list[int]] | None, str | None]:
    """The plans a trace's move lines choose -> (plans, None), or (None, reason), in either
    layout (relay runs, `trace.parse_relay`, else step blocks); never raises on any text."""
    relay_plans, how = parse_relay(text, num_agents)
    if relay_plans is not None or how:
        return relay_plans, None if relay_plans is not None else how
    plans: list[list[int]] = [[] for _ in range(num_agents)]
    at = 0
    for k, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if m := _STEP.match(line):
            if int(m.group(1)) != at + 1:
                return None, f"line {k}: step {m.group(1)} after step {at}"
            at += 1
            continue
        m = _MOVE.match(line)
        if m is None:
            if at and line:
                return None, f"line {k}: not a move line: {line[:60]!r}"
            continue  # header lines
        i, name = int(m.group(1)), m.group(2)
        if i >= num_agents or name not in ACTION_NAMES:
            return None, f"line {k}: agent {i} or action {name!r} not allowed"
        if len(plans[i]) != at - 1:
            return None, f"line {k}: agent {i} has no line at an earlier step, or two at t{at}"
        plans[i].append(ACTION_NAMES.index(name))
    return plans, None


def true_lines(
    problem: Problem,
    text: str,
    style: str | None = None,
    tries: Sequence[Attempt] = (),
    truth: str | None = None,
) -> tuple[list[str], list[str]] | None:
    """(the trace's lines, stripped, a look-ahead block's left out; the true lines of the plan
    its move lines choose, in its layout and `where` field, after `tries`), or None when no plan
    can be read from it; a trace that ends on NO_ORDER is checked against `truth` (None without
    it). style: the trace's (None: read from its first line)."""
    plans, how = parse_trace(text, problem.num_agents)
    style = styles.detect_style(text) if style is None else style
    if plans is None:
        if how != NO_ORDER or truth is None:
            return None
        want = truth
    else:
        order = parse_relay(text, problem.num_agents)[1] or None
        field = _WHERE.search(text) if order is not None else None
        where = "" if field is None else "next" if field.group(1) else "after"
        tries = tries if order is not None else ()
        want = render_trace(problem, plans, style, order=order, where=where, tries=tries)
    # a look-ahead block is not checked here: its own lines say where it went wrong
    got = [line.strip() for line in text.splitlines() if not LOOKAHEAD_LINE.match(line.strip())]
    return got, want.splitlines()


def check_trace(
    problem: Problem,
    response: str,
    style: str | None = None,
    tries: Sequence[Attempt] = (),
    truth: str | None = None,
) -> tuple[int, str | None]:
    """`trace.check_trace` for any layout and map style (`true_lines`; style None: read from
    the trace's first line); tries and truth as given."""
    body = thinking_text(response)
    if body is None:
        return 0, "no_trace"
    style = styles.detect_style(body) if style is None else style
    lines = true_lines(problem, body, style, tries, truth)
    if lines is None:
        return 0, "unreadable"
    map_count = len(styles.map_lines(problem, style))
    return trace.first_difference(*lines, map_count, map_count + problem.num_agents)


def truths(problem: Problem, body: str):
    """`relay.truths` with the rule's whole trace in the trace's own map style."""
    header = styles.render_header(problem, styles.detect_style(body))
    return relay.truths(problem, body, header)


def check_any(problem: Problem, response: str, style: str | None = None):
    """`check_trace` with a retrying relay trace's failed attempts checked against the rule's,
    one that ends on `no order left` against the rule's whole trace (`truths`)."""
    body = thinking_text(response)
    tries, truth = truths(problem, body) if body is not None else ((), None)
    return check_trace(problem, response, style, tries, truth)
