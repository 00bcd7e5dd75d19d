"""CBS oracle against a brute-force joint-state Dijkstra and an independent plan checker."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mapfjax.env import joint, oracle
from mapfjax.env.types import Problem, ProblemError

MOVES = {0: (0, 0), 1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


def make(grid, starts, goals, pid="t"):
    return Problem(pid, tuple(grid), tuple(map(tuple, starts)), tuple(map(tuple, goals)))


def brute_soc(p: Problem) -> int | None:
    """Optimal sum-of-costs by Dijkstra over (positions, finished flags); None if unsolvable.

    A finished agent stands on its goal and never moves again; a step costs the number of
    unfinished agents, so an agent pays exactly the steps before it settles on its goal.
    """
    h, w, k = p.height, p.width, p.num_agents

    def free(r, c):
        return 0 <= r < h and 0 <= c < w and p.grid[r][c] == "F"

    def options(cell):
        return [
            (cell[0] + dr, cell[1] + dc)
            for dr, dc in MOVES.values()
            if free(*cell) and free(cell[0] + dr, cell[1] + dc)
        ]

    start = (tuple(p.starts), (False,) * k)
    best = {start: 0}
    heap = [(0, start)]
    while heap:
        d, state = heapq.heappop(heap)
        if d > best[state]:
            continue
        pos, fin = state
        if all(fin):
            return d
        nexts = []
        for a in range(k):
            if not fin[a] and pos[a] == p.goals[a]:
                nexts.append(((pos, fin[:a] + (True,) + fin[a + 1 :]), d))
        step = k - sum(fin)
        choices = [[pos[a]] if fin[a] else options(pos[a]) for a in range(k)]
        for new in itertools.product(*choices):
            if len(set(new)) < k:
                continue
            swap = any(
                new[a] == pos[b] and new[b] == pos[a] and new[a] != pos[a]
                for a in range(k)
                for b in range(a + 1, k)
            )
            if not swap:
                nexts.append(((tuple(new), fin), d + step))
        for s, nd in nexts:
            if nd < best.get(s, 1 << 30):
                best[s] = nd
                heapq.heappush(heap, (nd, s))
    return None


def simulate(p: Problem, actions) -> tuple[int, int]:
    """Play per-agent action lists (a finished list means standing still); assert validity.

    Returns (sum-of-costs, makespan) with cost = first step from which the agent stays on goal.
    """
    k = p.num_agents
    horizon = max(len(a) for a in actions)
    traj = [list(p.starts)]
    for t in range(horizon):
        prev = traj[-1]
        cur = []
        for a in range(k):
            dr, dc = MOVES[actions[a][t]] if t < len(actions[a]) else (0, 0)
            r, c = prev[a][0] + dr, prev[a][1] + dc
            assert 0 <= r < p.height and 0 <= c < p.width, f"agent {a} leaves the map at {t + 1}"
            assert p.grid[r][c] == "F", f"agent {a} falls into a hole at step {t + 1}"
            cur.append((r, c))
        assert len(set(cur)) == k, f"vertex conflict at step {t + 1}: {cur}"
        for a in range(k):
            for b in range(a + 1, k):
                assert not (cur[a] == prev[b] and cur[b] == prev[a] and cur[a] != prev[a]), (
                    f"edge conflict between {a} and {b} at step {t + 1}"
                )
        traj.append(cur)
    costs = []
    for a in range(k):
        assert traj[-1][a] == p.goals[a], f"agent {a} ends at {traj[-1][a]}, not its goal"
        c = horizon
        while c > 0 and traj[c - 1][a] == p.goals[a]:
            c -= 1
        costs.append(c)
    return sum(costs), max(costs)


def check_solution(p: Problem, sol: oracle.Solution) -> None:
    """The reported plan is valid, its costs match the report, and paths match actions."""
    assert sol.status == "optimal"
    soc, makespan = simulate(p, sol.actions)
    assert (soc, makespan) == (sol.soc, sol.makespan)
    for a in range(p.num_agents):
        path, acts = sol.paths[a], sol.actions[a]
        assert len(path) == len(acts) + 1 and path[0] == p.starts[a] and path[-1] == p.goals[a]
        for (r0, c0), (r1, c1), act in zip(path, path[1:], acts):
            assert (r1 - r0, c1 - c0) == MOVES[act]
        # Trimmed to the agent's own cost: the last action brings it onto the goal for good.
        assert len(acts) == 0 or path[-2] != p.goals[a]


def random_problem(rng, h, w, k, hole_ratio):
    cells = [(r, c) for r in range(h) for c in range(w)]
    holes = set(rng.sample(cells, int(hole_ratio * h * w)))
    free = [x for x in cells if x not in holes]
    if len(free) < k:
        return None
    grid = ["".join("H" if (r, c) in holes else "F" for c in range(w)) for r in range(h)]
    return make(grid, rng.sample(free, k), rng.sample(free, k), pid=f"r{h}x{w}")


def compare(p: Problem):
    sol = oracle.solve(p)
    expected = brute_soc(p)
    if expected is None:
        assert sol.status == "unsolvable", (p, sol)
        assert sol.soc is None and sol.actions is None
    else:
        assert sol.status == "optimal", (p, sol)
        assert sol.soc == expected, (p, sol.soc, expected)
        check_solution(p, sol)
    return sol


def cells(p: Problem):
    """(map, start cells, goal cells) in the oracle's internal cell numbering."""
    m = joint.GridMap(p.grid)
    return m, tuple(m.cell(s) for s in p.starts), tuple(m.cell(g) for g in p.goals)


