"""The arms' phase hooks (`hooks.arm`): a screen draws each update's groups from the puzzles the
current greedy answer fails first, a time budget ends a phase before a step that would pass it
(a resumed phase counting its earlier steps' seconds), the placebo shuffles each group's
advantages, the greedy member reaches the rollouts; and the gate's flags reach the config."""

import json
import types

import ml_collections
import numpy as np
import pytest

from mapfjax import configfile
from mapfjax.env import oracle, text
from mapfjax.env.reward import RewardConfig
from mapfjax.rl import driver, rollout
from projects.go_no_go import hooks
from projects.go_no_go.tests.test_go_no_go import _PROBE, _run_probe
from tests.models.test_bpe import random_problems
from tests.rl.test_driver import _batch
from tests.rl.test_rollout import model, tok  # noqa: F401 (fixtures)

TINY_CPU = configfile.load_module("configs/tiny_cpu.py")


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
        self.batches, self.saved = [], []

    def model(self):  # what rollout.sample gets: the fake sample does not look
        return None

    def train_on(self, batch, n):
        self.batches.append(batch)
        return [{"loss": 0.0}]

    def save(self, directory, data=None, **k):
        self.saved.append(dict(data or {}))


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
    got, failed = hooks.screen_problems(_Trainer(), None, cands, 5, sampling, RewardConfig())
    assert failed == 3
    assert [p.id for p in got] == [cands[i].id for i in (1, 4, 5, 0, 2)]
    assert answered["calls"] == [(1, 0.0, None)]  # one greedy answer per candidate
    with pytest.raises(ValueError, match="7 problems wanted from 6 candidates"):
        hooks.screen_problems(_Trainer(), None, cands, 7, sampling, RewardConfig())


@pytest.mark.slow
def test_screen_with_a_real_tiny_model_answers_every_candidate_greedily(model, tok):  # noqa: F811
    """A random model's greedy answers are not plans: every candidate fails, in drawn order."""
    cands = random_problems(4, seed=9, sizes=(3,))
    sampling = rollout.SamplingConfig(max_new_tokens=16, temperature=1.0)
    got, failed = hooks.screen_problems(model, tok, cands, 3, sampling, RewardConfig())
    assert failed == 4 and [p.id for p in got] == [p.id for p in cands[:3]]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("screen", 0.5, r"phase_hooks.screen = 0.5; allowed: 0 \(off\) or a number >= 1"),
        ("max_minutes", -1.0, r"phase_hooks.max_minutes = -1.0; allowed: 0 \(no time budget\)"),
        ("max_minutes", 1e-12, r"phase_hooks.max_minutes = 1e-12; allowed: .* at least a sec"),
        ("max_minutes", float("nan"), r"phase_hooks.max_minutes = nan"),
        ("greedy_member", "yes", r"phase_hooks.greedy_member = 'yes'; allowed: True or False"),
        ("placebo", 1, r"phase_hooks.placebo = 1; allowed: True or False"),
    ],
)
def test_a_bad_option_names_it(option, value, message):
    with pytest.raises(ValueError, match=message):
        hooks.arm(**{option: value})


def test_an_arm_without_options_is_the_plain_phase():
    plain = hooks.arm()
    assert plain == driver.PhaseHooks(draw=driver.PhaseHooks.draw) and plain.name == ""


def _run(tmp_path, problems, h, steps=2, start_step=0, **train):
    c = TINY_CPU.get_config()
    c.train.steps, c.train.problems_per_step, c.train.group_size = steps, 2, 2
    c.train.checkpoint_every, c.grpo.kl_coef = 100, 0.0
    for k, v in train.items():
        c.train[k] = v
    trainer = _Trainer()
    driver.run_phase(
        trainer, None, problems, driver.GRPOSettings.from_config(c), seed=[1, 2],
        position={"round": 0}, out_dir=tmp_path, ckpt_dir=tmp_path / "ckpt",
        start_step=start_step, progress=False, hooks=h,
    )  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return trainer, rows


def test_a_screened_phase_samples_groups_on_the_screened_puzzles_and_logs_the_screen(
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
    _, rows = _run(tmp_path, problems, hooks.arm(screen=2.0), oversample=1.5)
    for step, (row, drawn) in enumerate(zip(rows, seen, strict=True)):
        cands = driver.step_problems(problems, 6, step, [1, 2, 1])
        fails = [p.id for p in cands if p.id not in answered["right"]]
        assert drawn == (fails + [p.id for p in cands if p.id in answered["right"]])[:3]
        assert (row["screened"], row["screen_failed"], row["drawn"]) == (6, len(fails), 3)
        assert 0 <= row["screen_seconds"] <= row["seconds"]


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """run(steps, max_minutes, step_seconds, start_step) -> (trainer, metrics rows): a phase
    whose every step takes step_seconds on a fake clock."""
    monkeypatch.setattr(rollout, "rollout", half_valid_rollout)
    monkeypatch.setattr(driver, "select_groups", lambda b, useful, keep, g: (b, None, keep))
    problems = random_problems(8, seed=5, sizes=(3,))

    def run(steps, max_minutes, step_seconds, start_step=0):
        clock = iter(np.arange(0, 10_000, step_seconds / 2))  # t0, t1, t2 per step
        monkeypatch.setattr(driver.time, "perf_counter", lambda: float(next(clock)))
        h = hooks.arm(max_minutes=max_minutes)
        return _run(tmp_path, problems, h, steps=steps, start_step=start_step)

    return run


def test_the_phase_ends_before_a_step_that_would_pass_the_budget(timed, tmp_path):
    # 20 s a step, 90 s allowed: after 4 steps (80 s) a fifth would reach 100
    trainer, rows = timed(steps=10, max_minutes=1.5, step_seconds=20)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["seconds"] for r in rows) == pytest.approx(80)
    # the phase counts as finished: a resumed run skips it, the loop validates the round
    assert trainer.saved == [{"round": 0, "step": 10}]
    ended = json.loads((tmp_path / driver.STOP_FILE).read_text())
    assert ended == {"updates": 4, "of": 10, "seconds": pytest.approx(80),
                     "by": "time budget of 1.5 minutes"}  # fmt: skip


