"""A reasoning trace for MAPF-FrozenLake: the puzzle transcribed as coordinates, then every
move of every agent with the four cells it could enter and what each holds, written from a
plan (the oracle's, for SFT) and read back into that plan.

The trace turns the two look-ups a small model gets wrong (what is in the cell next to an
agent; is another agent going there) into token matches against lines it wrote itself:

    H: (0, 2) (1, 1)
    A0 S (0, 0) G (2, 2)
    A1 s (2, 0) g (0, 0)
    t1
    A0 (0, 0) UP off DOWN (1, 0) F LEFT off RIGHT (0, 1) F = DOWN (1, 0)
    A1 (2, 0) UP (1, 0) taken DOWN off LEFT off RIGHT (2, 1) H = WAIT (2, 0)
    ...

Line `H:` lists the holes in row-major order (`none` if there are none); one line per agent
gives its start and goal with the grid's symbols. A step block `t<k>` has a line for each agent
whose plan still has an action at step k: its cell, then for UP, DOWN, LEFT, RIGHT the cell that
move enters and what is there (`off` the map; `taken` if an agent written earlier in this step
goes there, or stands there and comes to this agent's cell: a vertex or an edge conflict; else
the grid's symbol: F, H, or a start/goal letter), then `= ACTION (r, c)` with the cell the
agent will be in (the next line of this agent starts there; a later agent's `taken` matches
it). The answer block that follows (`text.render_answer`) is what the reward reads; the trace
is never scored. The relay layout (`render_trace` with `order`, `env.relay`) writes the same
move lines agent by agent instead of step by step, each prefixed with its step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from mapfjax.env.answer import parse_answer
from mapfjax.env.simulate import simulate
from mapfjax.env.text import GOAL_SYMBOLS, START_SYMBOLS
from mapfjax.env.types import ACTION_DELTAS, ACTION_NAMES, HOLE_CELL, Problem

MOVES = ("UP", "DOWN", "LEFT", "RIGHT")  # the order of the four cells on a move line
OFF, TAKEN, NONE = "off", "taken", "none"
# What a relay trace's later lines write of the earlier agents (`render_trace`'s where).
WHERE_FIELDS = ("", "after", "next")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# A relay run that fails (`render_trace`'s tries): its last line ends `= cornered` (no move and
# no wait allowed) or `= loop tJ` (the agent stands where its line of step J stood, once every
# earlier agent rests), then `retry A1 A0` names the order written next; after the last
# order's failed run, `no order left` ends the trace (`render_trace`'s ended).
CORNERED, LOOP, RETRY = "cornered", "loop", "retry"
NO_ORDER = "no order left"


def cell(rc: Sequence[int]) -> str:
    """'(r, c)': the form the prompt uses, one token in a tokenizer built with coordinates."""
    return f"({int(rc[0])}, {int(rc[1])})"


def hole_cells(problem: Problem) -> list[tuple[int, int]]:
    """The hole cells in row-major order (the order the `H:` line lists them)."""
    return [
        (r, c) for r, row in enumerate(problem.grid) for c, ch in enumerate(row) if ch == HOLE_CELL
    ]


def _symbols(problem: Problem) -> dict[tuple[int, int], str]:
    """The grid's symbol at every non-frozen cell, as the prompt draws it (starts win)."""
    out = dict.fromkeys(hole_cells(problem), HOLE_CELL)
    for i, g in enumerate(problem.goals):
        out[tuple(g)] = GOAL_SYMBOLS[i]
    for i, s in enumerate(problem.starts):
        out[tuple(s)] = START_SYMBOLS[i]
    return out


# How the trace transcribes the map before the moves (`STYLES`):
#  holes  `H: (0, 2) (1, 1)`: every hole as a cell, row-major (`H: none` without holes);
#  rows   `r1: F H F | (1, 1)`: each row copied with one token per cell, then its holes (`none`);
#  grid   `r1: (1, 0) F (1, 1) H (1, 2) F`: each row, every cell labelled by its coordinate,
#         so a later look-up of a cell's content matches the cell token and copies what follows.
# Every style then writes one line per agent (start and goal) and the same move lines.
STYLES = ("holes", "rows", "grid")


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"trace style {style!r}: allowed {STYLES}")


