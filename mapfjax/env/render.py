"""Pictures of puzzles and plans: a PNG of a map (optionally with a plan's trails) and a GIF
animation of a plan that marks its first failure. matplotlib is imported lazily (Agg canvas).
"""

from __future__ import annotations

import dataclasses
import io as _bytes_io
from collections.abc import Sequence

import numpy as np

from mapfjax.env.simulate import simulate
from mapfjax.env.types import ACTION_NAMES, Problem, check_problem
from mapfjax.files import atomic_write

# Okabe-Ito colours (distinguishable with the common colour-vision deficiencies); the first
# five are the agents of the paper's largest benchmark.
AGENT_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#D55E00", "#0072B2", "#F0E442")
FROZEN_COLOUR = "#EAF2F8"
HOLE_COLOUR = "#0B2545"
HOLE_HATCH_COLOUR = "#5C7FB0"
FAIL_COLOUR = "#C00000"
CELL_INCHES = 0.6  # figure size per map cell, clamped to [3, 9] inches overall


@dataclasses.dataclass(frozen=True)
class _Trace:
    """positions: int [T+1, N, 2] (row, col) per time step; failure fields are None if none."""

    positions: np.ndarray
    fail_step: int | None = None
    fail_kind: str | None = None
    fail_agents: tuple[int, ...] = ()
    fail_cells: tuple[tuple[int, int], ...] = ()


def _trace(problem: Problem, plan: Sequence[Sequence[int]]) -> _Trace:
    """The plan as drawn: the reference simulation (`simulate.simulate`, first failure only),
    ending on every agent's cell at a failing step and frozen from there on."""
    n = problem.num_agents
    if len(plan) != n:
        raise ValueError(f"plan has {len(plan)} agent lists, the problem has {n} agents")
    for i, acts in enumerate(plan):
        for t, a in enumerate(acts):
            if not 0 <= int(a) < len(ACTION_NAMES):
                raise ValueError(f"plan[{i}][{t}] = {a!r} is not an action code 0..4")
    sim = simulate(problem, [[int(a) for a in acts] for acts in plan])
    history = sim["positions"]
    if sim["failure_positions"] is not None:
        history = [*history, sim["failure_positions"]]
    steps = max((len(a) for a in plan), default=0)
    pos = np.zeros((steps + 1, n, 2), np.int64)
    pos[: len(history)] = np.asarray(history, np.int64).reshape(-1, n, 2)
    pos[len(history) :] = pos[len(history) - 1]
    if sim["failure"] is None:
        return _Trace(pos)
    kind, t = sim["failure"], sim["failure_time"]
    return _Trace(pos, t, kind, sim["failure_agents"], sim["failure_cells"])


def _colour(i: int) -> str:
    return AGENT_COLOURS[i % len(AGENT_COLOURS)]


