"""Which choices of a plan the reasoning trace's own lines decide: a move line shows the four
cells an agent could enter and what each holds (a hole, the map's edge, `taken` by an agent
written earlier in the step); add each cell's distance to the agent's goal and a local rule
follows. What the rule does not explain has to come from planning the trace does not write.

The rule (`explained`): a move into a free cell one step closer to the goal that the line does
not mark `taken` (a *progress move*: any of them, ties are not the trace's business), or a WAIT
when the line offers no progress move. `most_explained_optimal` searches the joint state space
for the optimal plan (least sum of costs) with the fewest unexplained actions, so the count
says how much any choice among optimal plans could make local; `greedy_plans` runs the rule
as a planner.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from mapfjax import stats
from mapfjax.env.joint import INF, GridMap
from mapfjax.env.relay import MOVE_CODES, WAIT
from mapfjax.env.simulate import simulate
from mapfjax.env.trace import step
from mapfjax.env.types import Problem
from projects.go_no_go.layouts import taken_cells

# Most agents `most_explained_optimal` searches jointly (5^n action combinations a state).
MAX_AGENTS = 3
MAX_STATES = 400_000


class _Board:
    """A problem's grid with each agent's BFS distance to its goal (holes only)."""

    def __init__(self, problem: Problem):
        self.m = GridMap(problem.grid)
        self.goals = [tuple(int(v) for v in g) for g in problem.goals]
        self.starts = [tuple(int(v) for v in s) for s in problem.starts]
        self.dist = [self.m.dist(self.m.cell(g)) for g in self.goals]

    def free(self, rc) -> bool:
        r, c = rc
        return 0 <= r < self.m.h and 0 <= c < self.m.w and self.m.nbrs[self.m.cell(rc)] != ()

    def d(self, agent: int, rc) -> int:
        return self.dist[agent][self.m.cell(rc)]

    def progress(self, agent: int, rc, taken: set) -> list[int]:
        """Move codes into a free cell one step closer to the agent's goal, not `taken`."""
        here = self.d(agent, rc)
        out = []
        for a in MOVE_CODES:
            q = step(rc, a)
            if self.free(q) and q not in taken and here < INF and self.d(agent, q) == here - 1:
                out.append(a)
        return out

    def is_explained(self, agent: int, rc, taken: set, action: int) -> bool:
        moves = self.progress(agent, rc, taken)
        return action in moves if action != WAIT else not moves


def explained(problem: Problem, plans: Sequence[Sequence[int]]) -> list[list[bool]]:
    """Per agent, per action of `plans`: whether its move line decides it (see the module
    docstring). Agents are written in index order within a step, as `layouts.render_trace` does;
    moves are followed as written (an illegal plan is still judged line by line)."""
    b = _Board(problem)
    pos = list(b.starts)
    out: list[list[bool]] = [[] for _ in plans]
    for t in range(max((len(p) for p in plans), default=0)):
        moved: dict[int, tuple[int, int]] = {}
        for i, plan in enumerate(plans):
            if t >= len(plan):
                continue
            a = int(plan[t])
            out[i].append(b.is_explained(i, pos[i], taken_cells(moved, pos, i), a))
            moved[i] = step(pos[i], a)
        for i, q in moved.items():
            pos[i] = q
    return out


def unexplained_count(problem: Problem, plans: Sequence[Sequence[int]]) -> int:
    """How many actions of `plans` their move lines do not decide."""
    return sum(not ok for agent in explained(problem, plans) for ok in agent)


def greedy_plans(problem: Problem, horizon: int = 64) -> list[list[int]]:
    """The rule as a planner: each step, in agent order, every agent not yet at its goal takes
    its first progress move (UP, DOWN, LEFT, RIGHT) or waits; an agent stops at its goal for
    good. Ends after `horizon` steps whatever it reached (`simulate` then says what failed)."""
    b = _Board(problem)
    pos = list(b.starts)
    plans: list[list[int]] = [[] for _ in pos]
    done = [p == g for p, g in zip(pos, b.goals, strict=True)]
    for _ in range(horizon):
        if all(done):
            break
        moved: dict[int, tuple[int, int]] = {}
        for i in range(len(pos)):
            if done[i]:
                continue
            moves = b.progress(i, pos[i], taken_cells(moved, pos, i))
            a = moves[0] if moves else WAIT
            plans[i].append(a)
            moved[i] = step(pos[i], a)
        for i, q in moved.items():
            pos[i] = q
            done[i] = q == b.goals[i]
    return plans


