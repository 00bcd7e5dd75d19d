"""The reasoning trace the shipped policy writes before its answer: the map transcribed cell by
cell, each agent's start and goal, then each agent's plan in turn as a run of move lines (the
relay, `env.relay`), a run that fails ending its attempt and a retry naming the next order.
Written from a plan, read back into that plan, and checked line by line:

    r0: (0, 0) S (0, 1) F (0, 2) G
    r1: (1, 0) g (1, 1) H (1, 2) F
    r2: (2, 0) s (2, 1) F (2, 2) F
    A0 S (0, 0) G (0, 2)
    A1 s (2, 0) g (1, 0)
    t1 A0 (0, 0) UP off DOWN (1, 0) g LEFT off RIGHT (0, 1) F = RIGHT (0, 1)
    t2 A0 (0, 1) UP off DOWN (1, 1) H LEFT (0, 0) S RIGHT (0, 2) G = RIGHT (0, 2)
    t1 A1 (2, 0) UP (1, 0) g DOWN off LEFT off RIGHT (2, 1) F = UP (1, 0)

A map line `rK:` labels every cell of row K with its coordinate and what it holds (F, H, or a
start/goal letter), so that a later look-up of a cell matches its label token and copies what
follows. An agent line gives its start and goal with the grid's symbols. A move line
`tK A<i> (r, c) ...` is agent i's step K: its cell (then `taken` when an agent written earlier
comes into it), for UP, DOWN, LEFT, RIGHT the cell that move enters and what is there (`off`
the map; `taken` where an agent written earlier stands after step K, or swaps with this one;
else the grid's symbol), then `= ACTION (r, c)` with the cell the agent will be in.

A run that fails ends on a line `= cornered` (no move and no wait allowed) or `= loop tJ` (the
agent stands where its line of step J stood, once every earlier agent rests), then
`retry A1 A0` names the order written next; after the last order's failed run, `no order left`
ends the trace and the answer is a plan no line decides. The answer block that follows
(`text.render_answer`) is what the reward reads; the trace is never scored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from mapfjax.env.answer import parse_answer
from mapfjax.env.simulate import simulate
from mapfjax.env.text import GOAL_SYMBOLS, START_SYMBOLS
from mapfjax.env.types import ACTION_DELTAS, ACTION_NAMES, HOLE_CELL, Problem

MOVES = ("UP", "DOWN", "LEFT", "RIGHT")  # the order of the four cells on a move line
OFF, TAKEN = "off", "taken"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CORNERED, LOOP, RETRY = "cornered", "loop", "retry"
NO_ORDER = "no order left"


def cell(rc: Sequence[int]) -> str:
    """'(r, c)': the form the prompt uses, one token in a tokenizer built with coordinates."""
    return f"({int(rc[0])}, {int(rc[1])})"


def hole_cells(problem: Problem) -> list[tuple[int, int]]:
    """The hole cells in row-major order."""
    return [
        (r, c) for r, row in enumerate(problem.grid) for c, ch in enumerate(row) if ch == HOLE_CELL
    ]


def symbols(problem: Problem) -> dict[tuple[int, int], str]:
    """The grid's symbol at every non-frozen cell, as the prompt draws it (starts win)."""
    out = dict.fromkeys(hole_cells(problem), HOLE_CELL)
    for i, g in enumerate(problem.goals):
        out[tuple(g)] = GOAL_SYMBOLS[i]
    for i, s in enumerate(problem.starts):
        out[tuple(s)] = START_SYMBOLS[i]
    return out


def map_lines(problem: Problem) -> list[str]:
    """One line per row, every cell labelled by its coordinate: `r1: (1, 0) F (1, 1) H ...`."""
    marks = symbols(problem)
    row = lambda r: [f"{cell((r, c))} {marks.get((r, c), 'F')}" for c in range(problem.width)]
    return [f"r{r}: " + " ".join(row(r)) for r in range(problem.height)]


def agent_lines(problem: Problem) -> list[str]:
    """One line per agent: its start and goal with the grid's symbols, `A0 S (0, 0) G (0, 2)`."""
    return [
        f"A{i} {START_SYMBOLS[i]} {cell(s)} {GOAL_SYMBOLS[i]} {cell(g)}"
        for i, (s, g) in enumerate(zip(problem.starts, problem.goals, strict=True))
    ]


