"""Supervised fine-tuning loss: masked token cross-entropy over a `SequenceBatch`'s loss
tokens (the answer and its end-of-turn token), a weighted mean over all loss tokens of the
batch. With a reasoning trace, the tokens after the trace's `</think>` (the answer the reward
reads: a few percent of a completion) can weigh more than the trace's (`answer_weight`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mapfjax.rl.batch import SequenceBatch
from mapfjax.rl.grpo import masked_mean
from mapfjax.rl.logprobs import completion_logprobs


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """logits_chunk: completion positions per vocabulary-projection block (memory knob).
    answer_weight: the weight of each loss token after the completion's `think_close_id`
    token (the answer after a reasoning trace) against 1 for the others; 1 = a plain token
    mean. think_close_id: the `</think>` token id (needed when answer_weight != 1; with it
    the metrics also report `answer_loss`, the mean loss of those tokens)."""

    logits_chunk: int = 256
    answer_weight: float = 1.0
    think_close_id: int = -1

    def validate(self) -> None:
        w = self.answer_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < float("inf"):
            raise ValueError(f"SFTConfig.answer_weight={w!r}: allowed a finite number > 0")
        if w != 1 and self.think_close_id < 0:
            raise ValueError(
                f"SFTConfig.answer_weight={w!r} needs think_close_id (the `</think>` token id)"
            )


def answer_tokens(batch: SequenceBatch, think_close_id: int) -> jax.Array:
    """bool [B, T]: completion columns after the row's first `think_close_id` token."""
    closes = batch.tokens[:, batch.prompt_len :] == think_close_id
    return (jnp.cumsum(closes, axis=1) - closes) > 0


def token_weights(batch: SequenceBatch, cfg: SFTConfig) -> jax.Array:
    """f32 [B, T]: each loss token's weight in `sft_loss` (0 off the loss mask)."""
    mask = jnp.asarray(batch.loss_mask, bool)
    w = mask.astype(jnp.float32)
    if cfg.answer_weight == 1:
        return w
    return w * jnp.where(answer_tokens(batch, cfg.think_close_id), cfg.answer_weight, 1.0)


def sft_loss(model, batch: SequenceBatch, cfg: SFTConfig | None = None):
    """Mean over loss tokens of -log p(token), temperature 1, weighted by `token_weights`.

    Returns (loss f32[], metrics: loss, num_tokens, entropy (mean over loss tokens), and
    answer_loss when cfg.think_close_id is set). With
    gradient accumulation the trainer weights each micro-batch by its share of the batch's
    loss tokens (`loss_tokens`, registered with the loss in `step.py`), so the result is the
    full-batch token mean.
    """
    cfg = SFTConfig() if cfg is None else cfg
    mask = jnp.asarray(batch.loss_mask, bool)
    weights = token_weights(batch, cfg)
    logp, entropy = completion_logprobs(model, batch, 1.0, cfg.logits_chunk)
    loss = jnp.sum(-logp * weights) / jnp.maximum(jnp.sum(weights), 1e-9)
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "num_tokens": jnp.sum(mask).astype(jnp.float32),
        "entropy": masked_mean(jax.lax.stop_gradient(entropy), mask),
    }
    if cfg.think_close_id >= 0:
        answer = mask & answer_tokens(batch, cfg.think_close_id)
        metrics["answer_loss"] = masked_mean(jax.lax.stop_gradient(-logp), answer)
    return loss, metrics


def loss_tokens(batch: SequenceBatch, cfg) -> jax.Array:
    """The normaliser of `sft_loss`: the summed token weights (f32[]; the number of loss tokens
    when answer_weight is 1)."""
    return jnp.sum(token_weights(batch, SFTConfig() if cfg is None else cfg))
