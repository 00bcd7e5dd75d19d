"""The GRPO driver's pieces: dynamic sampling keeps shapes and drops exactly the groups whose
rewards are all equal, the problem stream is deterministic and resumable, per-size rollout
statistics rebuild from metrics.jsonl, settings come from the shared config schema."""

import json
import math

import ml_collections
import numpy as np
import pytest

from configs import tiny_cpu
from mapfjax.rl import driver
from mapfjax.rl.batch import GroupBatch, SequenceBatch, make_batch


def _batch(groups, g, layout):
    rng = np.random.default_rng(0)
    prompts, comps = [], []
    for _ in range(groups):
        p = list(rng.integers(1, 50, rng.integers(2, 6)))
        for _ in range(g):
            prompts.append(p)
            comps.append(list(rng.integers(1, 50, rng.integers(1, 5))))
    adv = rng.normal(size=groups * g)
    shared = layout == "groups"
    return make_batch(prompts, comps, 0, advantages=adv, group_size=g, shared_prefix=shared)


@pytest.mark.parametrize("layout", ["groups", "rows"])
def test_dynamic_sampling_keeps_shapes_and_masks_equal_reward_groups(layout):
    g, drawn, keep = 3, 6, 4
    batch = _batch(drawn, g, layout)
    rewards = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1], [0, 0, 1]], float)
    valid = rewards.astype(bool).reshape(-1)
    useful = driver.useful_groups("grpo", valid, rewards.reshape(-1), g)
    picked, order, n_mixed = driver.select_groups(batch, useful, keep, g)
    # The mixed groups (1, 3, 5) first, in sampled order, then one equal-reward group (0).
    assert order.tolist() == [1, 3, 5, 0] and n_mixed == 3
    mask = np.asarray(picked.loss_mask)
    if isinstance(picked, GroupBatch):
        assert picked.tokens.shape[:2] == (keep, g)
        np.testing.assert_array_equal(picked.tokens, np.asarray(batch.tokens)[order])
        assert mask[:3].any(axis=(1, 2)).all() and not mask[3].any()
    else:
        assert isinstance(picked, SequenceBatch) and picked.tokens.shape[0] == keep * g
        rows = np.asarray(batch.tokens)[[r for j in order for r in range(j * g, j * g + g)]]
        np.testing.assert_array_equal(picked.tokens, rows)
        assert mask[: 3 * g].any(axis=1).all() and not mask[3 * g :].any()


@pytest.mark.parametrize("layout", ["groups", "rows"])
def test_rft_keeps_groups_with_a_valid_sample_and_imitates_only_valid_samples(layout):
    g, drawn, keep = 3, 5, 3
    batch = _batch(drawn, g, layout)
    valid = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1]], bool)
    rewards = valid * 1.5  # every valid sample optimal: groups 1 has equal rewards
    useful = driver.useful_groups("rft", valid.reshape(-1), rewards.reshape(-1), g)
    assert useful.tolist() == [False, True, True, False, True]
    picked, order, n_useful = driver.select_groups(batch, useful, keep, g)
    assert order.tolist() == [1, 2, 4] and n_useful == 3
    picked = driver.imitate_valid(picked, valid.reshape(-1), order, g)
    mask = np.asarray(picked.loss_mask).reshape(keep, g, -1)
    before = np.asarray(batch.loss_mask).reshape(drawn, g, -1)[order]
    # Exactly the valid samples keep their tokens in the loss, all of them.
    np.testing.assert_array_equal(mask, before & valid[order][:, :, None])
    assert mask.any(-1).tolist() == valid[order].tolist()


@pytest.mark.parametrize("layout", ["groups", "rows"])
def test_an_update_trains_on_the_objectives_batch(layout):
    g, drawn = 4, 6
    batch = _batch(drawn, g, layout)
    valid = np.ones(drawn * g, bool)
    order = np.arange(drawn)
    assert driver.objective_batch("grpo", batch, valid, order, g) is batch
    rft = driver.objective_batch("rft", batch, ~valid, order, g)
    assert not np.asarray(rft.loss_mask).any()  # no valid sample: nothing to imitate
    assert driver.OBJECTIVES == ("grpo", "rft")


