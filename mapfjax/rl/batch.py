"""Training batches on the host: `SequenceBatch` (one prompt + completion per row) and
`GroupBatch` (G completions sharing each prompt, run once: the GRPO layout), with the masks, old
log-probs and advantages the losses read; `make_batch` builds either with the sampler's length
buckets."""

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


@flax.struct.dataclass
class GroupBatch:
    """Bg groups of G completions of one prompt each: the prompt is stored and run once.

    prompt_tokens: int32 [Bg, P], left-padded with the pad id; prompt_mask: bool [Bg, P].
    tokens: int32 [Bg, G, T], completions right-padded with the pad id; attention_mask:
        bool [Bg, G, T], True on real completion tokens.
    loss_mask, old_logprobs, ref_logprobs: [Bg, G, T] and advantages [Bg, G], as in
        `SequenceBatch` (one row per completion).
    Every leaf leads with the group axis, so micro-batches and devices get whole groups.
    """

    prompt_tokens: Array
    prompt_mask: Array
    tokens: Array
    attention_mask: Array
    loss_mask: Array
    old_logprobs: Array
    advantages: Array
    ref_logprobs: Array | None = None

    @property
    def completion_len(self) -> int:
        """T, the number of completion columns."""
        return self.loss_mask.shape[-1]

    @property
    def group_size(self) -> int:
        """G, completions per prompt."""
        return self.loss_mask.shape[-2]


def _bucket(bucket: int | str, longest: int, name: str, cap: int | None = None) -> int:
    """A fixed int length (must hold the longest row) or a `sampler.BUCKETS` rule name applied
    to the longest row and capped at `cap` (when the cap still holds the longest row)."""
    if isinstance(bucket, str):
        if bucket not in BUCKETS:
            raise ValueError(f"make_batch: {name}={bucket!r}: allowed an int or {sorted(BUCKETS)}")
        width = max(1, BUCKETS[bucket](longest))
        if cap is not None and cap >= longest:
            width = min(width, cap)
        return width
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
    group_size: int = 1,
    shared_prefix: bool | str = "auto",
    max_completion_len: int | None = None,
) -> SequenceBatch | GroupBatch:
    """Host-side batch of B = len(prompts) rows (NumPy arrays; `jax.device_put` it to shard).

    prompts, completions: token-id lists; a completion holds exactly the tokens the policy
    produced, the end-of-turn token included when the row stopped (pass `SampleOutput.tokens`
    rows cut at `lengths`). prompt_bucket / completion_bucket: a fixed length or a
    `sampler.BUCKETS` rule name applied to the longest row, so that a stream of batches repeats
    a few shapes; max_completion_len caps a rule's completion width (e.g. at the generation
    budget). old_logprobs: per-row values ([B, >= len] array or ragged lists, e.g.
    `SampleOutput.logprobs_full`), default zeros. advantages: [B], default zeros. loss_masks:
    per-row bools over the completion tokens (default: every completion token). ref_logprobs:
    like old_logprobs, or None. batch_multiple: pad the leading axis (rows, or groups for a
    `GroupBatch`) with empty entries (no loss tokens) until it divides by it, e.g. the mesh's
    data x fsdp size.

    group_size G and shared_prefix: rows come in consecutive groups of G completions of one
    prompt. shared_prefix=True builds a `GroupBatch` (each prompt stored and run once) and
    raises ValueError naming the first row whose prompt differs from its group's; "auto" does
    so when G > 1 and every group shares its prompt, and otherwise falls back to a
    `SequenceBatch`; False always builds a `SequenceBatch`.
    """
    n = len(prompts)
    if n == 0 or len(completions) != n:
        raise ValueError(
            f"make_batch: {n} prompts and {len(completions)} completions: allowed equal, >= 1"
        )
    if not isinstance(batch_multiple, int) or batch_multiple < 1:
        raise ValueError(f"make_batch: batch_multiple={batch_multiple!r}: allowed an int >= 1")
    if shared_prefix not in (True, False, "auto"):
        raise ValueError(
            f"make_batch: shared_prefix={shared_prefix!r}: allowed True, False, 'auto'"
        )
    p_lens = [len(p) for p in prompts]
    c_lens = [len(c) for c in completions]
    if min(p_lens) < 1:
        raise ValueError(f"make_batch: prompt {p_lens.index(0)} is empty: allowed >= 1 token")
    P = _bucket(prompt_bucket, max(p_lens), "prompt_bucket")
    T = _bucket(completion_bucket, max(c_lens), "completion_bucket", max_completion_len)
    loss_mask = _loss_mask(loss_masks, c_lens, T)
    adv = np.zeros((n,), np.float32)
    if advantages is not None:
        a = np.asarray(advantages, np.float32).reshape(-1)
        if a.shape[0] != n:
            raise ValueError(f"make_batch: {a.shape[0]} advantages for {n} rows")
        adv[:] = a
    old = _per_token(old_logprobs, c_lens, T, "old_logprobs")
    ref = None if ref_logprobs is None else _per_token(ref_logprobs, c_lens, T, "ref_logprobs")
    comp = np.full((n, T), pad_id, np.int32)
    for i, c in enumerate(completions):
        comp[i, : len(c)] = c
    rows = (comp, np.arange(T)[None, :] < np.asarray(c_lens)[:, None], loss_mask, old, adv, ref)
    share = shared_prefix is True or (shared_prefix == "auto" and group_size > 1)
    if share and _check_groups(prompts, group_size, shared_prefix is True):
        return _group_batch(prompts, rows, group_size, pad_id, P, batch_multiple)
    return _sequence_batch(prompts, rows, pad_id, P, batch_multiple)