def most_explained_optimal(
    problem: Problem, any_order: bool = False
) -> tuple[list[list[int]], int, int]:
    """(plans, sum of costs, unexplained actions): of the plans with the least sum of costs,
    one with the fewest actions `explained` calls undecided. Exact Dijkstra over joint states
    (every agent's cell, whether its plan has ended) on the cost pair (sum of costs,
    unexplained), where an agent's cost is the length of its action list and an agent whose
    plan has ended stays on its goal (as `simulate` reads a shorter list). any_order: a step's
    lines may be written in any order of the agents (the order that decides most of them), not
    only in index order as `layouts.render_trace` writes them.

    Raises ValueError for more than MAX_AGENTS agents, when the search passes MAX_STATES joint
    states, or when no plan exists."""
    n = problem.num_agents
    if n > MAX_AGENTS:
        raise ValueError(f"problem {problem.id!r}: {n} agents; the joint search takes {MAX_AGENTS}")
    b = _Board(problem)
    start = (tuple(b.starts), (False,) * n)  # an agent on its goal may still need to step aside
    best = {start: (0, 0)}
    parent: dict = {start: None}
    tick = itertools.count()
    heap = [((0, 0), next(tick), start)]
    while heap:
        cost, _, s = heapq.heappop(heap)
        if best[s] != cost:
            continue
        pos, done = s
        if all(done):
            return _unwind(parent, s, n), cost[0], cost[1]
        if len(best) > MAX_STATES:
            raise ValueError(f"problem {problem.id!r}: more than {MAX_STATES} joint states")
        succ = []
        # an agent on its goal may end its plan there (no cost, no time)
        for i in range(n):
            if not done[i] and pos[i] == b.goals[i]:
                succ.append(((pos, done[:i] + (True,) + done[i + 1 :]), cost, None))
        acting = [i for i in range(n) if not done[i]]
        orders = list(itertools.permutations(acting)) if any_order else [acting]
        for combo in itertools.product(range(5), repeat=len(acting)):
            act = dict(zip(acting, combo, strict=True))
            new = list(pos)
            for i, a in act.items():
                new[i] = step(pos[i], a)
            if not all(b.free(new[i]) for i in acting) or len(set(new)) < n:
                continue
            if any(new[i] == pos[j] and new[j] == pos[i] for i in acting for j in acting if i < j):
                continue
            miss = min(_undecided(b, pos, new, act, order) for order in orders)
            actions = tuple(act.get(i) for i in range(n))
            succ.append(((tuple(new), done), (cost[0] + len(acting), cost[1] + miss), actions))
        for t, c, actions in succ:
            if t not in best or c < best[t]:
                best[t] = c
                parent[t] = (s, actions)
                heapq.heappush(heap, (c, next(tick), t))
    raise ValueError(f"problem {problem.id!r}: no plan reaches every goal")


def _undecided(b: _Board, pos, new, act: dict, order) -> int:
    """How many of one step's actions (`act`: agent -> code, `new`: where each goes) their
    lines leave undecided when the agents are written in `order`."""
    moved, miss = {}, 0
    for i in order:
        miss += not b.is_explained(i, pos[i], taken_cells(moved, pos, i), act[i])
        moved[i] = new[i]
    return miss


def _unwind(parent: dict, s, n: int) -> list[list[int]]:
    plans: list[list[int]] = [[] for _ in range(n)]
    while parent[s] is not None:
        s, actions = parent[s]
        for i, a in enumerate(actions or ()):
            if a is not None:
                plans[i].append(a)
    return [p[::-1] for p in plans]


