"""Core data types of MAPF-FrozenLake: host-side `Problem` records and the padded `Instance` pytree.

A `Problem` is what a human, a JSONL line or the oracle sees (a grid of strings and coordinate
tuples). An `Instance` is the same puzzle padded to static maxima so that maps of every size
batch together under one compiled function; a batch is an `Instance` with a leading axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chex
import jax.numpy as jnp
import numpy as np
from flax import struct

# Action codes shared by the text interface, the verifier and the oracle.
WAIT, UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3, 4
ACTION_NAMES = ("WAIT", "UP", "DOWN", "LEFT", "RIGHT")
# (d_row, d_col) per action code, shape [5, 2].
ACTION_DELTAS = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.int32)

# Failure labels; index 0 means "no failure". The order of the step failures is their
# precedence within one time step (see dynamics.py).
FAILURES = (
    None,
    "parse_error",
    "illegal_move",
    "hole",
    "vertex_conflict",
    "edge_conflict",
    "goal_not_reached",
)
NO_FAILURE, PARSE_ERROR, ILLEGAL_MOVE, HOLE, VERTEX_CONFLICT, EDGE_CONFLICT, GOAL_NOT_REACHED = (
    range(7)
)
FAILURE_NAMES = tuple(f for f in FAILURES if f is not None)

# Static padding maxima used unless a caller asks for others: the paper's largest map is
# 10x10 and its largest benchmark has 5 agents.
MAX_SIZE = 10
MAX_AGENTS = 5
UNKNOWN = -1  # label value meaning "not labelled"

FROZEN, HOLE_CELL = "F", "H"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One MAPF-FrozenLake puzzle on the host.

    grid: rows of 'F' (frozen) / 'H' (hole) characters, all rows the same length.
    starts, goals: one (row, col) per agent, 0-indexed.
    Labels are None when unknown. meta: what the set's builder knew about the puzzle (e.g.
    the benchmark cell: agents, size, hole_ratio, wait_ratio), a JSON object or None; it is
    descriptive only, so it takes no part in equality or hashing.
    """

    id: str
    grid: tuple[str, ...]
    starts: tuple[tuple[int, int], ...]
    goals: tuple[tuple[int, int], ...]
    optimal_soc: int | None = None
    optimal_makespan: int | None = None
    needs_wait: bool | None = None
    meta: dict | None = dataclasses.field(default=None, compare=False)

    @property
    def height(self) -> int:
        return len(self.grid)

    @property
    def width(self) -> int:
        return len(self.grid[0]) if self.grid else 0

    @property
    def num_agents(self) -> int:
        return len(self.starts)

    def holes(self) -> np.ndarray:
        """Bool [H, W], True on holes."""
        return np.array([[ch == HOLE_CELL for ch in row] for row in self.grid], dtype=bool)

    def with_labels(self, optimal_soc, optimal_makespan, needs_wait) -> Problem:
        return dataclasses.replace(
            self,
            optimal_soc=None if optimal_soc is None else int(optimal_soc),
            optimal_makespan=None if optimal_makespan is None else int(optimal_makespan),
            needs_wait=None if needs_wait is None else bool(needs_wait),
        )


class ProblemError(ValueError):
    """A malformed problem; the message names the field, the value and what is allowed."""


def check_problem(p: Problem, where: str = "") -> None:
    """Raise ProblemError unless `p` is a well-formed, renderable puzzle."""
    at = f"{where}: " if where else ""
    if not p.grid:
        raise ProblemError(f"{at}field 'grid' is empty; expected at least one row of F/H")
    width = len(p.grid[0])
    for r, row in enumerate(p.grid):
        if len(row) != width:
            raise ProblemError(
                f"{at}field 'grid' row {r} has length {len(row)}, expected {width} "
                "(all rows the same length)"
            )
        bad = sorted(set(row) - {FROZEN, HOLE_CELL})
        if bad:
            raise ProblemError(
                f"{at}field 'grid' row {r} has unknown symbol(s) {bad}; allowed: 'F' (frozen), "
                "'H' (hole)"
            )
    if p.height > MAX_SIZE * 4 or width > MAX_SIZE * 4:
        raise ProblemError(f"{at}grid {p.height}x{width} is too large (at most 40x40)")
    if len(p.starts) != len(p.goals):
        raise ProblemError(
            f"{at}'starts' has {len(p.starts)} agents but 'goals' has {len(p.goals)}"
        )
    if not 1 <= len(p.starts):
        raise ProblemError(f"{at}no agents: 'starts' must list at least one [row, col]")
    holes = p.holes()
    for field, cells in (("starts", p.starts), ("goals", p.goals)):
        for i, cell in enumerate(cells):
            if len(cell) != 2 or not all(isinstance(v, (int, np.integer)) for v in cell):
                raise ProblemError(f"{at}field '{field}'[{i}] = {cell!r} is not [row, col]")
            r, c = cell
            if not (0 <= r < p.height and 0 <= c < width):
                raise ProblemError(
                    f"{at}field '{field}'[{i}] = [{r}, {c}] lies outside the "
                    f"{p.height}x{width} grid (rows 0..{p.height - 1}, cols 0..{width - 1})"
                )
            if holes[r, c]:
                raise ProblemError(f"{at}field '{field}'[{i}] = [{r}, {c}] is on a hole")
        if len(set(map(tuple, cells))) != len(cells):
            raise ProblemError(f"{at}field '{field}' has duplicate cells: {list(cells)}")


