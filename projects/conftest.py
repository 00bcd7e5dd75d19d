"""The experiments' tests run with the package's test setup (8 fake CPU devices, set before jax
is imported, and the shared fixtures)."""

from tests.conftest import one_device_env, tiny_model_dir  # noqa: F401
