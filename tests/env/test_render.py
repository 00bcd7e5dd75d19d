"""Tests for the pictures: valid PNG/GIF files, frame counts, moving pixels, failure marking."""

import numpy as np
import pytest
from PIL import Image

from mapfjax.env import render
from mapfjax.env.types import DOWN, LEFT, RIGHT, UP, WAIT, Problem

P = Problem(
    id="r",
    grid=("FFFF", "FHFF", "FFHF", "FFFF"),
    starts=((0, 0), (3, 0), (1, 2)),
    goals=((0, 3), (1, 0), (3, 3)),
)
GOOD_PLAN = [[RIGHT, RIGHT, RIGHT], [UP, UP], [RIGHT, DOWN, DOWN]]


def test_trace_follows_the_plan_and_succeeds():
    tr = render._trace(P, GOOD_PLAN)
    assert tr.fail_kind is None
    assert tr.positions.shape == (4, 3, 2)
    assert tr.positions[:, 0].tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert tr.positions[:, 1].tolist() == [[3, 0], [2, 0], [1, 0], [1, 0]]  # list ended: stays
    assert tr.positions[-1].tolist() == [list(g) for g in P.goals]


@pytest.mark.parametrize(
    "plan, step, kind, agents",
    [
        ([[UP], [], []], 1, "illegal_move", (0,)),
        ([[], [], [DOWN]], 1, "hole", (2,)),
        ([[RIGHT, RIGHT], [], [WAIT, UP]], 2, "vertex_conflict", (0, 2)),
        ([[RIGHT, RIGHT], [], [UP, LEFT]], 2, "edge_conflict", (0, 2)),
        ([[RIGHT], [], [RIGHT]], 1, "goal_not_reached", (0, 1, 2)),
        ([[UP, DOWN], [], [DOWN]], 1, "illegal_move", (0,)),  # precedence over agent 2's hole
    ],
)
def test_trace_first_failure(plan, step, kind, agents):
    tr = render._trace(P, plan)
    assert (tr.fail_step, tr.fail_kind, tr.fail_agents) == (step, kind, agents)
    if kind != "goal_not_reached":  # positions freeze after a failure
        assert (tr.positions[step:] == tr.positions[step]).all()


def test_trace_rejects_bad_plans():
    with pytest.raises(ValueError, match="3 agents"):
        render._trace(P, [[UP]])
    with pytest.raises(ValueError, match=r"plan\[1\]\[0\] = 7"):
        render._trace(P, [[], [7], []])


def test_draw_problem_returns_axes_with_ticks_and_title():
    ax = render.draw_problem(P, plan=GOOD_PLAN, t=1)
    assert ax.get_title().startswith("4x4 map, 3 agents") and "t=1/3" in ax.get_title()
    assert [int(v) for v in ax.get_xticks()] == [0, 1, 2, 3]
    assert ax.get_ylim() == (3.5, -0.5)  # row 0 at the top
    failing = render.draw_problem(P, plan=[[], [], [DOWN]])
    assert "FAIL at t=1: hole (agent 2)" in failing.get_title()


def test_save_png_is_a_valid_png_and_plan_changes_it(tmp_path):
    plain, planned = tmp_path / "p.png", tmp_path / "pp.png"
    render.save_png(P, plain)
    render.save_png(P, planned, plan=GOOD_PLAN)
    for path in (plain, planned):
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] > 100
    a = np.asarray(Image.open(plain).convert("RGB"), dtype=int)
    b = np.asarray(Image.open(planned).convert("RGB"), dtype=int)
    assert a.shape == b.shape and np.abs(a - b).sum() > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "pp.png"]  # no temp files