def locality_table(problems: Sequence[Problem], plans, valid=None, nodes=None) -> str:
    """Markdown: per half (needs a wait or not) how many puzzles, how many of `plans` (the
    oracle's, in `problems`' order) their move lines decide whole, the actions they leave
    undecided, the same for the most explained optimal plan (with the agents of a step in index
    order, as the trace writes them, and in any order), and how often the rule as a
    planner (`greedy_plans`) is valid. valid: {label: {puzzle id: bool}} adds a second table:
    each policy's valid rate on the puzzles whose oracle plan is decided and on the others,
    paired against the first policy. nodes: the search nodes the oracle expanded per problem
    (`Solution.nodes`), reported as median / 90th percentile / max: what writing the search
    into a trace would cost."""
    rows = []
    nodes_of = [None] * len(problems) if nodes is None else list(nodes)
    for p, plan, node_count in zip(problems, plans, nodes_of, strict=True):
        best_miss = most_explained_optimal(p)[2]
        any_miss = most_explained_optimal(p, any_order=True)[2]
        miss = unexplained_count(p, plan)
        rows.append(
            dict(
                id=p.id,
                wait=p.needs_wait,
                actions=sum(map(len, plan)),
                miss=miss,
                best_miss=best_miss,
                any_miss=any_miss,
                greedy=bool(simulate(p, greedy_plans(p))["valid"]),
                nodes=node_count,
            )
        )
    header = [
        *("needs a wait", "puzzles", "oracle plan decided", "undecided actions"),
        *("best optimal plan decided", "its undecided actions"),
        *("the same, agents in any order", "its undecided actions", "rule as planner valid"),
    ]
    if nodes is not None:
        header.append("oracle search nodes (median / p90 / max)")
    out = []
    for name, keep in (("no", False), ("yes", True), ("all", None)):
        sel = [r for r in rows if keep is None or r["wait"] is keep]
        line = [name, len(sel)]
        line.append(stats.interval_text(stats.proportion([r["miss"] == 0 for r in sel])))
        line.append(f"{sum(r['miss'] for r in sel)} of {sum(r['actions'] for r in sel)}")
        line.append(stats.interval_text(stats.proportion([r["best_miss"] == 0 for r in sel])))
        line.append(sum(r["best_miss"] for r in sel))
        line.append(stats.interval_text(stats.proportion([r["any_miss"] == 0 for r in sel])))
        line.append(sum(r["any_miss"] for r in sel))
        line.append(stats.interval_text(stats.proportion([r["greedy"] for r in sel])))
        if nodes is not None:
            ns = sorted(r["nodes"] for r in sel)
            line.append(
                f"{ns[len(ns) // 2]} / {ns[min(len(ns) - 1, int(0.9 * len(ns)))]} / {ns[-1]}"
            )
        out.append(line)
    text = stats.markdown_table(header, out)
    if not valid:
        return text
    return text + "\n\n" + _policy_table(rows, valid)


def _policy_table(rows: list[dict], valid: dict) -> str:
    """Each policy's valid rate on the puzzles whose oracle plan its lines decide and on the
    rest, paired against the first policy on the same puzzles."""
    subsets = [
        (
            f"plan decided (n={sum(r['miss'] == 0 for r in rows)})",
            [r["id"] for r in rows if r["miss"] == 0],
        ),
        (
            f"not decided (n={sum(r['miss'] > 0 for r in rows)})",
            [r["id"] for r in rows if r["miss"] > 0],
        ),
    ]
    first = next(iter(valid))
    header = ["policy"]
    for name, _ in subsets:
        header += [f"{name}: valid %", f"vs {first} (points)"]
    out = []
    for label, verdict in valid.items():
        line = [label]
        for _, ids in subsets:
            mine, base = [verdict[i] for i in ids], [valid[first][i] for i in ids]
            line.append(stats.interval_text(stats.proportion(mine)))
            diff = stats.paired_proportion_difference(mine, base)
            line.append("-" if label == first else stats.interval_text(diff, signed=True))
        out.append(line)
    return stats.markdown_table(header, out)
