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

from mapfjax.env.types import ACTION_DELTAS, WAIT, Problem, check_problem, needs_wait

OPTIMAL, TIMEOUT, UNSOLVABLE = "optimal", "timeout", "unsolvable"
_INF = 1 << 30
# (d_row, d_col) -> action code, for turning cell paths back into actions.
_DELTA_TO_ACTION = {(int(dr), int(dc)): a for a, (dr, dc) in enumerate(ACTION_DELTAS)}
# CBS nodes popped before the joint-state search and the pair check join in (both are counted
# in expansions, not seconds, so results are deterministic), the joint-state expansions granted
# per CBS node (a joint expansion is ~50x cheaper than a CBS node, so each gets about half the
# time; on crowded small maps either can win by orders of magnitude), and the expansion budget
# of each pair check (a 10x10 pair space has ~4e5 states).
_JOINT_AFTER = 64
_JOINT_RATE = 50
_PAIR_BUDGET = 200_000
# Most free cells for which `_Joint` builds exact two-agent cost tables (~0.1 s per pair at 40).
_PAIR_TABLE_CELLS = 40


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
        self.free = sum(map(bool, nbrs))
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
    max_cost: int = _INF
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


def _low_level(m: _Map, start: int, goal: int, cons: _Cons, table) -> tuple[int, ...] | None:
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
            if blocked and nt >= blocked.get(v, _INF):
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
                and t < blocked.get(v, _INF)
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

    def __init__(self, m: _Map, starts, goals):
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
            if t < c.blocked.get(goal, _INF):
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


def _pair_table(m: _Map, ga: int, gb: int) -> list[int]:
    """Exact cost-to-go of two agents alone, by Dijkstra backwards from their settled goals.

    Indexed ((pa * n + pb) * 2 + fa) * 2 + fb (fa, fb: settled flags); _INF marks dead states.
    Moves are symmetric, so a state's predecessors are its neighbours (WAIT included).
    """
    n, nbrs = m.n, m.nbrs
    table = [_INF] * (4 * n * n)
    table[((ga * n + gb) * 2 + 1) * 2 + 1] = 0
    heap = [(0, ga, gb, 1, 1)]
    while heap:
        d, va, vb, fa, fb = heapq.heappop(heap)
        if d > table[((va * n + vb) * 2 + fa) * 2 + fb]:
            continue
        # Each agent's predecessor options: (cell, settled flag, cost paid).
        pre_a = [(va, 1, 0), (va, 0, 0)] if fa else [(u, 0, 1) for u in nbrs[va]]
        pre_b = [(vb, 1, 0), (vb, 0, 0)] if fb else [(u, 0, 1) for u in nbrs[vb]]
        for pa, fa0, ca in pre_a:
            for pb, fb0, cb in pre_b:
                if pa == pb or (pa == vb and pb == va and pa != va):
                    continue
                key = ((pa * n + pb) * 2 + fa0) * 2 + fb0
                if d + ca + cb < table[key]:
                    table[key] = d + ca + cb
                    heapq.heappush(heap, (d + ca + cb, pa, pb, fa0, fb0))
    return table


def _matchings(agents: list[int]) -> list[tuple]:
    """All maximum sets of disjoint pairs of `agents` (for k = 5: 15 of two pairs each)."""
    if len(agents) < 2:
        return [()]
    a, rest = agents[0], agents[1:]
    out = [((a, b), *mt) for b in rest for mt in _matchings([x for x in rest if x != b])]
    return out + (_matchings(rest) if len(agents) % 2 else [])


