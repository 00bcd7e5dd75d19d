"""The CPU decode-attention kernel (`cpu_decode`, an XLA FFI custom call) against the XLA
decode path `qwen3._decode_attend`: one step's attention, the sampler's greedy tokens, where
it is not used, and the fallback when it cannot be built."""

import dataclasses
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models import cpu_decode, qwen3, sampler
from mapfjax.models.qwen3 import PRESETS, Qwen3
from tests.models.decode_inputs import decode_inputs

# float32: the kernel sums in another order than XLA.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def kernel():
    if jax.default_backend() != "cpu":
        pytest.skip("a CPU kernel")
    if not cpu_decode.compiler():
        pytest.skip("no C++ compiler here: decoding takes the XLA path (tested below)")
    # With a compiler the kernel must build: a failure is a bug, not a reason to skip.
    assert cpu_decode.available(), cpu_decode._state.get("error")


def _inputs(b, g, kh, h, d, p, w, pads, seed=0):
    """q [B, G, K, H, D], prefix (kp, vp [B, K, P, D], valid [B, P]: pads[b] slots of group b
    invalid, spread over the prefix), own (k, v [B * G, K, W, D], the loop's layout)."""
    q, prefix, own = decode_inputs(b, g, kh, h, d, p, w, pads, "scattered", seed)
    return q, prefix, tuple(c.reshape(b * g, *c.shape[2:]) for c in own)


