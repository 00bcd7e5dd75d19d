"""The relay plan: agents planned one after another, each by the move lines' local rule, so
that every action of the plan is decided by a line the trace writes (`env.locality` found
that the step layout decides the whole plan on only 13.8 % of the puzzles that need a wait).

An agent's lines come as one run (`trace.render_trace` with `order`), each `tK A<i> ...`
showing the four cells with `taken` where an agent written earlier holds that cell after step
K (or swaps with this one), and `taken` after the agent's own cell when one comes into it:

    H: (0, 2)                     A0 at (1, 2) goes to (1, 1); A1 at (0, 1) to (2, 1)
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
agent comes there later. The first agent that runs is the one choice the trace makes that no
line decides: `relay` takes the first order (in `itertools.permutations` order) whose plan
is valid, which on the gate's held-out puzzles is every one that needs no wait and 84 % of
those that need one (the agents in index order alone: 65 %). `retry` makes that choice a
check: index order first, and a run that is cornered or loops ends its attempt on a line that
says so, after which the trace names the next order and starts again (`trace.render_trace`'s
tries).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import NamedTuple

from mapfjax import stats
from mapfjax.env import trace as _trace
from mapfjax.env.joint import INF, GridMap
from mapfjax.env.simulate import simulate
from mapfjax.env.trace import (
    CORNERED,
    FAILED_LINE,
    LOOP,
    NO_ORDER,
    RELAY_LINE,
    RETRY_LINE,
    TAKEN,
    THINK_CLOSE,
    Attempt,
    cells_by_time,
    detect_style,
    parse_relay,
    relay_taken,
    render_header,
    step,
    thinking_text,
    true_lines,
)
from mapfjax.env.types import HOLE_CELL, Problem

WAIT = 0
MOVE_CODES = (1, 2, 3, 4)  # UP, DOWN, LEFT, RIGHT: the move lines' order
MAX_ORDERS = 24  # orders `relay` tries (every order of up to 4 agents)


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


def _rule(problem: Problem, agent: int, earlier: Sequence[tuple[int, Sequence[int]]]):
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
    allowed, rest = _rule(problem, agent, earlier)
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


def agent_plan(
    problem: Problem, agent: int, earlier: Sequence[tuple[int, Sequence[int]]], horizon: int
) -> list[int] | None:
    """One agent's actions by the rule (`agent_run`); None unless it settles on its goal."""
    actions, outcome = agent_run(problem, agent, earlier, horizon)
    return actions if outcome == "settled" else None


def plan_in_order(problem: Problem, order: Sequence[int]) -> list[list[int]] | None:
    """Every agent's actions by the rule, planned in `order`; None when one of them finds none
    or the plan is not valid (`attempt` says how)."""
    return attempt(problem, order)[0]


def _orders(num_agents: int):
    """The orders of the agents the relay tries, in turn: `itertools.permutations` order
    (lexicographic, index order first), at most MAX_ORDERS."""
    return itertools.islice(itertools.permutations(range(num_agents)), MAX_ORDERS)


def relay(problem: Problem) -> tuple[tuple[int, ...] | None, list[list[int]] | None, int]:
    """(order, plans, orders tried): the first order of the agents (`itertools.permutations`,
    index order first; at most MAX_ORDERS) whose relay plan is valid; order and plans are None
    when none is."""
    tried = 0
    for order in _orders(problem.num_agents):
        tried += 1
        plans = plan_in_order(problem, order)
        if plans is not None:
            return order, plans, tried
    return None, None, tried


def _loop_step(cells: Sequence[tuple[int, int]], rest: int) -> int:
    """The step J >= `rest` of the line of a run (`cells`, by time) that stood on the cell the
    run has come back to (its last): what its loop line `= loop tJ` names."""
    return next(k for k in range(rest, len(cells)) if cells[k - 1] == cells[-1])


