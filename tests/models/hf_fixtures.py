"""Random tiny Qwen3 checkpoints written by transformers, and their PyTorch reference models."""

from __future__ import annotations

import pathlib

import numpy as np
import torch
import transformers

# PyTorch, the reference for logits, on one thread: with two, its float32 cos/sin for the
# rotary embedding is now and then (about one process in five, on one x86 machine) 1.5e-4
# off from position 76 on, the positions a second thread computes, which moves a model's
# logits by up to 3e-3 there. One thread gave the accurate result in 20 runs of 20.
torch.set_num_threads(1)


def make_tiny_checkpoint(
    path,
    *,
    tie: bool = True,
    rope_theta: float = 1e6,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 256,
    intermediate: int = 128,
    torch_dtype: str = "float32",
    seed: int = 0,
    max_shard_size: str | None = None,
) -> pathlib.Path:
    """Saves a randomly initialised transformers `Qwen3ForCausalLM` (safetensors) to `path`.

    Every weight, norms included, is random and O(1)-scaled so that a wrong transpose, head
    order, norm or rope detail changes the logits visibly. `max_shard_size` (e.g. "40KB") makes
    transformers write an index-sharded checkpoint. Returns `path`.
    """
    path = pathlib.Path(path)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty; stale shards would mix with new ones")
    config = transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # torch Linear weights are [out, in]: scale by 1/sqrt(fan_in)
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[1]))
    model = model.to(getattr(torch, torch_dtype))
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **kwargs)
    return path


def load_reference(path, dtype=torch.float32) -> transformers.PreTrainedModel:
    """The checkpoint at `path` as a transformers model (eval mode, eager attention)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager"
    )
    return model.eval()


def reference_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float32 logits [B, T, V] of a transformers model on a (left-)padded batch.

    Positions count real tokens from 0 in each row, as ours do by default.
    """
    tokens_t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    mask_t = torch.as_tensor(np.asarray(mask), dtype=torch.long)
    positions = (mask_t.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=tokens_t, attention_mask=mask_t, position_ids=positions)
    return out.logits.float().numpy()