def render_header(problem: Problem) -> list[str]:
    """The lines before the first move line: the map, then each agent's start and goal."""
    return map_lines(problem) + agent_lines(problem)


def move_line(
    problem: Problem,
    marks: dict,
    agent: int,
    here,
    taken: set,
    action: int | None,
    head: str = "",
) -> str:
    """One move line: `head` (the step label, `t3`; with it, the agent's cell is followed by
    `taken` when that cell is in `taken`), the agent and its cell, the four cells with what
    each holds (`marks`: `symbols(problem)`; `taken` for the cells in `taken`), then
    `= ACTION (r, c)`; action None: `= cornered` (a run that can neither move nor wait)."""
    if action is not None and not 0 <= action < len(ACTION_NAMES):
        raise ValueError(f"agent {agent}: action code {action} out of range")
    parts = [head] if head else []
    parts += [f"A{agent}", cell(here)]
    parts += [TAKEN] if head and tuple(here) in taken else []
    for name in MOVES:
        dr, dc = ACTION_DELTAS[ACTION_NAMES.index(name)]
        r, c = here[0] + int(dr), here[1] + int(dc)
        if not (0 <= r < problem.height and 0 <= c < problem.width):
            parts += [name, OFF]
            continue
        content = TAKEN if (r, c) in taken else marks.get((r, c), "F")
        parts += [name, cell((r, c)), content]
    if action is None:
        return " ".join([*parts, "=", CORNERED])
    dr, dc = ACTION_DELTAS[action]
    parts += ["=", ACTION_NAMES[action], cell((here[0] + int(dr), here[1] + int(dc)))]
    return " ".join(parts)


def step(rc: Sequence[int], action: int) -> tuple[int, int]:
    """The cell `action` (a code of ACTION_NAMES) moves to from `rc` (off the map included); a
    ValueError for a code out of range."""
    if not 0 <= int(action) < len(ACTION_NAMES):
        raise ValueError(f"action code {action} out of range")
    dr, dc = ACTION_DELTAS[int(action)]
    return int(rc[0]) + int(dr), int(rc[1]) + int(dc)


def cells_by_time(start: Sequence[int], plan: Sequence[int]) -> list[tuple[int, int]]:
    """An agent's cell at t = 0, 1, ..., len(plan), its moves followed as written."""
    out = [tuple(int(v) for v in start)]
    for a in plan:
        out.append(step(out[-1], a))
    return out


def relay_taken(earlier: Sequence[Sequence[tuple[int, int]]], k: int, here) -> set:
    """The cells a move line at step k marks `taken`: each earlier agent's cell after step k
    (`earlier`: their `cells_by_time`; one whose plan has ended stays on its last cell), and
    the cell of one that comes from there into `here`, the writing agent's cell (a swap).
    `here` itself is in the set when an earlier agent enters it."""
    out = set()
    for cells in earlier:
        now, before = cells[min(k, len(cells) - 1)], cells[min(k - 1, len(cells) - 1)]
        out.add(now)
        if now == tuple(here):
            out.add(before)
    return out


class Attempt(NamedTuple):
    """A failed attempt of the relay that retries: the agents' `order`; `runs`, (agent,
    actions) in that order up to the one that fails; `outcome` CORNERED or LOOP; `again`, for
    a loop, the step of that run whose line stood on the cell the agent has come back to."""

    order: tuple[int, ...]
    runs: tuple[tuple[int, tuple[int, ...]], ...]
    outcome: str
    again: int | None = None


def relay_runs(
    problem: Problem, runs, lines: list[str], before=()
) -> list[tuple[int, list[tuple[int, int]]]]:
    """Append the move lines of `runs` ((agent, actions) in order) to `lines`, after the runs
    `before` ((agent, cells by time) pairs, as returned); returns every run's (agent, cells by
    time), those before included."""
    marks = symbols(problem)
    agents = [i for i, _ in before]
    written = [c for _, c in before]
    for i, actions in runs:
        try:
            cells = cells_by_time(problem.starts[i], actions)
        except ValueError as e:
            raise ValueError(f"agent {i}: {e}") from None
        for k, a in enumerate(actions, 1):
            taken = relay_taken(written, k, cells[k - 1])
            lines.append(move_line(problem, marks, i, cells[k - 1], taken, int(a), f"t{k}"))
        written.append(cells)
        agents.append(i)
    return list(zip(agents, written, strict=True))