# How the relay ends with the agents in index order (`index_order_outcome`): a valid plan, a
# run that is cornered, loops or reaches its horizon, or runs that all settle into a plan the
# simulator rejects.
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
                _, rest = _rule(problem, i, done)
                again = _loop_step(cells_by_time(problem.starts[i], actions), rest)
            runs = tuple((j, tuple(p)) for j, p in [*done, (i, actions)])
            return None, Attempt(tuple(order), runs, outcome, again), outcome
        done.append((i, actions))
    plans = dict(done)
    out = [plans[i] for i in range(problem.num_agents)]
    return (out, None, "valid") if simulate(problem, out)["valid"] else (None, None, "invalid")


def retry(problem: Problem):
    """The relay that retries -> (order, plans, tries, orders tried): the orders in
    `itertools.permutations` order (at most MAX_ORDERS) until one gives a valid plan, `tries`
    the failed attempts before it (`trace.Attempt`, rendered before the plan's runs). order and
    plans are None when no order is valid or an order fails in a way no line shows (a run at
    its horizon, or runs that settle into an invalid plan): the trace would have no failure
    line to write."""
    return _retry_over(problem, _orders(problem.num_agents))


def every_order_fails(problem: Problem, found=None) -> tuple[Attempt, ...] | None:
    """The failed attempts of a puzzle on which every order the relay that retries tries
    (MAX_ORDERS: every order of up to 4 agents) fails on a line (cornered or a loop), as a
    trace that ends on `no order left` writes them (`trace.render_trace`'s ended); None when
    an order has a valid plan or fails in a way no line shows. found: `retry(problem)`, when
    already at hand."""
    _, plans, tries, tried = retry(problem) if found is None else found
    return tries if plans is None and tries and len(tries) == tried else None


def _retry_over(problem: Problem, orders):
    """`retry` over the given `orders` in turn (what it returns, the count of those tried)."""
    tries = []
    for n, order in enumerate(orders, 1):
        plans, failed, outcome = attempt(problem, order)
        if plans is not None:
            return order, plans, tuple(tries), n
        if outcome not in (CORNERED, LOOP):
            return None, None, tuple(tries), n
        tries.append(failed)
    return None, None, tuple(tries), len(tries)


class Lesson(NamedTuple):
    """A trace that goes wrong once and catches it (`loop_lesson`): `tries` as
    `trace.render_trace` takes them, the first the index order's attempt with one wrong line,
    then the plans of `order`, the order the relay that retries reaches from the next one."""

    tries: tuple[Attempt, ...]
    order: tuple[int, ...]
    plans: list[list[int]]


def loop_lesson(problem: Problem, pick: int) -> Lesson | None:
    """The index order's rule run with one wrong line: at a step K once the earlier agents
    rest (K - 1 >= the run's rest step), an agent that has just moved moves back where it came
    from (a free cell not `taken`, not the rule's move), so that its next line stands on the
    cell of its line K - 1 and ends the attempt `= loop t<K-1>`; the trace then retries from
    the next order as `retry` does. The policy's own loops go back and forth between two
    cells, and this is the check that ends them (the rule alone loops only where an agent
    cannot reach its goal, a different picture). `pick` chooses among the wrong lines the
    rule's runs allow (modulo their number; any int). None when there is none, or the retry
    from the next order reaches no plan (or fails on no line)."""
    orders = list(_orders(problem.num_agents))
    order, plans, tail, _ = _retry_over(problem, orders[1:])
    if plans is None:
        return None
    first, failed0, _ = attempt(problem, orders[0])
    if first is not None:
        runs = [(i, tuple(first[i])) for i in orders[0]]
    elif failed0 is not None:
        runs = list(failed0.runs)
    else:
        return None
    wrong = []  # (run, K, the move back, the run's rest step)
    for r, (i, actions) in enumerate(runs):
        rest = _rule(problem, i, runs[:r])[1]
        cells = cells_by_time(problem.starts[i], actions)
        earlier = [cells_by_time(problem.starts[j], p) for j, p in runs[:r]]
        for k in range(max(2, rest + 1), len(actions) + 1):
            here, back = cells[k - 1], cells[k - 2]
            if here == back or back in relay_taken(earlier, k, here):
                continue
            a = next(a for a in MOVE_CODES if step(here, a) == back)
            if a != actions[k - 1]:
                wrong.append((r, k, a, rest))
    if not wrong:
        return None
    r, k, a, rest = wrong[pick % len(wrong)]
    i, actions = runs[r]
    run = (*actions[: k - 1], a)
    again = _loop_step(cells_by_time(problem.starts[i], run), rest)
    lesson = Attempt(tuple(orders[0]), (*runs[:r], (i, run)), LOOP, again)
    return Lesson((lesson, *tail), tuple(order), plans)


