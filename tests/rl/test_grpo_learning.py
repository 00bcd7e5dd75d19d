"""GRPO learns, and what it learns carries to puzzles it never trained on: a micro Qwen3 is
SFT-ed to answer each of eight fixed puzzles correctly half of the time (the oracle answer) and
wrongly otherwise (one fixed invalid answer, the same for every puzzle); GRPO with rollouts,
verifier rewards and the trainer then trains on four of them. The sampled valid rate must rise
by at least MARGIN on those four and by at least HELD_OUT_MARGIN on the other four (unlearning
the fixed wrong answer carries over)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.env import oracle, text
from mapfjax.env.reward import RewardConfig
from mapfjax.env.types import ACTION_NAMES
from mapfjax.models import tokenizer as tok_lib
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl import data, grpo, rollout
from mapfjax.rl.trainer import OptimConfig, Trainer
from tests.models.test_bpe import random_problems
from tests.rl.test_data import make_tokenizer

MARGIN = 0.1  # absolute rise of the sampled valid rate on the GRPO puzzles
HELD_OUT_MARGIN = 0.05  # on the puzzles GRPO never saw (seen: 0.23 -> 0.31)
G = 8


def _wrong(_actions):
    """One fixed wrong answer for every puzzle: Agent 0 moves UP four times (off any 3x3 map),
    Agent 1 stays. Being the same text everywhere, it is a habit GRPO can unlearn for all
    puzzles at once, not one puzzle at a time."""
    return [[ACTION_NAMES.index("UP")] * 4, []]


def _valid_rate(trainer, tok, problems, key, sampling) -> float:
    _, stats = rollout.rollout(
        trainer, tok, problems, 32, sampling, RewardConfig(), key, grpo_cfg=_cfg(32)
    )
    return stats.valid_rate


def _cfg(g):
    return grpo.GRPOConfig(group_size=g, temperature=1.0)


@pytest.mark.slow
def test_grpo_raises_valid_rate(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    problems = random_problems(8, seed=21, sizes=(3,))
    right = [oracle.answer_actions(oracle.solve(p)) for p in problems]
    wrong = [_wrong(a) for a in right]
    good = data.sft_examples(tok, problems, right)
    bad = data.sft_examples(tok, problems, wrong)
    # The wrong answers really are invalid and the right ones valid.
    texts = [text.render_answer(a) for a in right + wrong]
    verdict, _ = rollout.score(problems + problems, 1, texts, RewardConfig())
    assert verdict.valid.tolist() == [True] * 8 + [False] * 8
    train, held_out = problems[:4], problems[4:]
    puzzle = lambda p: (p.grid, p.starts, p.goals)
    assert not {puzzle(p) for p in train} & {puzzle(p) for p in held_out}

    cfg = dataclasses.replace(
        PRESETS["tiny"], vocab_size=len(tok), rope_theta=1e4, max_position_embeddings=512
    )
    model = Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    pad = tok_lib.special_ids(tok).pad
    sft = Trainer(model, OptimConfig(lr=3e-3, warmup_steps=5, total_steps=200), "sft")
    for batch in data.sft_batches(good + bad, 8, pad, seed=0, epochs=100):
        sft.step(batch)

    sampling = rollout.SamplingConfig(max_new_tokens=32, temperature=1.0, warn_truncation=1.0)
    before = _valid_rate(sft, tok, train, jax.random.key(100), sampling)
    before_held = _valid_rate(sft, tok, held_out, jax.random.key(101), sampling)
    # SFT left a mixed policy (both answers likely), so GRPO has a signal to follow.
    assert 0.2 <= before <= 0.8 and 0.2 <= before_held <= 0.8, (before, before_held)

    optim = OptimConfig(lr=1e-3, warmup_steps=0, total_steps=20, end_lr_ratio=1.0)
    rl = Trainer(sft.model(), optim, "grpo", loss_cfg=_cfg(G))
    for step in range(20):
        batch, _ = rollout.rollout(
            rl, tok, train, G, sampling, RewardConfig(), jax.random.key(step), grpo_cfg=_cfg(G)
        )
        rl.train_on(batch, num_iterations=2)  # the second pass exercises ratio and clipping
    after = _valid_rate(rl, tok, train, jax.random.key(100), sampling)
    after_held = _valid_rate(rl, tok, held_out, jax.random.key(101), sampling)
    assert np.isfinite(after) and np.isfinite(after_held)
    assert after >= before + MARGIN, (before, after)
    assert after_held >= before_held + HELD_OUT_MARGIN, (before_held, after_held)
