"""A look-ahead block for the reasoning trace: how the plan is found, written as text lines a
policy can imitate step by step, so the waits and detours that no move line decides
(`locality`) follow from lines the trace has already written. Two forms (`LOOKAHEADS`):

`search`, conflict-based search best first on the sum of costs (optimal):

    P0 (0, 0) (0, 1) (0, 2)                each agent's path: its cell at t = 0, 1, ...
    P1 (1, 1) (0, 1)
    meet A0 A1 t1 (0, 1) rest A1           the first conflict; A1 already rests on its goal
    n1 A0 not (0, 1) from t1 = none        so either A0 never enters it again (no path)
    n2 A1 ends after t1 = (1, 1) (0, 1) (0, 1) cost 4           or A1 ends later
    open n2                                the cheapest node not yet opened
    P0 (0, 0) (0, 1) (0, 2)
    P1 (1, 1) (0, 1) (0, 1)
    meet A0 A1 t1 (0, 1)
    n3 A0 not (0, 1) t1 = (0, 0) (0, 0) (0, 1) (0, 2) cost 5
    n4 A1 ends after t1, not (0, 1) t1 = (1, 1) (1, 1) (0, 1) cost 4
    open n4
    P0 (0, 0) (0, 1) (0, 2)
    P1 (1, 1) (1, 1) (0, 1)
    meet none                              its paths are the plan

A node line lists every constraint of the agent it re-plans (its ancestors' too: `not CELL tK`,
`not CELL CELL tK` for a move, `not CELL from tK`, `ends after tK`) and the path that agent now
takes, or `none`; `open` picks the least cost, the first written among equals; a swap is
written `swap A0 A1 tK CELL CELL` (A0's move). `priority`, prioritised planning for two agents
(valid, not always optimal):

    P0 (0, 0) (0, 1) (0, 2)
    P1 (1, 1) (0, 1)
    meet A0 A1 t1 (0, 1) rest A1
    A1 around P0 = (1, 1) (1, 1) (0, 1) cost 4     A1 re-planned around A0's written path
    A0 around P1 = none
    plan A1 around P0                      the cheaper, A1 around P0 among equals

A path is the first shortest one in the move lines' order (UP, DOWN, LEFT, RIGHT, then WAIT)
under the agent's constraints: with none, each step is the first move one step closer to the
goal; with some, the agent waits as late as it can.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import NamedTuple

from mapfjax.env import relay
from mapfjax.env.joint import INF, GridMap
from mapfjax.env.oracle import path_actions
from mapfjax.env.trace import cell, thinking_text
from mapfjax.env.types import ACTION_DELTAS, Problem
from projects.go_no_go import relay_checks
from projects.go_no_go.layouts import LOOKAHEAD_LINE

ORDER = (1, 2, 3, 4, 0)  # UP, DOWN, LEFT, RIGHT, WAIT: moves first, in the move lines' order
MAX_OPEN = 16  # nodes a look-ahead may open before it gives up (its text grows with each)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What agent `agent` may not do. mode "at": be at `cells[0]` at time `t` (one cell) or move
    from `cells[0]` to `cells[1]` arriving at `t` (two cells); "from": be at `cells[0]` at `t`
    or any later time; "after": end its path (settle on its goal, `cells[0]`) by time `t`."""

    agent: int
    t: int
    cells: tuple[tuple[int, int], ...]
    mode: str = "at"

    def text(self) -> str:
        if self.mode == "after":
            return f"ends after t{self.t}"
        where = " ".join(cell(c) for c in self.cells)
        return f"not {where} from t{self.t}" if self.mode == "from" else f"not {where} t{self.t}"


class Conflict(NamedTuple):
    """The earliest conflict of a node's paths: agents `i` < `j` meet in `cells[0]` or swap
    `cells` at time `t`; `rest` is the agent already resting on its goal there, if any."""

    kind: str  # "meet" or "swap"
    t: int
    i: int
    j: int
    cells: tuple[tuple[int, int], ...]
    rest: int | None = None