def tiny_sample(seed, n, k, max_h=4, max_w=4):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        h, w = rng.randint(1, max_h), rng.randint(2, max_w)
        p = random_problem(rng, h, w, k, rng.choice([0.0, 0.1, 0.2, 0.3]))
        if p is not None:
            out.append(p)
    return out


# ---------------------------------------------------------------- against the brute force


@pytest.mark.parametrize("k", [2, 3, 4])
def test_random_tiny_instances_match_brute_force(k):
    n, max_h, max_w = {2: (150, 4, 4), 3: (70, 4, 3), 4: (12, 3, 3)}[k]
    sample = tiny_sample(1234 + k, n, k, max_h, max_w)
    statuses, methods, waited = [], set(), 0
    for p in sample:
        sol = compare(p)
        statuses.append(sol.status)
        methods.add(sol.method)
        if sol.optimal:
            waited += sol.soc > sum(oracle.shortest_path_lengths(p))
    # The sample must exercise both outcomes, interacting agents and unsolvability proofs
    # beyond unreachable goals ("pairs"), or it proves little.
    assert set(statuses) == {"optimal", "unsolvable"}
    assert waited >= 3 and "pairs" in methods


def test_cbs_alone_matches_brute_force(monkeypatch):
    """CBS without the joint-state search: optimal on every solvable instance."""
    monkeypatch.setattr(oracle, "_JOINT_AFTER", 10**9)
    methods = set()
    for p in tiny_sample(5, 90, 2) + tiny_sample(6, 40, 3, 3, 3):
        expected = brute_soc(p)
        if expected is None:
            continue
        sol = oracle.solve(p, max_nodes=20_000)
        assert sol.soc == expected, (p, sol)
        check_solution(p, sol)
        methods.add(sol.method)
    assert methods == {"cbs"}


@pytest.mark.parametrize("tables", [False, True])
def test_joint_search_alone_matches_brute_force(tables):
    """The joint-state A*, with and without its two-agent cost tables, decides everything."""
    for p in tiny_sample(9, 50, 2) + tiny_sample(10, 40, 3, 3, 3) + tiny_sample(11, 6, 4, 2, 3):
        m, s, g = cells(p)
        if any(m.dist(gg)[ss] >= joint.INF for ss, gg in zip(s, g)):
            continue
        search = joint.JointSearch(m, s, g, pair_tables=tables)
        status, paths = search.run(10**7, float("inf"))
        sol = oracle._finish(m, 0.0, status, paths, 0, "joint")
        expected = brute_soc(p)
        if expected is None:
            assert status == "unsolvable"
        else:
            assert sol.soc == expected, (p, sol)
            check_solution(p, sol)


def test_pair_tables_are_exact_two_agent_costs():
    for p in tiny_sample(12, 40, 2):
        m, s, g = cells(p)
        table = joint.pair_table(m, g[0], g[1])
        value = table[(s[0] * m.n + s[1]) * 4]
        expected = brute_soc(p)
        assert value == (joint.INF if expected is None else expected), p


def test_three_agents_on_4x4_with_holes_match_brute_force():
    rng = random.Random(7)
    for _ in range(6):
        compare(random_problem(rng, 4, 4, 3, 0.25))


