"""Pure dynamics of MAPF-FrozenLake: `reset`/`step` for rollouts, `verify` for whole plans.

Semantics (synchronous steps; see README "Environment semantics"): at step t every real agent
applies its action; within one step the checks run in the order illegal_move (out of bounds),
hole, vertex_conflict, edge_conflict, and the first failing step decides the verdict. Following
and rotations are allowed. After the last step every agent must stand on its goal, else
goal_not_reached. An agent's cost is the first time from which it stays on its goal for good.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mapfjax.env import types
from mapfjax.env.types import Instance

_DELTAS = jnp.asarray(types.ACTION_DELTAS)  # [5, 2]


@struct.dataclass
class EnvState:
    """State of one instance (add a leading axis for a batch).

    pos:           int32 [N, 2]  current (row, col) per agent slot.
    t:             int32 []      time steps taken.
    failure:       int32 []      index into types.FAILURES (0 = none); latched once set.
    failure_time:  int32 []      step (>= 1) at which the failure happened, -1 if none.
    failure_agent: int32 []      lowest agent index involved in the failure, -1 if none.
    last_off_goal: int32 [N]     last time the agent was off its goal (-1: never).
    """

    pos: jnp.ndarray
    t: jnp.ndarray
    failure: jnp.ndarray
    failure_time: jnp.ndarray
    failure_agent: jnp.ndarray
    last_off_goal: jnp.ndarray


@struct.dataclass
class Verdict:
    """Outcome of `verify`, one entry per plan (shapes [B]).

    valid, optimal: bool (optimal is False where the instance has no label; see `labelled`).
    failure: int32 index into types.FAILURES; failure_time, failure_agent: int32, -1 if none.
    soc, makespan: int32, -1 for invalid plans.
    labelled: bool, the instance carries an optimal-cost label.
    """

    valid: jnp.ndarray
    optimal: jnp.ndarray
    failure: jnp.ndarray
    failure_time: jnp.ndarray
    failure_agent: jnp.ndarray
    soc: jnp.ndarray
    makespan: jnp.ndarray
    labelled: jnp.ndarray


def reset(instance: Instance) -> EnvState:
    """Initial state of one (unbatched) instance: agents on their starts at t = 0."""
    on_goal = jnp.all(instance.starts == instance.goals, axis=-1) | ~instance.agent_mask
    n = instance.agent_mask.shape[-1]
    return EnvState(
        pos=instance.starts,
        t=jnp.int32(0),
        failure=jnp.int32(types.NO_FAILURE),
        failure_time=jnp.int32(-1),
        failure_agent=jnp.int32(-1),
        last_off_goal=jnp.where(on_goal, -1, 0).astype(jnp.int32) * jnp.ones(n, jnp.int32),
    )


def _first(flags: jnp.ndarray, axis: int = -1) -> jnp.ndarray:
    """Index of the first True along `axis` (its length if none)."""
    n = flags.shape[axis]
    idx = jnp.arange(n).reshape((n,) + (1,) * (flags.ndim - 1 - axis % flags.ndim))
    return jnp.min(jnp.where(flags, idx, n), axis=axis)


_CODES = (types.ILLEGAL_MOVE, types.HOLE, types.VERTEX_CONFLICT, types.EDGE_CONFLICT)
_DR = jnp.asarray(types.ACTION_DELTAS[:, 0])
_DC = jnp.asarray(types.ACTION_DELTAS[:, 1])


def _step_flags(prev_r, prev_c, actions, active, height, width, is_hole):
    """The checks of one synchronous step, agent axis first, anything after it.

    prev_r, prev_c, actions: int32 [N, ...]; active: bool [N, ...] (broadcastable);
    height, width: broadcastable to [...]; is_hole(r, c) -> bool for in-bounds cells.
    Returns (r, c, flags) with flags bool [4, N, ...]: illegal_move, hole, vertex_conflict,
    edge_conflict, in precedence order. Padded agent slots never move and never fail. The
    agent axis leads so that a batch axis can sit last, where the CPU vectorises it.
    """
    n = actions.shape[0]
    a = jnp.clip(actions, 0, 4)
    dr = jnp.where(active, _DR[a], 0)
    dc = jnp.where(active, _DC[a], 0)
    r, c = prev_r + dr, prev_c + dc
    bad_code = (actions < 0) | (actions > 4)
    oob = active & (bad_code | (r < 0) | (r >= height) | (c < 0) | (c >= width))
    hole = active & ~oob & is_hole(r, c)
    moved = (dr != 0) | (dc != 0)
    vertex = [jnp.zeros_like(oob[0]) for _ in range(n)]
    edge = [jnp.zeros_like(oob[0]) for _ in range(n)]
    for i in range(n):  # N <= 5: unrolled pair loop, elementwise over the trailing axes
        for j in range(i + 1, n):
            both = active[i] & active[j]
            v = both & (r[i] == r[j]) & (c[i] == c[j])
            e = (
                both
                & moved[i]
                & (r[i] == prev_r[j])
                & (c[i] == prev_c[j])
                & (r[j] == prev_r[i])
                & (c[j] == prev_c[i])
            )
            vertex[i], vertex[j] = vertex[i] | v, vertex[j] | v
            edge[i], edge[j] = edge[i] | e, edge[j] | e
    return r, c, jnp.stack([oob, hole, jnp.stack(vertex), jnp.stack(edge)])


def step(instance: Instance, state: EnvState, actions: jnp.ndarray) -> EnvState:
    """Apply one joint action (int32 [N] action codes; padded slots ignored) to one instance.

    A state that has already failed is returned unchanged (the failure is latched). Action
    codes outside 0..4 count as illegal_move.
    """
    size = instance.holes.shape[-1]

    def is_hole(r, c):
        return instance.holes[jnp.clip(r, 0, size - 1), jnp.clip(c, 0, size - 1)]

    r, c, flags = _step_flags(
        state.pos[:, 0],
        state.pos[:, 1],
        actions,
        instance.agent_mask,
        instance.height,
        instance.width,
        is_hole,
    )  # flags [4, N]
    any_cat = jnp.any(flags, axis=-1)
    cat = jnp.argmax(any_cat)
    failed_now = jnp.any(any_cat)
    new = jnp.stack([r, c], axis=-1)
    t = state.t + 1
    on_goal = jnp.all(new == instance.goals, axis=-1) | ~instance.agent_mask
    moved_state = EnvState(
        pos=new,
        t=t,
        failure=jnp.where(failed_now, jnp.asarray(_CODES, jnp.int32)[cat], state.failure),
        failure_time=jnp.where(failed_now, t, state.failure_time),
        failure_agent=jnp.where(failed_now, _first(flags[cat]), state.failure_agent).astype(
            jnp.int32
        ),
        last_off_goal=jnp.where(on_goal, state.last_off_goal, t),
    )
    already = state.failure != types.NO_FAILURE
    return jax.tree.map(lambda old, nw: jnp.where(already, old, nw), state, moved_state)


@jax.jit
def _verify_batch(instances: Instance, plans, ok, horizon) -> Verdict:
    """plans int32 [B, N, T] (WAIT-padded); ok bool [B]; horizon int32 [B].

    No scan: before the first failure, positions are running sums of the moves, so all T
    steps are checked at once (layout [N, T, B], batch last) and the earliest failing step is
    selected afterwards.
    """
    b, n, t_len = plans.shape
    size = instances.holes.shape[-1]
    actions = jnp.transpose(plans, (1, 2, 0))  # [N, T, B]
    active = instances.agent_mask.T[:, None, :]  # [N, 1, B]
    a = jnp.clip(actions, 0, 4)
    start_r = instances.starts[..., 0].T[:, None, :]  # [N, 1, B]
    start_c = instances.starts[..., 1].T[:, None, :]
    r = start_r + jnp.cumsum(jnp.where(active, _DR[a], 0), axis=1)  # [N, T, B] after each step
    c = start_c + jnp.cumsum(jnp.where(active, _DC[a], 0), axis=1)
    prev_r = jnp.concatenate([start_r, r[:, :-1]], axis=1)
    prev_c = jnp.concatenate([start_c, c[:, :-1]], axis=1)
    holes_flat = instances.holes.reshape(b, size * size)

    def is_hole(rr, cc):
        idx = jnp.clip(rr, 0, size - 1) * size + jnp.clip(cc, 0, size - 1)  # [N, T, B]
        got = jnp.take_along_axis(holes_flat, idx.reshape(n * t_len, b).T, axis=1)
        return got.T.reshape(n, t_len, b)

    _, _, flags = _step_flags(
        prev_r, prev_c, actions, active, instances.height, instances.width, is_hole
    )  # [4, N, T, B]
    fails = jnp.any(flags, axis=(0, 1))  # [T, B]
    step_fail = jnp.any(fails, axis=0)  # [B]
    t_fail = jnp.argmax(fails, axis=0)  # [B]
    at = jnp.take_along_axis(flags, t_fail[None, None, None, :], axis=2)[:, :, 0]  # [4, N, B]
    cat = jnp.argmax(jnp.any(at, axis=1), axis=0)  # [B]
    in_cat = jnp.take_along_axis(at, cat[None, None, :], axis=0)[0]  # [N, B]
    code = jnp.asarray(_CODES, jnp.int32)[cat]
    goal_r = instances.goals[..., 0].T[:, None, :]
    goal_c = instances.goals[..., 1].T[:, None, :]
    all_r = jnp.concatenate([start_r, r], axis=1)  # [N, T+1, B]
    all_c = jnp.concatenate([start_c, c], axis=1)
    off = active & ((all_r != goal_r) | (all_c != goal_c))  # [N, T+1, B]
    off_final = off[:, -1]  # [N, B]
    goal_fail = ~step_fail & jnp.any(off_final, axis=0)
    failure = jnp.where(
        ~ok,
        types.PARSE_ERROR,
        jnp.where(step_fail, code, jnp.where(goal_fail, types.GOAL_NOT_REACHED, 0)),
    ).astype(jnp.int32)
    valid = failure == types.NO_FAILURE
    # cost = first time from which the agent stays on its goal = 1 + last time it is off it.
    times = jnp.arange(t_len + 1)[None, :, None]
    costs = jnp.max(jnp.where(off, times + 1, 0), axis=1)  # [N, B]
    labelled = instances.optimal_soc >= 0
    soc = jnp.where(valid, costs.sum(0), -1).astype(jnp.int32)
    return Verdict(
        valid=valid,
        optimal=valid & labelled & (soc == instances.optimal_soc),
        failure=failure,
        failure_time=jnp.where(~ok | valid, -1, jnp.where(step_fail, t_fail + 1, horizon)).astype(
            jnp.int32
        ),
        failure_agent=jnp.where(
            ~ok | valid, -1, jnp.where(step_fail, _first(in_cat, 0), _first(off_final, 0))
        ).astype(jnp.int32),
        soc=soc,
        makespan=jnp.where(valid, costs.max(0), -1).astype(jnp.int32),
        labelled=labelled,
    )


def verify(
    instances: Instance,
    plans,
    ok=None,
    lengths=None,
) -> Verdict:
    """Verify whole plans for a batch of instances.

    instances: batched Instance (leading axis B, agent slots N).
    plans:     int [B, n, T] action codes, n <= N (padded to N with WAIT); a `ParsedAnswers`
               from `parse_answers` is accepted too (its plans, ok and lengths are used).
    ok:        bool [B], False marks a parse_error (default: all True).
    lengths:   int [B, n] actions per agent, used only for the failure time of
               goal_not_reached (default: T).
    Returns a Verdict with [B] leaves. Jitted; instances of different map sizes and agent
    counts share one compiled function per (B, N, T).
    """
    if hasattr(plans, "plans") and hasattr(plans, "ok"):
        ok = plans.ok if ok is None else ok
        lengths = plans.lengths if lengths is None else lengths
        plans = plans.plans
    plans = jnp.asarray(plans, jnp.int32)
    b, n_slots = instances.agent_mask.shape
    if plans.ndim != 3 or plans.shape[0] != b or plans.shape[1] > n_slots:
        raise ValueError(
            f"plans must have shape [B={b}, n<={n_slots}, T], got {tuple(plans.shape)}"
        )
    if plans.shape[1] < n_slots:
        pad = n_slots - plans.shape[1]
        plans = jnp.pad(plans, ((0, 0), (0, pad), (0, 0)), constant_values=types.WAIT)
    ok = jnp.ones(b, bool) if ok is None else jnp.asarray(ok, bool)
    if lengths is None:
        horizon = jnp.full(b, plans.shape[2], jnp.int32)
    else:
        horizon = jnp.asarray(lengths, jnp.int32).max(axis=-1)
    return _verify_batch(instances, plans, ok, horizon)


def verdict_rows(verdict: Verdict) -> list[dict]:
    """Host-side list of dicts per plan: valid, optimal (None without label), failure name,
    failure_time, failure_agent, soc, makespan (None when invalid)."""
    v = {k: np.asarray(getattr(verdict, k)) for k in verdict.__dataclass_fields__}
    rows = []
    for i in range(v["valid"].shape[0]):
        valid = bool(v["valid"][i])
        rows.append(
            {
                "valid": valid,
                "optimal": bool(v["optimal"][i]) if v["labelled"][i] else None,
                "failure": types.FAILURES[int(v["failure"][i])],
                "failure_time": int(v["failure_time"][i]),
                "failure_agent": int(v["failure_agent"][i]),
                "soc": int(v["soc"][i]) if valid else None,
                "makespan": int(v["makespan"][i]) if valid else None,
            }
        )
    return rows


@functools.partial(jax.jit, static_argnames=())
def distance_fields(instances: Instance) -> jnp.ndarray:
    """BFS distances from every cell to each agent's goal, int32 [B, N, S, S].

    Unreachable cells, holes and cells outside the real map hold `INF`. Computed by
    synchronous relaxation in a while_loop until no distance changes (at most S*S sweeps).
    """
    return jax.vmap(_distance_fields_one)(instances)


INF = np.int32(1 << 20)


def _distance_fields_one(instance: Instance) -> jnp.ndarray:
    s = instance.holes.shape[-1]
    rows = jnp.arange(s)[:, None]
    cols = jnp.arange(s)[None, :]
    free = ~instance.holes & (rows < instance.height) & (cols < instance.width)  # [S, S]
    n = instance.goals.shape[0]
    init = jnp.full((n, s, s), INF, jnp.int32)
    init = init.at[jnp.arange(n), instance.goals[:, 0], instance.goals[:, 1]].set(0)
    init = jnp.where(free[None], init, INF)

    def relax(d):
        pad = jnp.pad(d, ((0, 0), (1, 1), (1, 1)), constant_values=INF)
        nb = jnp.minimum(
            jnp.minimum(pad[:, :-2, 1:-1], pad[:, 2:, 1:-1]),
            jnp.minimum(pad[:, 1:-1, :-2], pad[:, 1:-1, 2:]),
        )
        return jnp.where(free[None], jnp.minimum(d, nb + 1), INF)

    def cond(carry):
        d, prev_changed = carry
        return prev_changed

    def body(carry):
        d, _ = carry
        nd = relax(d)
        return nd, jnp.any(nd != d)

    out, _ = jax.lax.while_loop(cond, body, (init, jnp.bool_(True)))
    return jnp.minimum(out, INF)
