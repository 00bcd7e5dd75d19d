"""Loading/saving Hugging Face Qwen3 checkpoints, checked against transformers' PyTorch model."""

import dataclasses
import json
import os

import huggingface_hub
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from mapfjax import configfile, parallel
from mapfjax.files import CheckpointError
from mapfjax.models import hf, qwen3
from mapfjax.models.hf import from_pretrained, save_pretrained
from mapfjax.models.qwen3 import KVCache
from tests.models.hf_fixtures import load_reference, make_tiny_checkpoint, reference_logits

F32 = dict(dtype=jnp.float32, param_dtype=jnp.float32)


@nnx.jit
def run(m, tokens, mask):
    return m(tokens, attention_mask=mask)


def left_padded_batch(vocab, lengths=(9, 5, 1, 7), total=9, seed=0):
    """tokens int32 [B, T] (pad id 0 on the left) and mask bool [B, T]."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (len(lengths), total)).astype(np.int32)
    mask = np.arange(total)[None, :] >= total - np.asarray(lengths)[:, None]
    return np.where(mask, tokens, 0).astype(np.int32), mask


def cached_logits(model, tokens, mask, prefill):
    """Prefill `prefill` tokens, then feed one token at a time through a KV cache."""
    b, t = tokens.shape
    cache = KVCache.init(model.config, b, t + 3, jnp.float32)
    step = nnx.jit(lambda m, x, k, c: m(x, attention_mask=k, cache=c))
    out, cache = step(model, tokens[:, :prefill], mask[:, :prefill], cache)
    outs = [out]
    for i in range(prefill, t):
        out, cache = step(model, tokens[:, i : i + 1], mask[:, i : i + 1], cache)
        outs.append(out)
    assert int(cache.index) == t
    np.testing.assert_array_equal(np.asarray(cache.valid[:, :t]), mask)
    return np.concatenate([np.asarray(o) for o in outs], axis=1)


CASES = [
    dict(tie=True, rope_theta=1e6, num_heads=4, num_kv_heads=4),
    dict(tie=False, rope_theta=1e6, num_heads=4, num_kv_heads=2),
    dict(tie=True, rope_theta=5e6, num_heads=8, num_kv_heads=1),
    dict(tie=False, rope_theta=5e6, num_heads=4, num_kv_heads=2, torch_dtype="bfloat16"),
    dict(tie=True, rope_theta=1e6, num_heads=8, num_kv_heads=1, torch_dtype="bfloat16"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_matches_transformers_and_cache(tmp_path, case):
    path = make_tiny_checkpoint(tmp_path / "ckpt", **case)
    model = from_pretrained(path, **F32)
    assert model.config.rope_theta == case["rope_theta"]
    assert model.config.tie_word_embeddings == case["tie"]
    tokens, mask = left_padded_batch(model.config.vocab_size)
    ref = reference_logits(load_reference(path), tokens, mask)
    ours, cache = run(model, jnp.asarray(tokens), jnp.asarray(mask))
    assert cache is None and ours.dtype == jnp.float32
    assert np.abs(ref[mask]).max() > 1.0  # the comparison is not between near-zero logits
    np.testing.assert_allclose(np.asarray(ours)[mask], ref[mask], atol=1e-4, rtol=0)
    cached = cached_logits(model, jnp.asarray(tokens), jnp.asarray(mask), prefill=4)
    np.testing.assert_allclose(cached[mask], np.asarray(ours)[mask], atol=1e-4, rtol=0)


def test_bf16_load_keeps_checkpoint_values(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "ckpt", torch_dtype="bfloat16")
    model = from_pretrained(path)  # bf16 params and compute
    assert model.embedding[...].dtype == jnp.bfloat16
    ref = load_reference(path, dtype=torch.bfloat16)
    embed = ref.model.embed_tokens.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(model.embedding[...], np.float32), embed)
    tokens, mask = left_padded_batch(model.config.vocab_size)
    ours = np.asarray(run(model, jnp.asarray(tokens), jnp.asarray(mask))[0])
    theirs = reference_logits(load_reference(path), tokens, mask)
    scale = np.abs(theirs[mask]).max()
    assert np.abs(ours[mask] - theirs[mask]).max() < 0.1 * scale  # bf16 compute, loose


def test_index_sharded_checkpoint(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "ckpt", max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").exists()
    assert not (path / "model.safetensors").exists()
    model = from_pretrained(path, **F32, remat=True)
    assert model.remat
    ref = load_reference(path)
    np.testing.assert_array_equal(
        np.asarray(model.layers.mlp.down[...][1]),
        ref.model.layers[1].mlp.down_proj.weight.detach().numpy().T,
    )


@pytest.mark.parametrize("mesh_shape", [{"fsdp": 4, "tp": 2}, {"data": 2, "fsdp": 4}])
def test_load_onto_mesh(tmp_path, mesh_shape):
    path = make_tiny_checkpoint(tmp_path / "ckpt", tie=False, num_heads=8, num_kv_heads=2)
    mesh = parallel.make_mesh(mesh_shape)
    model = from_pretrained(path, mesh=mesh, rules="train", **F32)
    plain = from_pretrained(path, **F32)
    expect = parallel.model_shardings(nnx.state(model), mesh, "train")
    for (p, var), (_, want) in zip(
        nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(expect), strict=True
    ):
        assert var[...].sharding == want.get_value(), p
    q = model.layers.attn.q[...]  # [L, H, N, D]
    tp = mesh.shape["tp"]
    want = jax.sharding.PartitionSpec(None, "fsdp", "tp" if tp > 1 else None, None)
    assert q.sharding.spec == want
    assert q.addressable_shards[0].data.shape == (2, 64 // 4, 8 // tp, 16)
    for (p, a), (_, b) in zip(
        nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(plain)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(p))


@pytest.mark.parametrize("tie", [True, False])
def test_save_round_trips_through_transformers(tmp_path, tie):
    path = make_tiny_checkpoint(tmp_path / "theirs", tie=tie, torch_dtype="bfloat16")
    ours = from_pretrained(path, dtype=jnp.float32, param_dtype=jnp.bfloat16)
    out = save_pretrained(ours, tmp_path / "ours")
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    a = load_reference(path, dtype=torch.bfloat16).state_dict()
    b = load_reference(out, dtype=torch.bfloat16).state_dict()
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # ours -> theirs -> ours
    theirs = load_reference(out, dtype=torch.float32)
    theirs.save_pretrained(tmp_path / "again")
    back = from_pretrained(tmp_path / "again", dtype=jnp.float32, param_dtype=jnp.bfloat16)
    for (p, x), (_, y) in zip(
        nnx.to_flat_state(nnx.state(ours)), nnx.to_flat_state(nnx.state(back)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x[...]), np.asarray(y[...]), err_msg=str(p))


def test_save_overwrites_atomically_and_casts(tmp_path):
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], **F32)
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    save_pretrained(model, target, dtype=jnp.bfloat16)
    assert not (target / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp dirs left behind
    theirs = load_reference(target, dtype=torch.float32)
    expect = np.asarray(model.layers.mlp.gate[...][0].astype(jnp.bfloat16).astype(jnp.float32))
    gate = theirs.model.layers[0].mlp.gate_proj.weight.detach().numpy().T
    np.testing.assert_array_equal(gate, expect)


def test_save_copies_tokens_from_source(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["eos_token_id"] = 7
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer_config.json").write_text("{}")
    out = save_pretrained(from_pretrained(src, **F32), tmp_path / "out", copy_from=src)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 7
    gen = (out / "generation_config.json").read_text()
    assert gen == (src / "generation_config.json").read_text()  # the source's own, verbatim
    assert (out / "tokenizer_config.json").exists()


def test_generation_settings_are_read_by_transformers(tmp_path):
    """The settings a checkpoint carries are transformers' own keys where it has them
    (max_new_tokens, do_sample, temperature, top_p); the thinking key is kept as an attribute."""
    from transformers import GenerationConfig

    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], **F32)
    settings = hf.GenerationSettings(True, 640, do_sample=True, temperature=0.5, top_p=0.9)
    out = save_pretrained(model, tmp_path / "m", generation=settings)
    theirs = GenerationConfig.from_pretrained(out)
    assert (theirs.max_new_tokens, theirs.do_sample) == (640, True)
    assert (theirs.temperature, theirs.top_p) == (0.5, 0.9)
    assert getattr(theirs, hf.THINKING_KEY) is True
    greedy = save_pretrained(model, tmp_path / "g", generation=hf.GenerationSettings())
    theirs = GenerationConfig.from_pretrained(greedy)
    assert theirs.do_sample is False and getattr(theirs, hf.THINKING_KEY) is False


# --- malformed checkpoints: every case names the file and the offending tensor/key -----------


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _rewrite(path, edit):
    """Re-writes model.safetensors after `edit(dict of numpy arrays)`."""
    file = path / "model.safetensors"
    arrays = {k: t.mmap().copy() for k, t in hf.read_safetensors_header(file).items()}
    edit(arrays)
    hf.write_safetensors(file, arrays)


def _truncate(path):
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 100])


BAD = {
    "no config": (lambda p: (p / "config.json").unlink(), ["config.json"]),
    "wrong model_type": (lambda p: _edit_config(p, model_type="llama"), ["config.json", "llama"]),
    "wrong architecture": (
        lambda p: _edit_config(p, architectures=["Qwen2ForCausalLM"]),
        ["config.json", "Qwen2ForCausalLM"],
    ),
    "no rope_theta": (
        lambda p: _edit_config(p, rope_parameters={"rope_type": "default"}),
        ["config.json", "rope_theta"],
    ),
    "no weights": (lambda p: (p / "model.safetensors").unlink(), ["model.safetensors"]),
    "truncated": (_truncate, ["model.safetensors", "truncated"]),
    "garbage": (
        lambda p: (p / "model.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{not json!}xxxx"),
        ["model.safetensors", "header"],
    ),
    "missing tensor": (
        lambda p: _rewrite(p, lambda a: a.pop("model.layers.1.mlp.up_proj.weight")),
        ["model.layers.1.mlp.up_proj.weight", "missing"],
    ),
    "unexpected tensor": (
        lambda p: _rewrite(p, lambda a: a.update(extra=np.zeros(3, np.float32))),
        ["extra", "model.safetensors", "unexpected"],
    ),
    "shape mismatch": (
        lambda p: _rewrite(p, lambda a: a.update({"model.norm.weight": np.ones(65, np.float32)})),
        ["model.safetensors", "model.norm.weight", "(65,)", "(64,)"],
    ),
    "config disagrees": (
        lambda p: _edit_config(p, intermediate_size=96),
        ["model.safetensors", "model.layers.0.mlp.", "128", "96"],
    ),
    "untied without head": (
        lambda p: _edit_config(p, tie_word_embeddings=False),
        ["lm_head.weight", "missing"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_raises(tmp_path, case):
    path = make_tiny_checkpoint(tmp_path / "ckpt")
    damage, needles = BAD[case]
    damage(path)
    with pytest.raises(CheckpointError) as err:
        from_pretrained(path, **F32)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


@pytest.mark.slow
def test_index_lists_absent_tensor(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "ckpt", max_shard_size="40KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    name, file = next(iter(index["weight_map"].items()))
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != file)
    index["weight_map"][name] = other
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"{other}.*{name}"):
        from_pretrained(path, **F32)


def test_unknown_path_and_hub_failure(tmp_path, monkeypatch):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        from_pretrained(tmp_path / "nowhere" / "x" / "y")

    def offline(repo_id, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="Qwen/Qwen3-4B.*hub.*unreachable"):
        from_pretrained("Qwen/Qwen3-4B")


@pytest.mark.slow
def test_qwen3_4b_widths(tmp_path):
    """Real Qwen3-4B widths and vocabulary, 2 layers, stored in bf16 (~1.2 GB)."""
    path = make_tiny_checkpoint(
        tmp_path / "wide",
        hidden=2560,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate=9728,
        vocab=151936,
        layers=2,
        torch_dtype="bfloat16",
    )
    model = from_pretrained(path, **F32)
    four_b = qwen3.PRESETS["qwen3-4b"]
    assert model.config == dataclasses.replace(four_b, num_layers=2, max_position_embeddings=4096)
    tokens, mask = left_padded_batch(151936, lengths=(6, 3), total=6)
    ours = np.asarray(run(model, jnp.asarray(tokens), jnp.asarray(mask))[0])
    ref = reference_logits(load_reference(path), tokens, mask)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-3 * np.abs(ref).max(), rtol=0)


@pytest.mark.parametrize("config", ["configs/tiny_cpu.py", "configs/paper_qwen3_4b.py"])
def test_model_options_from_experiment_configs_reach_the_model(tmp_path, config):
    section = configfile.get_config(config, "").model
    assert hf.ModelOptions.from_config(section) == hf.ModelOptions(attention_impl="einsum")
    section.attention_impl = "fused"
    path = make_tiny_checkpoint(tmp_path / "ckpt")
    model = from_pretrained(path, **hf.ModelOptions.from_config(section).kwargs())
    assert model.attention_impl == "fused"


def test_model_options_refuse_unknown_attention_and_default_a_missing_key():
    with pytest.raises(ValueError, match=r"^model.attention_impl = 'flash'; allowed: 'einsum'"):
        hf.ModelOptions.from_config({"path": "p", "attention_impl": "flash"})
    with pytest.raises(ValueError, match=r"model.attention_impl = \['splash'\]"):
        hf.ModelOptions(attention_impl=["splash"])
    assert hf.ModelOptions.from_config({"path": "p"}).attention_impl == "einsum"
