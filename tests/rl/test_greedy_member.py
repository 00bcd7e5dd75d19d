"""A greedy member: each GRPO group's first member is the policy's greedy answer and the rest
are sampled (`rollout.greedy_groups`, `SamplingConfig.greedy_member`), checked on a tiny random
Qwen3 against separate greedy and sampled calls and a plain forward pass."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mapfjax.env.reward import RewardConfig
from mapfjax.rl import grpo, rollout
from tests.models.test_bpe import random_problems
from tests.rl.test_rollout import as_rows, model, tok  # noqa: F401 (fixtures)

sys.path.insert(0, "configs")

G = 4


@pytest.fixture(scope="module")
def problems():
    return random_problems(3, seed=21, sizes=(3, 4))


def _sampling(**kw):
    return rollout.SamplingConfig(max_new_tokens=20, warn_truncation=1.0, **kw)


def test_each_group_holds_the_greedy_answer_first_then_the_samples(model, tok, problems):  # noqa: F811
    cfg, key = _sampling(temperature=1.0), jax.random.key(4)
    got = rollout.greedy_groups(model, tok, problems, G, cfg, key)
    greedy = rollout.sample(model, tok, problems, 1, _sampling(temperature=0.0), None)
    drawn = rollout.sample(model, tok, problems, G - 1, cfg, key)
    assert len(got.completions) == len(problems) * G
    for i in range(len(problems)):
        group = got.completions[i * G : (i + 1) * G]
        assert group[0] == greedy.completions[i]
        assert group[1:] == drawn.completions[i * (G - 1) : (i + 1) * (G - 1)]
        assert got.prompts[i * G : (i + 1) * G] == [greedy.prompts[i]] * G
    lengths = np.asarray(got.output.lengths)
    assert lengths.tolist() == [len(c) for c in got.completions]
    assert got.texts == tok.batch_decode(got.completions, skip_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logprobs_are_the_trainers_at_temperature(model, tok, problems, temperature):  # noqa: F811
    """The greedy rows were not drawn at the temperature the loss uses; every row's old
    log-probs must still be log_softmax(logits / T) at its tokens (importance ratio 1)."""
    sampling = _sampling(temperature=temperature, greedy_member=True)
    batch, stats = rollout.rollout(
        model, tok, problems, G, sampling, RewardConfig(), jax.random.key(5),
        grpo_cfg=grpo.GRPOConfig(group_size=G, temperature=temperature),
    )  # fmt: skip
    rows = as_rows(batch)
    assert len(rows) == len(problems) * G
    for prompt, comp, _, loss, old, _ in rows:
        n = int(loss.sum())
        logits, _ = model(jnp.asarray([prompt + comp[:n].tolist()], jnp.int32))
        logp = jax.nn.log_softmax(np.asarray(logits[0, len(prompt) - 1 : -1]) / temperature, -1)
        np.testing.assert_allclose(old[:n], logp[np.arange(n), comp[:n]], atol=2e-4)
        assert not old[n:].any()
    assert stats.greedy_valid_rate == pytest.approx(np.mean(stats.valid[::G]))


def test_a_failing_greedy_answer_gets_a_negative_advantage(model, tok, problems, monkeypatch):  # noqa: F811
    """The greedy member is scored inside its group: rewards [0, 1, 0, 0] (greedy fails, one
    sample valid) give the greedy row GRPO's negative advantage, [1, 0, 0, 0] a positive one."""
    pattern = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    real = rollout.score

    def score(problems, repeats, texts, reward_cfg):
        verdict, _ = real(problems, repeats, texts, reward_cfg)
        return verdict, pattern.reshape(-1)

    monkeypatch.setattr(rollout, "score", score)
    sampling = _sampling(temperature=1.0, greedy_member=True)
    key = jax.random.key(6)
    batch, stats = rollout.rollout(model, tok, problems, G, sampling, RewardConfig(), key)
    adv = np.array([r[5] for r in as_rows(batch)]).reshape(-1, G)
    np.testing.assert_allclose(
        adv, np.asarray(grpo.group_advantages(pattern.reshape(-1), G)).reshape(-1, G)
    )
    assert adv[0, 0] < 0 < adv[0, 1] and adv[1, 0] > 0 > adv[1, 1] and not adv[2].any()


def test_a_group_of_one_cannot_hold_a_greedy_member(model, tok, problems):  # noqa: F811
    with pytest.raises(ValueError, match="group_size=1: a greedy member needs a sampled row"):
        rollout.greedy_groups(model, tok, problems, 1, _sampling(), None)