def _hooks(name: str = "fake", fail: bool = False):
    """A `phase_hooks.factory` for the tests below."""
    if fail:
        raise ValueError("phase_hooks.fail = True; allowed: False")
    return driver.PhaseHooks(name=name)


def _not_hooks():
    return "not hooks"


def test_phase_hooks_come_from_the_factory_a_config_names():
    c = tiny_cpu.get_config("smoke")
    plain = driver.PhaseHooks.from_config(c)  # no section: the plain phase
    assert plain == driver.PhaseHooks() and plain.draw is driver._plain_draw
    c.phase_hooks = ml_collections.ConfigDict({"factory": "tests.rl.test_driver:_hooks"})
    c.phase_hooks.name = "mine"
    assert driver.PhaseHooks.from_config(c).name == "mine"
    c.phase_hooks.fail = True
    with pytest.raises(ValueError, match=r"phase_hooks: phase_hooks.fail = True; allowed"):
        driver.PhaseHooks.from_config(c)
    for spec, message in [
        ("tests.rl.test_driver", r"phase_hooks.factory = 'tests.rl.test_driver'; allowed: 'pack"),
        ("tests.rl.nowhere:_hooks", r"phase_hooks.factory = 'tests.rl.nowhere:_hooks': No mod"),
        ("tests.rl.test_driver:_none", r"module 'tests.rl.test_driver' has no '_none'"),
        ("tests.rl.test_driver:_not_hooks", r"phase_hooks.factory = .*a function that returns"),
    ]:
        c.phase_hooks = ml_collections.ConfigDict({"factory": spec})
        with pytest.raises(ValueError, match=message):
            driver.PhaseHooks.from_config(c)


def test_problem_stream_is_deterministic_and_covers_each_epoch():
    problems = list(range(10))
    first = [driver.step_problems(problems, 4, s, [0, 1]) for s in range(5)]
    again = [driver.step_problems(problems, 4, s, [0, 1]) for s in (3, 4)]
    assert first[3:] == again  # a resumed phase draws the same problems
    flat = [p for step in first for p in step]
    assert sorted(flat[:10]) == problems and sorted(flat[10:20]) == problems
    assert first != [driver.step_problems(problems, 4, s, [0, 2]) for s in range(5)]


def test_size_stats_rebuild_from_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "groups": [[3, 0, 0.0, False], [4, 2, 3.0, True]]},
        {"step": 2, "groups": [[3, 4, 0.0, False]]},
        {"step": 2, "groups": [[3, 1, 2.0, True]]},  # step 2 again after a resume: it counts
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = driver.size_summary(driver.phase_size_stats(path, 4))["sizes"]
    assert got["3"] == {
        "groups": 2, "samples": 8, "valid_rate": 1 / 8, "mixed_groups": 0.5,
        "learnability": (0 + 0.25 * 0.75) / 2, "mean_abs_advantage": 2.0 / 8,
    }  # fmt: skip
    assert got["4"]["learnability"] == 0.25 and got["4"]["valid_rate"] == 0.5
    assert driver.phase_size_stats(tmp_path / "none.jsonl", 4) == {}


