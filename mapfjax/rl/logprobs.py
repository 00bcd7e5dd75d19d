"""Log-probs and entropies of completion tokens under a model, for either batch layout: one
forward over [prompt | completion] rows (`SequenceBatch`), or each prompt once and its G
completions attending to its keys and values (`GroupBatch`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mapfjax.rl.batch import GroupBatch, SequenceBatch
from mapfjax.rl.grpo import chunked_token_logprobs

Array = jax.Array


def completion_logprobs(
    model, batch: SequenceBatch | GroupBatch, temperature: float = 1.0, chunk: int = 256
) -> tuple[Array, Array]:
    """(logp, entropy) f32 of each completion token, in the batch's completion layout:
    [B, T] for a `SequenceBatch`, [Bg, G, T] for a `GroupBatch`.

    The hidden state before token t predicts it, so [.., T, V] logits are never materialised
    (`grpo.chunked_token_logprobs`); logits are divided by `temperature` (the sampler's).
    Padding positions are fed as token 0 (a pad id may lie outside a small vocabulary; they
    are masked anyway) and their values are meaningless.
    """
    if isinstance(batch, GroupBatch):
        return _group_logprobs(model, batch, temperature, chunk)
    mask = jnp.asarray(batch.attention_mask, bool)
    tokens = jnp.where(mask, jnp.asarray(batch.tokens), 0)
    hidden, _ = model.hidden_states(tokens, batch.positions, mask)
    P, T = batch.prompt_len, batch.completion_len
    return chunked_token_logprobs(
        hidden[:, P - 1 : P + T - 1], model.lm_head, tokens[:, P:], temperature, chunk
    )


def _group_logprobs(model, batch: GroupBatch, temperature: float, chunk: int):
    prompt_mask = jnp.asarray(batch.prompt_mask, bool)
    mask = jnp.asarray(batch.attention_mask, bool)
    prompt = jnp.where(prompt_mask, jnp.asarray(batch.prompt_tokens), 0)
    tokens = jnp.where(mask, jnp.asarray(batch.tokens), 0)
    bg, g, t = tokens.shape
    prompt_hidden, prefix = model.prefix(prompt, prompt_mask)
    hidden = model.extend(tokens, prefix, mask)  # [Bg, G, T, H]
    # Token 0 of every completion is predicted by the prompt's last hidden state.
    first = jnp.broadcast_to(prompt_hidden[:, None, -1:], (bg, g, 1, hidden.shape[-1]))
    before = jnp.concatenate([first, hidden[:, :, : t - 1]], axis=2).reshape(bg * g, t, -1)
    logp, ent = chunked_token_logprobs(
        before, model.lm_head, tokens.reshape(bg * g, t), temperature, chunk
    )
    return logp.reshape(bg, g, t), ent.reshape(bg, g, t)