_CELL_LINE = re.compile(r"^t\d{1,4} A(\d{1,2}) (\(\d{1,2}, \d{1,2}\))")


def most_lines_on_a_cell(response: str) -> int:
    """The most lines a relay trace writes for one agent on one cell within one attempt (the
    text between `retry` lines): 2 where an agent waits once or comes back once, 3 or more
    where it goes back and forth. 0 without a relay line. Reads the text only (the trace need
    not close or parse)."""
    count: dict = {}
    best = attempt_no = 0
    for line in (thinking_text(response) or response).splitlines():
        line = line.strip()
        if RETRY_LINE.match(line):
            attempt_no += 1
        elif m := _CELL_LINE.match(line):
            key = (attempt_no, m.group(1), m.group(2))
            count[key] = count.get(key, 0) + 1
            best = max(best, count[key])
    return best


LOOP_COLUMNS = ("answers", "trace never closes", "of which an agent on a cell 3+ times",
                "answers with a loop line", "answers with a retry")  # fmt: skip


def loop_counts(responses: Sequence[str]) -> list[int]:
    """Per LOOP_COLUMNS, how many of `responses` (a policy's answers): all, those whose
    think block never closes, those of them with an agent on one cell on 3 or more lines of
    one attempt (`most_lines_on_a_cell`), and those writing a `= loop tJ` line or a `retry`."""
    cut = [r for r in responses if THINK_CLOSE not in r]
    lines = [[x.strip() for x in r.splitlines()] for r in responses]
    return [
        len(responses),
        len(cut),
        sum(most_lines_on_a_cell(r) >= 3 for r in cut),
        sum(any(FAILED_LINE.match(x) and f"= {LOOP} t" in x for x in ls) for ls in lines),
        sum(any(RETRY_LINE.match(x) for x in ls) for ls in lines),
    ]


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


def rule_trace(problem: Problem, style: str) -> str | None:
    """The trace the relay that retries writes for `problem` (map in `style`): its failed
    attempts, then the runs of the first valid order, or `no order left` after the last when
    every order fails on a line (`every_order_fails`); None when an order fails in a way no
    line shows."""
    found = retry(problem)
    order, plans, tries, _ = found
    if plans is not None:
        return _trace.render_trace(problem, plans, style, order=order, tries=tries)
    if (failed := every_order_fails(problem, found)) is None:
        return None
    return _trace.render_trace(problem, [[]] * problem.num_agents, style, tries=failed, ended=True)


def _truths(problem: Problem, body: str):
    """(tries, truth) a think block's text is checked against (`trace.true_lines`): the rule's
    failed attempts before its last order (`retry_truth`), or for one that ends on `no order
    left`, the rule's whole trace (`rule_trace`)."""
    if parse_relay(body, problem.num_agents)[1] == NO_ORDER:
        return (), rule_trace(problem, detect_style(body))
    return retry_truth(problem, body), None


def check_trace(problem: Problem, response: str, style: str | None = None):
    """`trace.check_trace` for any layout, a retrying relay trace's failed attempts checked
    against the rule's (`retry_truth`), one that ends on `no order left` against the rule's
    whole trace: what greedy evaluation records as `trace_error`."""
    body = thinking_text(response)
    tries, truth = _truths(problem, body) if body is not None else ((), None)
    return _trace.check_trace(problem, response, style, tries, truth)