def _map_lines(problem: Problem, style: str) -> list[str]:
    holes = hole_cells(problem)
    if style == "holes":
        return [f"{HOLE_CELL}: " + (" ".join(cell(rc) for rc in holes) if holes else NONE)]
    symbols = _symbols(problem)
    lines = []
    for r in range(problem.height):
        row = [(r, c) for c in range(problem.width)]
        if style == "grid":
            lines.append(f"r{r}: " + " ".join(f"{cell(rc)} {symbols.get(rc, 'F')}" for rc in row))
        else:
            in_row = [cell(rc) for rc in holes if rc[0] == r]
            copy = " ".join(symbols.get(rc, "F") for rc in row)
            lines.append(f"r{r}: {copy} | " + (" ".join(in_row) if in_row else NONE))
    return lines


def render_header(problem: Problem, style: str = "holes") -> list[str]:
    """The lines before the first step: the map (in `style`, see STYLES), then each agent's
    start and goal with the grid's symbols."""
    _check_style(style)
    lines = _map_lines(problem, style)
    for i, (s, g) in enumerate(zip(problem.starts, problem.goals, strict=True)):
        lines.append(f"A{i} {START_SYMBOLS[i]} {cell(s)} {GOAL_SYMBOLS[i]} {cell(g)}")
    return lines


def detect_style(trace: str) -> str:
    """The style a trace's first line is written in ("holes" when it is none of them)."""
    first = trace.lstrip("\n").split("\n", 1)[0]
    if not first.startswith("r0:"):
        return "holes"
    return "grid" if first.startswith("r0: (0, 0)") else "rows"


def read_holes(trace: str) -> set[tuple[int, int]] | None:
    """The hole cells a trace's map lines name, in any style (None without map lines): what
    a policy believes the map holds, to compare with the truth cell by cell."""
    style, out, lines = detect_style(trace), set(), trace.strip("\n").splitlines()
    found = False
    for line in lines:
        line = line.strip()
        if _STEP.match(line) or line.startswith("A"):
            break
        cells = [(int(r), int(c)) for r, c in _CELL.findall(line)]
        if style == "holes" and line.startswith(f"{HOLE_CELL}:"):
            out.update(cells)
        elif style == "rows" and "|" in line:
            out.update((int(r), int(c)) for r, c in _CELL.findall(line.split("|", 1)[1]))
        elif style == "grid" and cells:
            marks = line.split(") ")[1:]  # each cell's symbol follows its ") "
            out.update(rc for rc, m in zip(cells, marks, strict=False) if m[:1] == HOLE_CELL)
        else:
            continue
        found = True
    return out if found else None


def taken_cells(
    moved: dict[int, tuple[int, int]], pos: Sequence[tuple[int, int]], agent: int
) -> set[tuple[int, int]]:
    """The cells agent `agent`'s move line marks `taken`: each cell an agent written earlier in
    this step goes to (`moved`: agent -> its next cell), and the cell of one that stands there
    and comes to `agent`'s cell (`pos`: every agent's cell before the step)."""
    out = set(moved.values())
    out.update(pos[j] for j, goes in moved.items() if goes == pos[agent])
    return out