def test_no_budget_runs_every_step_and_the_first_step_always_runs(timed, tmp_path):
    _, rows = timed(steps=3, max_minutes=0, step_seconds=500)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert not (tmp_path / driver.STOP_FILE).exists()
    (tmp_path / "metrics.jsonl").unlink()
    trainer, rows = timed(steps=3, max_minutes=1, step_seconds=500)  # one step is over it
    assert [r["step"] for r in rows] == [1] and trainer.saved == [{"round": 0, "step": 3}]


def test_a_resumed_phase_counts_the_seconds_of_its_earlier_steps(timed):
    timed(steps=2, max_minutes=0, step_seconds=30)  # steps 1-2 logged: 60 s
    # resumed at 2 with 20 s steps and 90 s allowed: 80 s after step 3, a fourth would pass
    # it (counting only its own steps it would run to step 6)
    trainer, rows = timed(steps=10, max_minutes=1.5, step_seconds=20, start_step=2)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert trainer.saved == [{"round": 0, "step": 10}]


@pytest.mark.parametrize("layout", ["groups", "rows"])
def test_placebo_shuffles_advantages_within_each_group_only(layout):
    """The placebo arm's batch: every group keeps its own advantages (so its mean and spread),
    in another order drawn from the step's seed; nothing else of the batch changes."""
    g, drawn = 4, 6
    batch = _batch(drawn, g, layout)
    before = np.asarray(batch.advantages).reshape(drawn, g)
    out = hooks.shuffle_advantages(batch, np.random.default_rng(3), g)
    after = np.asarray(out.advantages).reshape(drawn, g)
    assert np.asarray(out.advantages).shape == np.asarray(batch.advantages).shape
    np.testing.assert_array_equal(np.sort(after, axis=1), np.sort(before, axis=1))
    assert not np.array_equal(after, before)  # 6 groups of 4 distinct normals: some moved
    np.testing.assert_array_equal(out.tokens, batch.tokens)
    np.testing.assert_array_equal(out.loss_mask, batch.loss_mask)
    again = hooks.shuffle_advantages(batch, np.random.default_rng(3), g)
    np.testing.assert_array_equal(again.advantages, out.advantages)  # seeded: resumable
    settings = types.SimpleNamespace(group_size=g)
    placebo = hooks.arm(placebo=True).batch(batch, settings, [5, 7])
    want = hooks.shuffle_advantages(batch, np.random.default_rng([5, 7, 2]), g)
    np.testing.assert_array_equal(placebo.advantages, want.advantages)


def test_the_greedy_member_reaches_the_rollouts_sampling():
    c = TINY_CPU.get_config()
    sampling = driver.GRPOSettings.from_config(c).sampling
    assert sampling.greedy_member is False
    assert hooks.arm(greedy_member=True).sampling(sampling).greedy_member is True
    assert hooks.arm().sampling is None


def test_a_run_config_names_the_arms_hooks_by_their_factory():
    c = TINY_CPU.get_config("smoke")
    c.phase_hooks = ml_collections.ConfigDict(
        {"factory": hooks.FACTORY, "screen": 2.0, "max_minutes": 27.0}
    )
    h = driver.PhaseHooks.from_config(c)
    assert h.name == "screen 2, time budget of 27 minutes" and h.stop(0, 60 * 28)
    c.phase_hooks.screen = 0.5
    with pytest.raises(ValueError, match=r"phase_hooks: phase_hooks.screen = 0.5"):
        driver.PhaseHooks.from_config(c)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, want",
    [
        ([], [False, "unset"]),
        (["--greedy_member"], [True, "projects.go_no_go.hooks:arm"]),
        (["--objective=placebo", "--minutes=27"], [False, "projects.go_no_go.hooks:arm"]),
    ],
)
def test_the_gate_flags_reach_the_phase_hooks_and_leave_the_config_alone_when_off(args, want):
    probe = _PROBE.replace(
        "c.train.objective, c.train.temperature]",
        "c.get('phase_hooks', {}).get('greedy_member', False), "
        "c.get('phase_hooks', {}).get('factory', 'unset'), c.train.objective]",
    )
    got = _run_probe(probe, args)
    assert got[-3:-1] == want and got[-1] == "grpo"
