"""Exact sum-of-costs oracle for MAPF-FrozenLake: Conflict-Based Search on the host.

Used to label instances (optimal SOC, makespan, `needs_wait`) and to produce reference plans.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import multiprocessing
import os
import time
from bisect import bisect_right
from collections.abc import Sequence

from mapfjax.env.types import ACTION_DELTAS, WAIT, Problem, check_problem, needs_wait

OPTIMAL, TIMEOUT, UNSOLVABLE = "optimal", "timeout", "unsolvable"
_INF = 1 << 30
# (d_row, d_col) -> action code, for turning cell paths back into actions.
_DELTA_TO_ACTION = {(int(dr), int(dc)): a for a, (dr, dc) in enumerate(ACTION_DELTAS)}
# High-level nodes popped before we try to prove unsolvability (CBS alone never stops on an
# unsolvable instance: its tree grows forever). Counted in nodes, so results are deterministic.
_PROOF_AFTER = 64
# Joint-state caps of the unsolvability proof: all pairs of agents, then each whole group.
_PAIR_CAP = 60_000
_GROUP_CAP = 20_000


@dataclasses.dataclass(frozen=True)
class Solution:
    """Result of `solve`.

    status:   "optimal", "timeout" (a budget ran out) or "unsolvable" (proved).
    soc:      optimal sum-of-costs; makespan: max cost of the returned plan (None unless optimal).
    actions:  per agent, action codes trimmed to that agent's cost (its arrival for good).
    paths:    per agent, (row, col) at time steps 0..cost.
    nodes:    high-level CBS nodes popped from the open list (the root counts).
    seconds:  wall-clock time of the solve.
    """

    status: str
    soc: int | None = None
    makespan: int | None = None
    actions: tuple[tuple[int, ...], ...] | None = None
    paths: tuple[tuple[tuple[int, int], ...], ...] | None = None
    nodes: int = 0
    seconds: float = 0.0

    @property
    def optimal(self) -> bool:
        return self.status == OPTIMAL


class _Map:
    """Cells as ints r * W + c; `nbrs[u]` lists u itself (WAIT) then its free 4-neighbours."""

    def __init__(self, grid: Sequence[str]):
        self.h, self.w = len(grid), len(grid[0])
        self.n = self.h * self.w
        free = [ch != "H" for row in grid for ch in row]
        nbrs = []
        for u in range(self.n):
            r, c = divmod(u, self.w)
            out = [u] if free[u] else []
            for dr, dc in ACTION_DELTAS[1:].tolist():
                rr, cc = r + dr, c + dc
                if free[u] and 0 <= rr < self.h and 0 <= cc < self.w and free[rr * self.w + cc]:
                    out.append(rr * self.w + cc)
            nbrs.append(tuple(out))
        self.nbrs = tuple(nbrs)
        self._dist: dict[int, list[int]] = {}

    def cell(self, rc) -> int:
        return int(rc[0]) * self.w + int(rc[1])

    def rc(self, u: int) -> tuple[int, int]:
        return divmod(u, self.w)

    def dist(self, goal: int) -> list[int]:
        """BFS distance of every cell to `goal` (_INF when unreachable); cached per goal."""
        d = self._dist.get(goal)
        if d is None:
            d = [_INF] * self.n
            d[goal] = 0
            frontier = [goal]
            while frontier:
                nxt = []
                for u in frontier:
                    du = d[u] + 1
                    for v in self.nbrs[u]:
                        if d[v] == _INF:
                            d[v] = du
                            nxt.append(v)
                frontier = nxt
            d.append(max(x for x in d if x < _INF))  # d[n]: the largest finite distance
            self._dist[goal] = d
        return d


def shortest_path_lengths(problem: Problem) -> list[int]:
    """Per-agent BFS shortest-path length, ignoring the other agents.

    Raises ValueError naming the agent when its goal is unreachable from its start.
    """
    check_problem(problem)
    m = _Map(problem.grid)
    out = []
    for i, (s, g) in enumerate(zip(problem.starts, problem.goals)):
        d = m.dist(m.cell(g))[m.cell(s)]
        if d >= _INF:
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
    goal_last: latest t of a vertex constraint on the agent's goal (-1 if none): the agent may
               stop for good only after it. tmax: latest time of any constraint (-1 if none).
    """

    vertex: frozenset = frozenset()
    edge: frozenset = frozenset()
    goal_last: int = -1
    tmax: int = -1


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


def _low_level(m: _Map, start: int, goal: int, cons: _Cons, table) -> tuple[int, ...] | None:
    """Space-time A* for one agent: an optimal path honouring `cons`, or None if none exists.

    Heuristic max(BFS distance, goal_last + 1 - t) is consistent. Ties go to fewer conflicts
    with `table` (other agents' paths), then to later times. Termination bound: after `tmax`
    no constraint applies, so an optimal path costs at most tmax + 1 + (largest BFS distance
    to the goal); states whose f exceeds that are pruned and the search space is finite.
    """
    n, nbrs = m.n, m.nbrs
    dist = m.dist(goal)
    vset, eset = cons.vertex, cons.edge
    floor = cons.goal_last + 1
    horizon = max(cons.tmax, 0) + 1 + dist[n]
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
            if c < best.get(nk, _INF):
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


