"""Generator: determinism, requested vs achieved ratios, solvability and label correctness."""

import collections
import subprocess
import sys

import jax
import numpy as np
import pytest

from mapfjax.env import config as C
from mapfjax.env import dynamics, generator, io, oracle, text, types
from tests.env.test_oracle import brute_soc

N = 240


@pytest.fixture(scope="module")
def small_config():
    cfg = C.default_config(num_agents=2, sizes=(3, 4, 5, 6), hole_ratio=0.2, wait_ratio=0.3)
    cfg, _ = C.project(
        {
            "sizes.s3.data_ratio": 0.4,
            "sizes.s4.wait_ratio": 0.6,
            "sizes.s5.hole_ratio": 0.35,
            "sizes.s6.wait_ratio": 0.0,
        },
        cfg,
    )
    return cfg


@pytest.fixture(scope="module")
def batch(small_config):
    return generator.generate(jax.random.key(7), small_config, N)


def test_deterministic_given_key(small_config, batch):
    again = generator.generate(jax.random.key(7), small_config, N)
    assert again.problems == batch.problems
    other = generator.generate(jax.random.key(8), small_config, N)
    assert other.problems != batch.problems


def test_achieved_ratios_match_requested(small_config, batch):
    counts = C.requested_counts(small_config, N)
    by_size = collections.defaultdict(list)
    for p in batch.problems:
        by_size[p.height].append(p)
    assert {s: len(v) for s, v in by_size.items()} == {s: c for s, (c, _) in counts.items()}
    for s, (_, w) in counts.items():
        probs = by_size[s]
        # wait quota met exactly (tolerance 0): the shares are filled from labelled pools
        assert sum(p.needs_wait for p in probs) == w, s
        hole = small_config.sizes[C.size_key(s)].hole_ratio
        want = round(hole * s * s) / (s * s)
        assert all(abs(p.holes().mean() - want) < 1e-9 for p in probs), s
    rep = {r.size: r for r in batch.report.sizes}
    for s, (c, w) in counts.items():
        assert rep[s].achieved == c and rep[s].requested == c
        assert abs(rep[s].achieved_wait_ratio - w / c) < 1e-9
    assert "wait req" in batch.report.table()


def test_instances_are_well_formed_and_labels_are_exact(batch):
    for p in batch.problems:
        types.check_problem(p)
        assert not set(p.starts) & set(p.goals)  # no start on any goal: clean rendering
        lengths = oracle.shortest_path_lengths(p)
        assert p.needs_wait == types.needs_wait(p.optimal_soc, lengths)
    # optimal costs against brute-force joint search on the small maps
    small = [p for p in batch.problems if p.height <= 4][:60]
    assert small
    for p in small:
        assert p.optimal_soc == brute_soc(p), p


def test_padded_batch_roundtrip(batch):
    assert batch.instances.holes.shape == (N, 10, 10)
    assert batch.instances.starts.shape == (N, 5, 2)
    back = types.to_problems(batch.instances, [p.id for p in batch.problems])
    assert back == batch.problems


def test_render_solve_parse_verify_is_valid_and_optimal(batch):
    probs = batch.problems[:80]
    sols = oracle.solve_many(probs, processes=1)
    answers = [text.render_answer(oracle.answer_actions(s)) for s in sols]
    # the prompt parses back to the same puzzle, and the canonical answer verifies as optimal
    assert all(text.parse_prompt(text.render_prompt(p)).grid == p.grid for p in probs)
    parsed = text.parse_answers(answers, [p.num_agents for p in probs])
    v = dynamics.verify(types.to_instances(probs), parsed)
    assert np.asarray(v.valid).all() and np.asarray(v.optimal).all()


def test_candidates_have_exact_holes_distinct_cells_and_reachability():
    sizes = jax.numpy.asarray([3, 5, 10, 7] * 16, jax.numpy.int32)
    holes = jax.numpy.asarray([0.0, 0.5, 0.3, 0.2] * 16, jax.numpy.float32)
    inst, reachable, shortest = generator.sample_candidates(
        jax.random.key(0),
        sizes,
        holes,
        jax.numpy.arange(64) % 2 == 0,
        max_size=10,
        max_agents=5,
        num_agents=3,
    )
    probs = types.to_problems(inst)
    for p, ok, d in zip(probs, np.asarray(reachable), np.asarray(shortest), strict=True):
        types.check_problem(p)
        cells = list(p.starts) + list(p.goals)
        assert len(set(cells)) == 6
        try:
            lens = oracle.shortest_path_lengths(p)
            assert ok and list(d[:3]) == lens
        except ValueError:
            assert not ok
    counts = {3: 0, 5: 12, 10: 30, 7: 10}
    for p in probs:
        assert p.holes().sum() == counts[p.height]


def test_generate_cli_writes_jsonl(tmp_path):
    out = tmp_path / "g.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "mapfjax.env",
        "generate",
        "--out",
        str(out),
        "--n",
        "20",
        "--sizes",
        "3-4",
        "--set",
        "sizes.s4.hole_ratio=0.9",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "clipped to 0.5" in res.stderr
    probs = io.load_instances(out)
    assert len(probs) == 20 and all(p.optimal_soc is not None for p in probs)
    bad = subprocess.run(cmd[:-2] + ["--set", "seed=3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "seed" in bad.stderr and "Traceback" not in bad.stderr


def test_a_wait_shortfall_is_filled_from_no_wait_instances_and_reported():
    cfg = C.default_config(num_agents=2, sizes=(3,), hole_ratio=0.0, wait_ratio=1.0)
    cfg.pool.max_rounds = 1  # too few rounds for 40 needs-wait instances on an open 3x3 map
    cfg.oracle.processes = 1
    got = generator.generate(jax.random.key(5), cfg, 40)
    (row,) = got.report.sizes
    waits = sum(p.needs_wait for p in got.problems)
    assert len(got.problems) == row.achieved == 40 and 0 < waits < 40
    assert row.requested_wait_ratio == 1.0 and row.achieved_wait_ratio == waits / 40


def test_too_few_solvable_instances_raise_naming_the_size_and_the_remedy():
    cfg = C.default_config(num_agents=3, sizes=(3,), hole_ratio=0.5, wait_ratio=0.0)
    cfg.pool.max_rounds = 1
    cfg.oracle.processes = 1
    with pytest.raises(RuntimeError, match=r"size 3x3 produced only \d+ of 200 .*pool.max_rounds"):
        generator.generate(jax.random.key(0), cfg, 200)