@dataclasses.dataclass(frozen=True)
class Lookahead:
    """The block's `lines` and the plan its last opened node holds (`plans`: per-agent action
    codes, each list at its agent's cost), `opened` nodes (orders tried, for `relay`); plans
    is None when the search gave up after MAX_OPEN nodes or found no plan. order: the trace
    writes the plan in the relay layout, the agents in this order (`relay_checks.relay`);
    where: what a later agent's lines write of where the earlier ones stand
    (`layouts.WHERE_FIELDS`)."""

    lines: tuple[str, ...]
    plans: list[list[int]] | None
    opened: int
    order: tuple[int, ...] | None = None
    where: str = ""
    tries: tuple = ()  # failed relay attempts written before the plan (`relay_retry_form`)
    # plans is None because every order failed on a line: the trace writes `tries`, then
    # `no order left` (`relay_retry_end_form`), and the answer is another's (`traces`)
    ended: bool = False


def path(m: GridMap, start, goal, cons: Sequence[Constraint], limit: int = 256):
    """The first shortest path (cells at t = 0..T, T the last arrival at `goal`) that keeps
    `cons` (one agent's constraints), trying actions in ORDER; None when there is none (or none
    within `limit` steps)."""
    start, goal = tuple(start), tuple(goal)
    vertex = {(c.t, c.cells[0]) for c in cons if len(c.cells) == 1 and c.mode == "at"}
    edge = {(c.t, *c.cells) for c in cons if len(c.cells) == 2}
    since: dict[tuple[int, int], int] = {}  # cell -> the time from which it is barred
    for c in cons:
        if c.mode == "from":
            since[c.cells[0]] = min(c.t, since.get(c.cells[0], c.t))
    after = max((c.t for c in cons if c.mode == "after"), default=-1)

    def barred(t: int, rc) -> bool:
        return (t, rc) in vertex or t >= since.get(rc, INF)

    d = m.dist(m.cell(goal))[m.cell(start)]
    if d >= INF or goal in since:  # unreachable, or the agent could not rest on its goal
        return None
    last_goal = max([after, *(t for t, q in vertex if q == goal)])
    # after the last constraint the map is static: a path, if any, arrives within `free` more
    latest = max((c.t for c in cons), default=0) + m.free + d
    for arrive in range(max(d, last_goal + 1), min(limit, latest) + 1):
        # can[t]: cells from which the goal is reached exactly at `arrive`, keeping cons
        can = [set() for _ in range(arrive + 1)]
        can[arrive] = set() if barred(arrive, goal) else {goal}
        for t in range(arrive - 1, -1, -1):
            for q in can[t + 1]:
                for u in m.nbrs[m.cell(q)]:  # q itself (a wait) and its free neighbours
                    rc = m.rc(u)
                    if (t + 1, rc, q) not in edge and not barred(t, rc):
                        can[t].add(rc)
        if start not in can[0]:
            continue
        out = [start]
        for t in range(arrive):
            here = out[-1]
            for a in ORDER:
                dr, dc = ACTION_DELTAS[a].tolist()
                q = (here[0] + dr, here[1] + dc)
                if q in can[t + 1] and (t + 1, here, q) not in edge:
                    out.append(q)
                    break
        return out
    return None


def _at(p, t):
    return p[min(t, len(p) - 1)]


def first_conflict(paths) -> Conflict | None:
    """The earliest conflict (then the lowest pair, a meeting before a swap), agents staying on
    their goals after their paths end; None without one."""
    horizon = max(len(p) for p in paths)
    for t in range(1, horizon):
        for i, j in itertools.combinations(range(len(paths)), 2):
            if _at(paths[i], t) == _at(paths[j], t):
                rest = next((k for k in (i, j) if t >= len(paths[k]) - 1), None)
                return Conflict("meet", t, i, j, (_at(paths[i], t),), rest)
        for i, j in itertools.combinations(range(len(paths)), 2):
            a0, a1 = _at(paths[i], t - 1), _at(paths[i], t)
            b0, b1 = _at(paths[j], t - 1), _at(paths[j], t)
            if a0 != a1 and a1 == b0 and b1 == a0:
                return Conflict("swap", t, i, j, (a0, a1))
    return None


def _cells(p) -> str:
    return " ".join(cell(c) for c in p)