def _move_line(
    problem: Problem,
    symbols: dict,
    agent: int,
    here,
    taken: set,
    action: int,
    head: str = "",
    where: Sequence[str] = (),
) -> str:
    """One move line: `head` (a relay line's step label: with it, the agent's cell is followed
    by `where`, the earlier agents' cells after this step, then `taken` when one of them comes
    into it), the agent and its cell, the four cells with what each holds, then
    `= ACTION (r, c)`; action None: `= cornered` (a relay run that can neither move nor wait)."""
    if action is not None and not 0 <= action < len(ACTION_NAMES):
        raise ValueError(f"agent {agent}: action code {action} out of range")
    parts = [head] if head else []
    parts += [f"A{agent}", cell(here), *where]
    parts += [TAKEN] if head and tuple(here) in taken else []
    for name in MOVES:
        dr, dc = ACTION_DELTAS[ACTION_NAMES.index(name)]
        r, c = here[0] + int(dr), here[1] + int(dc)
        if not (0 <= r < problem.height and 0 <= c < problem.width):
            parts += [name, OFF]
            continue
        content = TAKEN if (r, c) in taken else symbols.get((r, c), "F")
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
    """The cells a relay line at step k (`render_trace` with `order`) marks `taken`: each
    earlier agent's cell after step k (`earlier`: their `cells_by_time`; one whose plan has
    ended stays on its last cell), and the cell of one that comes from there into `here`, the
    writing agent's cell (a swap). `here` itself is in the set when an earlier agent enters it."""
    out = set()
    for cells in earlier:
        now, before = cells[min(k, len(cells) - 1)], cells[min(k - 1, len(cells) - 1)]
        out.add(now)
        if now == tuple(here):
            out.add(before)
    return out


class Attempt(NamedTuple):
    """A failed relay attempt (`render_trace`'s tries): the agents' `order`; `runs`, (agent,
    actions) in that order up to the one that fails; `outcome` CORNERED or LOOP; `again`, for
    a loop, the step of that run whose line stood on the cell the agent has come back to."""

    order: tuple[int, ...]
    runs: tuple[tuple[int, tuple[int, ...]], ...]
    outcome: str
    again: int | None = None


