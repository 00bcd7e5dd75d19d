"""Plain-Python reference simulator of a whole plan: the independent check of the jitted `verify`.

Deliberately written with loops and sets over host `Problem`s, sharing no code with
dynamics.py; the test suite and benchmarks/bench_env.py compare the two.
"""

from __future__ import annotations

from collections.abc import Sequence

from mapfjax.env.types import Problem

_MOVES = {0: (0, 0), 1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


def simulate(problem: Problem, plan: Sequence[Sequence[int]] | None) -> dict:
    """Simulate per-agent action lists; None means the answer did not parse.

    Returns {"valid", "failure", "failure_time", "failure_agent", "soc", "makespan",
    "positions"} where positions[t] lists every agent's cell at time t (up to the failure).
    """
    if plan is None:
        return _result("parse_error", -1, -1, None, [])
    n = problem.num_agents
    plan = [list(plan[i]) if i < len(plan) else [] for i in range(n)]
    horizon = max((len(p) for p in plan), default=0)
    pos = [tuple(s) for s in problem.starts]
    goals = [tuple(g) for g in problem.goals]
    history = [list(pos)]
    for t in range(1, horizon + 1):
        new = []
        for i in range(n):
            a = plan[i][t - 1] if t - 1 < len(plan[i]) else 0
            dr, dc = _MOVES.get(a, (None, None)) if a in _MOVES else (None, None)
            if dr is None:
                new.append(None)
            else:
                new.append((pos[i][0] + dr, pos[i][1] + dc))
        for i in range(n):
            cell = new[i]
            if cell is None or not (0 <= cell[0] < problem.height and 0 <= cell[1] < problem.width):
                return _result("illegal_move", t, i, None, history)
        for i in range(n):
            r, c = new[i]
            if problem.grid[r][c] == "H":
                return _result("hole", t, i, None, history)
        for i in range(n):
            for j in range(i + 1, n):
                if new[i] == new[j]:
                    return _result("vertex_conflict", t, i, None, history)
        for i in range(n):
            for j in range(n):
                if i != j and new[i] != pos[i] and new[i] == pos[j] and new[j] == pos[i]:
                    return _result("edge_conflict", t, min(i, j), None, history)
        pos = new
        history.append(list(pos))
    for i in range(n):
        if pos[i] != goals[i]:
            return _result("goal_not_reached", horizon, i, None, history)
    costs = []
    for i in range(n):
        cost = 0
        for t, cells in enumerate(history):
            if cells[i] != goals[i]:
                cost = t + 1
        costs.append(cost)
    return _result(None, -1, -1, costs, history)


def _result(failure, time, agent, costs, history):
    return {
        "valid": failure is None,
        "failure": failure,
        "failure_time": time,
        "failure_agent": agent,
        "soc": sum(costs) if costs is not None else None,
        "makespan": max(costs, default=0) if costs is not None else None,
        "positions": history,
    }