def _conflict_line(found: Conflict) -> str:
    """`meet A0 A1 t1 (0, 1)` (+ ` rest A1` when an agent rests on its goal there) or `swap ...`."""
    tail = "" if found.rest is None else f" rest A{found.rest}"
    return f"{found.kind} A{found.i} A{found.j} t{found.t} {_cells(found.cells)}{tail}"


def search(problem: Problem, max_open: int | None = None) -> Lookahead:
    """The look-ahead block of `problem` (see the module docstring) and the plan it finds:
    optimal (least sum of costs) when it ends within `max_open` opened nodes (None: MAX_OPEN)."""
    max_open = MAX_OPEN if max_open is None else max_open
    m = GridMap(problem.grid)
    starts, goals = problem.starts, problem.goals
    paths = [path(m, s, g, ()) for s, g in zip(starts, goals, strict=True)]
    if any(p is None for p in paths):
        return Lookahead((), None, 0)
    lines: list[str] = []
    # open nodes: (cost, written order, name, constraints, paths)
    frontier = [(sum(len(p) - 1 for p in paths), 0, "", (), paths)]
    written = itertools.count(1)
    for opened in range(1, max_open + 1):
        k = min(range(len(frontier)), key=lambda x: frontier[x][:2])
        _, _, name, cons, paths = frontier.pop(k)
        if name:
            lines.append(f"open {name}")
        lines += [f"P{i} {_cells(p)}" for i, p in enumerate(paths)]
        found = first_conflict(paths)
        if found is None:
            lines.append("meet none")
            return Lookahead(tuple(lines), [path_actions(p) for p in paths], opened)
        kind, t, i, j, where, rest = found
        lines.append(_conflict_line(found))
        for agent in (i, j):
            if kind == "swap":
                new = Constraint(agent, t, where if agent == i else where[::-1])
            else:
                # an agent resting on its goal there: it ends later, or the other one never
                # enters that cell again (one branch instead of a wait per time step)
                mode = "at" if rest is None else ("after" if agent == rest else "from")
                new = Constraint(agent, t, where, mode)
            mine = [c for c in cons if c.agent == agent] + [new]
            p = path(m, starts[agent], goals[agent], mine)
            order = next(written)
            head = f"n{order} A{agent} " + ", ".join(c.text() for c in mine) + " = "
            if p is None:
                lines.append(head + "none")
                continue
            kid = [*paths[:agent], p, *paths[agent + 1 :]]
            cost = sum(len(q) - 1 for q in kid)
            lines.append(head + f"{_cells(p)} cost {cost}")
            frontier.append((cost, order, f"n{order}", (*cons, new), kid))
        if not frontier:
            break
    return Lookahead(tuple(lines), None, opened)


def _around(other, agent: int) -> list[Constraint]:
    """Constraints that keep `agent` off `other`'s path: its cell at every time, its reverse
    moves (no swap), and its goal from when it rests there."""
    out = [Constraint(agent, t, (c,)) for t, c in enumerate(other) if t]
    out += [Constraint(agent, t, (other[t], other[t - 1])) for t in range(1, len(other))]
    return [*out, Constraint(agent, len(other) - 1, (other[-1],), "from")]


def priority(problem: Problem) -> Lookahead:
    """The `priority` look-ahead block (two agents; see the module docstring): each agent's path
    alone and, when they conflict, each agent re-planned around the other's written path; the
    plan is the cheaper pair. plans is None when neither order has a path."""
    if problem.num_agents != 2:
        raise ValueError(
            f"problem {problem.id!r}: {problem.num_agents} agents; the priority look-ahead takes 2"
        )
    m = GridMap(problem.grid)
    starts, goals = problem.starts, problem.goals
    alone = [path(m, s, g, ()) for s, g in zip(starts, goals, strict=True)]
    if any(p is None for p in alone):
        return Lookahead((), None, 0)
    lines = [f"P{i} {_cells(p)}" for i, p in enumerate(alone)]
    found = first_conflict(alone)
    if found is None:
        return Lookahead((*lines, "meet none"), [path_actions(p) for p in alone], 1)
    lines.append(_conflict_line(found))
    best = None
    for agent, first in ((1, 0), (0, 1)):
        p = path(m, starts[agent], goals[agent], _around(alone[first], agent))
        head = f"A{agent} around P{first} = "
        if p is None:
            lines.append(head + "none")
            continue
        pair = [alone[0], p] if agent == 1 else [p, alone[1]]
        cost = sum(len(q) - 1 for q in pair)
        lines.append(head + f"{_cells(p)} cost {cost}")
        if best is None or cost < best[0]:
            best = (cost, head[:-3], pair)
    if best is None:
        return Lookahead(tuple(lines), None, 2)
    lines.append(f"plan {best[1]}")
    return Lookahead(tuple(lines), [path_actions(p) for p in best[2]], 2)