def _relay_runs(
    problem: Problem, symbols: dict, runs, where: str, lines: list[str], before=()
) -> list[tuple[int, list[tuple[int, int]]]]:
    """Append the relay lines of `runs` ((agent, actions) in order) to `lines`, after the runs
    `before` ((agent, cells by time) pairs, as returned); returns every run's (agent, cells by
    time), those before included."""
    agents = [i for i, _ in before]
    written = [c for _, c in before]
    for i, actions in runs:
        try:
            cells = cells_by_time(problem.starts[i], actions)
        except ValueError as e:
            raise ValueError(f"agent {i}: {e}") from None
        for k, a in enumerate(actions, 1):
            taken = relay_taken(written, k, cells[k - 1])
            at = [c[min(k, len(c) - 1)] for c in written]
            key = f"t{k + 1} " if where == "next" else ""  # "after": none; "": no field
            who = [f"{key}A{j} {cell(rc)}" for j, rc in zip(agents, at, strict=True) if where]
            lines.append(_move_line(problem, symbols, i, cells[k - 1], taken, int(a), f"t{k}", who))
        written.append(cells)
        agents.append(i)
    return list(zip(agents, written, strict=True))


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
    """The trace of `plans` (per-agent action codes, as `oracle.answer_actions` gives) on
    `problem`, its map transcribed in `style` (see STYLES). Moves are followed as written (an
    illegal plan still gets a trace: its cells are what the moves say, `off` cells included),
    so any plan can be rendered and read back. plan_lines: a look-ahead block written between the
    header and the first step (`env.lookahead`); the moves do not read it.

    order: the relay layout (`env.relay`) instead of step blocks: each agent's whole plan in
    turn, in this order, one line per step `tK A<i> (r, c) ...` whose `taken` marks the cells
    the agents written before it hold after step K (`relay_taken`); agents left out of `order`
    follow in index order. where (with order; WHERE_FIELDS): a later agent's line also writes,
    after its cell, each earlier agent's cell after step K, so that every `taken` compares
    cells on its own line: "after" as `A0 (1, 2)` (the end of that agent's `tK` line), "next"
    as `t5 A0 (1, 2)` at K = 4 (the start of that agent's `t5` line, after the key the line
    writes; an agent whose run has ended stays on its last cell).

    tries (with order): failed relay attempts written before `order`'s runs (`Attempt`; the
    relay that retries, `env.relay.retry`): each attempt's runs, the last one ending on its
    failure line (`= cornered`, or `= loop tJ`), then `retry` and the next attempt's order.
    ended (with tries, without order): every order failed; the last attempt's failure line is
    followed by NO_ORDER and the trace ends there (`plans` are not written)."""
    n = problem.num_agents
    if len(plans) != n:
        raise ValueError(f"{len(plans)} plans for {n} agents")
    if where not in WHERE_FIELDS or (where and order is None):
        raise ValueError(f"where = {where!r}: allowed {WHERE_FIELDS}, a field only with order")
    if ended and (not tries or order is not None):
        raise ValueError("ended: a trace that ends on NO_ORDER has tries and no order")
    if tries and ((order is None and not ended) or where):
        raise ValueError("tries: failed relay attempts come only with an order, without where")
    symbols = _symbols(problem)
    lines = render_header(problem, style) + list(plan_lines)
    if order is not None or ended:
        order = None if ended else [*order, *(i for i in range(n) if i not in order)]
        if order is not None and sorted(order) != list(range(n)):
            raise ValueError(f"order {order}: not an order of the {n} agents")
        nexts = [t.order for t in tries[1:]] + ([order] if tries else [])
        for attempt, after in zip(tries, nexts, strict=True):
            before = _relay_runs(problem, symbols, attempt.runs[:-1], where, lines)
            i, actions = attempt.runs[-1]
            cells = _relay_runs(problem, symbols, [attempt.runs[-1]], where, lines, before)[-1][1]
            k, here = len(actions) + 1, cells[-1]
            if attempt.outcome == CORNERED:
                taken = relay_taken([c for _, c in before], k, here)
                lines.append(_move_line(problem, symbols, i, here, taken, None, f"t{k}"))
            elif attempt.outcome == LOOP and attempt.again is not None:
                lines.append(f"t{k} A{i} {cell(here)} = {LOOP} t{attempt.again}")
            else:
                raise ValueError(f"attempt {attempt}: a failed run is cornered or loops")
            lines.append(
                NO_ORDER if after is None else " ".join([RETRY, *(f"A{j}" for j in after)])
            )
        if ended:
            return "\n".join(lines)
        _relay_runs(problem, symbols, [(i, plans[i]) for i in order], where, lines)
        return "\n".join(lines)
    pos = [tuple(int(v) for v in s) for s in problem.starts]
    for t in range(max((len(p) for p in plans), default=0)):
        lines.append(f"t{t + 1}")
        moved: dict[int, tuple[int, int]] = {}  # agents written earlier this step -> target
        for i in range(n):
            if t >= len(plans[i]):
                continue
            a = int(plans[i][t])
            try:
                lines.append(_move_line(problem, symbols, i, pos[i], taken_cells(moved, pos, i), a))
            except ValueError as e:
                raise ValueError(f"{e}, step {t + 1}") from None
            dr, dc = ACTION_DELTAS[a]
            moved[i] = (pos[i][0] + int(dr), pos[i][1] + int(dc))
        for i, goes in moved.items():
            pos[i] = goes
    return "\n".join(lines)


def render_thinking(
    problem: Problem,
    plans: Sequence[Sequence[int]],
    style: str = "holes",
    plan_lines: Sequence[str] = (),
    order: Sequence[int] | None = None,
    where: str = "",
    tries: Sequence[Attempt] = (),
    ended: bool = False,
) -> str:
    """The think block of `plans`: '<think>\\n' + trace + '\\n</think>\\n\\n' (the answer follows,
    as Qwen3 writes it); plan_lines, order, where, tries and ended as in `render_trace`."""
    body = render_trace(problem, plans, style, plan_lines, order, where, tries, ended)
    return f"{THINK_OPEN}\n{body}\n{THINK_CLOSE}\n\n"


