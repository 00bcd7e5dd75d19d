"""Plain-Python reference simulator of a whole plan: the independent check of the jitted `verify`.

Deliberately written with loops and sets over host `Problem`s, sharing no code with
dynamics.py; the test suite and benchmarks/bench_env.py compare the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pure Python at run time: the scorer (score.py) loads this without JAX
    from mapfjax.env.types import Problem

_MOVES = {0: (0, 0), 1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


def simulate(problem: Problem, plan: Sequence[Sequence[int]] | None) -> dict:
    """Simulate per-agent action lists; None means the answer did not parse.

    problem: a `Problem`, or any record with its `grid`, `starts` and `goals` (score.py's
    `Puzzle`).

    Returns {"valid", "failure", "failure_time", "failure_agent", "failure_agents",
    "failure_cells", "failure_positions", "soc", "makespan", "positions"}: positions[t] lists
    every agent's cell at time t up to the last legal step; failure_agent is the lowest agent
    involved in the first failure and failure_agents all of them, with their cells in
    failure_cells (where they tried to go; an agent making an illegal move stays put).
    failure_positions lists every agent's cell at the failing step in the same way (what a
    picture of the failure shows), None unless the failure happens within a step. Precedence
    within a step: illegal_move, hole, vertex_conflict, edge_conflict; after the last step,
    goal_not_reached.
    """
    if plan is None:
        return _result("parse_error", -1, (), [])
    n = len(problem.starts)
    height = len(problem.grid)
    width = len(problem.grid[0]) if problem.grid else 0
    plan = [list(plan[i]) if i < len(plan) else [] for i in range(n)]
    horizon = max((len(p) for p in plan), default=0)
    pos = [tuple(s) for s in problem.starts]
    goals = [tuple(g) for g in problem.goals]
    history = [list(pos)]
    for t in range(1, horizon + 1):
        new = []
        for i in range(n):
            a = plan[i][t - 1] if t - 1 < len(plan[i]) else 0
            move = _MOVES.get(a)
            new.append(None if move is None else (pos[i][0] + move[0], pos[i][1] + move[1]))
        illegal = []
        for i in range(n):
            cell = new[i]
            if cell is None or not (0 <= cell[0] < height and 0 <= cell[1] < width):
                illegal.append(i)
        if illegal:
            stay = [pos[i] if i in illegal else new[i] for i in range(n)]
            return _result("illegal_move", t, illegal, history, stay)
        holes = [i for i in range(n) if problem.grid[new[i][0]][new[i][1]] == "H"]
        vertex = [i for i in range(n) if sum(new[j] == new[i] for j in range(n)) > 1]
        edge = set()
        for i in range(n):
            for j in range(i + 1, n):
                if new[i] != pos[i] and new[i] == pos[j] and new[j] == pos[i]:
                    edge.update((i, j))
        for kind, agents in (("hole", holes), ("vertex_conflict", vertex), ("edge_conflict", edge)):
            if agents:
                return _result(kind, t, sorted(agents), history, new)
        pos = new
        history.append(list(pos))
    late = [i for i in range(n) if pos[i] != goals[i]]
    if late:
        return _result("goal_not_reached", horizon, late, history, pos)
    costs = []
    for i in range(n):
        cost = 0
        for t, cells in enumerate(history):
            if cells[i] != goals[i]:
                cost = t + 1
        costs.append(cost)
    return _result(None, -1, (), history, costs=costs)


def _result(failure, time, agents, history, every=(), costs=None):
    """The result dict. every: each agent's cell at the failure (where it tried to go in a
    failing step, where it stands after the last step for goal_not_reached)."""
    in_step = failure not in (None, "parse_error", "goal_not_reached")
    return {
        "valid": failure is None,
        "failure": failure,
        "failure_time": time,
        "failure_agent": agents[0] if agents else -1,
        "failure_agents": tuple(agents),
        "failure_cells": tuple(tuple(every[i]) for i in agents),
        "failure_positions": [tuple(c) for c in every] if in_step else None,
        "soc": sum(costs) if costs is not None else None,
        "makespan": max(costs, default=0) if costs is not None else None,
        "positions": history,
    }
