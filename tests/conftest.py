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


import inspect  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

# The fixtures of end-to-end tests: a subprocess's environment, a model built for the session.
_E2E_FIXTURES = {"one_device_env", "tiny_model_dir"}


def _starts_processes(module) -> set[str]:
    """Names of a test module's own functions and fixtures that start a process, directly or
    through another of them."""
    sources = {}
    for name, obj in vars(module).items():
        fn = getattr(obj, "__wrapped__", obj)  # a fixture's own function
        fn = getattr(obj, "_get_wrapped_function", lambda fn=fn: fn)()
        if inspect.isfunction(fn) and fn.__module__ == module.__name__:
            try:
                sources[name] = inspect.getsource(fn)
            except (OSError, TypeError):
                pass
    out = {name for name, src in sources.items() if "subprocess" in src}
    grew = True
    while grew:  # callers of those, to a fixed point
        more = {n for n, src in sources.items() if n not in out and _calls(src, out)}
        out |= more
        grew = bool(more)
    return out


def _calls(source: str, names: set[str]) -> bool:
    return any(re.search(rf"\b{n}\(", source) for n in names)


def is_end_to_end(item, helpers: set[str]) -> bool:
    """A test that starts a process (itself or through a helper of its module) or uses an
    end-to-end fixture."""
    if (_E2E_FIXTURES | helpers) & set(item.fixturenames):
        return True
    fn = getattr(item, "function", None)
    try:
        source = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return False
    return "subprocess" in source or _calls(source, helpers)


def pytest_collection_modifyitems(config, items):
    """Mark `e2e` every end-to-end test (`is_end_to_end`): `pytest -m "not slow and not e2e"`
    is the fast tier, the unit tests alone (docs/development.md)."""
    helpers: dict = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module not in helpers:
            helpers[module] = _starts_processes(module)
        if is_end_to_end(item, helpers.get(module, set())):
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_teardown(item, nextitem):
    """Between test modules, drop JAX's in-memory compiled programs and collect garbage: a
    worker runs hundreds of modules, and what each compiled stays otherwise for the whole run
    (the persistent cache on disk keeps the next compile cheap)."""
    if nextitem is not None and getattr(nextitem, "module", None) is getattr(item, "module", 0):
        return
    import gc
    import sys

    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    gc.collect()


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