def render_relay(
    problem: Problem,
    plans: Sequence[Sequence[int]],
    order: Sequence[int] | None,
    tries: Sequence[Attempt] = (),
    ended: bool = False,
    header: Sequence[str] | None = None,
) -> str:
    """The trace of `plans` (per-agent action codes) on `problem`: `header` (None:
    `render_header`), then each agent's run in `order` (agents left out follow in index
    order). Moves are followed as written (an illegal plan still gets a trace, `off` cells
    included), so any plan can be rendered and read back.

    tries: failed attempts written before `order`'s runs (`relay.retry`): each attempt's runs,
    the last one ending on its failure line (`= cornered`, or `= loop tJ`), then `retry` and
    the next attempt's order. ended (with tries, order None): every order failed; the last
    attempt's failure line is followed by NO_ORDER and the trace ends there (`plans` are not
    written)."""
    n = problem.num_agents
    if len(plans) != n:
        raise ValueError(f"{len(plans)} plans for {n} agents")
    if ended and (not tries or order is not None):
        raise ValueError("ended: a trace that ends on NO_ORDER has tries and no order")
    if order is None and not ended:
        raise ValueError("order None: a relay trace names its order, unless it has ended")
    lines = list(render_header(problem) if header is None else header)
    if order is not None:
        order = [*order, *(i for i in range(n) if i not in order)]
        if sorted(order) != list(range(n)):
            raise ValueError(f"order {order}: not an order of the {n} agents")
    marks = symbols(problem)
    nexts = [t.order for t in tries[1:]] + ([order] if tries else [])
    for attempt, after in zip(tries, nexts, strict=True):
        before = relay_runs(problem, attempt.runs[:-1], lines)
        i, actions = attempt.runs[-1]
        cells = relay_runs(problem, [attempt.runs[-1]], lines, before)[-1][1]
        k, here = len(actions) + 1, cells[-1]
        if attempt.outcome == CORNERED:
            taken = relay_taken([c for _, c in before], k, here)
            lines.append(move_line(problem, marks, i, here, taken, None, f"t{k}"))
        elif attempt.outcome == LOOP and attempt.again is not None:
            lines.append(f"t{k} A{i} {cell(here)} = {LOOP} t{attempt.again}")
        else:
            raise ValueError(f"attempt {attempt}: a failed run is cornered or loops")
        lines.append(NO_ORDER if after is None else " ".join([RETRY, *(f"A{j}" for j in after)]))
    if order is not None:
        relay_runs(problem, [(i, plans[i]) for i in order], lines)
    return "\n".join(lines)


def think_block(trace: str) -> str:
    """'<think>\\n' + trace + '\\n</think>\\n\\n': the answer follows, as Qwen3 writes it."""
    return f"{THINK_OPEN}\n{trace}\n{THINK_CLOSE}\n\n"


RELAY_LINE = re.compile(r"^t(\d{1,4}) A(\d{1,2}) .* = ([A-Z]+) \(-?\d+, -?\d+\)$")
# The last line of a failed run, and the line naming the order written next.
FAILED_LINE = re.compile(
    rf"^t\d{{1,4}} A\d{{1,2}} \(-?\d+, -?\d+\).* = ({CORNERED}|{LOOP} t\d{{1,4}})$", re.M
)
RETRY_LINE = re.compile(rf"^{RETRY}( A\d{{1,2}})+$")
# A move line without its step label (the step blocks of earlier traces): no run of this form.
_UNLABELLED = re.compile(r"^A(\d{1,2}) .* = ([A-Z]+) \(-?\d+, -?\d+\)$")
_FIRST_STEP = re.compile(r"^[ \t]*t1[ \t]*$", re.MULTILINE)


def header_end(response: str) -> int:
    """The character offset in a response where its first line `t1` (a step label alone, the
    step blocks of earlier trace layouts) starts: the text before it is the map transcription
    and the agents' lines, a function of the prompt alone. 0 when the response has no such
    line (nothing is a header then; a relay trace has none)."""
    m = _FIRST_STEP.search(response)
    return m.start() if m else 0