def _mdd_widths(m: _Map, start: int, goal: int, cons: _Cons, cost: int) -> list[int]:
    """Number of distinct cells at each time 0..cost over all optimal constrained paths."""
    n, nbrs, dist = m.n, m.nbrs, m.dist(goal)
    vset, eset = cons.vertex, cons.edge
    layers = [{start}]
    for t in range(1, cost + 1):
        base = t * n
        layers.append(
            {
                v
                for u in layers[-1]
                for v in nbrs[u]
                if t + dist[v] <= cost and base + v not in vset and (base + u) * n + v not in eset
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
    __slots__ = ("cost", "paths", "cons", "conflicts")

    def __init__(self, paths, cons):
        self.paths = paths
        self.cons = cons
        self.cost = sum(len(p) - 1 for p in paths)
        self.conflicts = _conflicts(paths)


def _constrain(cons: _Cons, n: int, goal: int, conflict, side: int) -> _Cons:
    """Constraint forbidding agent `side` (0: i, 1: j) its part of `conflict`."""
    t, _, _, kind, a, b = conflict
    if kind == 0:
        return _Cons(
            cons.vertex | {t * n + a},
            cons.edge,
            max(cons.goal_last, t) if a == goal else cons.goal_last,
            max(cons.tmax, t),
        )
    u, v = (a, b) if side == 0 else (b, a)
    return _Cons(cons.vertex, cons.edge | {(t * n + u) * n + v}, cons.goal_last, max(cons.tmax, t))


class _Search:
    """One CBS run (ICBS flavour: cardinal conflicts first, bypass); all state for one problem."""

    def __init__(self, m: _Map, starts, goals):
        self.m, self.starts, self.goals = m, starts, goals
        self._mdd: dict = {}

    def plan(self, agent: int, cons: _Cons, paths) -> tuple[int, ...] | None:
        goal = self.goals[agent]
        table = _other_paths_table(self.m.n, paths, agent, goal)
        return _low_level(self.m, self.starts[agent], goal, cons, table)

    def widths(self, agent: int, cons: _Cons, cost: int) -> list[int]:
        key = (agent, id(cons), cost)
        hit = self._mdd.get(key)
        if hit is None:
            w = _mdd_widths(self.m, self.starts[agent], self.goals[agent], cons, cost)
            hit = self._mdd[key] = (cons, w)  # keep `cons` alive so its id stays unique
        return hit[1]

    def choose(self, node: _Node):
        """Cardinal > semi-cardinal > non-cardinal; earliest first within a class."""
        best, best_rank = None, 3
        for cf in sorted(node.conflicts):
            t, i, j, kind = cf[:4]
            rank = 2
            for agent in (i, j):
                cost = len(node.paths[agent]) - 1
                if t > cost:  # sitting on its goal: forbidding that raises its cost
                    rank -= 1
                    continue
                w = self.widths(agent, node.cons[agent], cost)
                if w[t] == 1 and (kind == 0 or w[t - 1] == 1):
                    rank -= 1
            if rank < best_rank:
                best, best_rank = cf, rank
                if rank == 0:
                    break
        return best


def _joint_reachable(nbrs, starts: tuple, goals: tuple, cap: int, deadline: float):
    """Breadth-first reachability of `goals` from `starts` in the joint configuration graph
    (no vertex or edge conflicts). True / False, or None when `cap` states or time ran out."""
    if starts == goals:
        return True
    seen = {starts}
    frontier = [starts]
    k = len(starts)
    while frontier:
        nxt = []
        for s in frontier:
            partial = [()]
            for a in range(k):
                u = s[a]
                grown = []
                for pre in partial:
                    for v in nbrs[u]:
                        if v in pre:
                            continue
                        if v != u and any(s[b] == v and pre[b] == u for b in range(a)):
                            continue
                        grown.append((*pre, v))
                partial = grown
            for s2 in partial:
                if s2 not in seen:
                    if s2 == goals:
                        return True
                    seen.add(s2)
                    nxt.append(s2)
            if len(seen) > cap or time.perf_counter() > deadline:
                return None
        frontier = nxt
    return False


def _proved_unsolvable(m: _Map, starts, goals, deadline: float) -> bool:
    """Sound but incomplete: a subset of agents that cannot reach its goals dooms them all."""
    # Agents in different connected components never meet; label a component by its least cell.
    comp = [next(u for u in range(m.n) if m.dist(g)[u] < _INF) for g in goals]
    groups: dict[int, list[int]] = {}
    for a, c in enumerate(comp):
        groups.setdefault(c, []).append(a)
    for members in groups.values():
        subsets = [(a, b) for x, a in enumerate(members) for b in members[x + 1 :]]
        if len(members) > 2:
            subsets.append(tuple(members))
        for sub in subsets:
            cap = _PAIR_CAP if len(sub) == 2 else _GROUP_CAP
            s = tuple(starts[a] for a in sub)
            g = tuple(goals[a] for a in sub)
            if _joint_reachable(m.nbrs, s, g, cap, deadline) is False:
                return True
    return False


def solve(problem: Problem, max_nodes: int = 20_000, time_limit: float = 10.0) -> Solution:
    """Sum-of-costs optimal plan by Conflict-Based Search (deterministic).

    "unsolvable" when some goal is unreachable, the CBS tree is exhausted or a joint-state
    reachability check (run after a few dozen nodes) proves it; "timeout" when `max_nodes`
    high-level nodes or `time_limit` seconds run out first.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    check_problem(problem)
    m = _Map(problem.grid)
    starts = tuple(m.cell(s) for s in problem.starts)
    goals = tuple(m.cell(g) for g in problem.goals)
    done = functools.partial(_finish, m, t0)
    if any(m.dist(g)[s] >= _INF for s, g in zip(starts, goals)):
        return done(UNSOLVABLE, None, 0)
    search = _Search(m, starts, goals)
    cons = tuple(_Cons() for _ in starts)
    paths: list = [None] * len(starts)
    for a in range(len(starts)):
        paths[a] = search.plan(a, cons[a], paths)
    root = _Node(tuple(paths), cons)
    heap = [(root.cost, len(root.conflicts), 0, root)]
    seq, nodes, proof_tried = 0, 0, False
    while heap:
        if nodes >= max_nodes or time.perf_counter() > deadline:
            return done(TIMEOUT, None, nodes)
        if nodes >= _PROOF_AFTER and not proof_tried:
            proof_tried = True
            if _proved_unsolvable(m, starts, goals, deadline):
                return done(UNSOLVABLE, None, nodes)
        node = heapq.heappop(heap)[3]
        nodes += 1
        if not node.conflicts:
            return done(OPTIMAL, node.paths, nodes)
        cf = search.choose(node)
        children = []
        for side, agent in enumerate(cf[1:3]):
            c = _constrain(node.cons[agent], m.n, goals[agent], cf, side)
            p = search.plan(agent, c, node.paths)
            if p is None:
                continue
            paths = node.paths[:agent] + (p,) + node.paths[agent + 1 :]
            children.append(_Node(paths, node.cons[:agent] + (c,) + node.cons[agent + 1 :]))
        bypass = [
            ch
            for ch in children
            if ch.cost == node.cost and len(ch.conflicts) < len(node.conflicts)
        ]
        if bypass:  # same cost, fewer conflicts: adopt the path, keep the parent's constraints
            better = _Node(bypass[0].paths, node.cons)
            children = [better]
        for ch in children:
            seq += 1
            heapq.heappush(heap, (ch.cost, len(ch.conflicts), -seq, ch))
    return done(UNSOLVABLE, None, nodes)


def _finish(m: _Map, t0: float, status: str, cell_paths, nodes: int) -> Solution:
    if cell_paths is None:
        return Solution(status, nodes=nodes, seconds=time.perf_counter() - t0)
    paths = tuple(tuple(m.rc(u) for u in p) for p in cell_paths)
    actions = tuple(
        tuple(_DELTA_TO_ACTION[(b[0] - a[0], b[1] - a[1])] for a, b in zip(p, p[1:])) for p in paths
    )
    costs = [len(p) - 1 for p in paths]
    return Solution(
        status,
        soc=sum(costs),
        makespan=max(costs),
        actions=actions,
        paths=paths,
        nodes=nodes,
        seconds=time.perf_counter() - t0,
    )


def solve_many(
    problems: Sequence[Problem],
    max_nodes: int = 20_000,
    time_limit: float = 10.0,
    processes: int | None = None,
    progress: bool = False,
) -> list[Solution]:
    """`solve` over many problems, in order; a process pool unless processes == 1.

    processes=None uses os.cpu_count(). Workers are spawned (never forked): the parent may
    hold JAX's threads, which do not survive a fork.
    """
    problems = list(problems)
    if processes is None:
        processes = os.cpu_count() or 1
    if processes < 1:
        raise ValueError(f"solve_many: processes={processes!r}; allowed: None or an int >= 1")
    work = functools.partial(solve, max_nodes=max_nodes, time_limit=time_limit)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), desc="oracle", unit="inst")
    out = []
    processes = min(processes, max(1, len(problems)))
    try:
        if processes == 1:
            for p in problems:
                out.append(work(p))
                if bar is not None:
                    bar.update(1)
        else:
            chunk = max(1, min(64, len(problems) // (processes * 8)))
            with multiprocessing.get_context("spawn").Pool(processes) as pool:
                for sol in pool.imap(work, problems, chunksize=chunk):
                    out.append(sol)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


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
