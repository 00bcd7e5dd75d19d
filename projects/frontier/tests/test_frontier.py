"""The frontier map: statistics against an independent NumPy transcription, n=0 cells, an
end-to-end run on a tiny grid, the command line's errors."""

import json
import math
import pathlib
import subprocess
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from mapfjax import env
from mapfjax.env import config as env_config
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib
from projects.frontier import frontier

ROOT = pathlib.Path(__file__).resolve().parents[3]
Z = 1.959963984540054


def wilson_roots(k_over_n, n):
    """The Wilson interval as the two roots of (x - phat)^2 = z^2 x (1 - x) / n."""
    a = 1 + Z**2 / n
    b = -(2 * k_over_n + Z**2 / n)
    c = k_over_n**2
    disc = max(b * b - 4 * a * c, 0.0)
    return (-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)


def reference(samples, greedy):
    """Each statistic written out puzzle by puzzle: value and (low, high)."""
    p_count, k = samples.shape
    rate = [sum(bool(x) for x in row) / k for row in samples]
    solved = [any(row) for row in samples]
    mixed = [any(row) and not all(row) for row in samples]
    flip = [(not g) and s for g, s in zip(greedy, solved)]
    learn = [r * (1 - r) for r in rate]

    def prop(xs):
        v = sum(xs) / p_count
        return v, wilson_roots(v, p_count)

    def mean(xs, upper):
        v = sum(xs) / p_count
        lo, hi = wilson_roots(v / upper, p_count)
        return v, (lo * upper, hi * upper)

    return {
        "greedy_valid": prop(list(greedy)),
        "mean_at_k": mean(rate, 1.0),
        "pass_at_k": prop(solved),
        "mixed": prop(mixed),
        "learnability": mean(learn, 0.25),
        "flip": prop(flip),
    }


@pytest.mark.parametrize("seed, p_count, k", [(0, 37, 8), (1, 5, 4), (2, 60, 1), (3, 1, 8)])
def test_statistics_match_reference(seed, p_count, k):
    rng = np.random.default_rng(seed)
    difficulty = rng.beta(0.7, 0.7, size=(p_count, 1))  # some puzzles always/never solved
    samples = rng.random((p_count, k)) < difficulty
    greedy = rng.random(p_count) < difficulty[:, 0]
    got = frontier.cell_stats(samples, greedy)
    want = reference(samples, greedy)
    assert set(got) == set(want)
    for name, (value, (low, high)) in want.items():
        e = got[name]
        assert e.n == p_count, name
        np.testing.assert_allclose([e.value, e.low, e.high], [value, low, high], atol=1e-12)
        assert e.low <= e.value <= e.high, name


def test_statistics_hand_case():
    # puzzle 0: all valid, greedy valid; 1: half valid, greedy fails (flip, mixed);
    # 2: none valid, greedy fails; 3: one of four, greedy valid (mixed, no flip).
    samples = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 1, 0]], bool)
    greedy = np.array([1, 0, 0, 1], bool)
    s = frontier.cell_stats(samples, greedy)
    assert s["greedy_valid"].value == 0.5
    assert s["mean_at_k"].value == pytest.approx((1 + 0.5 + 0 + 0.25) / 4)
    assert s["pass_at_k"].value == 0.75
    assert s["mixed"].value == 0.5
    assert s["learnability"].value == pytest.approx((0 + 0.25 + 0 + 0.1875) / 4)
    assert s["flip"].value == 0.25


def test_empty_cell_gives_n0_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice", no division by zero
        stats = frontier.cell_stats(np.zeros((0, 8), bool), np.zeros(0, bool))
    for e in stats.values():
        assert e.n == 0 and math.isnan(e.value) and e.as_dict()["value"] is None


def test_rows_cover_every_requested_cell_and_name_empty_splits():
    cols = {"id": ["a", "b"], "size": [3, 3], "hole_ratio": [0.2, 0.2], "needs_wait": "00",
            "greedy": "10", "samples": ["1100", "0000"]}  # fmt: skip
    results = frontier.PuzzleResults.from_columns(cols, 4)
    assert results.to_columns() == cols
    table, messages = frontier.frontier_rows(results, (3, 4), (0.0, 0.2))
    assert len(table) == 2 * 2 * 3
    by = {(r.size, r.hole_ratio, r.split): r for r in table}
    assert by[(3, 0.2, "no-wait")].n == 2 and by[(3, 0.2, "all")].n == 2
    assert by[(3, 0.2, "needs-wait")].n == 0
    assert by[(4, 0.0, "all")].n == 0
    assert messages == ["3x3, hole ratio 0.2, needs-wait: n=0 (none of the cell's 2 puzzle(s) is "
                        "needs-wait)"]  # fmt: skip
    assert by[(3, 0.2, "all")].stats["flip"].value == 0.0
    assert by[(3, 0.2, "all")].stats["mixed"].value == 0.5


