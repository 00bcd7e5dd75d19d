"""mapfjax: MAPF-FrozenLake in JAX, Qwen3 in Flax, GRPO and an LLM environment engineer."""