class _Joint:
    """Exact A* over joint states with operator decomposition (one agent moves per expansion).

    A state is (j, old, new, fin): agents < j already moved from `old` to `new` this step, `fin`
    is a bitmask of agents settled on their goals for good. An unsettled agent pays 1 per step;
    one standing on its goal may settle instead (cost 0, it never moves again), so a path's
    cost is exactly the sum-of-costs. The heuristic at whole-step states is the best sum over
    disjoint agent pairs of their exact two-agent costs (`_pair_table`, small maps only) plus
    the others' BFS distances; it is consistent, and a dead pair prunes the state. Within a
    step the parent's value minus what was paid since is used. The state space is finite, so
    an exhausted open list proves the problem unsolvable. `run` resumes where it stopped.
    """

    def __init__(self, m: _Map, starts: tuple, goals: tuple, pair_tables: bool = True):
        self.n, self.nbrs, self.goals, self.k = m.n, m.nbrs, goals, len(starts)
        self.dists = [m.dist(g) for g in goals]
        self.owner = {g: a for a, g in enumerate(goals)}
        self.tables = {}
        if pair_tables and m.free <= _PAIR_TABLE_CELLS:
            for a in range(self.k):
                for b in range(a + 1, self.k):
                    if self.dists[a][goals[b]] < _INF:  # same component: they may meet
                        self.tables[a, b] = _pair_table(m, goals[a], goals[b])
        self.matchings = _matchings(list(range(self.k)))
        root = (0, starts, (), 0)
        self.best = {root: 0}
        self.parent = {root: None}
        h = self._h(starts, 0)
        self.heap = [(h, 0, 0, root, h)] if h < _INF else []
        self.expanded = 0
        self.closed: set = set()

    def _h(self, pos: tuple, fin: int) -> int:
        n, dists = self.n, self.dists
        single = [0 if fin >> a & 1 else dists[a][pos[a]] for a in range(self.k)]
        extra = {}
        for (a, b), table in self.tables.items():
            v = table[((pos[a] * n + pos[b]) * 2 + (fin >> a & 1)) * 2 + (fin >> b & 1)]
            if v >= _INF:
                return _INF
            extra[a, b] = v - single[a] - single[b]
        return sum(single) + max(sum(extra.get(pr, 0) for pr in mt) for mt in self.matchings)

    def run(self, budget: int, deadline: float):
        """Expand up to `budget` states: (OPTIMAL, cell paths), (UNSOLVABLE, None) or None."""
        k, nbrs, goals, owner = self.k, self.nbrs, self.goals, self.owner
        heap, best, parent, closed = self.heap, self.best, self.parent, self.closed
        done = (1 << k) - 1
        stop = self.expanded + budget
        while heap:
            if self.expanded >= stop:
                return None
            if self.expanded & 1023 == 0 and time.perf_counter() > deadline:
                return None
            _, negg, _, state, h = heapq.heappop(heap)
            if state in closed:
                continue
            closed.add(state)
            self.expanded += 1
            j, old, new, fin = state
            if fin == done and j == 0:
                return OPTIMAL, self._paths(state)
            g, u = -negg, old[j]
            if fin >> j & 1:
                moves = ((u, 0, fin),)
            else:
                moves = [(v, 1, fin) for v in nbrs[u]]
                if u == goals[j]:
                    moves.insert(0, (u, 0, fin | 1 << j))
            for v, cost, fin2 in moves:
                if v in new:
                    continue
                o = owner.get(v)
                if o is not None and o != j and fin >> o & 1:
                    continue  # a settled agent stands there forever
                if v != u and v in old:  # a swap with an agent that already moved?
                    b = old.index(v)
                    if b < j and new[b] == u:
                        continue
                nxt = (0, (*new, v), (), fin2) if j + 1 == k else (j + 1, old, (*new, v), fin2)
                g2 = g + cost
                if nxt in closed or g2 >= best.get(nxt, _INF):
                    continue
                h2 = self._h(nxt[1], fin2) if j + 1 == k else h - cost
                if h2 >= _INF:
                    continue
                best[nxt] = g2
                parent[nxt] = state
                heapq.heappush(heap, (g2 + h2, -g2, len(best), nxt, h2))
        return UNSOLVABLE, None

    def _paths(self, state) -> tuple[tuple[int, ...], ...]:
        steps = []  # (positions, fin) at t = 0, 1, ...
        while state is not None:
            if state[0] == 0:
                steps.append((state[1], state[3]))
            state = self.parent[state]
        steps.reverse()
        out = []
        for a in range(self.k):
            # Settled during step t -> t + 1 means cost t.
            cost = next(t for t, (_, fin) in enumerate(steps) if fin >> a & 1) - 1
            out.append(tuple(pos[a] for pos, _ in steps[: cost + 1]))
        return tuple(out)


def _pair_unsolvable(m: _Map, starts, goals, deadline: float) -> bool:
    """Sound, incomplete: if two agents alone cannot both reach their goals, nobody can."""
    for a in range(len(starts)):
        for b in range(a + 1, len(starts)):
            if m.dist(goals[a])[starts[b]] >= _INF:
                continue  # different components: they never meet
            pair = _Joint(m, (starts[a], starts[b]), (goals[a], goals[b]), pair_tables=False)
            r = pair.run(_PAIR_BUDGET, deadline)
            if r is not None and r[0] == UNSOLVABLE:
                return True
    return False


def solve(problem: Problem, max_nodes: int = 20_000, time_limit: float = 10.0) -> Solution:
    """Sum-of-costs optimal plan by Conflict-Based Search (deterministic).

    CBS runs first, with exact refinements: cardinal conflicts first, the CG heuristic,
    target reasoning, bypass, conflict-avoidance tie-breaking. CBS never stops on an unsolvable
    instance and is slow on crowded small maps, so once it has popped `_JOINT_AFTER` nodes,
    pairs of agents are checked for unsolvability and an exact joint-state A* (`_Joint`) is
    interleaved with it, `_JOINT_RATE` expansions per CBS node; whichever finishes first
    decides. "unsolvable": a goal is unreachable, or the CBS tree, the joint state space or a
    pair's is exhausted; "timeout": `max_nodes` CBS nodes or `time_limit` seconds ran out.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    check_problem(problem)
    m = _Map(problem.grid)
    starts = tuple(m.cell(s) for s in problem.starts)
    goals = tuple(m.cell(g) for g in problem.goals)
    done = functools.partial(_finish, m, t0)
    if any(m.dist(g)[s] >= _INF for s, g in zip(starts, goals)):
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
                if _pair_unsolvable(m, starts, goals, deadline):
                    return done(UNSOLVABLE, None, nodes, "pairs")
                joint = _Joint(m, starts, goals)
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


def _finish(m: _Map, t0: float, status: str, cell_paths, nodes: int, method: str) -> Solution:
    if cell_paths is None:
        return Solution(status, nodes=nodes, seconds=time.perf_counter() - t0, method=method)
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
        method=method,
    )


_POOL: dict = {}  # processes -> the live worker pool, reused across calls


def _pool(processes: int):
    """A spawned worker pool kept for later calls: starting one costs seconds, because each
    worker imports JAX through the package. Spawned, never forked: the parent may already
    run JAX's threads, which do not survive a fork."""
    pool = _POOL.get(processes)
    if pool is None:
        _drop_pools()
        pool = _POOL[processes] = multiprocessing.get_context("spawn").Pool(processes)
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
