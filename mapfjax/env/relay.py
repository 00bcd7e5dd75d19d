"""The relay plan the shipped trace writes: agents planned one after another, each by the move
lines' local rule, so that every action of the plan is decided by a line the trace writes.

An agent's lines come as one run (`trace.render_relay`), each `tK A<i> ...` showing the four
cells with `taken` where an agent written earlier holds that cell after step K (or swaps with
this one), and `taken` after the agent's own cell when one comes into it:

    r0: (0, 0) F (0, 1) s (0, 2) H    A0 at (1, 2) goes to (1, 1); A1 at (0, 1) to (2, 1)
    r1: (1, 0) F (1, 1) G (1, 2) S
    r2: (2, 0) F (2, 1) g (2, 2) F
    A0 S (1, 2) G (1, 1)
    A1 s (0, 1) g (2, 1)
    t1 A0 (1, 2) UP (0, 2) H DOWN (2, 2) F LEFT (1, 1) G RIGHT off = LEFT (1, 1)
    t1 A1 (0, 1) UP off DOWN (1, 1) taken LEFT (0, 0) F RIGHT (0, 2) H = LEFT (0, 0)
    t2 A1 (0, 0) UP off DOWN (1, 0) F LEFT off RIGHT (0, 1) s = DOWN (1, 0)
    t3 A1 (1, 0) UP (0, 0) F DOWN (2, 0) F LEFT off RIGHT (1, 1) taken = DOWN (2, 0)
    t4 A1 (2, 0) UP (1, 0) F DOWN off LEFT off RIGHT (2, 1) g = RIGHT (2, 1)

A1 goes around (1, 1), A0's goal, where A0 rests from t1 on.

The rule, per line: the first move (UP, DOWN, LEFT, RIGHT) into a free cell one step closer to
the goal that is not `taken`; else WAIT if the agent's own cell is not `taken` and the goal
can be reached from it; else the free cell not `taken` closest to the goal, another agent's
goal only when nothing else is free (stepping aside). Distances count holes and the goals of
the agents written earlier as walls (they rest there), so a later agent goes around them
rather than waiting for ever. An agent's run ends when it stands on its goal and no earlier
agent comes there later. Which agent runs first is a check, not a choice (`retry`): index
order first, and a run that is cornered or loops ends its attempt on a line that says so,
after which the trace names the next order and starts again (`trace.render_relay`'s tries);
where every order fails on a line, the trace ends on `no order left` (`every_order_fails`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from mapfjax.env import trace as _trace
from mapfjax.env.joint import INF, GridMap
from mapfjax.env.simulate import simulate
from mapfjax.env.trace import (
    CORNERED,
    LOOP,
    NO_ORDER,
    RETRY_LINE,
    Attempt,
    cells_by_time,
    parse_relay,
    relay_taken,
    step,
    thinking_text,
)
from mapfjax.env.types import HOLE_CELL, Problem

WAIT = 0
MOVE_CODES = (1, 2, 3, 4)  # UP, DOWN, LEFT, RIGHT: the move lines' order
MAX_ORDERS = 24  # orders `retry` tries (every order of up to 4 agents)


def _distances(problem: Problem, goal, walls: set) -> dict:
    """BFS distance to `goal` of every free cell, `walls` (earlier agents' goals) blocked;
    a wall cell gets one more than its nearest reachable neighbour (an agent may start on one,
    or step aside into one, and leaves it; no move into a wall counts as progress)."""
    m = GridMap(problem.grid)
    rows = [list(row) for row in problem.grid]
    for r, c in walls:
        rows[r][c] = HOLE_CELL
    walled = GridMap(["".join(row) for row in rows])
    d = walled.dist(walled.cell(goal))
    out = {m.rc(u): d[u] for u in range(m.n) if m.nbrs[u]}
    for w in walls:
        near = min((d[v] for v in m.nbrs[m.cell(w)][1:]), default=INF)
        if near < INF:
            out[tuple(w)] = near + 1
    return out


def rule(problem: Problem, agent: int, earlier: Sequence[tuple[int, Sequence[int]]]):
    """The rule for one agent after the runs of `earlier` ((index, plan) pairs): (allowed,
    rest), allowed a function of (its cell, step k) -> the actions the rule allows, preferred
    first ([] when cornered; None when the run ends there: the agent is on its goal and no
    earlier agent comes there later) and rest, the step from which no earlier agent moves.
    Ties: every move one step closer is allowed, the first preferred; stepping aside allows
    every cell as good as the best."""
    goal = tuple(int(v) for v in problem.goals[agent])
    walls = {tuple(int(v) for v in problem.goals[j]) for j, _ in earlier}
    d, plain = _distances(problem, goal, walls), _distances(problem, goal, set())
    cells = [cells_by_time(problem.starts[j], p) for j, p in earlier]
    last = max((len(c) for c in cells), default=1)

    def aside(q):  # where to step aside: not a wall if possible, then the closest
        return q in walls, d[q], plain[q]

    def allowed(here, k: int) -> list[int] | None:
        later = (c[min(t, len(c) - 1)] for c in cells for t in range(k, last))
        if here == goal and goal not in later:
            return None
        taken = relay_taken(cells, k, here)
        free = [a for a in MOVE_CODES if step(here, a) in d and step(here, a) not in taken]
        dh = d.get(here, INF)
        closer = [a for a in free if step(here, a) not in walls and d[step(here, a)] == dh - 1]
        if closer:
            return closer
        if here not in taken and dh < INF:
            return [WAIT]
        best = min((aside(step(here, a)) for a in free), default=None)
        return [a for a in free if aside(step(here, a)) == best]

    return allowed, last


def agent_run(
    problem: Problem, agent: int, earlier: Sequence[tuple[int, Sequence[int]]], horizon: int
) -> tuple[list[int], str]:
    """(actions, outcome) of one agent's run by the rule (module docstring), the agents of
    `earlier` ((index, plan) pairs) already written. outcome: "settled" (on its goal, and no
    earlier agent comes there later), "cornered" (its cell taken and no free cell left),
    "loop" (a cell comes back once every earlier agent rests: from then on the rule's choice
    depends on the cell alone, so the run would go round for ever; the actions stop before
    the repeat), or "horizon" (`horizon` steps without settling)."""
    allowed, rest = rule(problem, agent, earlier)
    here, out, seen = tuple(int(v) for v in problem.starts[agent]), [], set()
    for k in range(1, horizon + 1):
        choices = allowed(here, k)
        if choices is None:
            return out, "settled"
        if not choices:
            return out, "cornered"
        if k >= rest:
            if here in seen:
                return out, "loop"
            seen.add(here)
        out.append(choices[0])
        here = step(here, choices[0])
    return out, "horizon"


def orders(num_agents: int):
    """The orders of the agents the relay tries, in turn: `itertools.permutations` order
    (lexicographic, index order first), at most MAX_ORDERS."""
    return itertools.islice(itertools.permutations(range(num_agents)), MAX_ORDERS)


def loop_step(cells: Sequence[tuple[int, int]], rest: int) -> int:
    """The step J >= `rest` of the line of a run (`cells`, by time) that stood on the cell the
    run has come back to (its last): what its loop line `= loop tJ` names."""
    return next(k for k in range(rest, len(cells)) if cells[k - 1] == cells[-1])


# How the relay in one order ends (`attempt`): a valid plan, a run that is cornered, loops or
# reaches its horizon, or runs that all settle into a plan the simulator rejects.
OUTCOMES = ("valid", "cornered", "loop", "horizon", "invalid")


def attempt(problem: Problem, order: Sequence[int]):
    """The relay in `order`, as a trace that retries writes it -> (plans, failed, outcome):
    plans when the plan is valid (outcome "valid"); else None, with `failed` the attempt's
    runs up to the one that fails (`trace.Attempt`, its `again` the step of that run whose
    cell the agent has come back to, for a loop) and how it ended (OUTCOMES); failed is None
    when every run settles into a plan the simulator rejects ("invalid")."""
    h, w = problem.height, problem.width
    done: list[tuple[int, list[int]]] = []
    for i in order:
        horizon = 4 * h * w + sum(len(p) for _, p in done)
        actions, outcome = agent_run(problem, i, done, horizon)
        if outcome != "settled":
            again = None
            if outcome == "loop":
                _, rest = rule(problem, i, done)
                again = loop_step(cells_by_time(problem.starts[i], actions), rest)
            runs = tuple((j, tuple(p)) for j, p in [*done, (i, actions)])
            return None, Attempt(tuple(order), runs, outcome, again), outcome
        done.append((i, actions))
    plans = dict(done)
    out = [plans[i] for i in range(problem.num_agents)]
    return (out, None, "valid") if simulate(problem, out)["valid"] else (None, None, "invalid")


def retry(problem: Problem, tried_orders=None):
    """The relay that retries -> (order, plans, tries, orders tried): the orders in turn
    (`tried_orders`; None: `orders`, every order in `itertools.permutations` order, at most
    MAX_ORDERS) until one gives a valid plan, `tries` the failed attempts before it
    (`trace.Attempt`, rendered before the plan's runs). order and plans are None when no order
    is valid or an order fails in a way no line shows (a run at its horizon, or runs that
    settle into an invalid plan): the trace would have no failure line to write."""
    tries = []
    every = orders(problem.num_agents) if tried_orders is None else tried_orders
    for n, order in enumerate(every, 1):
        plans, failed, outcome = attempt(problem, order)
        if plans is not None:
            return order, plans, tuple(tries), n
        if outcome not in (CORNERED, LOOP):
            return None, None, tuple(tries), n
        tries.append(failed)
    return None, None, tuple(tries), len(tries)


def every_order_fails(problem: Problem, found=None) -> tuple[Attempt, ...] | None:
    """The failed attempts of a puzzle on which every order the relay that retries tries
    (MAX_ORDERS: every order of up to 4 agents) fails on a line (cornered or a loop), as a
    trace that ends on `no order left` writes them (`trace.render_relay`'s ended); None when
    an order has a valid plan or fails in a way no line shows. found: `retry(problem)`, when
    already at hand."""
    _, plans, tries, tried = retry(problem) if found is None else found
    return tries if plans is None and tries and len(tries) == tried else None


def attempts_before(problem: Problem, order: Sequence[int]) -> tuple[Attempt, ...]:
    """The failed attempts the relay that retries writes before the runs in `order` (the
    truth a retrying trace's earlier lines are checked against): those of the orders before it
    in `itertools.permutations` order (lexicographic), up to the first that does not fail on a
    line: `retry`'s failed attempts, those of orders before `order`."""
    return tuple(t for t in retry(problem)[2] if t.order < tuple(order))


def retry_truth(problem: Problem, body: str) -> tuple[Attempt, ...]:
    """The failed attempts a trace (the think block's text) is checked against: for one that
    retries, the rule's for the orders before its last (`attempts_before`); else none."""
    if not any(RETRY_LINE.match(line.strip()) for line in body.splitlines()):
        return ()
    plans, order = parse_relay(body, problem.num_agents)
    return attempts_before(problem, order) if plans is not None else ()


def rule_trace(problem: Problem, header: Sequence[str] | None = None) -> str | None:
    """The trace the relay that retries writes for `problem` (after `header`, None:
    `trace.render_header`): its failed attempts, then the runs of the first valid order, or
    `no order left` after the last when every order fails on a line (`every_order_fails`);
    None when an order fails in a way no line shows."""
    found = retry(problem)
    order, plans, tries, _ = found
    if plans is not None:
        return _trace.render_relay(problem, plans, order, tries, header=header)
    if (failed := every_order_fails(problem, found)) is None:
        return None
    empty = [[]] * problem.num_agents
    return _trace.render_relay(problem, empty, None, failed, ended=True, header=header)


def truths(problem: Problem, body: str, header: Sequence[str] | None = None):
    """(tries, truth) a think block's text is checked against (`trace.true_lines`): the rule's
    failed attempts before its last order (`retry_truth`), or for one that ends on `no order
    left`, the rule's whole trace (`rule_trace`, after `header`)."""
    if parse_relay(body, problem.num_agents)[1] == NO_ORDER:
        return (), rule_trace(problem, header)
    return retry_truth(problem, body), None


def check_trace(problem: Problem, response: str) -> tuple[int, str | None]:
    """`trace.check_trace` with a retrying trace's failed attempts checked against the rule's
    (`retry_truth`), one that ends on `no order left` against the rule's whole trace: what
    greedy evaluation records as `trace_error`."""
    body = thinking_text(response)
    tries, truth = truths(problem, body) if body is not None else ((), None)
    return _trace.check_trace(problem, response, tries, truth)
