"""The checkpoint as its own environment engineer: `generate_fn` and `score_fn` over our sampler.

Both read the weights through a zero-argument `model_fn` (e.g. `trainer.model`), so the engineer
is always the current policy with the same sampler and sharding as the rollouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from mapfjax.models import sampler
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl.batch import make_batch
from mapfjax.rl.logprobs import completion_logprobs


def _fit(ids: list[int], budget: int) -> list[int]:
    """Keep the last `budget` prompt tokens: a small model's context window holds the tail of
    the engineer prompt (the failure table, the current config and the answer format)."""
    return ids[-budget:] if len(ids) > budget else ids


def make_generate_fn(
    model_fn: Callable,
    tokenizer,
    max_new_tokens: int = 512,
    temperature: float = 0.7,
    enable_thinking: bool = False,
    key: jax.Array | None = None,
) -> Callable[[Sequence[str], int], list[str]]:
    """generate_fn(prompts, n) -> n sampled answers per prompt (flattened, prompt-major); call
    c samples with fold_in(key, c) (default key: jax.random.key(0))."""
    key = jax.random.key(0) if key is None else key
    calls = [0]

    def generate_fn(prompts: Sequence[str], n: int) -> list[str]:
        model = model_fn()
        ids = tok_lib.special_ids(tokenizer)
        budget = model.config.max_position_embeddings - max_new_tokens
        enc = tok_lib.encode_chat(tokenizer, list(prompts), enable_thinking=enable_thinking)
        rows = [_fit(p, budget) for p in enc for _ in range(n)]
        call_key = jax.random.fold_in(key, calls[0])
        calls[0] += 1
        out = sampler.generate(
            model,
            rows,
            max_new_tokens,
            temperature=temperature,
            key=call_key,
            stop_tokens=(ids.im_end, ids.pad),
            pad_id=ids.pad,
        )
        return tokenizer.batch_decode(sampler.to_lists(out), skip_special_tokens=True)

    return generate_fn


def make_score_fn(
    model_fn: Callable, tokenizer, enable_thinking: bool = False, batch_size: int = 8
) -> Callable[[str, Sequence[str]], list[float]]:
    """score_fn(prompt, continuations) -> total log-likelihood of each continuation (plus the
    end-of-turn token) after the chat-formatted prompt, by teacher-forced forward passes over
    `batch_size` continuations at a time that share one pass over the prompt (a `GroupBatch`:
    the prompt's keys and values computed once per call, not once per continuation)."""

    def score_fn(prompt: str, continuations: Sequence[str]) -> list[float]:
        model = model_fn()
        ids = tok_lib.special_ids(tokenizer)
        conts = [
            list(tokenizer(c, add_special_tokens=False)["input_ids"]) + [ids.im_end]
            for c in continuations
        ]
        longest = max(len(c) for c in conts)
        budget = model.config.max_position_embeddings - longest
        if budget < 1:
            raise ValueError(f"a continuation of {longest} tokens fills the context window")
        (p,) = tok_lib.encode_chat(tokenizer, [prompt], enable_thinking=enable_thinking)
        p = _fit(p, budget)
        scores = []
        for i in range(0, len(conts), batch_size):
            part = conts[i : i + batch_size]
            part = part + [part[-1]] * (batch_size - len(part))  # one compiled shape
            batch = make_batch(
                [p] * batch_size,
                part,
                ids.pad,
                prompt_bucket="x64",
                completion_bucket=longest,
                group_size=batch_size,
                shared_prefix=True,
            )
            logp, _ = _logprobs(model, batch)  # [1, batch_size, T]
            logp = np.asarray(logp).reshape(batch_size, -1)
            mask = np.asarray(batch.loss_mask).reshape(batch_size, -1)
            scores += [float(v) for v in np.where(mask, logp, 0.0).sum(axis=1)]
        return scores[: len(conts)]

    return score_fn


@nnx.jit
def _logprobs(model, batch):
    return completion_logprobs(model, batch, 1.0)
