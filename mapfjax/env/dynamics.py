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


def _first(flags: jnp.ndarray) -> jnp.ndarray:
    """Index of the first True in bool [N] (N if none)."""
    n = flags.shape[-1]
    return jnp.min(jnp.where(flags, jnp.arange(n), n))


def step(instance: Instance, state: EnvState, actions: jnp.ndarray) -> EnvState:
    """Apply one joint action (int32 [N] action codes; padded slots ignored) to one instance.

    A state that has already failed is returned unchanged (the failure is latched). Action
    codes outside 0..4 count as illegal_move.
    """
    active = instance.agent_mask
    bad_code = (actions < 0) | (actions > 4)
    delta = _DELTAS[jnp.clip(actions, 0, 4)]
    new = jnp.where(active[:, None], state.pos + delta, state.pos)
    r, c = new[:, 0], new[:, 1]
    oob = active & ((r < 0) | (r >= instance.height) | (c < 0) | (c >= instance.width) | bad_code)
    size = instance.holes.shape[-1]
    in_hole = active & ~oob & instance.holes[jnp.clip(r, 0, size - 1), jnp.clip(c, 0, size - 1)]
    pair = active[:, None] & active[None, :] & ~jnp.eye(active.shape[0], dtype=bool)
    same_cell = jnp.all(new[:, None, :] == new[None, :, :], axis=-1)
    vertex = jnp.any(pair & same_cell, axis=1)
    moved = jnp.any(new != state.pos, axis=-1)
    swap = jnp.all(new[:, None, :] == state.pos[None, :, :], axis=-1) & jnp.all(
        state.pos[:, None, :] == new[None, :, :], axis=-1
    )
    edge = jnp.any(pair & swap & moved[:, None], axis=1)

    # Precedence within a step: the first category with any failing agent wins.
    cats = jnp.stack([oob, in_hole, vertex, edge])  # [4, N]
    any_cat = jnp.any(cats, axis=1)
    cat = jnp.argmax(any_cat)
    failed_now = jnp.any(any_cat) & (state.failure == types.NO_FAILURE)
    codes = jnp.array(
        [types.ILLEGAL_MOVE, types.HOLE, types.VERTEX_CONFLICT, types.EDGE_CONFLICT], jnp.int32
    )
    t = state.t + 1
    already = state.failure != types.NO_FAILURE
    on_goal = jnp.all(new == instance.goals, axis=-1) | ~active
    moved_state = EnvState(
        pos=new,
        t=t,
        failure=jnp.where(failed_now, codes[cat], state.failure),
        failure_time=jnp.where(failed_now, t, state.failure_time),
        failure_agent=jnp.where(failed_now, _first(cats[cat]), state.failure_agent).astype(
            jnp.int32
        ),
        last_off_goal=jnp.where(on_goal, state.last_off_goal, t),
    )
    return jax.tree.map(lambda old, nw: jnp.where(already, old, nw), state, moved_state)


def _verify_one(instance: Instance, plan: jnp.ndarray, ok: jnp.ndarray, horizon: jnp.ndarray):
    """plan: int32 [N, T] (WAIT-padded), ok: bool [], horizon: int32 [] plan length."""

    def body(state, actions):
        return step(instance, state, actions), None

    final, _ = jax.lax.scan(body, reset(instance), plan.T)
    active = instance.agent_mask
    off_goal = active & ~jnp.all(final.pos == instance.goals, axis=-1)
    step_fail = final.failure != types.NO_FAILURE
    goal_fail = ~step_fail & jnp.any(off_goal)
    failure = jnp.where(
        ~ok,
        types.PARSE_ERROR,
        jnp.where(goal_fail, types.GOAL_NOT_REACHED, final.failure),
    ).astype(jnp.int32)
    valid = failure == types.NO_FAILURE
    costs = jnp.where(active, final.last_off_goal + 1, 0)
    soc = jnp.where(valid, costs.sum(), -1).astype(jnp.int32)
    makespan = jnp.where(valid, costs.max(), -1).astype(jnp.int32)
    labelled = instance.optimal_soc >= 0
    return Verdict(
        valid=valid,
        optimal=valid & labelled & (soc == instance.optimal_soc),
        failure=failure,
        failure_time=jnp.where(~ok, -1, jnp.where(goal_fail, horizon, final.failure_time)).astype(
            jnp.int32
        ),
        failure_agent=jnp.where(
            ~ok, -1, jnp.where(goal_fail, _first(off_goal), final.failure_agent)
        ).astype(jnp.int32),
        soc=soc,
        makespan=makespan,
        labelled=labelled,
    )


@jax.jit
def _verify_batch(instances, plans, ok, horizon):
    return jax.vmap(_verify_one)(instances, plans, ok, horizon)


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
