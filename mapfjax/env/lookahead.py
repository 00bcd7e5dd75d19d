"""A look-ahead block for the reasoning trace: the search that finds the plan, written as text
lines a policy can imitate step by step (conflict-based search, best first on the sum of
costs), so the waits and detours that no move line decides (`env.locality`) follow from lines
the trace has already written.

    P0 (0, 0) (0, 1) (0, 2)                each agent's path: its cell at t = 0, 1, ...
    P1 (1, 1) (0, 1)
    meet A0 A1 t1 (0, 1)                   the first conflict (`swap ...` for an edge one)
    n1 A0 not (0, 1) t1 = (0, 0) (0, 0) (0, 1) (0, 2) cost 4
    n2 A1 not (0, 1) t1 = (1, 1) (1, 1) (0, 1) cost 4
    open n1                                the cheapest node not yet opened
    P0 (0, 0) (0, 0) (0, 1) (0, 2)
    P1 (1, 1) (0, 1)
    meet A0 A1 t2 (0, 1)                   A1 stays on its goal, where A0 now arrives
    n3 A0 not (0, 1) t1, not (0, 1) t2 = (0, 0) (0, 0) (0, 0) (0, 1) (0, 2) cost 5
    n4 A1 not (0, 1) t2 = (1, 1) (0, 1) (1, 1) (0, 1) cost 6
    open n2
    P0 (0, 0) (0, 1) (0, 2)
    P1 (1, 1) (1, 1) (0, 1)
    meet none                              its paths are the plan

A node line lists every constraint of the agent it re-plans (its ancestors' too) and the path
that agent now takes, or `none`; `open` picks the least cost, the first written among equals.
A path is the first shortest one in the move lines' order (UP, DOWN, LEFT, RIGHT, then WAIT)
under the agent's constraints: with none, each step is the first move one step closer to the
goal; with some, the agent waits as late as it can.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from mapfjax.env.joint import INF, GridMap
from mapfjax.env.trace import cell
from mapfjax.env.types import ACTION_DELTAS, Problem

ORDER = (1, 2, 3, 4, 0)  # UP, DOWN, LEFT, RIGHT, WAIT: moves first, in the move lines' order
MAX_OPEN = 16  # nodes a look-ahead may open before it gives up (its text grows with each)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """Agent `agent` may not be at `cells[-1]` at time `t` (one cell: a vertex constraint) or
    move from `cells[0]` to `cells[1]` arriving at `t` (two cells: an edge constraint)."""

    agent: int
    t: int
    cells: tuple[tuple[int, int], ...]

    def text(self) -> str:
        return "not " + " ".join(cell(c) for c in self.cells) + f" t{self.t}"


@dataclasses.dataclass(frozen=True)
class Lookahead:
    """The block's `lines` and the plan its last opened node holds (`plans`: per-agent action
    codes, each list at its agent's cost), `opened` nodes; plans is None when the search gave
    up after MAX_OPEN nodes or found no plan."""

    lines: tuple[str, ...]
    plans: list[list[int]] | None
    opened: int


def path(m: GridMap, start, goal, cons: Sequence[Constraint], limit: int = 256):
    """The first shortest path (cells at t = 0..T, T the last arrival at `goal`) that keeps
    `cons` (one agent's constraints), trying actions in ORDER; None within `limit` steps."""
    start, goal = tuple(start), tuple(goal)
    vertex = {(c.t, c.cells[0]) for c in cons if len(c.cells) == 1}
    edge = {(c.t, *c.cells) for c in cons if len(c.cells) == 2}
    last_goal = max((t for t, q in vertex if q == goal), default=-1)
    d = m.dist(m.cell(goal))[m.cell(start)]
    if d >= INF:
        return None
    for arrive in range(max(d, last_goal + 1), limit + 1):
        # can[t]: cells from which the goal is reached exactly at `arrive`, keeping cons
        can = [set() for _ in range(arrive + 1)]
        can[arrive] = {goal} if (arrive, goal) not in vertex else set()
        for t in range(arrive - 1, -1, -1):
            for q in can[t + 1]:
                for u in m.nbrs[m.cell(q)]:  # q itself (a wait) and its free neighbours
                    rc = m.rc(u)
                    if (t + 1, rc, q) not in edge and (t, rc) not in vertex:
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


def first_conflict(paths) -> tuple[str, int, int, int, tuple] | None:
    """(kind "meet"/"swap", t, i, j, cells) of the earliest conflict (then the lowest pair, a
    meeting before a swap), agents staying on their goals after their paths end; or None."""
    horizon = max(len(p) for p in paths)
    for t in range(1, horizon):
        for i, j in itertools.combinations(range(len(paths)), 2):
            if _at(paths[i], t) == _at(paths[j], t):
                return "meet", t, i, j, (_at(paths[i], t),)
        for i, j in itertools.combinations(range(len(paths)), 2):
            a0, a1, b0, b1 = (
                _at(paths[i], t - 1),
                _at(paths[i], t),
                _at(paths[j], t - 1),
                _at(paths[j], t),
            )
            if a0 != a1 and a1 == b0 and b1 == a0:
                return "swap", t, i, j, (a0, a1)
    return None


def _cells(p) -> str:
    return " ".join(cell(c) for c in p)


def _actions(p) -> list[int]:
    deltas = [tuple(x) for x in ACTION_DELTAS.tolist()]
    return [deltas.index((b[0] - a[0], b[1] - a[1])) for a, b in zip(p, p[1:], strict=False)]


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
            return Lookahead(tuple(lines), [_actions(p) for p in paths], opened)
        kind, t, i, j, where = found
        lines.append(f"{kind} A{i} A{j} t{t} {_cells(where)}")
        for agent in (i, j):
            if kind == "meet":
                new = Constraint(agent, t, where)
            else:
                new = Constraint(agent, t, where if agent == i else where[::-1])
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