def test_settings_and_schedule_from_the_shared_schema():
    c = tiny_cpu.get_config("answer_only")
    s = driver.GRPOSettings.from_config(c)
    assert s.steps == c.train.instances // c.train.problems_per_step
    # dynamic sampling draws oversample x problems_per_step groups per update
    assert s.drawn_per_step == math.ceil(c.train.oversample * c.train.problems_per_step) == 32
    assert s.loss.group_size == s.group_size == 8
    optim = driver.optim_config(c, s.steps, c.rounds)
    assert optim.schedule == "constant" and optim.cycle_steps == s.steps
    bad = c.copy_and_resolve_references()
    bad.train.oversample = 0.5
    with pytest.raises(ValueError, match="train.oversample = 0.5; allowed: a number >= 1"):
        driver.GRPOSettings.from_config(bad)
    assert s.objective == "grpo" and s.trainer_loss() == ("grpo", s.loss)
    rft = c.copy_and_resolve_references()
    rft.train.objective = "rft"
    assert driver.GRPOSettings.from_config(rft).trainer_loss()[0] == "sft"
    rft.train.objective = "ppo"
    with pytest.raises(ValueError, match="train.objective = 'ppo'; allowed: grpo, rft"):
        driver.GRPOSettings.from_config(rft)
    assert s.sampling.trace_loss == "all"
    moves = c.copy_and_resolve_references()
    moves.train.trace_loss = "moves"
    assert driver.GRPOSettings.from_config(moves).sampling.trace_loss == "moves"
    moves.train.trace_loss = "move"
    with pytest.raises(ValueError, match="train.trace_loss = 'move'; allowed: one of 'all', 'm"):
        driver.GRPOSettings.from_config(moves)
    # Decode steps per loop iteration: 1 unless set, an int >= 1.
    assert s.sampling.steps_per_loop == 1
    loops = c.copy_and_resolve_references()
    loops.train.steps_per_loop = 4
    assert driver.GRPOSettings.from_config(loops).sampling.steps_per_loop == 4
    loops.train.steps_per_loop = 0
    with pytest.raises(ValueError, match="train.steps_per_loop = 0; allowed: an integer >= 1"):
        driver.GRPOSettings.from_config(loops)
    # Padding rules: the CPU config's multiples of 8; a missing key keeps the sampler's default.
    assert (s.sampling.bucket, s.sampling.completion_bucket) == (c.train.bucket, "x8")
    pads = c.copy_and_resolve_references()
    del pads.train.bucket
    assert driver.GRPOSettings.from_config(pads).sampling.bucket == "pow2_mid"
    pads.train.completion_bucket = "x7"
    with pytest.raises(ValueError, match="train.completion_bucket = 'x7'; allowed: one of 'pow2'"):
        driver.GRPOSettings.from_config(pads)
    pads.train.completion_bucket, pads.train.max_new_tokens = "x8", 640
    with pytest.raises(ValueError, match=r"'x8' only with train.max_new_tokens <= 256 \(here 640"):
        driver.GRPOSettings.from_config(pads)
    pads.train.completion_bucket = "pow2"
    assert driver.GRPOSettings.from_config(pads).sampling.completion_bucket == "pow2"
    assert isinstance(c.optim, ml_collections.ConfigDict)


def test_group_outcomes_are_named_records_and_old_positional_rows_still_read(tmp_path):
    from mapfjax.rl import metrics

    o = metrics.GroupOutcome(size=4, valid=3, abs_advantage=2.5, mixed=True)
    assert o.to_record() == {"size": 4, "valid": 3, "abs_advantage": 2.5, "mixed": True}
    assert metrics.GroupOutcome.from_record(o.to_record()) == o
    assert metrics.GroupOutcome.from_record([4, 3, 2.5, True]) == o  # runs logged before names
    rows = [
        {"step": 1, "groups": [o.to_record(), [4, 8, 0.0, False]]},
        {"step": 2, "groups": [{"size": 5, "valid": 0, "abs_advantage": 0.0, "mixed": False}]},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = driver.phase_size_stats(path, group_size=8)
    assert (got[4].groups, got[4].valid, got[4].mixed, got[4].samples) == (2, 11, 1, 16)
    assert got[4].abs_advantage == 2.5 and got[5].groups == 1 and got[5].valid == 0


def test_the_accelerator_config_pads_to_few_shapes():
    """configs/paper_qwen3_4b.py builds on the CPU config but keeps the sampler's few-shape
    rules: a compile of the 4B model costs minutes, and its 4,096-token budget in multiples of
    8 would be refused."""
    from mapfjax import configfile
    from mapfjax.engineer.settings import ValidationSettings

    c = configfile.get_config("configs/paper_qwen3_4b.py", "")
    s = driver.GRPOSettings.from_config(c)
    assert (s.sampling.bucket, s.sampling.completion_bucket) == ("pow2_mid", "pow2")
    assert ValidationSettings.from_config(c).bucket == "pow2_mid"
