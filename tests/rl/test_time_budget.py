"""train.max_minutes: a GRPO phase that ends on a time budget rather than an update count
(`driver.run_phase`), resumed phases counting their earlier steps' seconds."""

import json
import sys

import numpy as np
import pytest

from mapfjax.rl import driver, rollout
from tests.models.test_bpe import random_problems
from tests.rl.test_screen import half_valid_rollout

sys.path.insert(0, "configs")
import tiny_cpu  # noqa: E402


class _Trainer:
    def __init__(self):
        self.saved = []

    def train_on(self, batch, n):
        return [{"loss": 0.0}]

    def save(self, directory, data=None, **k):
        self.saved.append(dict(data))


@pytest.fixture
def phase(monkeypatch, tmp_path):
    """run(steps, max_minutes, step_seconds, start_step) -> (trainer, metrics rows): a phase
    whose every step takes step_seconds on a fake clock."""
    monkeypatch.setattr(rollout, "rollout", half_valid_rollout)
    monkeypatch.setattr(driver, "select_groups", lambda b, useful, keep, g: (b, None, keep))
    problems = random_problems(8, seed=5, sizes=(3,))

    def run(steps, max_minutes, step_seconds, start_step=0):
        clock = iter(np.arange(0, 10_000, step_seconds / 2))  # t0, t1, t2 per step
        monkeypatch.setattr(driver.time, "perf_counter", lambda: float(next(clock)))
        c = tiny_cpu.get_config()
        c.train.steps, c.train.problems_per_step, c.train.group_size = steps, 2, 2
        c.train.max_minutes, c.train.checkpoint_every = max_minutes, 100
        trainer = _Trainer()
        driver.run_phase(
            trainer, None, problems, driver.GRPOSettings.from_config(c), seed=[1],
            position={"round": 0}, out_dir=tmp_path, ckpt_dir=tmp_path / "ckpt",
            start_step=start_step, progress=False,
        )  # fmt: skip
        rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        return trainer, rows

    return run


def test_the_phase_ends_before_a_step_that_would_pass_the_budget(phase, tmp_path):
    # 20 s a step, 90 s allowed: after 4 steps (80 s) a fifth would reach 100
    trainer, rows = phase(steps=10, max_minutes=1.5, step_seconds=20)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["seconds"] for r in rows) == pytest.approx(80)
    # the phase counts as finished: a resumed run skips it, the loop validates the round
    assert trainer.saved == [{"round": 0, "step": 10}]
    budget = json.loads((tmp_path / driver.BUDGET_FILE).read_text())
    assert budget == {"updates": 4, "of": 10, "seconds": pytest.approx(80), "max_minutes": 1.5}


def test_no_budget_runs_every_step_and_the_first_step_always_runs(phase, tmp_path):
    _, rows = phase(steps=3, max_minutes=0, step_seconds=500)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert not (tmp_path / driver.BUDGET_FILE).exists()
    (tmp_path / "metrics.jsonl").unlink()
    trainer, rows = phase(steps=3, max_minutes=1, step_seconds=500)  # one step is over it
    assert [r["step"] for r in rows] == [1] and trainer.saved == [{"round": 0, "step": 3}]


def test_a_resumed_phase_counts_the_seconds_of_its_earlier_steps(phase):
    phase(steps=2, max_minutes=0, step_seconds=30)  # steps 1-2 logged: 60 s
    # resumed at 2 with 20 s steps and 90 s allowed: 80 s after step 3, a fourth would pass
    # it (counting only its own steps it would run to step 6)
    trainer, rows = phase(steps=10, max_minutes=1.5, step_seconds=20, start_step=2)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert trainer.saved == [{"round": 0, "step": 10}]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "30", True])
def test_a_bad_budget_names_the_key(bad):
    c = tiny_cpu.get_config()
    c.train.max_minutes = bad
    with pytest.raises(ValueError, match=r"train.max_minutes = .*; allowed: 0 \(no time budget\)"):
        driver.GRPOSettings.from_config(c)