_STEP = re.compile(r"^t(\d{1,4})$")
_MOVE = re.compile(r"^A(\d{1,2}) .* = ([A-Z]+) \(-?\d+, -?\d+\)$")
# A relay line with a `where` field after its cell: "after" (`A0 (r, c)`), "next" (`t5 A0 ...`).
_WHERE = re.compile(r"^t\d{1,4} A\d{1,2} \(\d{1,2}, \d{1,2}\) (t\d{1,4} )?A\d{1,2} \(", re.M)
RELAY_LINE = re.compile(r"^t(\d{1,4}) A(\d{1,2}) .* = ([A-Z]+) \(-?\d+, -?\d+\)$")
# The last line of a failed relay run, and the line naming the order written next.
FAILED_LINE = re.compile(
    rf"^t\d{{1,4}} A\d{{1,2}} \(-?\d+, -?\d+\).* = ({CORNERED}|{LOOP} t\d{{1,4}})$", re.M
)
RETRY_LINE = re.compile(rf"^{RETRY}( A\d{{1,2}})+$")
_CELL = re.compile(r"\((\d{1,2}), (\d{1,2})\)")


_FIRST_STEP = re.compile(r"^[ \t]*t1[ \t]*$", re.MULTILINE)
# The lines of a look-ahead block (`env.lookahead`): paths, a conflict, a node, an opened node.
LOOKAHEAD_LINE = re.compile(
    r"^(P\d{1,2} \(|(meet|swap) |n\d+ A\d{1,2} (not|ends) |open n\d+$"
    r"|A\d{1,2} around P\d{1,2} = |plan A\d{1,2} around P\d{1,2}$)"
)


def header_end(response: str) -> int:
    """The character offset in a response where its first step line (`t1`) starts: the text
    before it is the map transcription and the agents' lines (`render_header`), a function of
    the prompt alone. 0 when the response has no step line (nothing is a header then)."""
    m = _FIRST_STEP.search(response)
    return m.start() if m else 0


def answer_start(response: str) -> int:
    """The character offset where a response's trace closes (`</think>`): from there on come
    the closing tag and the answer block. len(response) when the trace never closes (all of
    it is trace)."""
    close = response.find(THINK_CLOSE)
    return len(response) if close < 0 else close


def parse_trace(trace: str, num_agents: int) -> tuple[list[list[int]] | None, str | None]:
    """The plans a trace's move lines choose -> (plans, None), or (None, reason). Reads only
    the step lines and the `= ACTION (r, c)` ending each move line (the header and the cells
    are checked by `check_trace`), in either layout (`render_trace`: step blocks, or relay
    lines, each agent's in one run); never raises on any text."""
    relay, how = parse_relay(trace, num_agents)
    if relay is not None or how:
        return relay, None if relay is not None else how
    plans: list[list[int]] = [[] for _ in range(num_agents)]
    step = 0
    for k, line in enumerate(trace.splitlines(), 1):
        line = line.strip()
        if m := _STEP.match(line):
            if int(m.group(1)) != step + 1:
                return None, f"line {k}: step {m.group(1)} after step {step}"
            step += 1
            continue
        m = _MOVE.match(line)
        if m is None:
            if step and line:
                return None, f"line {k}: not a move line: {line[:60]!r}"
            continue  # header lines
        i, name = int(m.group(1)), m.group(2)
        if i >= num_agents or name not in ACTION_NAMES:
            return None, f"line {k}: agent {i} or action {name!r} not allowed"
        if len(plans[i]) != step - 1:
            return None, f"line {k}: agent {i} has no line at an earlier step, or two at t{step}"
        plans[i].append(ACTION_NAMES.index(name))
    return plans, None


def parse_relay(trace: str, num_agents: int):
    """A relay-layout trace (`render_trace` with `order`) -> (plans, order of the agents'
    runs); (None, "") when the trace has no relay line (it may be in the step layout); (None,
    reason) when it is not a readable relay trace. A trace that retries (`render_trace`'s
    tries) is read from its last `retry` line on: a failed run's last line and the `retry`
    line after it close an attempt, and the plans are those of the attempt written last. A
    trace whose last failed run is followed by NO_ORDER (`render_trace`'s ended) has no plan:
    (None, NO_ORDER)."""
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
        step, i, name = int(m.group(1)), int(m.group(2)), m.group(3)
        if i >= num_agents or name not in ACTION_NAMES:
            return None, f"line {k}: agent {i} or action {name!r} not allowed"
        if not order or order[-1] != i:
            if i in order:
                return None, f"line {k}: agent {i}'s lines resume after another agent's"
            order.append(i)
        if step != len(plans[i]) + 1:
            return None, f"line {k}: agent {i} step {step} after step {len(plans[i])}"
        plans[i].append(ACTION_NAMES.index(name))
    if ended:
        return None, NO_ORDER
    if failed:
        return None, "the trace ends on a failed run"
    if retried and not order:
        return None, "no run after the last retry line"
    return (plans, order) if order else (None, "")


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