def index_order_outcome(problem: Problem) -> tuple[str, bool]:
    """(how the relay in index order ends (OUTCOMES), whether another order has a valid plan):
    what a trace that always starts with A0 and writes the other order when a run fails (a
    retry) would meet. The first outcome is "valid" exactly when `relay` returns index order;
    the second is True for a valid index order too when another order is also valid."""
    how = attempt(problem, range(problem.num_agents))[2]
    orders = itertools.islice(_orders(problem.num_agents), 1, None)
    return how, any(plan_in_order(problem, o) is not None for o in orders)


def orders_table(problems: Sequence[Problem]) -> str:
    """Markdown: per whether a puzzle needs a wait (its label, `Problem.needs_wait`), how the
    relay in index order ends (`index_order_outcome`) and how many of its failures another
    order solves, so what a trace that retries would reach against one that must choose its
    first agent. A ValueError names a puzzle without the label."""
    if unlabelled := [p.id for p in problems if p.needs_wait is None]:
        raise ValueError(
            f"{len(unlabelled)} puzzle(s) without a needs_wait label, e.g. {unlabelled[0]!r}: "
            "label them with the oracle first (env.io writes it)"
        )
    needs_wait = [bool(p.needs_wait) for p in problems]
    outcomes = [index_order_outcome(p) for p in problems]
    rows = []
    for label, keep in (("no", False), ("yes", True), ("all", None)):
        got = [o for o, nw in zip(outcomes, needs_wait, strict=True) if keep in (None, nw)]
        n = len(got)
        if not n:
            continue
        cells = [label, str(n)]
        for how in OUTCOMES:
            k = sum(o == how for o, _ in got)
            fixed = sum(o == how and b for o, b in got)
            cells.append(str(k) if how == "valid" else f"{k} ({fixed})")
        for hits in ([o == "valid" for o, _ in got], [o == "valid" or b for o, b in got]):
            cells.append(stats.interval_text(stats.proportion(hits)))
        rows.append(cells)
    head = ["needs a wait", "puzzles", "index order valid"]
    head += [f"{how} (another order valid)" for how in OUTCOMES[1:]]
    head += ["index order valid %", "with a retry: some order valid %"]
    return stats.markdown_table(head, rows)


def plan_from(problem: Problem, agent: int) -> list[list[int]] | None:
    """The first valid relay plan (as `relay`) among the orders that run `agent` first; None
    when no order starting with it has one (a trace that starts with it cannot be right)."""
    others = [i for i in range(problem.num_agents) if i != agent]
    orders = ((agent, *rest) for rest in itertools.permutations(others))
    for order in itertools.islice(orders, MAX_ORDERS):
        if (plans := plan_in_order(problem, order)) is not None:
            return plans
    return None


def first_departure(
    problem: Problem, plans: Sequence[Sequence[int]], order: Sequence[int]
) -> tuple[int, int] | None:
    """(agent, step) of the first action of `plans`, written in `order`, that the rule does not
    allow given the runs written before it (any move one step closer counts, not only the
    first); a run that stops where the rule goes on, or goes on where it ends, departs at its
    end. None when every run keeps the rule."""
    for n_before, i in enumerate(order):
        allowed, _ = _rule(problem, i, [(j, list(plans[j])) for j in order[:n_before]])
        here = tuple(int(v) for v in problem.starts[i])
        for k, a in enumerate([*plans[i], None], 1):
            choices = allowed(here, k)
            if a is None:
                if choices is not None:
                    return i, k
                break
            if choices is None or int(a) not in choices:
                return i, k
            here = step(here, int(a))
    return None


def first_agent(response: str) -> int | None:
    """The agent whose run a response's relay trace writes first (None without a relay line):
    the one choice of the trace that no line decides."""
    for line in (thinking_text(response) or "").splitlines():
        if m := RELAY_LINE.match(line.strip()):
            return int(m.group(2))
    return None