@struct.dataclass
class Instance:
    """A puzzle padded to static maxima; add a leading batch axis for a batch.

    holes:      bool  [S, S]   True on holes; cells outside (height, width) are False and
                               treated as out of bounds by the dynamics.
    height:     int32 []       real number of rows.
    width:      int32 []       real number of columns.
    starts:     int32 [N, 2]   (row, col) per agent slot; padded slots hold (0, 0).
    goals:      int32 [N, 2]
    agent_mask: bool  [N]      True for real agents (always a prefix).
    optimal_soc, optimal_makespan: int32 [] labels, -1 when unknown.
    needs_wait: int32 []       1 / 0, -1 when unknown.
    """

    holes: jnp.ndarray
    height: jnp.ndarray
    width: jnp.ndarray
    starts: jnp.ndarray
    goals: jnp.ndarray
    agent_mask: jnp.ndarray
    optimal_soc: jnp.ndarray
    optimal_makespan: jnp.ndarray
    needs_wait: jnp.ndarray

    @property
    def num_agents(self):
        """int32 [] (or [B]) number of real agents."""
        return self.agent_mask.sum(-1)


def assert_instance_shapes(instance: Instance, batched: bool) -> tuple[int, int]:
    """Assert (chex) that the leaves agree on (B,) S and N; return (S, N). Shapes are static, so
    this costs nothing per call under jit.

    holes Bool[Array, "b s s"]; starts, goals Int[Array, "b n 2"]; agent_mask Bool[Array, "b n"];
    height, width and the labels Int[Array, "b"]; no "b" axis when not `batched`.
    """
    chex.assert_rank(instance.height, 1 if batched else 0)
    lead = tuple(np.shape(instance.height))
    size, n = np.shape(instance.holes)[-1], np.shape(instance.agent_mask)[-1]
    chex.assert_shape(instance.holes, (*lead, size, size))
    chex.assert_shape([instance.starts, instance.goals], (*lead, n, 2))
    chex.assert_shape(instance.agent_mask, (*lead, n))
    scalars = [instance.width, instance.optimal_soc, instance.optimal_makespan, instance.needs_wait]
    chex.assert_shape(scalars, lead)
    return size, n


def _label(v) -> int:
    return UNKNOWN if v is None else int(v)


def to_instances(
    problems: Sequence[Problem], max_size: int | None = None, max_agents: int | None = None
) -> Instance:
    """Stack host problems into one padded batch (NumPy leaves, leading axis B).

    Padding defaults to (MAX_SIZE, MAX_AGENTS), or larger when a problem needs it, so that
    batches of different mixes share one compiled shape.
    """
    if max_size is None:
        max_size = max([MAX_SIZE, *(max(p.height, p.width) for p in problems)])
    if max_agents is None:
        max_agents = max([MAX_AGENTS, *(p.num_agents for p in problems)])
    b = len(problems)
    holes = np.zeros((b, max_size, max_size), bool)
    starts = np.zeros((b, max_agents, 2), np.int32)
    goals = np.zeros((b, max_agents, 2), np.int32)
    mask = np.zeros((b, max_agents), bool)
    h = np.zeros(b, np.int32)
    w = np.zeros(b, np.int32)
    soc = np.full(b, UNKNOWN, np.int32)
    mk = np.full(b, UNKNOWN, np.int32)
    nw = np.full(b, UNKNOWN, np.int32)
    for i, p in enumerate(problems):
        if p.height > max_size or p.width > max_size or p.num_agents > max_agents:
            raise ProblemError(
                f"problem {p.id!r} ({p.height}x{p.width}, {p.num_agents} agents) exceeds the "
                f"padding ({max_size}x{max_size}, {max_agents} agents)"
            )
        holes[i, : p.height, : p.width] = p.holes()
        n = p.num_agents
        starts[i, :n] = p.starts
        goals[i, :n] = p.goals
        mask[i, :n] = True
        h[i], w[i] = p.height, p.width
        soc[i] = _label(p.optimal_soc)
        mk[i] = _label(p.optimal_makespan)
        nw[i] = _label(p.needs_wait)
    return Instance(holes, h, w, starts, goals, mask, soc, mk, nw)


def to_problems(batch: Instance, ids: Sequence[str] | None = None) -> list[Problem]:
    """Inverse of `to_instances`: a batched Instance back to host problems."""
    leaves = {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
    b = leaves["height"].shape[0]
    if ids is None:
        ids = [f"inst_{i:06d}" for i in range(b)]
    out = []
    for i in range(b):
        h, w = int(leaves["height"][i]), int(leaves["width"][i])
        n = int(leaves["agent_mask"][i].sum())
        grid = tuple(
            "".join(HOLE_CELL if leaves["holes"][i, r, c] else FROZEN for c in range(w))
            for r in range(h)
        )

        def lab(name, i=i):
            v = int(leaves[name][i])
            return None if v == UNKNOWN else v

        nw = lab("needs_wait")
        out.append(
            Problem(
                id=ids[i],
                grid=grid,
                starts=tuple(tuple(int(v) for v in xy) for xy in leaves["starts"][i, :n]),
                goals=tuple(tuple(int(v) for v in xy) for xy in leaves["goals"][i, :n]),
                optimal_soc=lab("optimal_soc"),
                optimal_makespan=lab("optimal_makespan"),
                needs_wait=None if nw is None else bool(nw),
            )
        )
    return out


def needs_wait(optimal_soc, shortest_path_lengths) -> bool:
    """The `wait_ratio` label: the agents must interact to be solved optimally.

    True when the optimal sum-of-costs exceeds the sum of the agents' individual
    shortest-path lengths (ignoring the other agents). The generator, the statistics and
    the engineer's context all call this one function.
    """
    return int(optimal_soc) > int(np.sum(shortest_path_lengths))
