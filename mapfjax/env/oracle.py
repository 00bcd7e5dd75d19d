"""Exact sum-of-costs oracle for MAPF-FrozenLake on the host: Conflict-Based Search, backed by
a joint-state A* on crowded maps. Labels instances (SOC, makespan, `needs_wait`), gives plans.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import heapq
import itertools
import multiprocessing
import os
import time
from bisect import bisect_right
from collections.abc import Sequence

from mapfjax.env.joint import (
    INF,
    OPTIMAL,
    TIMEOUT,
    UNSOLVABLE,
    GridMap,
    JointSearch,
    pair_unsolvable,
)
from mapfjax.env.types import ACTION_DELTAS, WAIT, Problem, check_problem, needs_wait

# (d_row, d_col) -> action code, for turning cell paths back into actions.
_DELTA_TO_ACTION = {(int(dr), int(dc)): a for a, (dr, dc) in enumerate(ACTION_DELTAS)}
# CBS nodes popped before the joint-state search and the pair check join in (both are counted
# in expansions, not seconds, so results are deterministic), the joint-state expansions granted
# per CBS node (a joint expansion is ~50x cheaper than a CBS node, so each gets about half the
# time; on crowded small maps either can win by orders of magnitude). The pair check's budget
# is joint.PAIR_BUDGET.
_JOINT_AFTER = 64
_JOINT_RATE = 50


@dataclasses.dataclass(frozen=True)
class Solution:
    """Result of `solve`.

    status:   "optimal", "timeout" (a budget ran out) or "unsolvable" (proved).
    soc:      optimal sum-of-costs; makespan: max cost of the returned plan (None unless optimal).
    actions:  per agent, action codes trimmed to that agent's cost (its arrival for good).
    paths:    per agent, (row, col) at time steps 0..cost.
    nodes:    high-level CBS nodes popped from the open list (the root counts).
    seconds:  wall-clock time of the solve.
    method:   what decided the result: "cbs", "joint" (joint-state A*), "pairs" (a pair of
              agents proved unsolvable) or "bfs" (a goal is unreachable).
    """

    status: str
    soc: int | None = None
    makespan: int | None = None
    actions: tuple[tuple[int, ...], ...] | None = None
    paths: tuple[tuple[tuple[int, int], ...], ...] | None = None
    nodes: int = 0
    seconds: float = 0.0
    method: str = "cbs"

    @property
    def optimal(self) -> bool:
        return self.status == OPTIMAL


def shortest_path_lengths(problem: Problem) -> list[int]:
    """Per-agent BFS shortest-path length, ignoring the other agents.

    Raises ValueError naming the agent when its goal is unreachable from its start.
    """
    check_problem(problem)
    m = GridMap(problem.grid)
    out = []
    for i, (s, g) in enumerate(zip(problem.starts, problem.goals)):
        d = m.dist(m.cell(g))[m.cell(s)]
        if d >= INF:
            raise ValueError(
                f"problem {problem.id!r}: agent {i}'s goal {tuple(g)} is unreachable from its "
                f"start {tuple(s)} (holes or the map edge cut them apart)"
            )
        out.append(d)
    return out


@dataclasses.dataclass(frozen=True)
class _Cons:
    """One agent's CBS constraints.

    vertex: keys t * n + cell (may not be at cell at time t).
    edge:   keys (t * n + u) * n + v (may not move u -> v arriving at time t).
    goal_last: the agent may settle on its goal only after this time (-1: any time); raised by
               a vertex constraint on its goal or by target reasoning. tmax: latest time of any
               constraint (-1 if none).
    max_cost:  the agent must settle on its goal by this time (target reasoning).
    blocked:   cell -> t: another agent has settled there by t, so the cell is off limits from
               t on (target reasoning; t counts in tmax). Never mutated; updates copy it.
    """

    vertex: frozenset = frozenset()
    edge: frozenset = frozenset()
    goal_last: int = -1
    tmax: int = -1
    max_cost: int = INF
    blocked: dict = dataclasses.field(default_factory=dict)


def _other_paths_table(n: int, paths, agent: int, goal: int):
    """Conflict-avoidance table of the other agents' paths, for tie-breaking only.

    Returns (occupied: key -> count for t < cost, swaps: reversed move keys, sit: cell -> time
    the other agent sits there for good, times: sorted times others stand on `goal`).
    """
    occ: dict[int, int] = {}
    swaps = set()
    sit = {}
    times = []
    for k, p in enumerate(paths):
        if k == agent or p is None:
            continue
        last = len(p) - 1
        sit[p[last]] = last
        for t in range(last):
            key = t * n + p[t]
            occ[key] = occ.get(key, 0) + 1
            if p[t] == goal:
                times.append(t)
            if t and p[t] != p[t - 1]:
                swaps.add((key) * n + p[t - 1])
        if last and p[last] != p[last - 1]:
            swaps.add((last * n + p[last]) * n + p[last - 1])
    times.sort()
    return occ, swaps, sit, times


def _low_level(m: GridMap, start: int, goal: int, cons: _Cons, table) -> tuple[int, ...] | None:
    """Space-time A* for one agent: an optimal path honouring `cons`, or None if none exists.

    Heuristic max(BFS distance, goal_last + 1 - t) is consistent. Ties go to fewer conflicts
    with `table` (other agents' paths), then to later times. Termination bound: after `tmax`
    the constraints no longer change, so an optimal path costs at most tmax + 1 + (largest BFS
    distance to the goal), or tmax + (free cells) when blocked cells lengthen paths; states
    whose f exceeds that (or `max_cost`) are pruned and the search space is finite.
    """
    n, nbrs = m.n, m.nbrs
    dist = m.dist(goal)
    vset, eset, blocked = cons.vertex, cons.edge, cons.blocked
    floor = cons.goal_last + 1
    horizon = max(cons.tmax, 0) + (m.free if blocked else 1 + dist[n])
    horizon = min(horizon, cons.max_cost)
    occ, swaps, sit, times = table
    f0 = max(dist[start], floor)
    if f0 > horizon:
        return None
    heap = [(f0, 0, 0, start)]  # (f, conflicts, -t, key = t * n + cell)
    best = {start: 0}
    parent = {start: -1}
    closed = set()
    push, pop = heapq.heappush, heapq.heappop
    while heap:
        f, conf, negt, key = pop(heap)
        if key < 0:  # a terminal entry re-queued with its staying-at-goal conflicts
            return _trace(parent, -1 - key, n)
        if key in closed:
            continue
        closed.add(key)
        t = -negt
        u = key - t * n
        if u == goal and t >= floor:
            extra = len(times) - bisect_right(times, t)
            if not extra:
                return _trace(parent, key, n)
            push(heap, (f, conf + extra, negt, -1 - key))
        nt = t + 1
        base = nt * n
        for v in nbrs[u]:
            nk = base + v
            if nk in closed or nk in vset:
                continue
            mk = (base + u) * n + v
            if eset and mk in eset:
                continue
            if blocked and nt >= blocked.get(v, INF):
                continue
            fv = nt + dist[v]
            if fv < floor:
                fv = floor
            if fv > horizon:
                continue
            c = conf + occ.get(nk, 0)
            if v != u and mk in swaps:
                c += 1
            s = sit.get(v)
            if s is not None and nt >= s:
                c += 1
            if c < best.get(nk, INF):
                best[nk] = c
                parent[nk] = key
                push(heap, (fv, c, -nt, nk))
    return None


def _trace(parent: dict, key: int, n: int) -> tuple[int, ...]:
    out = []
    while key >= 0:
        out.append(key % n)
        key = parent[key]
    return tuple(reversed(out))


def _mdd_widths(m: GridMap, start: int, goal: int, cons: _Cons, cost: int) -> list[int]:
    """Number of distinct cells at each time 0..cost over all optimal constrained paths."""
    n, nbrs, dist = m.n, m.nbrs, m.dist(goal)
    vset, eset, blocked = cons.vertex, cons.edge, cons.blocked
    layers = [{start}]
    for t in range(1, cost + 1):
        base = t * n
        layers.append(
            {
                v
                for u in layers[-1]
                for v in nbrs[u]
                if t + dist[v] <= cost
                and base + v not in vset
                and (base + u) * n + v not in eset
                and t < blocked.get(v, INF)
            }
        )
    alive = {goal}
    widths = [1] * (cost + 1)
    for t in range(cost, 0, -1):
        base = t * n
        alive = {
            u
            for u in layers[t - 1]
            if any(v in alive and (base + u) * n + v not in eset for v in nbrs[u])
        }
        widths[t - 1] = len(alive)
    return widths


def _conflicts(paths) -> list[tuple]:
    """All conflicts as (t, i, j, kind, a, b): kind 0 vertex at cell a; kind 1 edge, agent i
    moving a -> b while agent j moves b -> a, arriving at time t."""
    out = []
    for i in range(len(paths)):
        p = paths[i]
        lp = len(p)
        for j in range(i + 1, len(paths)):
            q = paths[j]
            lq = len(q)
            pa, qb = p[0], q[0]
            for t in range(1, max(lp, lq)):
                a = p[t] if t < lp else p[-1]
                b = q[t] if t < lq else q[-1]
                if a == b:
                    out.append((t, i, j, 0, a, a))
                elif a == qb and b == pa:
                    out.append((t, i, j, 1, pa, a))
                pa, qb = a, b
    return out


class _Node:
    __slots__ = ("cost", "paths", "cons", "conflicts", "choice")

    def __init__(self, paths, cons):
        self.paths = paths
        self.cons = cons
        self.cost = sum(len(p) - 1 for p in paths)
        self.conflicts = _conflicts(paths)
        self.choice = None  # (conflict to split on, CG heuristic), filled when first popped

    def cost_of(self, agent: int) -> int:
        return len(self.paths[agent]) - 1


def _constrain(cons: _Cons, n: int, goal: int, conflict, side: int) -> _Cons:
    """Constraint forbidding agent `side` (0: i, 1: j) its part of `conflict`."""
    t, _, _, kind, a, b = conflict
    if kind == 0:
        g = max(cons.goal_last, t) if a == goal else cons.goal_last
        return dataclasses.replace(
            cons, vertex=cons.vertex | {t * n + a}, goal_last=g, tmax=max(cons.tmax, t)
        )
    u, v = (a, b) if side == 0 else (b, a)
    e = cons.edge | {(t * n + u) * n + v}
    return dataclasses.replace(cons, edge=e, tmax=max(cons.tmax, t))


class _Search:
    """Per-problem CBS helpers: low-level planning, target reasoning, MDD cache, classification."""

    def __init__(self, m: GridMap, starts, goals):
        self.m, self.starts, self.goals = m, starts, goals
        self._mdd: dict = {}

    def plan(self, agent: int, cons: _Cons, paths) -> tuple[int, ...] | None:
        goal = self.goals[agent]
        table = _other_paths_table(self.m.n, paths, agent, goal)
        return _low_level(self.m, self.starts[agent], goal, cons, table)

    def settle(self, node: _Node, agent: int, t: int) -> _Node | None:
        """Target reasoning (Li et al. 2020): the branch where `agent` has settled on its goal
        by time t; the other branch (it settles after t) is the usual vertex constraint. So
        nobody else may stand on that goal from t on; replan whoever does."""
        goal, paths, cons = self.goals[agent], list(node.paths), list(node.cons)
        cons[agent] = dataclasses.replace(cons[agent], max_cost=min(cons[agent].max_cost, t))
        for a in range(len(paths)):
            if a == agent:
                continue
            c = cons[a]
            if t < c.blocked.get(goal, INF):
                blocked = {**c.blocked, goal: t}
                c = cons[a] = dataclasses.replace(c, blocked=blocked, tmax=max(c.tmax, t))
            if goal in paths[a][t:]:
                paths[a] = self.plan(a, c, paths)
                if paths[a] is None:
                    return None
        return _Node(tuple(paths), tuple(cons))

    def widths(self, agent: int, cons: _Cons, cost: int) -> list[int]:
        key = (agent, id(cons), cost)
        hit = self._mdd.get(key)
        if hit is None:
            w = _mdd_widths(self.m, self.starts[agent], self.goals[agent], cons, cost)
            hit = self._mdd[key] = (cons, w)  # keep `cons` alive so its id stays unique
        return hit[1]

    def classify(self, node: _Node) -> tuple[tuple, int]:
        """The conflict to split on (cardinal > semi-cardinal > non-cardinal, earliest first)
        and the CG heuristic (Felner et al. 2018): a minimum vertex cover of the graph of agent
        pairs with a cardinal conflict, since each such pair must raise one agent's cost."""
        best, best_rank, cardinal = None, 3, set()
        for cf in sorted(node.conflicts):
            t, i, j, kind = cf[:4]
            if (i, j) in cardinal:
                continue
            rank = 2
            for agent in (i, j):
                cost = node.cost_of(agent)
                if t > cost:  # sitting on its goal: forbidding that raises its cost
                    rank -= 1
                    continue
                w = self.widths(agent, node.cons[agent], cost)
                if w[t] == 1 and (kind == 0 or w[t - 1] == 1):
                    rank -= 1
            if rank == 0:
                cardinal.add((i, j))
            if rank < best_rank:
                best, best_rank = cf, rank
        return best, _min_cover(cardinal, len(node.paths))


def _min_cover(edges: set, k: int) -> int:
    """Size of a minimum vertex cover of a graph on k <= ~8 agents (brute force)."""
    for size in range(k + 1):
        for cover in itertools.combinations(range(k), size):
            if all(i in cover or j in cover for i, j in edges):
                return size
    return k


def solve(problem: Problem, max_nodes: int = 20_000, time_limit: float = 10.0) -> Solution:
    """Sum-of-costs optimal plan by Conflict-Based Search (deterministic).

    CBS runs first, with exact refinements: cardinal conflicts first, the CG heuristic,
    target reasoning, bypass, conflict-avoidance tie-breaking. CBS never stops on an unsolvable
    instance and is slow on crowded small maps, so once it has popped `_JOINT_AFTER` nodes,
    pairs of agents are checked for unsolvability and an exact joint-state A* (`JointSearch`) is
    interleaved with it, `_JOINT_RATE` expansions per CBS node; whichever finishes first
    decides. "unsolvable": a goal is unreachable, or the CBS tree, the joint state space or a
    pair's is exhausted; "timeout": `max_nodes` CBS nodes or `time_limit` seconds ran out.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    check_problem(problem)
    m = GridMap(problem.grid)
    starts = tuple(m.cell(s) for s in problem.starts)
    goals = tuple(m.cell(g) for g in problem.goals)
    done = functools.partial(_finish, m, t0)
    if any(m.dist(g)[s] >= INF for s, g in zip(starts, goals)):
        return done(UNSOLVABLE, None, 0, "bfs")
    search = _Search(m, starts, goals)
    cons = tuple(_Cons() for _ in starts)
    paths: list = [None] * len(starts)
    for a in range(len(starts)):
        paths[a] = search.plan(a, cons[a], paths)
    root = _Node(tuple(paths), cons)
    heap = [(root.cost, len(root.conflicts), 0, root)]  # (lower bound, conflicts, -seq, node)
    seq, nodes, checkpoint, joint = 0, 0, _JOINT_AFTER, None
    while heap:
        if nodes >= max_nodes or time.perf_counter() > deadline:
            return done(TIMEOUT, None, nodes, "cbs")
        if nodes >= checkpoint:
            if joint is None:
                if pair_unsolvable(m, starts, goals, deadline):
                    return done(UNSOLVABLE, None, nodes, "pairs")
                joint = JointSearch(m, starts, goals)
            r = joint.run(_JOINT_RATE * nodes - joint.expanded, deadline)
            if r is not None:
                return done(*r, nodes, "joint")
            checkpoint *= 2
        bound, _, _, node = heapq.heappop(heap)
        if node.conflicts and node.choice is None:
            node.choice = search.classify(node)
            if node.cost + node.choice[1] > bound:  # better bound: requeue behind cheaper nodes
                seq += 1
                heapq.heappush(heap, (node.cost + node.choice[1], len(node.conflicts), -seq, node))
                continue
        nodes += 1
        if not node.conflicts:
            return done(OPTIMAL, node.paths, nodes, "cbs")
        cf = node.choice[0]
        t, i, j, kind, cell = cf[:5]
        # A target conflict: someone stands on the goal of an agent that settled there by t.
        settled = [x for x in (i, j) if kind == 0 and cell == goals[x] and t >= node.cost_of(x)]
        children = [search.settle(node, settled[0], t)] if settled else []
        for side, agent in enumerate(cf[1:3]):
            c = node.cons[agent]
            if settled and agent != settled[0]:
                continue  # its branch is "settled by t", made above
            if settled:  # the complement: it settles after t (it may still pass at t)
                c = dataclasses.replace(c, goal_last=max(c.goal_last, t), tmax=max(c.tmax, t))
            else:
                c = _constrain(c, m.n, goals[agent], cf, side)
            p = search.plan(agent, c, node.paths)
            if p is not None:
                paths = node.paths[:agent] + (p,) + node.paths[agent + 1 :]
                children.append(_Node(paths, node.cons[:agent] + (c,) + node.cons[agent + 1 :]))
        children = [ch for ch in children if ch is not None]
        for ch in children:  # bypass: same cost, fewer conflicts -> adopt the path, no split
            if ch.cost == node.cost and len(ch.conflicts) < len(node.conflicts):
                children = [_Node(ch.paths, node.cons)]
                break
        for ch in children:  # a child's bound is at least its parent's
            seq += 1
            heapq.heappush(heap, (max(bound, ch.cost), len(ch.conflicts), -seq, ch))
    return done(UNSOLVABLE, None, nodes, "cbs")


def path_actions(path) -> list[int]:
    """The action codes that walk `path` (cells (r, c) at t = 0, 1, ...; a repeated cell is a
    WAIT)."""
    return [_DELTA_TO_ACTION[(b[0] - a[0], b[1] - a[1])] for a, b in zip(path, path[1:])]


def _finish(m: GridMap, t0: float, status: str, cell_paths, nodes: int, method: str) -> Solution:
    if cell_paths is None:
        return Solution(status, nodes=nodes, seconds=time.perf_counter() - t0, method=method)
    paths = tuple(tuple(m.rc(u) for u in p) for p in cell_paths)
    actions = tuple(tuple(path_actions(p)) for p in paths)
    costs = [len(p) - 1 for p in paths]
    return Solution(
        status,
        soc=sum(costs),
        makespan=max(costs),
        actions=actions,
        paths=paths,
        nodes=nodes,
        seconds=time.perf_counter() - t0,
        method=method,
    )


_POOL: dict = {}  # processes -> the live worker pool, reused across calls


def _host_only() -> None:
    """A worker's initializer: its JAX stays on the CPU. The search is plain Python, but a
    worker that meets a JAX array (unpickling a problem) would otherwise start its own
    accelerator client, and on a GPU each claims a share of the memory the parent holds: they
    run out of memory and fail."""
    import jax

    jax.config.update("jax_platforms", "cpu")


def _pool(processes: int):
    """A spawned worker pool kept for later calls: starting one costs seconds, because each
    worker imports JAX through the package. Spawned, never forked: the parent may already
    run JAX's threads, which do not survive a fork. Its workers compute on the host
    (`_host_only`)."""
    pool = _POOL.get(processes)
    if pool is None:
        _drop_pools()
        ctx = multiprocessing.get_context("spawn")
        pool = _POOL[processes] = ctx.Pool(processes, initializer=_host_only)
        atexit.register(_drop_pools)  # before interpreter teardown, which breaks Pool.__del__
    return pool


def _drop_pools() -> None:
    for pool in _POOL.values():
        pool.terminate()
    _POOL.clear()
    atexit.unregister(_drop_pools)


def solve_many(
    problems: Sequence[Problem],
    max_nodes: int = 20_000,
    time_limit: float = 10.0,
    processes: int | None = None,
    progress: bool = False,
) -> list[Solution]:
    """`solve` over many problems, results in order; a process pool unless processes == 1.

    processes=None uses os.cpu_count(). The pool outlives the call (see `_pool`); scripts that
    call this need the usual `if __name__ == "__main__":` guard of spawned multiprocessing.
    """
    problems = list(problems)
    if processes is None:
        processes = os.cpu_count() or 1
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"solve_many: processes={processes!r}; allowed: None or an int >= 1")
    work = functools.partial(solve, max_nodes=max_nodes, time_limit=time_limit)
    if processes == 1 or len(problems) <= 1:
        results = map(work, problems)
    else:
        # Solve times range over four orders of magnitude: small chunks keep workers busy.
        chunk = max(1, min(16, len(problems) // (processes * 16)))
        results = _pool(processes).imap(work, problems, chunksize=chunk)
    if progress:
        from tqdm.auto import tqdm

        results = tqdm(results, total=len(problems), desc="oracle", unit="inst")
    try:
        return list(results)
    except BaseException:  # e.g. KeyboardInterrupt: drop the queued work with the pool
        _drop_pools()
        raise


def label(problem: Problem, **budget) -> tuple[Problem, Solution]:
    """Solve and attach `optimal_soc`, `optimal_makespan` and `needs_wait` to the problem.

    `budget` is passed to `solve` (max_nodes, time_limit). When the status is not "optimal"
    the problem is returned unchanged, so callers can drop it.
    """
    sol = solve(problem, **budget)
    if not sol.optimal:
        return problem, sol
    nw = needs_wait(sol.soc, shortest_path_lengths(problem))
    return problem.with_labels(sol.soc, sol.makespan, nw), sol


def answer_actions(solution: Solution, pad_to: int | None = None) -> list[list[int]]:
    """Per-agent action codes of an optimal solution, padded with WAIT to `pad_to` steps.

    pad_to=None leaves every list at its agent's cost; an int pads all lists to that length
    (it must be at least the makespan).
    """
    if solution.actions is None:
        raise ValueError(
            f"answer_actions: solution status is {solution.status!r}; only an 'optimal' "
            "solution carries actions"
        )
    if pad_to is not None and pad_to < (solution.makespan or 0):
        raise ValueError(
            f"answer_actions: pad_to={pad_to} is shorter than the makespan {solution.makespan}"
        )
    out = [list(a) for a in solution.actions]
    if pad_to is not None:
        out = [a + [WAIT] * (pad_to - len(a)) for a in out]
    return out
