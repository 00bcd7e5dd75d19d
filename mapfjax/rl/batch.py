"""`SequenceBatch`: prompt + completion token rows with the masks, old log-probs and advantages
the trainer's losses read; `make_batch` builds one on the host with the sampler's bucketing."""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.struct
import jax
import numpy as np

from mapfjax.models.sampler import BUCKETS

Array = jax.Array


@flax.struct.dataclass
class SequenceBatch:
    """B rows of one prompt (left-padded to P) followed by its completion (right-padded to T).

    tokens: int32 [B, L], L = P + T; padding positions hold `pad_id` (never read as input:
        losses feed padding as token 0, so a pad id outside a small vocabulary is harmless).
    attention_mask: bool [B, L], True on real prompt and completion tokens.
    positions: int32 [B, L], each row counts its real tokens from 0 (as the sampler does).
    prompt_len: P (static): completion token j of a row sits at column P + j.
    loss_mask: bool [B, T], completion tokens in the loss. GRPO: the first `lengths[b]` tokens,
        the end-of-turn token included (`grpo.response_mask`); SFT: answer tokens + end-of-turn.
    old_logprobs: f32 [B, T], sampler log-probs of the completion tokens (`logprobs_full`,
        temperature-scaled, no top-k/top-p); zeros for SFT.
    advantages: f32 [B], one per row; zeros for SFT.
    ref_logprobs: f32 [B, T] reference-policy log-probs, or None (needed only when kl_coef > 0).
    """

    tokens: Array
    attention_mask: Array
    positions: Array
    loss_mask: Array
    old_logprobs: Array
    advantages: Array
    ref_logprobs: Array | None = None
    prompt_len: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def completion_len(self) -> int:
        """T, the number of completion columns."""
        return self.loss_mask.shape[-1]

    @property
    def completion_tokens(self) -> Array:
        """int32 [B, T], the completion part of `tokens`."""
        return self.tokens[..., self.prompt_len :]


def _bucket(bucket: int | str, longest: int, name: str) -> int:
    """A fixed int length (must hold the longest row) or a `sampler.BUCKETS` rule name."""
    if isinstance(bucket, str):
        if bucket not in BUCKETS:
            raise ValueError(f"make_batch: {name}={bucket!r}: allowed an int or {sorted(BUCKETS)}")
        return max(1, BUCKETS[bucket](longest))
    if isinstance(bucket, bool) or not isinstance(bucket, int | np.integer) or bucket < 1:
        raise ValueError(f"make_batch: {name}={bucket!r}: allowed an int >= 1 or {sorted(BUCKETS)}")
    if longest > bucket:
        raise ValueError(
            f"make_batch: {name}={bucket} is shorter than the longest row ({longest} tokens); "
            "allowed a length >= every row, or a bucket rule name"
        )
    return int(bucket)


def _rows_to_array(rows, lengths: Sequence[int], width: int, name: str, dtype) -> np.ndarray:
    """Per-row values (ragged lists or a [B, >= len] array) -> [B, width], zero past each len."""
    out = np.zeros((len(lengths), width), dtype)
    if len(rows) != len(lengths):
        raise ValueError(
            f"make_batch: {name} has {len(rows)} rows but there are {len(lengths)} completions"
        )
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        row = np.asarray(row, dtype).reshape(-1)
        if row.shape[0] < n:
            raise ValueError(
                f"make_batch: {name}[{i}] has {row.shape[0]} values for a completion of {n} tokens"
            )
        out[i, :n] = row[:n]
    return out