# (B, G, K, H, D, P, W, invalid prefix slots per group): GQA, G > 1 rows per shared prefix, a
# group with no valid prefix slot, head dims 8 to 128, windows from 1 slot.
CASES = [
    (2, 3, 2, 2, 16, 24, 32, [5, 0]),
    (1, 1, 1, 4, 32, 16, 16, [3]),
    (3, 2, 2, 4, 32, 40, 64, [0, 17, 40]),
    (2, 4, 1, 1, 8, 7, 9, [6, 2]),
    (1, 2, 2, 8, 128, 5, 1, [0]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_kernel_matches_the_xla_path(kernel, case):
    """Every own-cache column (the slot written at this step is the last one read)."""
    *shape, pads = case
    b, g = shape[:2]
    q, prefix, (k, v) = _inputs(*shape, pads)
    w = shape[-1]
    own = (k.reshape(b, g, *k.shape[1:]), v.reshape(b, g, *v.shape[1:]))
    step = jax.jit(cpu_decode.decode_attend)
    for index in sorted({0, 1, w // 2, w - 1} & set(range(w))):
        want = qwen3._decode_attend(q, prefix, own, jnp.arange(w) <= index)
        got = step(q, prefix, (k, v), jnp.int32(index))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"index {index}")


def test_kernel_rejects_what_it_cannot_run(kernel):
    """More than 16 query heads per KV head: an error saying so, not a wrong answer."""
    q, prefix, own = _inputs(1, 1, 1, 17, 8, 4, 4, [0])
    with pytest.raises(Exception, match="at most 16 query heads"):
        jax.block_until_ready(cpu_decode.decode_attend(q, prefix, own, jnp.int32(1)))


# GQA: 4 query heads over 2 KV heads, head_dim 16, 2 layers.
CFG = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=False)
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)
# Different lengths (left padding to a bucket of 8), one of them at the bucket's length.
PROMPTS = [[5, 17, 3], [9, 1, 44, 2, 7, 100, 31, 8], [200]]
KW = dict(num_samples=2, window=4, stop_tokens=(), compact=False)


def _generate(model, monkeypatch, on: bool, **kw):
    monkeypatch.setattr(qwen3, "CPU_DECODE_KERNEL", on)
    sampler._decode.clear_cache()  # the flag is read when the loop is traced
    try:
        return sampler.generate(model, PROMPTS, 18, **{**KW, **kw})
    finally:
        sampler._decode.clear_cache()


def test_generate_greedy_is_the_xla_paths(kernel, monkeypatch):
    """Greedy tokens with 2 samples per prompt over growing own-cache windows (4, 8, 16, 17
    slots) are those of the XLA path, and every layer's decode step went through the kernel."""
    calls = []
    real = cpu_decode.decode_attend

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(cpu_decode, "decode_attend", counted)
    model = Qwen3(CFG, **F32, rngs=nnx.Rngs(5))
    want = _generate(model, monkeypatch, False)
    assert not calls
    got = _generate(model, monkeypatch, True)
    assert len(calls) == CFG.num_layers * 4  # traced once per layer and window
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert len({tuple(r) for r in np.asarray(want.tokens).tolist()}) > 1  # not one constant row


def test_not_used_for_bf16_or_under_a_mesh(kernel):
    """float32 only, and not under a multi-device mesh (the custom call is not partitioned)."""
    x = jnp.zeros((2, 2), jnp.float32)
    assert cpu_decode.usable(x, x)
    assert not cpu_decode.usable(x, x.astype(jnp.bfloat16))
    mesh = parallel.make_mesh({"data": 2, "fsdp": 1, "tp": 1}, devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        assert not cpu_decode.usable(x, x)


def test_a_failed_build_warns_once_and_decodes_on_the_xla_path(tmp_path, monkeypatch):
    """No compiler: one RuntimeWarning naming the cause, `available()` False, and `generate`
    gives the XLA path's tokens."""
    monkeypatch.setenv("MAPFJAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(cpu_decode, "_state", {})
    with pytest.warns(RuntimeWarning, match="no-such-compiler"):
        assert not cpu_decode.available()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the answer is cached: no second warning
        assert not cpu_decode.available()
    assert not list(tmp_path.rglob("*.so"))
    model = Qwen3(CFG, **F32, rngs=nnx.Rngs(5))
    got = _generate(model, monkeypatch, True)
    want = _generate(model, monkeypatch, False)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))


def test_build_is_cached_by_source_and_machine(kernel, tmp_path, monkeypatch):
    """A build lands once at its keyed path (no temp files left) and is reused."""
    monkeypatch.setenv("MAPFJAX_CACHE_DIR", str(tmp_path))
    path = cpu_decode.build()
    assert path == cpu_decode.library_path() and path.parent == tmp_path / "kernels"
    stamp = path.stat().st_mtime_ns
    assert cpu_decode.build() == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_bench_sampler_times_both_paths_and_the_bound(kernel, capsys):
    """`benchmarks/bench_sampler.py --cpu-kernel 0,1 --attention-bound` in a tiny form: one row
    per variant, each against the same transformers run; the kernel's and the XLA path's tokens
    are transformers', the bound's are not claimed."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sampler.py"
    spec = importlib.util.spec_from_file_location("bench_sampler", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--models", "random", "--batches", "2", "--lengths", "8", "--prompt-len", "4",
            "--repeats", "1", "--cpu-kernel", "0,1", "--attention-bound"]  # fmt: skip
    bench.main(argv)
    rows = [
        r.split("|")[1:-1] for r in capsys.readouterr().out.splitlines() if r.startswith("| random")
    ]
    assert [r[1].strip() for r in rows] == ["0", "1", "no attention"]
    assert [r[-1].strip() for r in rows[:2]] == ["2/2", "2/2"]
    assert qwen3.CPU_DECODE_KERNEL and qwen3._decode_attend.__name__ == "_decode_attend"
    with pytest.raises(SystemExit):
        bench.main(["--cpu-kernel", "2"])


def test_loading_the_kernel_keeps_the_process_float_mode(kernel, tmp_path):
    """The library is linked without -ffast-math: loading it must not turn on flush-to-zero
    (a fast-math link adds a constructor that does, for the whole process)."""
    import subprocess
    import sys

    path = cpu_decode.build(tmp_path / "kernel.so")
    code = (
        f"import ctypes, numpy as np; ctypes.CDLL({str(path)!r}); "
        "print(float(np.float32(1e-39) * np.float32(1.0)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) > 0.0  # a denormal survives


def test_a_damaged_cached_build_is_rebuilt(kernel, tmp_path):
    """A cached library that does not load (here: truncated) is built again, once, without a
    warning (in a fresh process: XLA keeps one registration per target and process)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MAPFJAX_CACHE_DIR": str(tmp_path)}
    code = "from mapfjax.models import cpu_decode; print(cpu_decode.library_path())"
    where = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    path = pathlib.Path(where.stdout.strip())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    code = (
        "import warnings; warnings.simplefilter('error'); "
        "from mapfjax.models import cpu_decode; print(cpu_decode.available())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "True"
    assert path.stat().st_size > 1000


def test_kernel_rejects_inconsistent_shapes(kernel):
    """Caches whose shapes do not match the queries': an error naming the expected layout."""
    q, prefix, (k, v) = _inputs(2, 2, 2, 2, 8, 4, 4, [0, 0])
    with pytest.raises(Exception, match=r"inconsistent shapes; expected q \[B, G, K, Q, D\]"):
        jax.block_until_ready(cpu_decode.decode_attend(q, prefix, (k, v[:, :, :2]), jnp.int32(1)))
    kp, vp, valid = prefix
    with pytest.raises(Exception, match="inconsistent shapes"):
        jax.block_until_ready(cpu_decode.decode_attend(q, (kp, vp, valid[:, :3]), (k, v), 1))