def _new_axes(problem: Problem, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    side = float(np.clip(CELL_INCHES * max(problem.height, problem.width) + 1.2, 3.0, 9.0))
    fig = Figure(figsize=(side, side), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def draw_problem(problem: Problem, ax=None, plan: Sequence[Sequence[int]] | None = None, t=None):
    """Draw a puzzle on `ax` (a new Agg figure when None) and return the Axes.

    Frozen cells are light, holes dark and hatched; each agent is a coloured disc with its index,
    its goal a hollow square of the same colour. With a plan (per-agent action-code lists) the
    agents are drawn at time step `t` (default: the end) with their trails so far, and the
    plan's first failure is marked with a red X from the step it happens.
    """
    check_problem(problem, where=f"problem {problem.id!r}")
    if ax is None:
        ax = _new_axes(problem, dpi=100)
    h, w, k = problem.height, problem.width, problem.num_agents
    cell_pts = ax.get_position().width * ax.figure.get_figwidth() * 72 / max(h, w)
    font = float(np.clip(cell_pts * 0.38, 5, 16))
    _draw_map(ax, problem, font)
    _draw_goals(ax, problem.goals, font)
    title = f"{h}x{w} map, {k} agent{'s' * (k != 1)}"
    positions = np.asarray(problem.starts).reshape(k, 2)
    if plan is not None:
        trace = _trace(problem, plan)
        steps = len(trace.positions) - 1
        t = steps if t is None else int(np.clip(t, 0, steps))
        positions = trace.positions[t]
        _draw_trails(ax, trace.positions[: t + 1], font)
        title += f"  t={t}/{steps}"
        if trace.fail_step is not None and trace.fail_step <= t:
            _mark_failure(ax, trace.fail_cells, font)
            agents = ", ".join(map(str, trace.fail_agents))
            title += f"\nFAIL at t={trace.fail_step}: {trace.fail_kind} (agent {agents})"
    _draw_agents(ax, positions, font)
    ax.set_title(title, fontsize=max(font * 0.8, 7))
    return ax


def _draw_map(ax, problem: Problem, font: float) -> None:
    """Frozen background, hatched holes, cell grid and (row, col) axes, row 0 at the top."""
    from matplotlib.patches import Rectangle

    h, w = problem.height, problem.width
    ax.imshow(np.zeros((h, w)), cmap=_single_colour_cmap(FROZEN_COLOUR), vmin=0, vmax=1)
    for r, c in zip(*np.nonzero(problem.holes())):
        ax.add_patch(
            Rectangle(
                (c - 0.5, r - 0.5),
                1,
                1,
                facecolor=HOLE_COLOUR,
                edgecolor=HOLE_HATCH_COLOUR,
                hatch="xx",
                linewidth=0,
                zorder=1,
            )
        )
    ax.set_xticks(np.arange(w))
    ax.set_yticks(np.arange(h))
    ax.set_xticks(np.arange(-0.5, w), minor=True)
    ax.set_yticks(np.arange(-0.5, h), minor=True)
    ax.grid(which="minor", color="#7F8C99", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    ax.tick_params(labelsize=max(font * 0.7, 5))
    ax.set_xlabel("col", fontsize=max(font * 0.8, 6))
    ax.set_ylabel("row", fontsize=max(font * 0.8, 6))
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)  # row 0 at the top, as in the prompt
    ax.set_aspect("equal")


def _draw_goals(ax, goals, font: float) -> None:
    """Each goal as a hollow square in its agent's colour, the agent index in a corner."""
    from matplotlib.patches import Rectangle

    for i, (r, c) in enumerate(goals):
        ax.add_patch(
            Rectangle(
                (c - 0.43, r - 0.43),
                0.86,
                0.86,
                fill=False,
                edgecolor=_colour(i),
                linewidth=max(font * 0.2, 1.5),
                zorder=3,
            )
        )
        ax.text(
            c + 0.4,
            r - 0.38,
            str(i),
            color=_colour(i),
            fontsize=font * 0.55,
            fontweight="bold",
            ha="right",
            va="top",
            zorder=3,
        )


def _draw_trails(ax, path: np.ndarray, font: float) -> None:
    """path: int [t+1, N, 2] cells so far; one translucent line per agent, slightly offset so
    that overlapping trails stay apart."""
    k = path.shape[1]
    for i in range(k):
        off = (i - (k - 1) / 2) * 0.06
        ax.plot(
            path[:, i, 1] + off,
            path[:, i, 0] + off,
            color=_colour(i),
            linewidth=font * 0.25,
            alpha=0.55,
            solid_capstyle="round",
            zorder=2,
        )


def _mark_failure(ax, cells, font: float) -> None:
    """A red X and a red frame on each (row, col) cell of the first failure."""
    from matplotlib.patches import Rectangle

    for r, c in cells:
        ax.plot(
            c,
            r,
            marker="X",
            markersize=font * 2.6,
            color=FAIL_COLOUR,
            markeredgecolor="black",
            markeredgewidth=1.0,
            alpha=0.9,
            zorder=3.5,  # under the disc: its arms stay visible around it
        )
        ax.add_patch(
            Rectangle(
                (c - 0.5, r - 0.5),
                1,
                1,
                fill=False,
                edgecolor=FAIL_COLOUR,
                linewidth=max(font * 0.3, 2),
                zorder=3.6,
            )
        )


def _draw_agents(ax, positions: np.ndarray, font: float) -> None:
    """positions: int [N, 2]; each agent a disc in its colour with its index."""
    from matplotlib.patches import Circle

    for i, (r, c) in enumerate(positions):
        ax.add_patch(
            Circle((c, r), 0.27, facecolor=_colour(i), edgecolor="black", linewidth=1.2, zorder=4)
        )
        ax.text(
            c,
            r,
            str(i),
            color="black",
            fontsize=font * 0.75,
            fontweight="bold",
            ha="center",
            va="center",
            zorder=5,
        )


def _single_colour_cmap(colour: str):
    from matplotlib.colors import ListedColormap

    return ListedColormap([colour])


def _figure_bytes(fig, fmt: str) -> bytes:
    buf = _bytes_io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue()


def save_png(problem: Problem, path, plan: Sequence[Sequence[int]] | None = None) -> None:
    """Write a PNG of the puzzle (with the whole plan's trails and final positions if given)."""
    ax = draw_problem(problem, ax=_new_axes(problem, dpi=100), plan=plan)
    ax.figure.tight_layout()
    atomic_write(path, _figure_bytes(ax.figure, "png"))


def _frames(problem: Problem, plan: Sequence[Sequence[int]], dpi: int = 72):
    """RGB frames uint8 [H_px, W_px, 3] for t = 0..T, and the frame's (row, col) -> (y, x)
    pixel mapping of cell centres."""
    ax = _new_axes(problem, dpi=dpi)
    fig = ax.figure
    steps = max((len(a) for a in plan), default=0)
    # Lay out once, on the last frame (the longest title), so cells stay put between frames.
    draw_problem(problem, ax=ax, plan=plan, t=steps)
    fig.tight_layout()
    frames = []
    for t in range(steps + 1):
        ax.clear()
        draw_problem(problem, ax=ax, plan=plan, t=t)
        fig.canvas.draw()
        frames.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
    height_px = frames[0].shape[0]

    def cell_to_pixel(r: int, c: int) -> tuple[int, int]:
        x, y = ax.transData.transform((c, r))
        return int(round(height_px - y)), int(round(x))

    return frames, cell_to_pixel


def save_gif(problem: Problem, plan: Sequence[Sequence[int]], path, fps: float = 2) -> None:
    """Write an animated GIF of a plan: one frame per time step 0..T (T = longest action list),
    trails of the agents so far, and the first failure marked from the frame it happens in."""
    from PIL import Image

    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    frames, _ = _frames(problem, plan)
    images = [Image.fromarray(f) for f in frames]
    buf = _bytes_io.BytesIO()
    images[0].save(
        buf,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=int(round(1000 / fps)),
        loop=0,
    )
    atomic_write(path, buf.getvalue())