def test_save_gif_frames_and_moving_pixels(tmp_path):
    path = tmp_path / "a.gif"
    render.save_gif(P, GOOD_PLAN, path, fps=4)
    with Image.open(path) as im:
        assert im.format == "GIF" and im.n_frames == 4
        assert im.info["duration"] == 250
        frames = []
        for i in range(im.n_frames):
            im.seek(i)
            frames.append(np.asarray(im.convert("RGB"), dtype=int))
    _, to_px = render._frames(P, GOOD_PLAN)

    def pixel(frame, cell):
        y, x = to_px(*cell)
        return frames[frame][y, x]

    def moved(f0, f1, cell):
        return np.abs(pixel(f0, cell) - pixel(f1, cell)).sum() > 60

    # Agent 0 leaves (0, 0) and reaches (0, 1) at t=1; nothing happens at the empty cell (3, 2).
    assert moved(0, 1, (0, 0)) and moved(0, 1, (0, 1))
    assert not moved(0, 1, (3, 2)) and not moved(0, 3, (3, 2))
    # Agent 1 stops after two steps: frames 2 and 3 agree at its cell.
    assert not moved(2, 3, (1, 0))


def test_save_gif_marks_failure_from_its_frame(tmp_path):
    plan = [[RIGHT, DOWN, WAIT, WAIT], [], []]  # agent 0 enters the hole (1, 1) at t=2
    frames, to_px = render._frames(P, plan)
    assert len(frames) == 5
    y, x = to_px(1, 1)

    def redness(frame):  # how much red dominates near the hole cell (the failure colour is red)
        f = frame[y - 30 : y + 31, x - 30 : x + 31].astype(int)
        return (f[..., 0] - np.maximum(f[..., 1], f[..., 2])).max()

    assert redness(frames[1]) < 120 < redness(frames[2])
    assert redness(frames[4]) > 120  # stays marked
    render.save_gif(P, plan, tmp_path / "f.gif")
    with Image.open(tmp_path / "f.gif") as im:
        assert im.n_frames == 5


def test_empty_plan_gives_one_frame_and_bad_fps_raises(tmp_path):
    render.save_gif(P, [[], [], []], tmp_path / "one.gif")
    with Image.open(tmp_path / "one.gif") as im:
        assert getattr(im, "n_frames", 1) == 1
    with pytest.raises(ValueError, match="fps"):
        render.save_gif(P, GOOD_PLAN, tmp_path / "x.gif", fps=0)


def test_importing_env_modules_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, mapfjax.env.render, mapfjax.env.io; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_trace_agrees_with_the_verifier_on_random_plans():
    """The drawing simulation is independent of dynamics.py; both must tell the same story."""
    from mapfjax.env import dynamics, text, types

    rng = np.random.default_rng(0)
    problems, plans = [], []
    for k in range(200):
        h, w = rng.integers(2, 6, size=2)
        cells = [(r, c) for r in range(h) for c in range(w)]
        n = int(rng.integers(1, min(4, len(cells)) + 1))
        starts = [cells[j] for j in rng.permutation(len(cells))[:n]]
        goals = [cells[j] for j in rng.permutation(len(cells))[:n]]
        keep = set(starts) | set(goals)
        grid = tuple(
            "".join("H" if (r, c) not in keep and rng.random() < 0.2 else "F" for c in range(w))
            for r in range(h)
        )
        problems.append(Problem(f"p{k}", grid, tuple(starts), tuple(goals)))
        plans.append([rng.integers(0, 5, size=rng.integers(0, 7)).tolist() for _ in range(n)])
    parsed = text.parse_answers([text.render_answer(p) for p in plans], [len(p) for p in plans])
    verdict = dynamics.verify(types.to_instances(problems), parsed)
    kinds = set()
    for i, (p, plan) in enumerate(zip(problems, plans)):
        tr = render._trace(p, plan)
        kinds.add(tr.fail_kind)
        assert tr.fail_kind == types.FAILURES[int(verdict.failure[i])], (p, plan)
        if tr.fail_kind is not None:
            assert tr.fail_step == int(verdict.failure_time[i]), (p, plan)
    assert len(kinds) == 6  # every outcome (5 failures + success) was exercised
