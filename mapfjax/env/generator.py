"""The vectorised instance generator: jitted candidate sampling, host CBS labelling, quota filling.

Candidates (map size, holes, distinct starts and goals, BFS reachability) are sampled in one
jitted, vmapped call; the exact oracle labels them on the host; per map size the generator then
keeps the requested number of needs-wait and no-wait instances (`types.needs_wait`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mapfjax import stats
from mapfjax.env import config as env_config
from mapfjax.env import dynamics, types
from mapfjax.env.types import Instance, Problem

MIN_CANDIDATES = 64  # smallest candidate batch per size and round (amortises dispatch)
SPAWN_MIN = 512  # fewer candidates than this are labelled in-process


@functools.partial(jax.jit, static_argnames=("max_size", "max_agents", "num_agents"))
def sample_candidates(
    key: jax.Array,
    sizes: jnp.ndarray,
    hole_ratios: jnp.ndarray,
    crossing: jnp.ndarray,
    *,
    max_size: int,
    max_agents: int,
    num_agents: int,
) -> tuple[Instance, jnp.ndarray, jnp.ndarray]:
    """Sample unlabelled candidate puzzles.

    sizes: int32 [B] side length per candidate; hole_ratios: f32 [B]; crossing: bool [B]
    (goals drawn near the next agent's start, a layout that often forces waits).
    Returns (instances [B], reachable bool [B], shortest int32 [B, max_agents]) where
    reachable says every agent can reach its goal alone and shortest holds the individual
    BFS distances (0 in padded slots).
    """
    keys = jax.random.split(key, sizes.shape[0])
    one = functools.partial(
        _sample_one, max_size=max_size, max_agents=max_agents, num_agents=num_agents
    )
    inst = jax.vmap(one)(keys, sizes, hole_ratios, crossing)
    dist = dynamics.distance_fields(inst)  # [B, N, S, S]
    b_idx = jnp.arange(sizes.shape[0])[:, None]
    a_idx = jnp.arange(max_agents)[None, :]
    d_start = dist[b_idx, a_idx, inst.starts[..., 0], inst.starts[..., 1]]  # [B, N]
    d_start = jnp.where(inst.agent_mask, d_start, 0)
    reachable = jnp.all(d_start < dynamics.INF, axis=-1)
    return inst, reachable, d_start


def _sample_one(key, size, hole_ratio, crossing, *, max_size, max_agents, num_agents):
    k_holes, k_cells = jax.random.split(key)
    rows = jnp.arange(max_size)[:, None]
    cols = jnp.arange(max_size)[None, :]
    inside = ((rows < size) & (cols < size)).reshape(-1)
    area = size * size
    # Exact hole count (not Bernoulli) so achieved hole ratios match requested ones; always
    # leave room for 2 * num_agents distinct start/goal cells.
    n_holes = jnp.minimum(jnp.round(hole_ratio * area).astype(jnp.int32), area - 2 * num_agents)
    scores = jnp.where(inside, jax.random.uniform(k_holes, (max_size * max_size,)), 2.0)
    rank = jnp.argsort(jnp.argsort(scores))
    holes_flat = rank < n_holes
    free = inside & ~holes_flat

    taken = ~free
    cell_r = (jnp.arange(max_size * max_size) // max_size).astype(jnp.int32)
    cell_c = (jnp.arange(max_size * max_size) % max_size).astype(jnp.int32)
    keys = jax.random.split(k_cells, 2 * num_agents)
    starts = []
    for i in range(num_agents):
        g = jax.random.gumbel(keys[i], (max_size * max_size,))
        pick = jnp.argmax(jnp.where(taken, -jnp.inf, g))
        starts.append(pick)
        taken = taken.at[pick].set(True)
    goals = []
    for i in range(num_agents):
        other = starts[(i + 1) % num_agents]
        manhattan = jnp.abs(cell_r - cell_r[other]) + jnp.abs(cell_c - cell_c[other])
        logits = jnp.where(crossing & (num_agents > 1), -1.5 * manhattan, 0.0)
        g = jax.random.gumbel(keys[num_agents + i], (max_size * max_size,))
        pick = jnp.argmax(jnp.where(taken, -jnp.inf, logits + g))
        goals.append(pick)
        taken = taken.at[pick].set(True)

    def coords(picks):
        p = jnp.stack(picks)
        xy = jnp.stack([p // max_size, p % max_size], axis=-1).astype(jnp.int32)
        return jnp.zeros((max_agents, 2), jnp.int32).at[:num_agents].set(xy)

    return Instance(
        holes=holes_flat.reshape(max_size, max_size),
        height=size.astype(jnp.int32),
        width=size.astype(jnp.int32),
        starts=coords(starts),
        goals=coords(goals),
        agent_mask=jnp.arange(max_agents) < num_agents,
        optimal_soc=jnp.int32(types.UNKNOWN),
        optimal_makespan=jnp.int32(types.UNKNOWN),
        needs_wait=jnp.int32(types.UNKNOWN),
    )


@dataclasses.dataclass(frozen=True)
class SizeReport:
    size: int
    requested: int
    achieved: int
    requested_wait_ratio: float
    achieved_wait_ratio: float
    requested_hole_ratio: float
    achieved_hole_ratio: float
    candidates: int
    oracle_failures: int


@dataclasses.dataclass(frozen=True)
class GenerationReport:
    """Requested vs achieved ratios per map size."""

    sizes: tuple[SizeReport, ...]
    seconds: float

    def table(self) -> str:
        head = ["size", "n req", "n got", "wait req", "wait got", "holes req", "holes got",
                "candidates", "oracle fail"]  # fmt: skip
        rows = [
            [
                f"{r.size}x{r.size}",
                r.requested,
                r.achieved,
                f"{r.requested_wait_ratio:.2f}",
                f"{r.achieved_wait_ratio:.2f}",
                f"{r.requested_hole_ratio:.2f}",
                f"{r.achieved_hole_ratio:.2f}",
                r.candidates,
                r.oracle_failures,
            ]  # fmt: skip
            for r in self.sizes
        ]
        return stats.markdown_table(head, rows)

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "sizes": [dataclasses.asdict(r) for r in self.sizes]}


@dataclasses.dataclass(frozen=True)
class Generated:
    """A labelled batch: `instances` (padded pytree, leading axis n), the same puzzles as host
    `problems` (for text rendering), and the generation `report`."""

    instances: Instance
    problems: list[Problem]
    report: GenerationReport


@dataclasses.dataclass
class _SizePool:
    """The labelled instances kept so far at one map size and what it took to get them."""

    size: int
    count: int  # instances requested
    waits: int  # of which need a wait
    kept: dict[bool, list[Problem]] = dataclasses.field(
        default_factory=lambda: {True: [], False: []}
    )
    candidates: int = 0
    oracle_failures: int = 0

    def missing(self) -> tuple[int, int]:
        """(needs-wait, no-wait) instances still missing."""
        return (
            max(self.waits - len(self.kept[True]), 0),
            max(self.count - self.waits - len(self.kept[False]), 0),
        )

    def offer(self, problem: Problem) -> bool:
        """Keep a labelled problem while its bucket has room (a bounded surplus fills the other
        bucket's shortfall, if any); True when it counts toward the requested numbers."""
        bucket = self.kept[problem.needs_wait]
        quota = self.waits if problem.needs_wait else self.count - self.waits
        if len(bucket) >= quota + self.count:
            return False
        bucket.append(problem)
        return len(bucket) <= quota

    def chosen(self) -> list[Problem]:
        """The requested numbers of needs-wait and no-wait instances, any shortfall of one
        filled from the other."""
        w = self.waits
        chosen = self.kept[True][:w] + self.kept[False][: self.count - w]
        spare = self.kept[True][w:] + self.kept[False][self.count - w :]
        return chosen + spare[: self.count - len(chosen)]


def generate(
    key: jax.Array,
    config: ml_collections.ConfigDict,
    n: int,
    id_prefix: str = "",
    progress: bool = False,
) -> Generated:
    """Generate `n` labelled, jointly solvable instances following `config` (deterministic in key).

    Per size, data_ratio decides how many instances, hole_ratio the exact hole count
    (round(ratio * area)), wait_ratio the share that needs a wait (`types.needs_wait`). When a
    quota cannot be met within `config.pool.max_rounds` rounds of candidates, the remainder is
    filled from the other bucket and the report shows the shortfall.
    """
    import time

    env_config.validate(config)
    t0 = time.perf_counter()
    pools = {s: _SizePool(s, c, w) for s, (c, w) in env_config.requested_counts(config, n).items()}
    key, k_order = jax.random.split(key)
    bar = _progress(n, progress)
    for rnd in range(config.pool.max_rounds):
        need = {s: p.missing() for s, p in pools.items() if any(p.missing())}
        if not need:
            break
        key, k_round = jax.random.split(key)
        for problem in _label_round(k_round, config, need, rnd, pools):
            if pools[problem.height].offer(problem):
                bar.update(1)
    bar.close()
    out, reports = [], []
    for pool in pools.values():
        chosen = _check_filled(pool, config)
        out += chosen
        reports.append(_size_report(pool, chosen, config.sizes[env_config.size_key(pool.size)]))
    perm = np.asarray(jax.random.permutation(k_order, len(out)))
    out = [out[i] for i in perm]
    out = [
        dataclasses.replace(p, id=f"{id_prefix}{config.num_agents}ag_{p.height}x{p.width}_{i:05d}")
        for i, p in enumerate(out)
    ]
    report = GenerationReport(tuple(reports), time.perf_counter() - t0)
    instances = types.to_instances(out, config.max_size, config.max_agents)
    return Generated(jax.tree.map(jnp.asarray, instances), out, report)


def _round_request(config, need: dict[int, tuple[int, int]], rnd: int):
    """Candidate (sizes, hole ratios, crossing flags) of one round for the missing (needs-wait,
    no-wait) counts per size."""
    pool = config.pool
    sizes, holes, cross = [], [], []
    for s, (nw, nn) in need.items():
        m = max(MIN_CANDIDATES, math.ceil(pool.oversample * (nw + nn)))
        # Wait instances are the rare ones; spend more candidates on them as rounds go.
        if nw > 0:
            m = max(m, math.ceil(pool.oversample * nw * (2 + rnd)))
        p_cross = pool.wait_bias if nw > 0 else 0.0
        n_cross = round(m * p_cross) if nn > 0 else m if nw > 0 else 0
        sizes += [s] * m
        holes += [config.sizes[env_config.size_key(s)].hole_ratio] * m
        cross += [True] * n_cross + [False] * (m - n_cross)
    return sizes, holes, cross


def _label_round(key, config, need, rnd: int, pools: dict[int, _SizePool]) -> list[Problem]:
    """Sample one round of candidates, label the reachable ones with the oracle and return those
    it solved optimally; counts candidates and oracle failures into `pools`."""
    from mapfjax.env import oracle

    sizes, holes, cross = _round_request(config, need, rnd)
    pad = _bucket(len(sizes)) - len(sizes)
    inst, reachable, shortest = sample_candidates(
        key,
        jnp.asarray(sizes + [sizes[0]] * pad, jnp.int32),
        jnp.asarray(holes + [holes[0]] * pad, jnp.float32),
        jnp.asarray(cross + [False] * pad),
        max_size=config.max_size,
        max_agents=config.max_agents,
        num_agents=config.num_agents,
    )
    m_all = len(sizes)
    reachable = np.asarray(reachable)[:m_all]
    shortest = np.asarray(shortest)[:m_all]
    cands = types.to_problems(jax.tree.map(lambda x: x[:m_all], inst))
    idx = [i for i in range(m_all) if reachable[i]]
    for s in need:
        pools[s].candidates += sizes.count(s)
    processes = config.oracle.processes or os.cpu_count() or 1
    sols = oracle.solve_many(
        [cands[i] for i in idx],
        max_nodes=config.oracle.max_nodes,
        time_limit=config.oracle.time_limit,
        # Spawning workers costs ~2 s (each imports JAX): not worth it for small pools.
        processes=processes if len(idx) >= SPAWN_MIN else 1,
    )
    labelled = []
    for i, sol in zip(idx, sols, strict=True):
        if sol.status != "optimal":
            pools[sizes[i]].oracle_failures += 1
            continue
        nw = types.needs_wait(sol.soc, shortest[i])
        labelled.append(cands[i].with_labels(sol.soc, sol.makespan, nw))
    return labelled


def _check_filled(pool: _SizePool, config) -> list[Problem]:
    """The pool's chosen instances; RuntimeError when there are too few solvable ones."""
    chosen = pool.chosen()
    if len(chosen) < pool.count:
        s = pool.size
        raise RuntimeError(
            f"generator: size {s}x{s} produced only {len(chosen)} of {pool.count} solvable "
            f"instances in {config.pool.max_rounds} rounds (hole_ratio "
            f"{config.sizes[env_config.size_key(s)].hole_ratio}); raise pool.max_rounds or "
            "lower the hole ratio"
        )
    return chosen


def _size_report(pool: _SizePool, chosen: list[Problem], entry) -> SizeReport:
    return SizeReport(
        size=pool.size,
        requested=pool.count,
        achieved=len(chosen),
        requested_wait_ratio=float(entry.wait_ratio),
        achieved_wait_ratio=_mean([p.needs_wait for p in chosen]),
        requested_hole_ratio=float(entry.hole_ratio),
        achieved_hole_ratio=_mean([p.holes().mean() for p in chosen]),
        candidates=pool.candidates,
        oracle_failures=pool.oracle_failures,
    )


def _mean(xs) -> float:
    return float(np.mean(np.asarray(xs, np.float64))) if len(xs) else float("nan")


def _bucket(n: int) -> int:
    """Round a candidate count up to a power of two (>= 64) to bound recompilation."""
    return max(MIN_CANDIDATES, 1 << (n - 1).bit_length())


class _NoBar:
    def update(self, k):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="inst")