# Found by random search: each has cardinal conflicts chained through one agent, so an
# inadmissible CBS lower bound (e.g. counting cardinal pairs instead of a vertex cover) fails.
CHAINED = [
    (["FFFF", "FFFF"], [(1, 0), (0, 2), (1, 1)], [(1, 2), (1, 1), (1, 0)]),
    (["HFFH", "FHFF", "FFFF"], [(1, 2), (2, 1), (0, 2)], [(1, 0), (0, 2), (2, 2)]),
    (["FFF", "FFF"], [(0, 0), (1, 1), (1, 2), (0, 2)], [(1, 1), (1, 0), (0, 1), (1, 2)]),
    (["FFFF", "FFHF"], [(0, 2), (1, 0), (0, 3)], [(0, 2), (1, 3), (0, 0)]),
]


@pytest.mark.parametrize("case", CHAINED)
def test_chained_cardinal_conflicts_match_brute_force(case):
    compare(make(*case))


@st.composite
def tiny_problems(draw):
    h, w = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    holes = draw(st.lists(st.booleans(), min_size=h * w, max_size=h * w))
    free = [(r, c) for r in range(h) for c in range(w) if not holes[r * w + c]]
    assume(free)
    k = draw(st.integers(1, min(3, len(free))))
    starts = draw(st.permutations(free))[:k]
    goals = draw(st.permutations(free))[:k]
    grid = ["".join("H" if holes[r * w + c] else "F" for c in range(w)) for r in range(h)]
    return make(grid, starts, goals, pid="hyp")


@settings(max_examples=80, deadline=None)
@given(tiny_problems())
def test_hypothesis_instances_match_brute_force(p):
    compare(p)


# ---------------------------------------------------------------- hand-made cases

POCKET = ["FFFFF", "HHFHH"]  # a corridor with one side pocket below its middle


def test_corridor_swap_is_unsolvable():
    p = make(["FFFF"], [(0, 0), (0, 3)], [(0, 3), (0, 0)])
    sol = oracle.solve(p)
    assert sol.status == "unsolvable" and sol.soc is None
    assert brute_soc(p) is None


def test_corridor_with_pocket_needs_a_detour_and_a_wait():
    # One agent ducks into the pocket (2 extra moves), the other waits once: 4 + 4 + 3.
    p = make(POCKET, [(0, 0), (0, 4)], [(0, 4), (0, 0)])
    sol = oracle.solve(p)
    check_solution(p, sol)
    assert (sol.soc, sol.makespan) == (11, 6)
    assert brute_soc(p) == 11
    assert sorted(len(a) for a in sol.actions) == [5, 6]


def test_unreachable_goal_is_unsolvable_immediately():
    p = make(["FHF", "FHF"], [(0, 0), (1, 0)], [(0, 2), (1, 0)])
    sol = oracle.solve(p)
    assert sol.status == "unsolvable" and sol.nodes == 0
    with pytest.raises(ValueError, match="agent 0"):
        oracle.shortest_path_lengths(p)


def test_budgets_give_timeout():
    p = make(POCKET, [(0, 0), (0, 4)], [(0, 4), (0, 0)])
    sol = oracle.solve(p, max_nodes=1)
    assert sol.status == "timeout" and sol.nodes == 1 and sol.soc is None
    assert oracle.solve(p, time_limit=0.0).status == "timeout"
    assert oracle.solve(p, max_nodes=100).status == "optimal"


def test_agent_on_its_goal_steps_aside_for_a_later_passer():
    # Agent 0 starts on its goal in the only passage; agent 1 must cross it.
    p = make(["FFF", "HFH"], [(0, 1), (0, 0)], [(0, 1), (0, 2)])
    sol = oracle.solve(p)
    check_solution(p, sol)
    assert sol.soc == brute_soc(p) == 4
    assert sol.paths[0] == ((0, 1), (1, 1), (0, 1))
    labelled, _ = oracle.label(p)
    assert (labelled.optimal_soc, labelled.optimal_makespan, labelled.needs_wait) == (4, 2, True)


def test_agent_that_arrived_first_leaves_its_goal_for_a_passer():
    # Agent 0 reaches its goal (0, 2) at t=1, but agent 1 crosses it at t=2 on the way to
    # (0, 4): agent 0 ducks into the pocket and returns, cost 3 instead of 1.
    p = make(POCKET, [(0, 3), (0, 0)], [(0, 2), (0, 4)])
    sol = oracle.solve(p)
    check_solution(p, sol)
    assert sol.soc == brute_soc(p) == 7
    assert sol.paths[0] == ((0, 3), (0, 2), (1, 2), (0, 2))