def relay_form(problem: Problem) -> Lookahead:
    """The `relay` form (`relay_checks.relay`): no block; the trace writes each agent's plan in
    turn by the move lines' rule, the first valid order of the agents. plans is None when no order
    gives a valid plan."""
    order, plans, tried = relay_checks.relay(problem)
    return Lookahead((), plans, tried, order)


def relay_where_form(problem: Problem) -> Lookahead:
    """`relay_form`, a later agent's lines also writing each earlier agent's cell at that step,
    so that its `taken` marks compare cells on the same line: `A0 (r, c)`, copied from the
    end of that agent's line for the step."""
    return dataclasses.replace(relay_form(problem), where="after")


def relay_next_form(problem: Problem) -> Lookahead:
    """`relay_where_form` with the cell written after its key: `t5 A0 (r, c)` on a step-4
    line, copied from the start of that agent's `t5` line (the same cell), where the copy
    stands next to the words just written."""
    return dataclasses.replace(relay_form(problem), where="next")


def relay_retry_form(problem: Problem) -> Lookahead:
    """`relay_form` that always starts in index order and, when a run fails (cornered, or a
    loop), writes that run's last line and `retry` with the next order (`relay.retry`): the
    first agent becomes a check instead of a choice. plans is None when no order is valid or
    an order fails in a way no line shows."""
    order, plans, tries, tried = relay.retry(problem)
    return Lookahead((), plans, tried, order, tries=tries)


def relay_retry_end_form(problem: Problem) -> Lookahead:
    """`relay_retry_form` that also ends where every order fails on a line: the failed
    attempts, then `no order left` (`relay.every_order_fails`; `ended`). plans is None then,
    and when an order fails in a way no line shows."""
    found = relay.retry(problem)
    order, plans, tries, tried = found
    ended = relay.every_order_fails(problem, found) is not None
    return Lookahead((), plans, tried, order, tries=tries, ended=ended)


# The look-ahead forms a trace can write (`traces.FORMS`, `trace_lengths.py`, `lookahead_check.py`).
LOOKAHEADS = {
    "search": search,
    "priority": priority,
    "relay": relay_form,
    "relay_where": relay_where_form,
    "relay_next": relay_next_form,
    "relay_retry": relay_retry_form,
    "relay_retry_end": relay_retry_end_form,
}


# Where a written look-ahead block first departs from the true one (`first_wrong`).
BLOCK_PARTS = ("paths", "conflict", "re-plan")


def first_wrong(problem: Problem, response: str, form: str) -> str | None:
    """The part of a response's look-ahead block (`form`, see LOOKAHEADS) that first differs
    from the true block: "paths" (the first P lines, each agent alone), "conflict" (the line
    after them), "re-plan" (anything later), "missing" (no block line written); None when the
    block is right. A ValueError when the form finds no plan for `problem` or writes no block
    (`relay`: `layouts.check_any` says where its lines go wrong)."""
    if form.startswith("relay"):
        raise ValueError("the relay form writes no look-ahead block; layouts.check_any reads it")
    want = LOOKAHEADS[form](problem)
    if want.plans is None:
        raise ValueError(f"problem {problem.id!r}: the {form} look-ahead finds no plan")
    body = thinking_text(response) or ""
    got = [x.strip() for x in body.splitlines() if LOOKAHEAD_LINE.match(x.strip())]
    if not got:
        return "missing"
    n = problem.num_agents
    for part, (a, b) in (
        ("paths", (0, n)),
        ("conflict", (n, n + 1)),
        ("re-plan", (n + 1, max(len(got), len(want.lines)))),
    ):
        if got[a:b] != list(want.lines[a:b]):
            return part
    return None
