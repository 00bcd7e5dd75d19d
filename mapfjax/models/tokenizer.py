"""Qwen3 tokenizer loading, chat prompts (thinking on/off), padding and length-based masks.

Masks are always built from lengths, never from `tokens != pad`: Qwen3's pad and end-of-turn
ids can coincide in fine-tuned checkpoints, and the end-of-turn token must stay in the loss.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from mapfjax import files

# Qwen3's ids (docs/paper.md section 7), declared only here; `special_ids` prefers the
# tokenizer's own.
PAD_ID = 151643  # <|endoftext|>
IM_START_ID = 151644  # <|im_start|>
IM_END_ID = 151645  # <|im_end|>, end of turn
THINK_ID = 151667  # <think>
END_THINK_ID = 151668  # </think>
STOP_IDS = (IM_END_ID, PAD_ID)  # generation ends at the end of turn or at <|endoftext|>

IM_START, IM_END, THINK, END_THINK, ENDOFTEXT = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|endoftext|>",
)
# What Qwen3's template appends to the generation prompt when thinking is switched off.
EMPTY_THINK = f"{THINK}\n\n{END_THINK}\n\n"


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens the sampler, trainer and parser need."""

    pad: int = PAD_ID
    im_start: int = IM_START_ID
    im_end: int = IM_END_ID
    think: int = THINK_ID
    end_think: int = END_THINK_ID


def load_tokenizer(path):
    """A transformers tokenizer from a local directory (or hub id, where there is a network)."""
    import transformers  # slow to import (seconds); only loading a tokenizer needs it

    local = pathlib.Path(path).expanduser()
    if files.missing_local_dir(path):
        raise OSError(f"{path}: no such directory (expected a model directory with config.json)")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(local))
    except (OSError, ValueError) as e:
        raise OSError(f"{path}: cannot load a tokenizer ({e})") from e


def special_ids(tokenizer) -> SpecialIds:
    """The tokenizer's own ids for Qwen3's special tokens; Qwen3's defaults where it has none."""

    def own(text: str, default: int) -> int:
        vocab = tokenizer.get_vocab()
        return int(vocab[text]) if text in vocab else default

    pad = tokenizer.pad_token_id
    return SpecialIds(
        pad=int(pad) if pad is not None else own(ENDOFTEXT, PAD_ID),
        im_start=own(IM_START, IM_START_ID),
        im_end=own(IM_END, IM_END_ID),
        think=own(THINK, THINK_ID),
        end_think=own(END_THINK, END_THINK_ID),
    )


def _as_messages(prompt, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    return messages


def builtin_chat_text(messages: Sequence[dict[str, str]], enable_thinking: bool = True) -> str:
    """Qwen3-style chat text for tokenizers without a chat template, ending in a generation
    prompt: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
    `<|im_start|>assistant\\n` (plus an empty think block when thinking is off)."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK)


def chat_text(tokenizer, prompt, *, enable_thinking: bool = True, system: str | None = None):
    """The model input text for one user prompt (str) or a list of chat messages.

    Uses the tokenizer's chat template when it has one, else `builtin_chat_text`. The mode is
    always passed to the template, never left to its default (a shipped model's template
    defaults to the mode it was trained in, `bpe.chat_template`), so this project's prompts are
    the same whatever a template's default.
    """
    messages = _as_messages(prompt, system)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
    return builtin_chat_text(messages, enable_thinking)


def encode_chat(
    tokenizer, prompts, *, enable_thinking: bool = True, system: str | None = None
) -> list[list[int]]:
    """Token ids of `chat_text` for each prompt (special tokens in the text are recognised)."""
    kw = dict(enable_thinking=enable_thinking, system=system)
    texts = [chat_text(tokenizer, p, **kw) for p in prompts]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _bucketed(n: int, bucket) -> int:
    if bucket is None:
        return n
    if isinstance(bucket, int):
        if bucket <= 0:
            raise ValueError(f"bucket={bucket} must be a positive multiple")
        return -(-n // bucket) * bucket
    sizes = sorted(bucket)
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"longest sequence has {n} tokens; largest bucket is {sizes[-1]}")


def pad_batch(
    token_lists: Sequence[Sequence[int]], pad_id: int, side: str = "left", bucket=None
) -> tuple[np.ndarray, np.ndarray]:
    """Pads variable-length token lists into (tokens int32 [B, T], mask bool [B, T]).

    side: "left" (prompts, so generation continues at the same column) or "right".
    bucket: None (T = longest), an int (T rounded up to a multiple) or a list of allowed T
    (the smallest that fits), which bounds the number of compiled shapes.
    """
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r}: allowed are 'left' and 'right'")
    lengths = np.array([len(t) for t in token_lists], np.int32)
    width = _bucketed(int(lengths.max(initial=0)), bucket)
    mask = np.asarray(lengths_to_mask(lengths, width, side=side))
    tokens = np.full(mask.shape, pad_id, np.int32)
    tokens[mask] = np.concatenate([np.asarray(t, np.int32) for t in token_lists] or [[]])
    return tokens, mask


def lengths_to_mask(lengths, total: int, side: str = "right"):
    """bool [B, T] mask, True on the first (side="right") or last (side="left") `lengths[b]`
    positions of each row. Works on numpy and jax arrays, inside jit too."""
    lengths = jnp.asarray(lengths)[:, None]
    pos = jnp.arange(total)[None, :]
    if side == "right":
        return pos < lengths
    if side == "left":
        return pos >= total - lengths
    raise ValueError(f"side={side!r}: allowed are 'left' and 'right'")


def completion_lengths(tokens, stop_ids: Sequence[int]):
    """int32 [B]: tokens up to and including the first stop token (e.g. <|im_end|>) of each
    row of `tokens` [B, T]; T when a row never stops. Use with `lengths_to_mask` for the
    loss mask, which then contains the end-of-turn token even when it equals the pad id."""
    tokens = jnp.asarray(tokens)
    is_stop = jnp.isin(tokens, jnp.asarray(list(stop_ids), tokens.dtype))
    first = jnp.argmax(is_stop, axis=1)
    return jnp.where(is_stop.any(axis=1), first + 1, tokens.shape[1]).astype(jnp.int32)