def test_single_agent_and_no_interaction():
    p = make(["FFF", "FFF"], [(0, 0), (1, 2)], [(1, 2), (1, 0)])
    sol = oracle.solve(p)
    check_solution(p, sol)
    assert sol.soc == sum(oracle.shortest_path_lengths(p)) == 5
    labelled, _ = oracle.label(p)
    assert labelled.needs_wait is False
    still = oracle.solve(make(["F"], [(0, 0)], [(0, 0)]))
    assert (still.status, still.soc, still.makespan, still.actions) == ("optimal", 0, 0, ((),))


def test_malformed_problem_is_rejected():
    with pytest.raises(ProblemError, match="hole"):
        oracle.solve(make(["FH"], [(0, 1)], [(0, 0)]))


# ---------------------------------------------------------------- larger maps, API


def test_five_agents_on_8x8_plans_are_valid_and_deterministic():
    rng = random.Random(3)
    solved = 0
    for _ in range(8):
        p = random_problem(rng, 8, 8, 5, 0.2)
        sol = oracle.solve(p, time_limit=20.0)
        again = oracle.solve(p, time_limit=20.0)
        assert dataclasses.replace(sol, seconds=0) == dataclasses.replace(again, seconds=0)
        if sol.optimal:
            solved += 1
            check_solution(p, sol)
            assert sol.soc >= sum(oracle.shortest_path_lengths(p))
    assert solved >= 4


def test_label_leaves_unsolved_problems_unchanged():
    p = make(["FFFF"], [(0, 0), (0, 3)], [(0, 3), (0, 0)])
    labelled, sol = oracle.label(p, max_nodes=5)
    assert labelled is p and sol.status == "timeout"


def test_answer_actions_pads_with_wait():
    p = make(POCKET, [(0, 0), (0, 4)], [(0, 4), (0, 0)])
    sol = oracle.solve(p)
    acts = oracle.answer_actions(sol)
    assert [len(a) for a in acts] == [len(a) for a in sol.actions]
    padded = oracle.answer_actions(sol, pad_to=8)
    assert all(len(a) == 8 for a in padded)
    assert all(a[len(b) :] == [0] * (8 - len(b)) for a, b in zip(padded, acts))
    assert simulate(p, padded) == (sol.soc, sol.makespan)
    with pytest.raises(ValueError, match="makespan"):
        oracle.answer_actions(sol, pad_to=3)
    with pytest.raises(ValueError, match="timeout"):
        oracle.answer_actions(oracle.solve(p, max_nodes=1))


@pytest.mark.slow
def test_solve_many_matches_in_process_results():
    rng = random.Random(11)
    problems = [random_problem(rng, 5, 5, rng.choice([2, 3]), 0.2) for _ in range(12)]
    one = oracle.solve_many(problems, processes=1)
    two = oracle.solve_many(problems, processes=2, progress=True)
    again = oracle.solve_many(problems[::-1], processes=2)  # the pool is reused
    strip = [dataclasses.replace(s, seconds=0.0) for s in one]
    assert [dataclasses.replace(s, seconds=0.0) for s in two] == strip
    assert [dataclasses.replace(s, seconds=0.0) for s in again] == strip[::-1]
    assert [s.soc for s in one] == [oracle.solve(p).soc for p in problems]
    with pytest.raises(ValueError, match="processes"):
        oracle.solve_many(problems, processes=0)


def _worker_platforms(_) -> str:
    import jax

    return jax.config.jax_platforms


@pytest.mark.slow
def test_oracle_workers_stay_on_the_host(monkeypatch):
    # On a GPU machine a worker that started its own CUDA client ran out of memory beside the
    # parent's: the pool's workers are pinned to the CPU, whatever the environment says (the
    # test suite's JAX_PLATFORMS=cpu would otherwise reach the spawned workers by inheritance).
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    oracle._drop_pools()  # a fresh pool, spawned with this environment
    try:
        assert oracle._pool(2).map(_worker_platforms, range(4)) == ["cpu"] * 4
    finally:
        oracle._drop_pools()  # later tests spawn theirs with the suite's environment
