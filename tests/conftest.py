"""Test setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""

import getpass
import os
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Launch scripts started by the tests keep the default allocator, as on a machine without
# tcmalloc (mapfjax/hostalloc.py); tests/test_hostalloc.py tests the restart itself.
os.environ.setdefault("MAPFJAX_TCMALLOC", "0")
# One persistent compilation cache for the whole run, in-process and in the subprocesses the
# end-to-end tests start (they inherit the environment): the same tiny programs are compiled
# by many tests, and compiling is most of a smoke loop's time on 2 cores. Set
# MAPFJAX_COMPILATION_CACHE=off to compile everything afresh.
if os.environ.get("MAPFJAX_COMPILATION_CACHE", "").strip().lower() not in ("off", "0", "none"):
    _cache = os.environ.get("MAPFJAX_COMPILATION_CACHE") or os.path.join(
        tempfile.gettempdir(), f"mapfjax-test-jax-cache-{getpass.getuser()}"
    )
    os.environ["MAPFJAX_COMPILATION_CACHE"] = _cache
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


import pytest  # noqa: E402


def pytest_sessionstart(session):
    """Stop at once, in one line, when the launch scripts the tests start would import another
    checkout's mapfjax (`tests/install.py`), instead of failing every end-to-end test."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller checks, once
        return
    from tests.install import install_problem, installed_mapfjax

    problem = install_problem(installed_mapfjax())
    if problem:
        pytest.exit(problem, returncode=4)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random MAPF language model directory (HF format), built once per session."""
    from tests.tiny_mapf import build_tiny_mapf_model

    return build_tiny_mapf_model(tmp_path_factory.mktemp("tinymodel"))


@pytest.fixture
def one_device_env():
    """The environment for a subprocess that runs as a user's job would: one CPU device, not
    the 8 fake devices of this process (a mesh of 8 threads on 2 cores is several times
    slower). For end-to-end runs whose sharding is tested elsewhere."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    kept = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    return {**os.environ, "XLA_FLAGS": " ".join(kept)}
