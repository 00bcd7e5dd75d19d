"""Pure dynamics of MAPF-FrozenLake: `reset`/`step` for rollouts, `verify` for whole plans.

Semantics (synchronous steps; see docs/environment.md, "Semantics"): at step t every real agent
applies its action; within one step the checks run in the order illegal_move (out of bounds),
hole, vertex_conflict, edge_conflict, and the first failing step decides the verdict. Following
and rotations are allowed. After the last step every agent must stand on its goal, else
goal_not_reached. An agent's cost is the first time from which it stays on its goal for good.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
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
    """Apply one joint action to one (unbatched) instance; vmap it for a batch.

    instance: holes Bool[Array, "s s"], starts and goals Int[Array, "n 2"], agent_mask
              Bool[Array, "n"] (see `types.Instance`).
    state:    pos Int[Array, "n 2"], last_off_goal Int[Array, "n"] (see `EnvState`).
    actions:  Int[Array, "n"] action codes; padded slots are ignored.
    A state that has already failed is returned unchanged (the failure is latched). Action
    codes outside 0..4 count as illegal_move.
    """
    size, n = types.assert_instance_shapes(instance, batched=False)
    chex.assert_shape(actions, (n,))
    chex.assert_shape(state.pos, (n, 2))

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


# Batched verifier: while loops over time steps that stop once every plan has failed. Each
# step is elementwise work on [N, B] arrays with the batch axis last, which XLA's CPU backend
# vectorises. The plans are transposed to that layout _CHUNK steps at a time, so plans that fail
# early are never transposed in full, and the inner loop keeps XLA from fusing the transpose
# into the step (a fused transpose runs several times slower). A cell is a single integer on a
# grid padded by a one-cell border with a power-of-two row stride, so a vertex or edge test is
# one comparison.
_NUM_CATS = len(_CODES)
_CHUNK = 8


def _halve(op, x: jnp.ndarray) -> jnp.ndarray:
    """Reduce the leading axis of x with the elementwise binary `op` by repeated halving.

    (XLA's CPU reduction over a major axis is a scalar loop; this stays vectorised.)
    """
    while x.shape[0] > 1:
        h = x.shape[0] // 2
        head = op(x[:h], x[h : 2 * h])
        x = head if x.shape[0] % 2 == 0 else jnp.concatenate([head, x[2 * h :]])
    return x[0]


def _hole_words(holes: jnp.ndarray, shift: int, n_words: int, dtype) -> jnp.ndarray:
    """holes bool [B, S, S] -> [n_words, B] bitmasks, bit i of word k = cell 16 k + i is a hole.

    Cell (r, c) has index (r+1) * 2^shift + (c+1) (see `_verify_batch`).
    """
    b, s, _ = holes.shape
    stride = 1 << shift
    grid = jnp.pad(holes, ((0, 0), (1, stride - s - 1), (1, stride - s - 1))).reshape(b, -1)
    bits = grid[:, : 16 * n_words].reshape(b, n_words, 16).astype(jnp.int32)
    words = jnp.sum(bits << jnp.arange(16, dtype=jnp.int32), axis=-1).astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(words, jnp.int16).astype(dtype).T


@dataclasses.dataclass(frozen=True)
class _Codec:
    """The integer encoding of one compiled shape (S map side, N agent slots, T steps).

    A cell (r, c) is (r + 1) * stride + c + 1 on a grid padded by a one-cell border, with a
    power-of-two row stride >= S + 2; before a plan's first failure a cell is < `cells`, and the
    step that fails may add `cells`. A failure is the key step * span + category * 2^bits +
    agent, so the earliest one (step, then category precedence, then agent) is the smallest key;
    `none` means no failure.
    """

    size: int
    n: int
    t_len: int

    @property
    def shift(self) -> int:
        return max(4, (self.size + 1).bit_length())  # row stride 2^shift >= size + 2

    @property
    def stride(self) -> int:
        return 1 << self.shift

    @property
    def cells(self) -> int:
        return self.stride * self.stride

    @property
    def pdt(self):
        """Cell dtype: int16 when every cell, parked slots included, fits."""
        fits = 2 * self.cells + (self.n + 2) * self.stride < 2**15
        return jnp.int16 if fits else jnp.int32

    @property
    def n_words(self) -> int:
        """16-bit hole words covering every cell a real agent can reach or step off to."""
        return -(-((self.size + 1) * self.stride + self.size + 2) // 16)

    @property
    def bits(self) -> int:
        return max(1, (self.n - 1).bit_length())

    @property
    def span(self) -> int:
        return _NUM_CATS << self.bits

    @property
    def kdt(self):
        """Key dtype: int16 when every key up to `none` fits."""
        return jnp.int16 if (self.t_len + 1) * self.span < 2**15 else jnp.int32

    @functools.cached_property
    def none(self):  # one scalar shared by every step of the trace
        return self.kdt(self.t_len * self.span)


def _encode_agents(instances: Instance, k: _Codec) -> tuple[jnp.ndarray, ...]:
    """(start, goal, height, width): cells and map bounds per agent slot, k.pdt [N, B] each.

    Padded slots park in column 0 of distinct rows past the grid: free of holes, never out of
    (their) bounds, and never met by a real agent before its first failure.
    """
    far = 2**14 if k.pdt == jnp.int16 else 2**30  # bounds of padded slots: never out of bounds
    mask = instances.agent_mask  # [B, N]
    park = k.cells + (1 + jnp.arange(k.n)[None, :]) * k.stride + 1

    def cell(rc):
        return jnp.where(mask, (rc[..., 0] + 1) * k.stride + rc[..., 1] + 1, park)

    setup = jnp.stack(
        [
            cell(instances.starts),
            cell(instances.goals),
            jnp.where(mask, instances.height[:, None], far),
            jnp.where(mask, instances.width[:, None], far),
        ]
    ).astype(k.pdt)
    return tuple(jnp.transpose(setup, (0, 2, 1)))


def _encode_moves(plans: jnp.ndarray, mask: jnp.ndarray, k: _Codec) -> jnp.ndarray:
    """Action codes int32 [B, N, T] -> cell offsets k.pdt [B, N, T / _CHUNK, _CHUNK].

    An invalid action code jumps a whole grid ahead: out of bounds from any cell. Padded slots
    never move; steps past T are waits.
    """
    move = jnp.full(plans.shape, k.cells, k.pdt)
    for code, delta in enumerate((0, -k.stride, k.stride, -1, 1)):
        move = jnp.where(plans == code, k.pdt(delta), move)
    move = jnp.where(mask[..., None], move, 0)
    n_chunks = max(1, -(-k.t_len // _CHUNK))
    move = jnp.pad(move, ((0, 0), (0, 0), (0, n_chunks * _CHUNK - k.t_len)))
    return move.reshape(plans.shape[0], k.n, n_chunks, _CHUNK)


def _step_code(k: _Codec, new, old, height, width, words) -> jnp.ndarray:
    """The smallest failure code (category * 2^bits + agent) of one step, k.none if none.

    new, old: cells [N, B] after / before the step; height, width: [N, B]; words: [K, B].
    Returns k.kdt [B].
    """
    n, b = new.shape
    row, col = new >> k.shift, new & (k.stride - 1)
    oob = (row < 1) | (row > height) | (col < 1) | (col > width)
    word = jnp.zeros_like(new)
    for w in range(k.n_words):
        word = jnp.where((new >> 4) == w, words[w], word)
    hole = ((word >> (new & 15)) & 1) == 1
    checks = [(i, oob[i]) for i in range(n)]
    checks += [((1 << k.bits) + i, hole[i]) for i in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    checks += [((2 << k.bits) + i, new[i] == new[j]) for i, j in pairs]
    # no "i moved" test: a swap without moving is also a vertex conflict, which wins
    checks += [((3 << k.bits) + i, (new[i] == old[j]) & (new[j] == old[i])) for i, j in pairs]
    code = jnp.full((b,), k.none, k.kdt)
    for c, flag in reversed(checks):
        code = jnp.where(flag, k.kdt(c), code)
    return code


def _run_steps(k: _Codec, agents: tuple[jnp.ndarray, ...], words, move):
    """Step every plan until all have failed or T steps are done.

    agents: from `_encode_agents`; words: [K, B]; move: [B, N, T / _CHUNK, _CHUNK].
    Returns (pos [N, B] final cells, key k.kdt [B] earliest failure, cost k.kdt [N, B] first
    time from which each agent stays on its goal). An early exit leaves pos and cost stale, but
    only when every plan has already failed.
    """
    start, goal, height, width = agents
    b = start.shape[1]

    def alive(t, key):
        return (t < k.t_len) & jnp.any(key == k.none)

    def step(carry):  # time step t -> t + 1
        t, pos, key, cost, chunk = carry
        new = pos + jax.lax.dynamic_index_in_dim(chunk, t % _CHUNK, keepdims=False)
        code = _step_code(k, new, pos, height, width, words)
        key = jnp.minimum(key, jnp.where(code < k.none, (t * k.span).astype(k.kdt) + code, k.none))
        # cost = first time from which the agent stays on its goal = 1 + last time off it
        cost = jnp.where(new != goal, (t + 2).astype(k.kdt), cost)
        return t + 1, new, key, cost, chunk

    def run_chunk(carry):  # steps j * _CHUNK ... (j + 1) * _CHUNK - 1
        j, t, pos, key, cost = carry
        chunk = jax.lax.dynamic_index_in_dim(move, j, axis=2, keepdims=False)
        chunk = jnp.transpose(chunk, (2, 1, 0))  # [_CHUNK, N, B]
        end = (j + 1) * _CHUNK
        t, pos, key, cost, _ = jax.lax.while_loop(
            lambda c: (c[0] < end) & alive(c[0], c[2]), step, (t, pos, key, cost, chunk)
        )
        return j + 1, t, pos, key, cost

    init = (jnp.int32(0), jnp.int32(0), start, jnp.full((b,), k.none, k.kdt))
    init += ((start != goal).astype(k.kdt),)
    _, _, pos, key, cost = jax.lax.while_loop(lambda c: alive(c[1], c[3]), run_chunk, init)
    return pos, key, cost


def _verdict(k: _Codec, instances: Instance, ok, horizon, goal, pos, key, cost) -> Verdict:
    """Decode the earliest step failure `key` [B], or check the goals `goal` [N, B] against the
    final cells `pos` [N, B]; `cost` [N, B] gives soc and makespan of valid plans."""
    b = key.shape[0]
    step_fail = key < k.none
    agent = (key % (1 << k.bits)).astype(jnp.int32)
    cat = (key // (1 << k.bits)) % _NUM_CATS
    first_off = jnp.full((b,), k.n, jnp.int32)
    for i in reversed(range(k.n)):
        first_off = jnp.where(pos[i] != goal[i], i, first_off)
    goal_fail = ~step_fail & (first_off < k.n)
    failure = jnp.where(
        ~ok,
        types.PARSE_ERROR,
        jnp.where(
            step_fail,
            jnp.asarray(_CODES, jnp.int32)[cat],
            jnp.where(goal_fail, types.GOAL_NOT_REACHED, types.NO_FAILURE),
        ),
    ).astype(jnp.int32)
    valid = failure == types.NO_FAILURE
    labelled = instances.optimal_soc >= 0
    cost = cost.astype(jnp.int32)
    soc = jnp.where(valid, _halve(jnp.add, cost), -1)
    t_fail = (key // k.span).astype(jnp.int32) + 1
    return Verdict(
        valid=valid,
        optimal=valid & labelled & (soc == instances.optimal_soc),
        failure=failure,
        failure_time=jnp.where(~ok | valid, -1, jnp.where(step_fail, t_fail, horizon)),
        failure_agent=jnp.where(~ok | valid, -1, jnp.where(step_fail, agent, first_off)),
        soc=soc,
        makespan=jnp.where(valid, _halve(jnp.maximum, cost), -1),
        labelled=labelled,
    )


@jax.jit
def _verify_batch(instances: Instance, plans, ok, horizon) -> Verdict:
    """plans: Int[Array, "b n t"] (WAIT-padded); ok: Bool[Array, "b"]; horizon: Int[Array, "b"].

    Encode (`_encode_agents`, `_hole_words`, `_encode_moves`), step (`_run_steps`), decode
    (`_verdict`). Assumes starts inside the map (as `types.check_problem` ensures).
    """
    k = _Codec(instances.holes.shape[-1], plans.shape[1], plans.shape[2])
    agents = _encode_agents(instances, k)  # start, goal, height, width
    words = _hole_words(instances.holes, k.shift, k.n_words, k.pdt)  # [K, B]
    move = _encode_moves(plans, instances.agent_mask, k)
    pos, key, cost = _run_steps(k, agents, words, move)
    return _verdict(k, instances, ok, horizon, agents[1], pos, key, cost)


def verify(
    instances: Instance,
    plans,
    ok=None,
    lengths=None,
) -> Verdict:
    """Verify whole plans for a batch of instances.

    instances: a batch (see `types.Instance`): holes Bool[Array, "b s s"], starts and goals
               Int[Array, "b n 2"], agent_mask Bool[Array, "b n"], labels Int[Array, "b"].
    plans:     Int[Array, "b m t"] action codes, m <= n (padded to n with WAIT); a
               `ParsedAnswers` from `parse_answers` is accepted too (its plans, ok and lengths
               are used).
    ok:        Bool[Array, "b"], False marks a parse_error (default: all True).
    lengths:   Int[Array, "b m"] actions per agent, used only for the failure time of
               goal_not_reached (default: t).
    Returns a Verdict with [b] leaves. Jitted; instances of different map sizes and agent
    counts share one compiled function per (b, n, t).
    """
    if hasattr(plans, "plans") and hasattr(plans, "ok"):
        ok = plans.ok if ok is None else ok
        lengths = plans.lengths if lengths is None else lengths
        plans = plans.plans
    plans = _as_array(plans, np.int32)
    _, n_slots = types.assert_instance_shapes(instances, batched=True)
    b = instances.agent_mask.shape[0]
    if plans.ndim != 3 or plans.shape[0] != b or plans.shape[1] > n_slots:
        raise ValueError(
            f"plans must have shape [B={b}, n<={n_slots}, T], got {tuple(plans.shape)}"
        )
    if plans.shape[1] < n_slots:
        pad = ((0, 0), (0, n_slots - plans.shape[1]), (0, 0))
        xp = jnp if isinstance(plans, jax.Array) else np
        plans = xp.pad(plans, pad, constant_values=types.WAIT)
    ok = np.ones(b, bool) if ok is None else _as_array(ok, np.bool_)
    chex.assert_shape(ok, (b,))
    if lengths is None or np.shape(lengths)[-1] == 0:
        horizon = np.full(b, plans.shape[2], np.int32)
    else:
        lengths = _as_array(lengths, np.int32)
        chex.assert_shape(lengths, (b, None))
        horizon = lengths.max(axis=-1)
    return _verify_batch(instances, plans, ok, horizon)


def _as_array(x, dtype):
    """x as a NumPy or jax array of `dtype`; host data stays on the host until the jitted call
    (each eager jnp op on it would be one more dispatch)."""
    if isinstance(x, jax.Array):
        return x if x.dtype == dtype else x.astype(dtype)
    return np.asarray(x, dtype)


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
