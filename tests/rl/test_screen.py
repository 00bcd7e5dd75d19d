"""train.screen: each update's groups drawn from the puzzles the current greedy answer fails
first (`driver.screen_problems`), wired through `driver.run_phase`."""

import json
import sys
import types

import numpy as np
import pytest

from mapfjax.env import oracle, text
from mapfjax.env.reward import RewardConfig
from mapfjax.rl import driver, rollout
from tests.models.test_bpe import random_problems
from tests.rl.test_rollout import model, tok  # noqa: F401 (fixtures)

sys.path.insert(0, "configs")
import tiny_cpu  # noqa: E402


def _right(p) -> str:
    return text.render_answer(oracle.answer_actions(oracle.solve(p)))


@pytest.fixture
def answered(monkeypatch):
    """rollout.sample answering each puzzle right or with nothing, as set in `right` (by id);
    the calls' (repeats, temperature) are kept in `calls`."""
    state = {"right": set(), "calls": []}

    def fake_sample(net, tokenizer, problems, repeats, cfg, key, mesh=None):
        state["calls"].append((repeats, cfg.temperature, key))
        texts = [_right(p) if p.id in state["right"] else "" for p in problems]
        return rollout.Samples([], None, [], texts)

    monkeypatch.setattr(rollout, "sample", fake_sample)
    return state


class _Trainer:
    def __init__(self):
        self.batches = []

    def model(self):  # what rollout.sample gets: the fake sample does not look
        return None

    def train_on(self, batch, n):
        self.batches.append(batch)
        return [{"loss": 0.0}]

    def save(self, *a, **k):
        pass


def half_valid_rollout(trainer, tokenizer, drawn, g, sampling, reward_cfg, key, grpo_cfg=None):
    """A stand-in for `rollout.rollout`: every group half valid, zero advantages."""
    valid = np.tile([True, False], len(drawn) * g // 2)
    stats = rollout.RolloutStats(
        reward_mean=0.5, valid_rate=0.5, optimal_rate=0.0, failures={"none": 1},
        response_len_mean=1.0, response_len_max=1, truncation_rate=0.0, mixed_groups=1.0,
        logprob_gap=0.0, valid=valid, rewards=valid.astype(np.float32),
    )  # fmt: skip
    return types.SimpleNamespace(advantages=np.zeros(len(drawn) * g, np.float32)), stats


def test_screen_puts_the_greedy_failures_first_in_drawn_order(answered):
    cands = random_problems(6, seed=5, sizes=(3, 4))
    answered["right"] = {cands[i].id for i in (0, 2, 3)}
    sampling = rollout.SamplingConfig(max_new_tokens=40, temperature=1.0)
    got, failed = driver.screen_problems(_Trainer(), None, cands, 5, sampling, RewardConfig())
    assert failed == 3
    assert [p.id for p in got] == [cands[i].id for i in (1, 4, 5, 0, 2)]
    assert answered["calls"] == [(1, 0.0, None)]  # one greedy answer per candidate
    with pytest.raises(ValueError, match="7 problems wanted from 6 candidates"):
        driver.screen_problems(_Trainer(), None, cands, 7, sampling, RewardConfig())


def test_screen_with_a_real_tiny_model_answers_every_candidate_greedily(model, tok):  # noqa: F811
    """A random model's greedy answers are not plans: every candidate fails, in drawn order."""
    cands = random_problems(4, seed=9, sizes=(3,))
    sampling = rollout.SamplingConfig(max_new_tokens=16, temperature=1.0)
    got, failed = driver.screen_problems(model, tok, cands, 3, sampling, RewardConfig())
    assert failed == 4 and [p.id for p in got] == [p.id for p in cands[:3]]


def test_settings_take_a_screen_and_refuse_a_share_under_1():
    c = tiny_cpu.get_config()
    assert driver.GRPOSettings.from_config(c).screen == 0.0  # the configs' default: off
    c.train.screen = 2.0
    s = driver.GRPOSettings.from_config(c)
    assert s.screen == 2.0 and s.screened_per_step == 2 * s.drawn_per_step
    c.train.screen = 0.5
    with pytest.raises(ValueError, match=r"train.screen = 0.5; allowed: 0 \(off\) or a number"):
        driver.GRPOSettings.from_config(c)


def test_run_phase_samples_groups_on_the_screened_puzzles_and_logs_the_screen(
    answered, monkeypatch, tmp_path
):
    problems = random_problems(12, seed=3, sizes=(3,))
    answered["right"] = {p.id for p in problems[::2]}  # odd ones fail greedily
    seen = []

    def fake_rollout(trainer, tokenizer, drawn, g, *args, **kwargs):
        seen.append([p.id for p in drawn])
        return half_valid_rollout(trainer, tokenizer, drawn, g, *args, **kwargs)

    monkeypatch.setattr(rollout, "rollout", fake_rollout)
    monkeypatch.setattr(driver, "select_groups", lambda b, useful, keep, g: (b, None, keep))
    c = tiny_cpu.get_config()
    c.train.steps, c.train.problems_per_step, c.train.oversample = 2, 2, 1.5
    c.train.group_size, c.train.screen = 2, 2.0
    c.grpo.kl_coef = 0.0
    s = driver.GRPOSettings.from_config(c)
    assert (s.drawn_per_step, s.screened_per_step) == (3, 6)
    driver.run_phase(
        _Trainer(), None, problems, s, seed=[1, 2], position={"round": 0}, out_dir=tmp_path,
        ckpt_dir=tmp_path / "ckpt", progress=False,
    )  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for step, (row, drawn) in enumerate(zip(rows, seen, strict=True)):
        cands = driver.step_problems(problems, 6, step, [1, 2, 1])
        fails = [p.id for p in cands if p.id not in answered["right"]]
        assert drawn == (fails + [p.id for p in cands if p.id in answered["right"]])[:3]
        assert (row["screened"], row["screen_failed"], row["drawn"]) == (6, len(fails), 3)
        assert 0 <= row["screen_seconds"] <= row["seconds"]