def trace_plan_outcome(problem: Problem, response: str) -> tuple[str, bool | None]:
    """(outcome, whether the trace's own plan is valid): "copied" when the answer block's
    plan is the one the trace's move lines choose, "differs" when it is another (or none
    parses), "no_plan" without a readable trace, or with an empty think block (validity
    None). The gap between the rate of valid trace plans and of valid answers is what copying
    the trace into the answer loses."""
    body = thinking_text(response)
    plans = parse_trace(body, problem.num_agents)[0] if body else None  # "": an empty block
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
    if RELAY_LINE.match(want):  # a relay line: its step label first, then a move line's fields
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


def true_lines(
    problem: Problem,
    trace: str,
    style: str | None = None,
    tries: Sequence[Attempt] = (),
    truth: str | None = None,
) -> tuple[list[str], list[str]] | None:
    """(the trace's lines, stripped, a look-ahead block's left out; the true lines of the plan
    its move lines choose, in its layout: step blocks or relay runs in its order, with its
    `where` field, after `tries`, the failed attempts a retrying trace is checked against:
    `env.relay.retry_truth` gives the rule's), or None when no plan can be read from it. A
    trace that ends on NO_ORDER chooses no plan: its true lines are `truth` (the rule's whole
    trace, `env.relay.rule_trace`), None without it.
    style: the trace's (STYLES); None reads it from the trace's first line."""
    plans, how = parse_trace(trace, problem.num_agents)
    style = detect_style(trace) if style is None else style
    if plans is None:  # a trace that ends on NO_ORDER is checked against the given truth
        if how != NO_ORDER or truth is None:
            return None
        want = truth
    else:
        order = parse_relay(trace, problem.num_agents)[1] or None
        field = _WHERE.search(trace) if order is not None else None
        where = "" if field is None else "next" if field.group(1) else "after"
        tries = tries if order is not None else ()
        want = render_trace(problem, plans, style, order=order, where=where, tries=tries)
    want = want.splitlines()
    # a look-ahead block is not checked here: its own lines say where it went wrong
    got = [line.strip() for line in trace.splitlines() if not LOOKAHEAD_LINE.match(line.strip())]
    return got, want


def check_trace(
    problem: Problem,
    response: str,
    style: str | None = None,
    tries: Sequence[Attempt] = (),
    truth: str | None = None,
) -> tuple[int, str | None]:
    """Where a response's trace first departs from the true trace of the plan it chooses:
    (number of correct lines before it, the kind of error or None if the trace is right; see
    ERROR_KINDS). A diagnostic of which look-up a policy gets wrong: transcribing the map
    ("holes", in any style) or the agents, tracking its position, naming a neighbouring cell,
    what the cell holds, or the cell its move enters. style: the trace's (see STYLES); None
    reads it from the trace's first line. A look-ahead block's lines (`LOOKAHEAD_LINE`) are
    left out of the comparison. tries: the failed attempts a retrying relay trace is checked
    against (`env.relay.check_trace` passes the rule's); truth: the true trace of one that
    ends on NO_ORDER (`true_lines`)."""
    trace = thinking_text(response)
    if trace is None:
        return 0, "no_trace"
    style = detect_style(trace) if style is None else style
    lines = true_lines(problem, trace, style, tries, truth)
    if lines is None:
        return 0, "unreadable"
    got, want = lines
    map_lines = len(_map_lines(problem, style))
    header = map_lines + problem.num_agents
    for k, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            if k < map_lines:
                return k, "holes"
            return k, "agents" if k < header else _field_kind(a, b)
    if len(got) != len(want):
        return min(len(got), len(want)), "length"
    return len(want), None