def make_batch(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    prompt_bucket: int | str = "pow2",
    completion_bucket: int | str = "pow2",
    old_logprobs=None,
    advantages=None,
    *,
    loss_masks: Sequence[Sequence[bool]] | None = None,
    ref_logprobs=None,
    batch_multiple: int = 1,
) -> SequenceBatch:
    """Host-side batch of B = len(prompts) rows (NumPy arrays; `jax.device_put` it to shard).

    prompts, completions: token-id lists; a completion holds exactly the tokens the policy
    produced, the end-of-turn token included when the row stopped (pass `SampleOutput.tokens`
    rows cut at `lengths`). prompt_bucket / completion_bucket: a fixed length (e.g. the
    sampler's prompt bucket and max_new_tokens) or a `sampler.BUCKETS` rule name applied to the
    longest row, so that a stream of batches repeats a few shapes. old_logprobs: per-row values
    ([B, >= len] array or ragged lists, e.g. `SampleOutput.logprobs_full`), default zeros.
    advantages: [B], default zeros. loss_masks: per-row bools over the completion tokens
    (default: every completion token). ref_logprobs: like old_logprobs, or None.
    batch_multiple: append empty rows (no loss tokens) until B divides by it, e.g. the mesh's
    data x fsdp size.
    """
    n = len(prompts)
    if n == 0 or len(completions) != n:
        raise ValueError(
            f"make_batch: {n} prompts and {len(completions)} completions: allowed equal, >= 1"
        )
    p_lens = [len(p) for p in prompts]
    c_lens = [len(c) for c in completions]
    if min(p_lens) < 1:
        raise ValueError(f"make_batch: prompt {p_lens.index(0)} is empty: allowed >= 1 token")
    P = _bucket(prompt_bucket, max(p_lens), "prompt_bucket")
    T = _bucket(completion_bucket, max(c_lens), "completion_bucket")
    if not isinstance(batch_multiple, int) or batch_multiple < 1:
        raise ValueError(f"make_batch: batch_multiple={batch_multiple!r}: allowed an int >= 1")
    B = batch_multiple * math.ceil(n / batch_multiple)

    tokens = np.full((B, P + T), pad_id, np.int64)
    mask = np.zeros((B, P + T), bool)
    loss_mask = np.zeros((B, T), bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        tokens[i, P - len(p) : P] = p
        tokens[i, P : P + len(c)] = c
        mask[i, P - len(p) : P + len(c)] = True
        if loss_masks is None:
            loss_mask[i, : len(c)] = True
    if loss_masks is not None:
        loss_mask[:n] = _rows_to_array(loss_masks, c_lens, T, "loss_masks", bool)
    # An empty padding row still sees one token, so no query attends to nothing.
    mask[n:, P - 1] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)

    def per_token(values, name):
        out = np.zeros((B, T), np.float32)
        if values is not None:
            out[:n] = _rows_to_array(values, c_lens, T, name, np.float32)
        return out

    adv = np.zeros((B,), np.float32)
    if advantages is not None:
        a = np.asarray(advantages, np.float32).reshape(-1)
        if a.shape[0] != n:
            raise ValueError(f"make_batch: {a.shape[0]} advantages for {n} rows")
        adv[:n] = a
    return SequenceBatch(
        tokens=tokens.astype(np.int32),
        attention_mask=mask,
        positions=positions,
        loss_mask=loss_mask,
        old_logprobs=per_token(old_logprobs, "old_logprobs"),
        advantages=adv,
        ref_logprobs=None if ref_logprobs is None else per_token(ref_logprobs, "ref_logprobs"),
        prompt_len=P,
    )


def completion_logprobs(
    model, batch: SequenceBatch, temperature: float = 1.0, chunk: int = 256
) -> tuple[Array, Array]:
    """Log-probs and entropies of the completion tokens under `model` (fp32, chunked vocab).

    The hidden states at columns [P - 1, P + T - 1) predict the tokens at [P, P + T), so the
    [B, T, V] logits are never materialised (`grpo.chunked_token_logprobs`). Padding positions
    are fed as token 0 (a pad id may lie outside a small vocabulary; they are masked anyway).
    Returns (logp f32[B, T], entropy f32[B, T]); values at padding columns are meaningless.
    """
    import jax.numpy as jnp

    from mapfjax.rl.grpo import chunked_token_logprobs

    mask = jnp.asarray(batch.attention_mask, bool)
    tokens = jnp.where(mask, jnp.asarray(batch.tokens), 0)
    hidden, _ = model.hidden_states(tokens, batch.positions, mask)
    P, T = batch.prompt_len, batch.completion_len
    return chunked_token_logprobs(
        hidden[:, P - 1 : P + T - 1], model.lm_head, tokens[:, P:], temperature, chunk
    )