def _check_groups(prompts, group_size: int, required: bool) -> bool:
    """True when the rows form consecutive groups of `group_size` rows with one prompt each;
    False (or ValueError naming the row when `required`) otherwise."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"make_batch: group_size={group_size!r}: allowed an int >= 1")
    n = len(prompts)
    problem = None
    if n % group_size:
        problem = f"{n} rows do not split into groups of group_size={group_size}"
    else:
        for i in range(n):
            first = i - i % group_size
            if i != first and list(prompts[i]) != list(prompts[first]):
                problem = (
                    f"row {i} ({len(prompts[i])} prompt tokens) has another prompt than row "
                    f"{first} ({len(prompts[first])} tokens), the first row of its group"
                )
                break
    if problem and required:
        raise ValueError(
            f"make_batch: shared_prefix=True needs consecutive groups of {group_size} rows with "
            f"one prompt each: {problem}"
        )
    return problem is None


def _loss_mask(loss_masks, c_lens, T) -> np.ndarray:
    if loss_masks is None:
        return np.arange(T)[None, :] < np.asarray(c_lens)[:, None]
    return _rows_to_array(loss_masks, c_lens, T, "loss_masks", bool)


def _per_token(values, c_lens, T, name) -> np.ndarray:
    if values is None:
        return np.zeros((len(c_lens), T), np.float32)
    return _rows_to_array(values, c_lens, T, name, np.float32)


def _pad_leading(x: np.ndarray | None, total: int) -> np.ndarray | None:
    """Appends zero (False) entries along axis 0 up to `total`."""
    if x is None or x.shape[0] == total:
        return x
    return np.concatenate([x, np.zeros((total - x.shape[0], *x.shape[1:]), x.dtype)])


def _sequence_batch(prompts, rows, pad_id, P, batch_multiple) -> SequenceBatch:
    comp, comp_mask, loss_mask, old, adv, ref = rows
    n, T = comp.shape
    B = batch_multiple * math.ceil(n / batch_multiple)
    tokens = np.full((B, P + T), pad_id, np.int32)
    mask = np.zeros((B, P + T), bool)
    for i, p in enumerate(prompts):
        tokens[i, P - len(p) : P] = p
        mask[i, P - len(p) : P] = True
    tokens[:n, P:] = comp
    mask[:n, P:] = comp_mask
    # An empty padding row still sees one token, so no query attends to nothing.
    mask[n:, P - 1] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return SequenceBatch(
        tokens=tokens,
        attention_mask=mask,
        positions=positions,
        loss_mask=_pad_leading(loss_mask, B),
        old_logprobs=_pad_leading(old, B),
        advantages=_pad_leading(adv, B),
        ref_logprobs=_pad_leading(ref, B),
        prompt_len=P,
    )


def _group_batch(prompts, rows, g, pad_id, P, batch_multiple) -> GroupBatch:
    comp, comp_mask, loss_mask, old, adv, ref = rows
    n, T = comp.shape
    groups = n // g
    Bg = batch_multiple * math.ceil(groups / batch_multiple)
    prompt_tokens = np.full((Bg, P), pad_id, np.int32)
    prompt_mask = np.zeros((Bg, P), bool)
    for j in range(groups):
        p = prompts[j * g]
        prompt_tokens[j, P - len(p) :] = p
        prompt_mask[j, P - len(p) :] = True
    prompt_mask[groups:, P - 1] = True  # empty padding groups see one token

    def grouped(x):
        return None if x is None else _pad_leading(x.reshape(groups, g, *x.shape[1:]), Bg)

    return GroupBatch(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        tokens=grouped(comp),
        attention_mask=grouped(comp_mask),
        loss_mask=grouped(loss_mask),
        old_logprobs=grouped(old),
        advantages=grouped(adv),
        ref_logprobs=grouped(ref),
    )


def row_view(batch: SequenceBatch | GroupBatch):
    """(loss_mask bool [R, T], old_logprobs f32 [R, T], advantages f32 [R], ref_logprobs
    f32 [R, T] or None) with one row per completion, whatever the batch layout."""
    if isinstance(batch, GroupBatch):
        t = batch.completion_len

        def flat(x):
            return None if x is None else x.reshape(-1, t)

        return (
            flat(batch.loss_mask),
            flat(batch.old_logprobs),
            batch.advantages.reshape(-1),
            flat(batch.ref_logprobs),
        )
    return batch.loss_mask, batch.old_logprobs, batch.advantages, batch.ref_logprobs