def test_parse_and_validate_errors():
    assert env_config.parse_sizes("3-5,8") == (3, 4, 5, 8)
    assert frontier.parse_ratios("0.2,0,0.1") == (0.0, 0.1, 0.2)
    with pytest.raises(ValueError, match="'x' is not N or N-M"):
        env_config.parse_sizes("3,x")
    with pytest.raises(ValueError, match="runs backwards"):
        env_config.parse_sizes("10-3")
    with pytest.raises(ValueError, match="'a' is not a number"):
        frontier.parse_ratios("0,a")
    with pytest.raises(ValueError, match=r"hole_ratios = \(0.0, 0.7\); allowed"):
        frontier.FrontierConfig(hole_ratios=(0.0, 0.7)).validate()
    with pytest.raises(ValueError, match="samples = 0"):
        frontier.FrontierConfig(samples=0).validate()


def test_cell_without_any_puzzle_is_reported(tmp_path, caplog):
    # 5 agents need 10 distinct cells; a 3x3 map has 9: no puzzle can exist.
    cfg = frontier.FrontierConfig(agents=5, sizes=(3,), hole_ratios=(0.0,), per_cell=4)
    f = frontier.run(None, None, cfg, "none", progress=False)  # nothing to answer
    assert len(f.results.ids) == 0
    assert [r.n for r in f.rows] == [0, 0, 0]
    assert len(f.generation) == 1 and f.generation[0].startswith("3x3, hole ratio 0: n=0")
    assert "5 agents need 10 distinct" in f.generation[0]
    assert "3x3, hole ratio 0" in caplog.text
    paths = frontier.write(f, tmp_path)
    md = paths["md"].read_text()
    assert f.generation[0] in md
    assert "| 3x3 | 0 | all | 0 | n=0 |" in md
    data = json.loads(paths["json"].read_text())
    assert data["cells"][2]["greedy_valid"] == {"value": None, "low": None, "high": None, "n": 0}
    assert paths["greedy_valid"].read_bytes().startswith(b"\x89PNG")


def test_generator_failure_is_an_n0_cell(monkeypatch):
    def fails(key, cfg, n, **kw):
        raise RuntimeError("generator: size 4x4 produced only 0 of 3 solvable instances")

    monkeypatch.setattr(env, "generate", fails)
    cfg = frontier.FrontierConfig(sizes=(4,), hole_ratios=(0.5,), per_cell=3)
    problems, cells, messages = frontier.generate_grid(cfg, progress=False)
    assert problems == [] and cells == []
    assert messages == [
        "4x4, hole ratio 0.5: n=0, the generator produced no solvable puzzle: generator: size "
        "4x4 produced only 0 of 3 solvable instances"
    ]


def test_generator_shortfall_keeps_the_puzzles_that_exist(monkeypatch):
    real = env.generate

    def at_most_two(key, cfg, n, **kw):
        if n > 2:
            raise RuntimeError(f"generator: size 4x4 produced only 2 of {n} solvable instances")
        return real(key, cfg, n, **kw)

    monkeypatch.setattr(env, "generate", at_most_two)
    cfg = frontier.FrontierConfig(sizes=(4,), hole_ratios=(0.2,), per_cell=9)
    problems, cells, messages = frontier.generate_grid(cfg, progress=False)
    assert len(problems) == 2 and cells == [(4, 0.2)] * 2  # asked for 9, 4, then 2
    assert messages == [
        "4x4, hole ratio 0.2: only 2 of 9 puzzles: generator: size 4x4 produced only 2 of 4 "
        "solvable instances"
    ]


def test_end_to_end_tiny_grid(tiny_model_dir, tmp_path):
    model = hf.from_pretrained(tiny_model_dir, dtype=jnp.float32)
    tok = tok_lib.load_tokenizer(tiny_model_dir)
    # batch_rows 12: 3 puzzles x 4 samples per call, so the grid takes several calls.
    cfg = frontier.FrontierConfig(
        sizes=(3, 4), hole_ratios=(0.0, 0.2), per_cell=4, samples=4, max_new_tokens=12,
        batch_rows=12,
    )  # fmt: skip
    f = frontier.run(model, tok, cfg, "tiny random", progress=False)
    assert len(f.results.ids) == 16 and f.results.samples.shape == (16, 4)
    assert f.generation == []
    cells = {(r.size, r.hole_ratio, r.split): r.n for r in f.rows}
    assert len(cells) == 12
    for s in (3, 4):
        for h in (0.0, 0.2):
            assert cells[(s, h, "all")] == 4
            assert cells[(s, h, "no-wait")] + cells[(s, h, "needs-wait")] == 4
    paths = frontier.write(f, tmp_path / "out")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(p.name for p in paths.values())  # no temp file left behind
    md = paths["md"].read_text()
    for s in (3, 4):
        for h in ("0", "0.2"):
            for split in frontier.SPLITS:
                assert f"| {s}x{s} | {h} | {split} |" in md
    csv_lines = paths["csv"].read_text().splitlines()
    assert len(csv_lines) == 1 + 12
    # The JSON's per-puzzle table reproduces every statistic.
    again = frontier.from_json(json.loads(paths["json"].read_text()))
    assert frontier.markdown_table(again.rows, 4) == frontier.markdown_table(f.rows, 4)
    first = f.rows[0]
    mask = (f.results.size == 3) & (f.results.hole_ratio == 0.0) & ~f.results.needs_wait
    assert first.stats == frontier.cell_stats(f.results.samples[mask], f.results.greedy[mask])


def test_command_line_names_a_bad_flag(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "projects.frontier.measure", "--checkpoint", str(tmp_path),
         "--sizes", "3-x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "error: sizes '3-x'" in proc.stderr
