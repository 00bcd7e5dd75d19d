"""A decode step's attention on CPU as a compiled kernel: an XLA FFI custom call
(`kernels/decode_attention_cpu.cc`), float32 only.

XLA:CPU runs a decode step's attention over per-row caches as many tiny products, far below
the memory bandwidth (docs/models.md). The kernel reads each group's shared prompt prefix once
for its G rows and each row's own cache only up to the filled slot, in one pass per
(group, KV head) split over XLA's intra-op threads. It gives the same result as
`qwen3._decode_attend` within float32 rounding (its sums run in another order).

The source is compiled on first use with the system's C++ compiler (`$CXX`, else `c++`) for
this machine's CPU (`-march=native`) and cached under `$MAPFJAX_CACHE_DIR` (default
`~/.cache/mapfjax`), keyed by the source, jaxlib's version and the CPU. Without a compiler, or
if the build fails, `available()` is False after one warning and decoding keeps the XLA path.
`qwen3.CPU_DECODE_KERNEL = False` (or `MAPFJAX_CPU_DECODE_KERNEL=0` in the environment before
mapfjax is imported) turns the kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import Array

SOURCE = Path(__file__).parent / "kernels" / "decode_attention_cpu.cc"
TARGET = "mapfjax_decode_attention_f32"
_SYMBOL = "MapfjaxDecodeAttentionF32"
# Compile flags. The object is linked in a second step without them: linking with -ffast-math
# adds a constructor (crtfastmath) that turns on flush-to-zero for the whole process on load.
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-std=c++17", "-fPIC", "-w")
LINK_FLAGS = ("-shared",)

# None until the first `available()` call; then True, or the reason the kernel is unavailable.
_state: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built kernels are kept: `$MAPFJAX_CACHE_DIR`, else `~/.cache/mapfjax`."""
    root = os.environ.get("MAPFJAX_CACHE_DIR") or Path.home() / ".cache" / "mapfjax"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """The CPU model and feature flags (a `-march=native` build runs only where they match)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return platform.machine() + "\n".join(sorted(set(lines)))


def library_path() -> Path:
    """The cached shared library for this source, jaxlib and CPU."""
    try:  # the FFI headers come with jaxlib
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = jax.__version__
    key = hashlib.sha256()
    flags = " ".join(FLAGS + LINK_FLAGS).encode()
    for part in (
        SOURCE.read_bytes(),
        jaxlib.encode(),
        flags,
        _cpu_signature().encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"decode_attention_cpu-{key.hexdigest()[:16]}.so"


def compiler() -> str | None:
    """The C++ compiler builds use: `$CXX`, else `c++` or `g++` on the PATH (None: none)."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def build(path: Path | None = None) -> Path:
    """Compiles the kernel to `path` (default `library_path()`) unless it is there; atomic (a
    temp file renamed into place, so concurrent builds are safe). Raises RuntimeError naming
    the compiler and its error output when the build fails."""
    path = library_path() if path is None else Path(path)
    if path.exists():
        return path
    cxx = compiler()
    if not cxx:
        raise RuntimeError("no C++ compiler found (set $CXX or install g++)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    obj = tmp + ".o"
    steps = [
        [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", "-c", str(SOURCE), "-o", obj],
        [cxx, *LINK_FLAGS, obj, "-o", tmp],
    ]
    try:
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                errors = [ln for ln in done.stderr.splitlines() if "error" in ln.lower()]
                detail = "\n".join(errors[:20]) or done.stderr[-2000:]
                raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{detail}")
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, obj):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path


def available() -> bool:
    """True once the kernel is built, loaded and registered with XLA for CPU (first call
    only; later calls return the cached answer). On failure: one warning, then False."""
    if "ok" not in _state:
        try:
            path = build()
            try:
                lib = ctypes.cdll.LoadLibrary(str(path))
            except OSError:  # a damaged cached build: build it again, once
                path.unlink(missing_ok=True)
                lib = ctypes.cdll.LoadLibrary(str(build()))
            jax.ffi.register_ffi_target(
                TARGET, jax.ffi.pycapsule(getattr(lib, _SYMBOL)), platform="cpu"
            )
            _state["ok"] = True
        except (OSError, RuntimeError, AttributeError, ValueError, subprocess.SubprocessError) as e:
            _state["ok"] = False
            _state["error"] = str(e)
            warnings.warn(
                f"the CPU decode-attention kernel is unavailable, decoding uses the XLA path: {e}",
                RuntimeWarning,
                stacklevel=2,
            )
    return bool(_state["ok"])


def usable(*arrays: Array) -> bool:
    """Whether a decode step over these arrays can run the kernel: CPU, every array float32,
    no multi-device mesh set (the custom call is not partitioned), and the kernel built."""
    if jax.default_backend() != "cpu" or any(a.dtype != jnp.float32 for a in arrays):
        return False
    if jax.sharding.get_abstract_mesh().size > 1:
        return False
    return available()


def decode_attend(q: Array, prefix, own, index) -> Array:
    """`qwen3._decode_attend` with `allowed` = slots 0..index, the own caches as the loop
    carries them: q [B, G, K, Q, D]; prefix (kp, vp [B, K, P, D], valid bool [B, P]); own
    (k, v [B * G, K, W, D]); index int32 []. float32 in and out. Returns [B, G, K, Q, D]."""
    kp, vp, valid = prefix
    k, v = own
    if not available():
        raise RuntimeError(f"CPU decode-attention kernel unavailable: {_state.get('error')}")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    return call(q, kp, vp, valid.astype(jnp.uint8), k, v, jnp.asarray(index, jnp.int32))
