"""Reinforcement learning: GRPO loss math, and the trainer built on it."""
