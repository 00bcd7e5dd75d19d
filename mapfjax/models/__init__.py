"""Qwen3 in Flax NNX: model (qwen3), Hugging Face checkpoints (hf), tokenizer, sampler."""
