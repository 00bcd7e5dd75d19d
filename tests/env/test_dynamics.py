"""The jitted verifier and step function against the plain-Python reference simulator."""

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.env import dynamics, reward, simulate, text, types

MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


@st.composite
def problems(draw, max_side=6, max_agents=5):
    h = draw(st.integers(2, max_side))
    w = draw(st.integers(2, max_side))
    cells = [(r, c) for r in range(h) for c in range(w)]
    n = draw(st.integers(1, min(max_agents, len(cells) // 2)))
    order = draw(st.permutations(cells))
    starts, goals = order[:n], order[n : 2 * n]
    if draw(st.booleans()) and n > 1:  # a start may coincide with another agent's goal
        goals = [starts[1]] + list(goals[1:]) if starts[1] not in goals else goals
    used = set(starts) | set(goals)
    grid = [
        "".join(
            "H" if (r, c) not in used and draw(st.floats(0, 1)) < 0.25 else "F" for c in range(w)
        )
        for r in range(h)
    ]
    return types.Problem("p", tuple(grid), tuple(starts), tuple(goals))


def bfs_actions(p: types.Problem, i: int):
    """One shortest single-agent action list (ignoring other agents), or None."""
    start, goal = p.starts[i], p.goals[i]
    prev = {start: None}
    q = collections.deque([start])
    while q:
        cur = q.popleft()
        if cur == goal:
            break
        for a, (dr, dc) in MOVES.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < p.height and 0 <= nxt[1] < p.width and p.grid[nxt[0]][nxt[1]] == "F":
                if nxt not in prev:
                    prev[nxt] = (cur, a)
                    q.append(nxt)
    if goal not in prev:
        return None
    acts, cur = [], goal
    while prev[cur] is not None:
        cur, a = prev[cur]
        acts.append(a)
    return acts[::-1]


@st.composite
def problem_and_plan(draw):
    p = draw(problems())
    kind = draw(st.sampled_from(["random", "shortest", "shortest_corrupted", "parse_error"]))
    if kind == "parse_error":
        return p, None
    plan = []
    for i in range(p.num_agents):
        acts = bfs_actions(p, i) if kind != "random" else None
        if acts is None:
            acts = draw(st.lists(st.integers(0, 4), max_size=12))
        if kind == "shortest_corrupted" and acts and draw(st.booleans()):
            k = draw(st.integers(0, len(acts) - 1))
            acts = acts[:k] + [draw(st.integers(0, 4))] + acts[k + 1 :]
        if draw(st.integers(0, 4)) == 0:
            acts = [0] * draw(st.integers(1, 3)) + acts  # waits shift timing: conflicts change
        plan.append(acts)
    return p, plan


def run_verify(probs, plans, labels=None):
    t = max([8, *(len(a) for pl in plans if pl for a in pl)])
    arr = np.zeros((len(probs), types.MAX_AGENTS, t), np.int32)
    ok = np.array([pl is not None for pl in plans])
    lengths = np.zeros((len(probs), types.MAX_AGENTS), np.int32)
    for b, pl in enumerate(plans):
        for i, acts in enumerate(pl or []):
            arr[b, i, : len(acts)] = acts
            lengths[b, i] = len(acts)
    inst = types.to_instances(probs)
    if labels is not None:
        inst = inst.replace(optimal_soc=np.asarray(labels, np.int32))
    return dynamics.verdict_rows(dynamics.verify(inst, arr, ok, lengths))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(problem_and_plan(), min_size=1, max_size=8))
def test_verify_matches_reference_simulator(cases):
    probs = [p for p, _ in cases]
    plans = [pl for _, pl in cases]
    rows = run_verify(probs, plans)
    for (p, pl), row in zip(cases, rows, strict=True):
        ref = simulate.simulate(p, pl)
        got = {k: row[k] for k in ("valid", "failure", "soc", "makespan")}
        want = {k: ref[k] for k in ("valid", "failure", "soc", "makespan")}
        assert got == want, (p, pl, row, ref)
        if ref["failure"] not in (None, "parse_error"):
            assert row["failure_time"] == ref["failure_time"], (p, pl)
            assert row["failure_agent"] == ref["failure_agent"], (p, pl)


def P(grid, starts, goals, **kw):
    return types.Problem("x", tuple(grid), tuple(starts), tuple(goals), **kw)


def test_hand_cases_each_failure_and_precedence():
    corridor = P(["FFF"], [(0, 0), (0, 2)], [(0, 2), (0, 0)])
    cases = [
        (corridor, [[4, 4], [3, 3]], "vertex_conflict", 1, 0),  # meet in the middle at t=1
        (P(["FF"], [(0, 0), (0, 1)], [(0, 1), (0, 0)]), [[4], [3]], "edge_conflict", 1, 0),
        (P(["FF"], [(0, 0)], [(0, 1)]), [[1]], "illegal_move", 1, 0),
        (P(["FH", "FF"], [(0, 0)], [(1, 1)]), [[4, 2]], "hole", 1, 0),
        (P(["FFF"], [(0, 0)], [(0, 2)]), [[4]], "goal_not_reached", 1, 0),
        # illegal move beats a vertex conflict of other agents in the same step
        (
            P(["FFF", "FFF"], [(0, 0), (0, 2), (1, 0)], [(0, 1), (0, 1), (1, 0)]),
            [[4], [3], [2]],
            "illegal_move",
            1,
            2,
        ),
        # following is allowed: agent 1 enters the cell agent 0 leaves
        (P(["FFF"], [(0, 1), (0, 0)], [(0, 2), (0, 1)]), [[4], [4]], None, -1, -1),
        # 3-agent rotation on a 2x2 block is allowed
        (
            P(["FF", "FF"], [(0, 0), (0, 1), (1, 1)], [(0, 1), (1, 1), (1, 0)]),
            [[4], [2], [3]],
            None,
            -1,
            -1,
        ),
    ]
    rows = run_verify([c[0] for c in cases], [c[1] for c in cases])
    for (p, plan, fail, t, agent), row in zip(cases, rows, strict=True):
        assert (row["failure"], row["failure_time"], row["failure_agent"]) == (fail, t, agent)
        assert simulate.simulate(p, plan)["failure"] == fail


def test_costs_count_time_until_staying_on_goal():
    # agent 0 reaches its goal at t=1, steps off and back (t=3): cost 3; agent 1 waits: 0.
    p = P(["FFF", "FFF"], [(0, 0), (1, 2)], [(0, 1), (1, 2)], optimal_soc=1)
    rows = run_verify([p, p], [[[4, 2, 1], []], [[4], [0, 0, 0]]], labels=[1, 1])
    assert (rows[0]["soc"], rows[0]["makespan"], rows[0]["optimal"]) == (3, 3, False)
    assert (rows[1]["soc"], rows[1]["makespan"], rows[1]["optimal"]) == (1, 1, True)


def test_parse_error_and_unlabelled():
    p = P(["FF"], [(0, 0)], [(0, 1)])
    rows = run_verify([p, p], [None, [[4]]])
    assert rows[0]["failure"] == "parse_error" and not rows[0]["valid"]
    assert rows[1]["valid"] and rows[1]["optimal"] is None


def test_step_rollout_equals_verify():
    p = P(["FFFF", "FHFF", "FFFF"], [(0, 0), (2, 3)], [(2, 0), (0, 3)])
    plan = np.array([[2, 0, 2, 0], [1, 1, 0, 0]], np.int32)
    inst = jax.tree.map(lambda x: x[0], types.to_instances([p], max_agents=2))
    state = dynamics.reset(inst)
    step = jax.jit(dynamics.step)
    for t in range(plan.shape[1]):
        state = step(inst, state, jnp.asarray(plan[:, t]))
    assert np.array_equal(np.asarray(state.pos), np.array(p.goals))
    assert int(state.failure) == types.NO_FAILURE and int(state.t) == 4
    # a failing step is latched: later steps change nothing
    bad = step(inst, dynamics.reset(inst), jnp.array([3, 0]))
    after = step(inst, bad, jnp.array([2, 0]))
    assert int(bad.failure) == types.ILLEGAL_MOVE
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), bad, after))


