"""Mesh construction, logical sharding rules, sharded forward/backward, distributed init."""

import dataclasses
import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mapfjax import parallel
from mapfjax.models.qwen3 import PRESETS, Qwen3

# Untied, 4 query heads over 2 KV heads: every kind of parameter is present and tp-divisible.
CFG = dataclasses.replace(PRESETS["tiny"], tie_word_embeddings=False)
F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)


def test_make_mesh_shapes_and_errors():
    mesh = parallel.make_mesh({"fsdp": 4, "tp": 2})
    assert mesh.axis_names == ("data", "fsdp", "tp")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tp": 2}
    assert dict(parallel.make_mesh({"data": -1, "tp": 2}).shape) == {"data": 4, "fsdp": 1, "tp": 2}
    cfg = ml_collections.ConfigDict({"data": 2, "fsdp": 2, "tp": 2})
    assert dict(parallel.make_mesh(cfg).shape) == {"data": 2, "fsdp": 2, "tp": 2}
    assert parallel.make_mesh({"tp": 2}, devices=jax.devices()[:2]).size == 2
    with pytest.raises(ValueError, match="unknown axes \\['model'\\]"):
        parallel.make_mesh({"model": 8})
    with pytest.raises(ValueError, match="needs 6 devices but 8"):
        parallel.make_mesh({"fsdp": 3, "tp": 2})
    with pytest.raises(ValueError, match="at most one -1"):
        parallel.make_mesh({"fsdp": -1, "tp": -1})


def test_logical_to_spec():
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tp": 2})
    train = parallel.RULES["train"]
    assert parallel.logical_to_spec(("embed", "q_heads", "head_dim"), mesh, train) == P(
        "fsdp", "tp", None
    )
    assert parallel.logical_to_spec(("batch", "seq"), mesh, "train") == P(("data", "fsdp"), None)
    assert parallel.logical_to_spec(("vocab", "embed"), mesh, "sample") == P("tp", None)
    # a mesh axis is used once per array; indivisible dims stay replicated
    assert parallel.logical_to_spec(("mlp", "vocab"), mesh, train) == P("tp", None)
    assert parallel.logical_to_spec(("kv_heads",), mesh, train, shape=(1,)) == P(None)
    sharding = parallel.logical_to_sharding(("batch",), mesh, train, shape=(6,))
    assert sharding.spec == P(None)  # 6 rows do not split over data*fsdp = 4
    with pytest.raises(KeyError, match="'experts'"):
        parallel.logical_to_spec(("experts",), mesh, train)
    with pytest.raises(ValueError, match="allowed names"):
        parallel.logical_to_spec(("embed",), mesh, "serve")


@pytest.fixture(scope="module")
def reference():
    """(model, tokens, mask, logits, grads) computed on a single device."""
    model = Qwen3(CFG, **F32, rngs=nnx.Rngs(11))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (8, 12)), jnp.int32)
    mask = jnp.arange(12)[None, :] >= jnp.array([0, 3, 5, 0, 11, 2, 0, 7])[:, None]
    logits, grads = _logits_and_grads(model, tokens, mask)
    return model, tokens, mask, logits, grads


@nnx.jit
def _logits_and_grads(model, tokens, mask):
    def loss(m):
        logp = jax.nn.log_softmax(m(tokens, attention_mask=mask)[0])
        return -jnp.sum(jnp.where(mask, logp[..., 1], 0.0)) / mask.sum()

    logits = model(tokens, attention_mask=mask)[0]
    return logits, nnx.grad(loss)(model)