def answer_start(response: str) -> int:
    """The character offset where a response's trace closes (`</think>`): from there on come
    the closing tag and the answer block. len(response) when the trace never closes (all of
    it is trace)."""
    close = response.find(THINK_CLOSE)
    return len(response) if close < 0 else close


def parse_relay(trace: str, num_agents: int):
    """A trace's runs -> (plans, order of the agents' runs); (None, "") when the trace has no
    relay line; (None, reason) when it is not a readable relay trace. A trace that retries is
    read from its last `retry` line on: a failed run's last line and the `retry` line after it
    close an attempt, and the plans are those of the attempt written last. A trace whose last
    failed run is followed by NO_ORDER has no plan: (None, NO_ORDER). Lines before the first
    move line are header lines, not read."""
    plans: list[list[int]] = [[] for _ in range(num_agents)]
    order: list[int] = []
    started = failed = retried = ended = False  # a relay line read; a run failed; a retry read
    for k, line in enumerate(trace.splitlines(), 1):
        line = line.strip()
        if ended:
            if line:
                return None, f"line {k}: a line after {NO_ORDER!r}: {line[:60]!r}"
            continue
        if failed:  # the line after a failed run's last one names the next order, or none
            if line == NO_ORDER:
                ended = True
                continue
            if RETRY_LINE.match(line) is None:
                return None, f"line {k}: no retry line after a failed run: {line[:60]!r}"
            plans, order, failed, retried = [[] for _ in range(num_agents)], [], False, True
            continue
        if started and FAILED_LINE.match(line):
            failed = True
            continue
        m = RELAY_LINE.match(line)
        if m is None:
            if started and line:
                return None, f"line {k}: not a relay line: {line[:60]!r}"
            continue  # header lines
        started = True
        k_step, i, name = int(m.group(1)), int(m.group(2)), m.group(3)
        if i >= num_agents or name not in ACTION_NAMES:
            return None, f"line {k}: agent {i} or action {name!r} not allowed"
        if not order or order[-1] != i:
            if i in order:
                return None, f"line {k}: agent {i}'s lines resume after another agent's"
            order.append(i)
        if k_step != len(plans[i]) + 1:
            return None, f"line {k}: agent {i} step {k_step} after step {len(plans[i])}"
        plans[i].append(ACTION_NAMES.index(name))
    if ended:
        return None, NO_ORDER
    if failed:
        return None, "the trace ends on a failed run"
    if retried and not order:
        return None, "no run after the last retry line"
    return (plans, order) if order else (None, "")


def parse_trace(trace: str, num_agents: int) -> tuple[list[list[int]] | None, str | None]:
    """The plans a trace's move lines choose -> (plans, None), or (None, reason); never raises
    on any text. Reads only the `tK A<i>` labels and the `= ACTION (r, c)` ending each line
    (`check_trace` checks the rest). A trace without a move line writes no run: every plan
    is empty (its header alone is checked); one whose move lines carry no step label is
    another layout's, not read. (None, NO_ORDER) for a trace that ends on NO_ORDER."""
    plans, how = parse_relay(trace, num_agents)
    if plans is not None:
        return plans, None
    if how:
        return None, how
    for k, line in enumerate(trace.splitlines(), 1):
        if _UNLABELLED.match(line.strip()):
            return None, f"line {k}: a move line without its step label: {line.strip()[:60]!r}"
    return [[] for _ in range(num_agents)], None


def thinking_text(response: str) -> str | None:
    """The text inside a response's first think block (the prompt may have opened it: a
    response that starts inside the block has only its closing tag), or None without one."""
    close = response.find(THINK_CLOSE)
    if close < 0:
        return None
    open_ = response.find(THINK_OPEN)
    start = open_ + len(THINK_OPEN) if 0 <= open_ < close else 0
    return response[start:close].strip("\n")


# How a response's answer relates to the plan its trace writes (`trace_plan_outcome`).
PLAN_OUTCOMES = ("copied", "differs", "no_plan")
Parse = Callable[[str, int], tuple[list[list[int]] | None, str | None]]