def test_mixed_sizes_do_not_recompile(monkeypatch):
    rng = np.random.default_rng(0)
    chex.clear_trace_counter()
    once = jax.jit(chex.assert_max_traces(dynamics._verify_batch.__wrapped__, n=1))
    monkeypatch.setattr(dynamics, "_verify_batch", once)
    for trial in range(4):
        probs = []
        for _ in range(16):
            s = int(rng.integers(3, 11))
            h, w = (s, s) if trial % 2 else (s, int(rng.integers(3, 11)))
            n = int(rng.integers(1, min(6, h * w // 2 + 1)))
            cells = rng.permutation(h * w)[: 2 * n]
            probs.append(
                P(
                    ["F" * w] * h,
                    [divmod(int(c), w) for c in cells[:n]],
                    [divmod(int(c), w) for c in cells[n:]],
                )
            )
        plans = np.asarray(rng.integers(0, 5, (16, 5, 16)), np.int32)
        verdict = dynamics.verify(types.to_instances(probs), plans)  # a retrace would raise
        assert verdict.failure.shape == (16,)
    assert once._cache_size() == 1


def test_step_rollouts_of_every_size_share_one_trace():
    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(dynamics.step, n=1))
    for side, n in [(3, 1), (6, 3), (10, 5)]:
        p = P(["F" * side] * side, [(0, c) for c in range(n)], [(side - 1, c) for c in range(n)])
        inst = jax.tree.map(lambda x: x[0], types.to_instances([p]))
        state = dynamics.reset(inst)
        for _ in range(side - 1):  # every agent walks down its column
            state = step(inst, state, jnp.full(types.MAX_AGENTS, types.DOWN, jnp.int32))
        assert int(state.failure) == types.NO_FAILURE
        assert np.array_equal(np.asarray(state.pos[:n]), np.array(p.goals))


def test_shape_checks_at_the_boundaries():
    p = P(["FFF"], [(0, 0)], [(0, 2)])
    batch = types.to_instances([p, p])
    one = jax.tree.map(lambda x: x[0], batch)
    with pytest.raises(AssertionError):  # an [N] action vector of the wrong length
        dynamics.step(one, dynamics.reset(one), jnp.zeros(3, jnp.int32))
    with pytest.raises(AssertionError):  # a batch where one instance is expected
        dynamics.step(batch, dynamics.reset(one), jnp.zeros(5, jnp.int32))
    plans = np.zeros((2, 1, 4), np.int32)
    with pytest.raises(AssertionError):  # goals of another agent count than the mask
        dynamics.verify(batch.replace(goals=batch.goals[:, :3]), plans)
    with pytest.raises(AssertionError):  # ok for three plans, two instances
        dynamics.verify(batch, plans, ok=np.ones(3, bool))
    with pytest.raises(AssertionError):  # lengths without the batch axis
        dynamics.verify(batch, plans, lengths=np.ones(1, np.int32))


def test_reward_function():
    p = P(["FF"], [(0, 0)], [(0, 1)], optimal_soc=1)
    inst = types.to_instances([p] * 4)
    plans = np.array([[[4]], [[0, 4]], [[3]], [[4]]], dtype=object)
    arr = np.zeros((4, 1, 2), np.int32)
    arr[0, 0, 0] = 4
    arr[1, 0, :2] = [0, 4]
    arr[2, 0, 0] = 3
    del plans
    v = dynamics.verify(inst, arr, ok=np.array([True, True, True, False]))
    cfg = reward.RewardConfig(valid_reward=1.0, optimal_bonus=0.5, format_penalty=0.25)
    np.testing.assert_allclose(np.asarray(reward.rewards(v, cfg)), [1.5, 1.0, 0.0, -0.25])


def _random_case(rng, side, n, t, codes):
    """A random problem (side x side, n agents) and n random action lists of length t."""
    cells = rng.permutation(side * side)
    holes = set(cells[2 * n : 2 * n + side * side // 5].tolist())
    grid = [
        "".join("H" if r * side + c in holes else "F" for c in range(side)) for r in range(side)
    ]
    starts = [divmod(int(c), side) for c in cells[:n]]
    goals = [divmod(int(c), side) for c in cells[n : 2 * n]]
    # mostly waits so that some plans survive long enough to fail in later chunks of steps
    plan = np.where(rng.random((n, t)) < 0.7, 0, rng.integers(codes[0], codes[1], (n, t)))
    return P(grid, starts, goals), plan.astype(np.int32)


def test_verify_wide_dtypes_invalid_codes_and_padding_match_simulator():
    """Paths the hypothesis test does not reach: int32 cells (padding > 62), int32 keys (long
    plans), more than 8 or 16 agent slots, invalid action codes, lengths not a multiple of the
    transposed chunk, and garbage actions in padded agent slots (which must be ignored)."""
    rng = np.random.default_rng(0)
    for side, pad_side, n, slots, t, codes in [
        (6, 70, 3, 9, 13, (-2, 7)),
        (4, 10, 2, 5, 300, (0, 5)),
        (5, 10, 4, 5, 1, (-1, 6)),
        (3, 10, 1, 2, 21, (0, 5)),
        (4, 10, 2, 17, 9, (0, 5)),  # more slots than the padded row stride
    ]:
        cases = [_random_case(rng, side, int(rng.integers(1, n + 1)), t, codes) for _ in range(64)]
        plans = rng.integers(-3, 9, (len(cases), slots, t)).astype(np.int32)  # garbage slots
        for b, (p, plan) in enumerate(cases):
            plans[b, : p.num_agents] = plan
        inst = types.to_instances([p for p, _ in cases], max_size=pad_side, max_agents=slots)
        rows = dynamics.verdict_rows(dynamics.verify(inst, plans))
        kinds = collections.Counter()
        for (p, plan), row in zip(cases, rows, strict=True):
            ref = simulate.simulate(p, plan.tolist())
            keys = ("failure", "failure_time", "failure_agent", "soc", "makespan")
            assert {k: row[k] for k in keys} == {k: ref[k] for k in keys}, (side, t, p, plan)
            kinds[ref["failure"]] += 1
        assert len(kinds) >= 2, kinds  # the cases are not all alike


def test_verify_early_exit_keeps_a_late_failure():
    """All plans but one fail at step 1; the loop must run on for the survivor, whose conflict
    at step 19 lies in the third chunk of transposed steps."""
    corridor = P(["F" * 12], [(0, 0), (0, 11)], [(0, 11), (0, 0)])
    wall = P(["FF"], [(0, 0)], [(0, 1)])
    late = [[0] * 13 + [4] * 11, [0] * 13 + [3] * 11]  # they meet in the middle
    probs = [corridor] + [wall] * 7
    plans = np.zeros((8, 2, 24), np.int32)
    plans[0] = late
    plans[1:, 0, 0] = 1  # UP off the map at step 1
    rows = dynamics.verdict_rows(dynamics.verify(types.to_instances(probs, max_agents=2), plans))
    ref = simulate.simulate(corridor, late)
    assert (rows[0]["failure"], rows[0]["failure_time"]) == (ref["failure"], ref["failure_time"])
    assert ref["failure_time"] > 16 and ref["failure"] in ("vertex_conflict", "edge_conflict")
    assert all(r["failure"] == "illegal_move" and r["failure_time"] == 1 for r in rows[1:])


def test_reference_simulator_names_every_agent_and_cell_of_the_first_failure():
    three = P(["FFF", "FHF", "FFF"], [(0, 0), (0, 2), (2, 0)], [(0, 2), (0, 0), (2, 2)])
    cases = [
        # agents 0 and 1 meet in (0, 1); agent 2 moves legally
        ([[4], [3], [4]], "vertex_conflict", (0, 1), ((0, 1), (0, 1))),
        # agents 0 and 1 swap along row 0 at t=2
        ([[4, 4], [0, 3], []], "edge_conflict", (0, 1), ((0, 2), (0, 1))),
        # two agents step off the map at once: both named, each where it stayed
        ([[1], [1], []], "illegal_move", (0, 1), ((0, 0), (0, 2))),
        # an illegal move beats agent 2's hole in the same step
        ([[1], [], [1, 4]], "illegal_move", (0,), ((0, 0),)),
        # agents 0 and 1 both step into the hole at t=2: the hole beats their vertex conflict
        ([[2, 4], [2, 3], []], "hole", (0, 1), ((1, 1), (1, 1))),
        ([[4], [], []], "goal_not_reached", (0, 1, 2), ((0, 1), (0, 2), (2, 0))),
    ]
    for plan, kind, agents, cells in cases:
        r = simulate.simulate(three, plan)
        assert (r["failure"], r["failure_agents"], r["failure_cells"]) == (kind, agents, cells)
        assert r["failure_agent"] == agents[0]
    ok = simulate.simulate(P(["FF"], [(0, 0)], [(0, 1)]), [[4]])
    assert ok["valid"] and ok["failure_agents"] == () and ok["failure_agent"] == -1


def test_reference_simulator_gives_every_agent_cell_at_the_failing_step():
    three = P(["FFF", "FHF", "FFF"], [(0, 0), (0, 2), (2, 0)], [(0, 2), (0, 0), (2, 2)])
    cases = [
        # a vertex conflict: agent 2 is where its legal move took it
        ([[4], [3], [4]], [(0, 1), (0, 1), (2, 1)]),
        # a swap at t=2 after agent 0's first step; agent 2 has no actions and stays
        ([[4, 4], [0, 3], []], [(0, 2), (0, 1), (2, 0)]),
        # illegal moves (off the map, an unknown code) stay put; agent 2's legal UP is shown
        ([[1], [7], [1]], [(0, 0), (0, 2), (1, 0)]),
        ([[2], [2, 3], []], [(1, 0), (1, 1), (2, 0)]),  # agent 1 steps into the hole
    ]
    for plan, want in cases:
        r = simulate.simulate(three, plan)
        assert r["failure_positions"] == want, (plan, r)
        assert len(r["positions"]) == r["failure_time"]  # history stops before the failing step
        assert r["failure_cells"] == tuple(want[i] for i in r["failure_agents"])
    for plan, kind in ((None, "parse_error"), ([[4], [], []], "goal_not_reached")):
        r = simulate.simulate(three, plan)
        assert (r["failure"], r["failure_positions"]) == (kind, None)
    ok = simulate.simulate(P(["FF"], [(0, 0)], [(0, 1)]), [[4]])
    assert ok["valid"] and ok["failure_positions"] is None


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(problem_and_plan(), min_size=1, max_size=6))
def test_agent_credit_matches_each_agent_simulated_alone(cases):
    """reward.agent_success (the shaped reward's share) equals, per answer, the share of
    agents whose own plan the reference simulator accepts with the other agents removed."""
    probs, plans = [c[0] for c in cases], [c[1] for c in cases]
    t = max([8, *(len(a) for pl in plans if pl for a in pl)])
    arr = np.zeros((len(probs), types.MAX_AGENTS, t), np.int32)
    lengths = np.zeros((len(probs), types.MAX_AGENTS), np.int32)
    for b, pl in enumerate(plans):
        for i, acts in enumerate(pl or []):
            arr[b, i, : len(acts)], lengths[b, i] = acts, len(acts)
    parsed = text.ParsedAnswers(arr, lengths, np.array([pl is not None for pl in plans]))
    got = reward.agent_success(types.to_instances(probs), parsed)
    for b, (p, pl) in enumerate(cases):
        want = 0.0
        if pl is not None:
            alone = [
                types.Problem(p.id, p.grid, (p.starts[i],), (p.goals[i],))
                for i in range(p.num_agents)
            ]
            want = np.mean([simulate.simulate(a, [pl[i]])["valid"] for i, a in enumerate(alone)])
        assert got[b] == pytest.approx(want), (p, pl)
    cfg = reward.RewardConfig(agent_credit=0.5)
    v = dynamics.verify(types.to_instances(probs), parsed)
    r = np.asarray(reward.rewards(v, cfg, got))
    valid = np.asarray(v.valid)
    np.testing.assert_allclose(r[~valid], 0.5 * got[~valid], atol=1e-6)
    with pytest.raises(ValueError, match="agent_credit > 0 needs agent_share"):
        reward.rewards(v, cfg)