@pytest.mark.parametrize(
    "shape,rules",
    [
        ({"fsdp": 4, "tp": 2}, "train"),
        ({"data": 2, "fsdp": 4}, "train"),
        ({"data": 4, "tp": 2}, "sample"),
    ],
)
def test_sharded_forward_and_grads_match_single_device(reference, shape, rules):
    model, tokens, mask, want_logits, want_grads = reference
    mesh = parallel.make_mesh(shape)
    sharded = Qwen3(CFG, **F32)
    nnx.update(sharded, nnx.state(model))
    parallel.shard_model(sharded, mesh, rules)
    q = sharded.layers.attn.q[...]
    assert q.sharding.spec == parallel.logical_to_spec(
        ("layers", "embed", "q_heads", "head_dim"), mesh, rules, q.shape
    )
    if mesh.shape["tp"] > 1 or (rules == "train" and mesh.shape["fsdp"] > 1):
        assert q.addressable_shards[0].data.size < q.size
    batch = parallel.logical_to_sharding(("batch", "seq"), mesh, rules, tokens.shape)
    with jax.set_mesh(mesh):
        logits, grads = _logits_and_grads(
            sharded, jax.device_put(tokens, batch), jax.device_put(mask, batch)
        )
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(logits)[m], np.asarray(want_logits)[m], atol=1e-5)
    for (p, a), (_, b) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-5, err_msg=p)


def test_init_sharded_places_every_parameter():
    mesh = parallel.make_mesh({"fsdp": 4, "tp": 2})
    model = parallel.init_sharded(lambda: Qwen3(CFG, **F32, rngs=nnx.Rngs(2)), mesh, "train")
    plain = Qwen3(CFG, **F32, rngs=nnx.Rngs(2))
    want = parallel.model_shardings(nnx.state(plain), mesh, "train")
    for (p, var), (_, w), (_, v) in zip(
        nnx.to_flat_state(nnx.state(model)),
        nnx.to_flat_state(want),
        nnx.to_flat_state(nnx.state(plain)),
        strict=True,
    ):
        assert var[...].sharding == w.get_value(), p
        # jit may fuse `std * normal` differently from eager: equal up to one ulp
        np.testing.assert_allclose(np.asarray(var[...]), np.asarray(v[...]), rtol=1e-6, err_msg=p)
    assert model.embedding[...].sharding.spec == P("tp", "fsdp")


def test_initialize_distributed_single_process(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    assert parallel.initialize_distributed() is False
    assert parallel.initialize_distributed() is False  # safe to call twice
    assert parallel.initialize_distributed(num_processes=1) is False
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        parallel.initialize_distributed()
    monkeypatch.setenv("JAX_PROCESS_ID", "zero")
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='zero'"):
        parallel.initialize_distributed()
    assert not jax.distributed.is_initialized()


def test_initialize_distributed_two_processes():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = textwrap.dedent(
        """
        import jax
        from mapfjax import parallel
        first = parallel.initialize_distributed()
        second = parallel.initialize_distributed()
        print(first, second, jax.process_count(), jax.process_index(), flush=True)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=env | {"JAX_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-2000:]
        assert out.split() == ["True", "True", "2", str(i)]


@pytest.mark.slow
def test_memory_plan_script_runs():
    script = os.path.join(os.path.dirname(__file__), "..", "launch", "memory_plan.py")
    args = ["--model", "tiny", "--sizes", "2x16", "--meshes", "fsdp4-tp2", "--devices", "8"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "fsdp4-tp2" in line]
    assert {line.split()[1] for line in lines} == {"forward", "hidden", "sample"}
    assert all("fits: 16 GB, 80 GB" in line for line in lines)
    (sample,) = [line for line in lines if line.split()[1] == "sample"]
    assert "cache growth" in sample


def test_compilation_cache_directory_choice_and_off(tmp_path, monkeypatch):
    keys = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    saved = {k: getattr(jax.config, k) for k in keys}
    try:
        assert parallel.enable_compilation_cache(tmp_path / "a") == str(tmp_path / "a")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "a")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        monkeypatch.setenv(parallel.CACHE_ENV, str(tmp_path / "b"))
        assert parallel.enable_compilation_cache() == str(tmp_path / "b")
        monkeypatch.delenv(parallel.CACHE_ENV)
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "c"))
        assert parallel.enable_compilation_cache() == str(tmp_path / "c")
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        monkeypatch.setenv("HOME", str(tmp_path))
        assert parallel.enable_compilation_cache() == str(tmp_path / ".cache" / "mapfjax" / "jax")
        monkeypatch.setenv(parallel.CACHE_ENV, "off")
        jax.config.update("jax_compilation_cache_dir", saved["jax_compilation_cache_dir"])
        assert parallel.enable_compilation_cache() is None
        assert jax.config.jax_compilation_cache_dir == saved["jax_compilation_cache_dir"]
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
