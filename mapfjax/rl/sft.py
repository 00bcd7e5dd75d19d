"""Supervised fine-tuning loss: masked token cross-entropy over a `SequenceBatch`'s loss
tokens (the answer and its end-of-turn token), averaged over all loss tokens of the batch."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mapfjax.rl.batch import SequenceBatch
from mapfjax.rl.grpo import masked_mean
from mapfjax.rl.logprobs import completion_logprobs


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """logits_chunk: completion positions per vocabulary-projection block (memory knob)."""

    logits_chunk: int = 256


def sft_loss(model, batch: SequenceBatch, cfg: SFTConfig | None = None):
    """Mean over loss tokens of -log p(token), temperature 1.

    Returns (loss f32[], metrics: loss, num_tokens, entropy (mean over loss tokens)). With
    gradient accumulation the trainer weights each micro-batch by its share of the batch's
    loss tokens (`loss_tokens`, registered with the loss in `step.py`), so the result is the
    full-batch token mean.
    """
    cfg = SFTConfig() if cfg is None else cfg
    mask = jnp.asarray(batch.loss_mask, bool)
    logp, entropy = completion_logprobs(model, batch, 1.0, cfg.logits_chunk)
    loss = masked_mean(-logp, mask)
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "num_tokens": jnp.sum(mask).astype(jnp.float32),
        "entropy": masked_mean(jax.lax.stop_gradient(entropy), mask),
    }
    return loss, metrics


def loss_tokens(batch: SequenceBatch, cfg) -> jax.Array:
    """The normaliser of `sft_loss`: the number of loss tokens (f32[])."""
    return jnp.sum(jnp.asarray(batch.loss_mask, bool)).astype(jnp.float32)
