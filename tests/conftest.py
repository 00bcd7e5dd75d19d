"""Test setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random MAPF language model directory (HF format), built once per session."""
    from tests.tiny_mapf import build_tiny_mapf_model

    return build_tiny_mapf_model(tmp_path_factory.mktemp("tinymodel"))