# Where a response's relay trace first goes wrong (`check`).
CHECKS = ("right", "header", "retry", "first run", "later run", "rule", "unreadable", "missing")
# What the first wrong line of a relay run gets wrong (`line_error`): the agent's cell (or the
# step label), a `where` field, the `taken` mark after its own cell, a neighbour's `taken`
# mark left out or written where the cell is free, what a neighbour holds otherwise, the
# action's target, or a line missing, left over or cut short.
LINE_FIELDS = ("cell", "where", "own mark", "mark missed", "mark added", "content", "target",
               "length")  # fmt: skip


def _first_wrong_line(problem: Problem, response: str):
    """(verdict, got, want) for a response's relay trace: verdict one of CHECKS; got and want
    are the first line that differs from the true line and that true line in "header", "first
    run" and "later run", else ""."""
    body = thinking_text(response)
    if body is None:
        return "missing", "", ""
    plans, order = parse_relay(body, problem.num_agents)
    if plans is None and order != NO_ORDER:
        return ("unreadable" if order else "missing"), "", ""
    tries, truth = _truths(problem, body)
    lines = true_lines(problem, body, tries=tries, truth=truth)
    if lines is None:  # ends on `no order left` where the rule fails in a way no line shows
        return "retry", NO_ORDER, ""
    got, want = lines
    header = len(render_header(problem, detect_style(body)))
    # a retrying trace's failed attempts end on the truth's last retry line
    final = max((k + 1 for k, x in enumerate(want) if RETRY_LINE.match(x)), default=header)
    for k, (a, b) in enumerate(zip([*got, ""], [*want, ""], strict=False)):
        if a != b:
            if k < header:
                return "header", a, b
            if k < final or plans is None:
                return "retry", a, b
            run = "first run" if k - final < len(plans[order[0]]) else "later run"
            return run, a, b
    if plans is None:  # every order failed, as the rule's did
        return "right", "", ""
    order = [*order, *(i for i in range(problem.num_agents) if i not in order)]
    return ("right" if first_departure(problem, plans, order) is None else "rule"), "", ""


def check(problem: Problem, response: str) -> str:
    """Where a response's relay trace first goes wrong (see CHECKS): "missing" (no think block
    or no relay line), "unreadable" (`trace.parse_relay` fails), a line that is not the true
    line of the plan it writes: in the map and agents' lines ("header"), a failed attempt of a
    trace that retries or its retry line ("retry", against the rule's attempts), the run of
    the agent written first ("first run") or a later one ("later run"); "rule" when every line
    is right but an action is not the rule's (`first_departure`); else "right"."""
    return _first_wrong_line(problem, response)[0]


def line_error(problem: Problem, response: str) -> tuple[str, str] | None:
    """(run, field) where a relay trace's first wrong line is in a run ("first run" or "later
    run", as `check` says) and the first field of it that differs from the true line (see
    LINE_FIELDS); None when `check` finds no wrong line in a run."""
    run, got, want = _first_wrong_line(problem, response)
    if run not in ("first run", "later run"):
        return None
    g, w = got.split(" "), want.split(" ")
    j = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), None)
    if j is None or not got or not want:  # a line missing or left over (a blank one counts)
        return run, "length"
    # the own cell's mark stands just before the first move (UP, or = when none is written)
    mark = next((k for k, x in enumerate(w) if x in ("UP", "=")), len(w))
    mark -= w[mark - 1] == TAKEN
    taken = TAKEN in (g[j], w[j])
    if j < 4:  # tK A<i> (r, c)
        field = "cell"
    elif j < mark:
        field = "where"
    elif j == mark and taken:
        field = "own mark"
    elif taken:
        field = "mark missed" if w[j] == TAKEN else "mark added"
    else:
        field = "target" if "=" in w[:j] else "content"
    return run, field
