"""Exact joint-state search for the oracle: the grid as a cell graph with cached BFS distances,
two-agent cost tables, a joint-state A* (used beside CBS on crowded maps) and a pair check that
proves instances unsolvable."""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from mapfjax.env.types import ACTION_DELTAS

OPTIMAL, TIMEOUT, UNSOLVABLE = "optimal", "timeout", "unsolvable"
INF = 1 << 30
# Expansion budget of each pair check (a 10x10 pair space has ~4e5 states).
PAIR_BUDGET = 200_000
# Most free cells for which `JointSearch` builds exact two-agent cost tables (~0.1 s a pair
# at 40).
PAIR_TABLE_CELLS = 40


class GridMap:
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
        """BFS distance of every cell to `goal` (INF when unreachable); cached per goal."""
        d = self._dist.get(goal)
        if d is None:
            d = [INF] * self.n
            d[goal] = 0
            frontier = [goal]
            while frontier:
                nxt = []
                for u in frontier:
                    du = d[u] + 1
                    for v in self.nbrs[u]:
                        if d[v] == INF:
                            d[v] = du
                            nxt.append(v)
                frontier = nxt
            d.append(max(x for x in d if x < INF))  # d[n]: the largest finite distance
            self._dist[goal] = d
        return d


def pair_table(m: GridMap, ga: int, gb: int) -> list[int]:
    """Exact cost-to-go of two agents alone, by Dijkstra backwards from their settled goals.

    Indexed ((pa * n + pb) * 2 + fa) * 2 + fb (fa, fb: settled flags); INF marks dead states.
    Moves are symmetric, so a state's predecessors are its neighbours (WAIT included).
    """
    n, nbrs = m.n, m.nbrs
    table = [INF] * (4 * n * n)
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


def matchings(agents: list[int]) -> list[tuple]:
    """All maximum sets of disjoint pairs of `agents` (for k = 5: 15 of two pairs each)."""
    if len(agents) < 2:
        return [()]
    a, rest = agents[0], agents[1:]
    out = [((a, b), *mt) for b in rest for mt in matchings([x for x in rest if x != b])]
    return out + (matchings(rest) if len(agents) % 2 else [])


class JointSearch:
    """Exact A* over joint states with operator decomposition (one agent moves per expansion).

    A state is (j, old, new, fin): agents < j already moved from `old` to `new` this step, `fin`
    is a bitmask of agents settled on their goals for good. An unsettled agent pays 1 per step;
    one standing on its goal may settle instead (cost 0, it never moves again), so a path's
    cost is exactly the sum-of-costs. The heuristic at whole-step states is the best sum over
    disjoint agent pairs of their exact two-agent costs (`pair_table`, small maps only) plus
    the others' BFS distances; it is consistent, and a dead pair prunes the state. Within a
    step the parent's value minus what was paid since is used. The state space is finite, so
    an exhausted open list proves the problem unsolvable. `run` resumes where it stopped.
    """

    def __init__(self, m: GridMap, starts: tuple, goals: tuple, pair_tables: bool = True):
        self.n, self.nbrs, self.goals, self.k = m.n, m.nbrs, goals, len(starts)
        self.dists = [m.dist(g) for g in goals]
        self.owner = {g: a for a, g in enumerate(goals)}
        self.tables = {}
        if pair_tables and m.free <= PAIR_TABLE_CELLS:
            for a in range(self.k):
                for b in range(a + 1, self.k):
                    if self.dists[a][goals[b]] < INF:  # same component: they may meet
                        self.tables[a, b] = pair_table(m, goals[a], goals[b])
        self.matchings = matchings(list(range(self.k)))
        root = (0, starts, (), 0)
        self.best = {root: 0}
        self.parent = {root: None}
        h = self._h(starts, 0)
        self.heap = [(h, 0, 0, root, h)] if h < INF else []
        self.expanded = 0
        self.closed: set = set()

    def _h(self, pos: tuple, fin: int) -> int:
        n, dists = self.n, self.dists
        single = [0 if fin >> a & 1 else dists[a][pos[a]] for a in range(self.k)]
        extra = {}
        for (a, b), table in self.tables.items():
            v = table[((pos[a] * n + pos[b]) * 2 + (fin >> a & 1)) * 2 + (fin >> b & 1)]
            if v >= INF:
                return INF
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
                if nxt in closed or g2 >= best.get(nxt, INF):
                    continue
                h2 = self._h(nxt[1], fin2) if j + 1 == k else h - cost
                if h2 >= INF:
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


def pair_unsolvable(m: GridMap, starts, goals, deadline: float) -> bool:
    """Sound, incomplete: if two agents alone cannot both reach their goals, nobody can."""
    for a in range(len(starts)):
        for b in range(a + 1, len(starts)):
            if m.dist(goals[a])[starts[b]] >= INF:
                continue  # different components: they never meet
            pair = JointSearch(m, (starts[a], starts[b]), (goals[a], goals[b]), pair_tables=False)
            r = pair.run(PAIR_BUDGET, deadline)
            if r is not None and r[0] == UNSOLVABLE:
                return True
    return False