def trace_plan_outcome(
    problem: Problem, response: str, parse: Parse = parse_trace
) -> tuple[str, bool | None]:
    """(outcome, whether the trace's own plan is valid): "copied" when the answer block's
    plan is the one the trace's move lines choose (read by `parse`), "differs" when it is
    another (or none parses), "no_plan" without a readable trace, or with an empty think block
    (validity None). The gap between the rate of valid trace plans and of valid answers is
    what copying the trace into the answer loses."""
    body = thinking_text(response)
    plans = parse(body, problem.num_agents)[0] if body else None  # "": an empty block
    if plans is None:
        return "no_plan", None
    valid = bool(simulate(problem, plans)["valid"])
    answer, _ = parse_answer(response, problem.num_agents)
    same = answer is not None and [list(map(int, a)) for a in answer] == plans
    return ("copied" if same else "differs"), valid


# What a wrong trace line got wrong, by the first field that differs from the true line.
ERROR_KINDS = ("no_trace", "unreadable", "holes", "agents", "position", "cell", "content",
               "target", "length")  # fmt: skip


def _field_kind(got: str, want: str) -> str:
    """The kind of the first differing field of a move line (see ERROR_KINDS)."""
    g, w = got.split(" "), want.split(" ")
    if RELAY_LINE.match(want):  # a line with its step label first, then the move line's fields
        g, w = g[1:], w[1:]
    j = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), None)
    if j is None:
        return "length"
    # Fields, with "(r, c)" as two words: A<i> (r, c) then per move NAME (r, c) SYMBOL or
    # NAME off, then = ACTION (r, c).
    if j <= 2:
        return "position"
    if "=" in g[:j]:
        return "target"
    field = w[j]
    return (
        "cell"
        if field == OFF or field in MOVES or field[:1] == "(" or field[-1:] == ")"
        else "content"
    )


def first_difference(
    got: Sequence[str], want: Sequence[str], map_count: int, header_count: int
) -> tuple[int, str | None]:
    """(number of equal lines before the first that differs, its kind; see ERROR_KINDS) of a
    trace's lines `got` against the true lines `want`, whose first `map_count` lines
    transcribe the map and first `header_count` the map and the agents; None when equal."""
    for k, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            if k < map_count:
                return k, "holes"
            return k, "agents" if k < header_count else _field_kind(a, b)
    if len(got) != len(want):
        return min(len(got), len(want)), "length"
    return len(want), None


def true_lines(
    problem: Problem, trace: str, tries: Sequence[Attempt] = (), truth: str | None = None
) -> tuple[list[str], list[str]] | None:
    """(the trace's lines, stripped; the true lines of the plan its move lines choose, its
    runs in its order after `tries`, the failed attempts a retrying trace is checked against:
    `relay.retry_truth` gives the rule's), or None when no plan can be read from it. A trace
    that ends on NO_ORDER chooses no plan: its true lines are `truth` (the rule's whole trace,
    `relay.rule_trace`), None without it."""
    plans, how = parse_trace(trace, problem.num_agents)
    if plans is None:
        if how != NO_ORDER or truth is None:
            return None
        want = truth
    else:
        order = parse_relay(trace, problem.num_agents)[1] or ()
        want = render_relay(problem, plans, order, tries if order else ())
    return [line.strip() for line in trace.splitlines()], want.splitlines()


def check_trace(
    problem: Problem, response: str, tries: Sequence[Attempt] = (), truth: str | None = None
) -> tuple[int, str | None]:
    """Where a response's trace first departs from the true trace of the plan it chooses:
    (number of correct lines before it, the kind of error or None if the trace is right; see
    ERROR_KINDS). A diagnostic of which look-up a policy gets wrong: transcribing the map
    ("holes") or the agents, tracking its position, naming a neighbouring cell, what the cell
    holds, or the cell its move enters. tries and truth: what a retrying trace, or one that
    ends on NO_ORDER, is checked against (`true_lines`; `relay.check_trace` passes the
    rule's)."""
    trace = thinking_text(response)
    if trace is None:
        return 0, "no_trace"
    lines = true_lines(problem, trace, tries, truth)
    if lines is None:
        return 0, "unreadable"
    return first_difference(*lines, problem.height, problem.height + problem.num_agents)
