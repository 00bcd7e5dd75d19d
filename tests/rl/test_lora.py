"""LoRA adapters: the merge against NumPy, the adapters' gradient as the chain rule gives it
from the full weight gradient, a trainer that starts at the model and moves only the adapted
kernels, the frozen model as the KL reference, sharded == unsharded, an update in parts ==
whole, checkpoints and export, bad settings refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl import lora, step
from mapfjax.rl.batch import make_batch
from mapfjax.rl.checkpoint import CheckpointError, export_hf
from mapfjax.rl.grpo import GRPOConfig
from mapfjax.rl.trainer import OptimConfig, Trainer

CFG = PRESETS["tiny"]
SPEC = lora.LoraSpec(rank=3, alpha=6.0, targets=tuple(lora.TARGETS))
OPTIM = OptimConfig(lr=1e-2, eps=1e-4, total_steps=100, lora_rank=3, lora_alpha=6.0)
GRPO = GRPOConfig(group_size=4)


def tiny_model(seed=0):
    return Qwen3(CFG, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def batch(seed=0, rows=8):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(1, CFG.vocab_size, rng.integers(2, 9))) for _ in range(rows)]
    comps = [list(rng.integers(1, CFG.vocab_size, rng.integers(1, 12))) for _ in range(rows)]
    old = [list(rng.normal(-5.5, 0.3, len(c))) for c in comps]
    return make_batch(prompts, comps, 0, "pow2", 16, old, rng.normal(size=rows))


def params_of(model):
    return nnx.split(model, nnx.Param, ...)[1]


def random_adapters(base, seed=1):
    """Adapters with B drawn too (at init B is 0 and the merge is the identity)."""
    ad = jax.eval_shape(lambda: lora.init(base, SPEC, jax.random.key(seed)))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype), ad)


def host(tree):
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(tree)}


def test_merge_matches_numpy():
    base = params_of(tiny_model())
    ad = random_adapters(base)
    merge = jax.jit(lambda b, a: lora.merge(b, a, SPEC))  # one program, not one per op
    merged, b, a = host(merge(base, ad)), host(base), host(ad)
    for path, w in b.items():
        if path[-1] not in lora.TARGETS:
            np.testing.assert_array_equal(merged[path], w)  # norms, embedding: untouched
            continue
        n_in = lora.TARGETS[path[-1]]
        A, B = a[(*path, "a")], a[(*path, "b")]
        want = np.stack(
            [
                w[i]
                + SPEC.scale
                * (A[i].reshape(-1, SPEC.rank) @ B[i].reshape(SPEC.rank, -1)).reshape(w.shape[1:])
                for i in range(w.shape[0])
            ]
        )
        assert A.shape == (*w.shape[: 1 + n_in], SPEC.rank)
        np.testing.assert_allclose(merged[path], want, rtol=1e-5, atol=1e-6)
    # at init B = 0: the merged weights are the model's own
    fresh = host(merge(base, jax.jit(lambda b: lora.init(b, SPEC, jax.random.key(0)))(base)))
    assert all(np.array_equal(fresh[p], w) for p, w in b.items())


def test_adapter_gradient_is_the_chain_rule_of_the_full_gradient():
    """dL/dA = s dL/dW B^T and dL/dB = s A^T dL/dW per layer, with dL/dW the gradient of the
    same loss with respect to the merged weights (NumPy contractions)."""
    model = tiny_model()
    graphdef, base, rest = nnx.split(model, nnx.Param, ...)
    ad = random_adapters(base)
    data = batch(2)
    loss, _ = step.resolve_loss("grpo", GRPO)
    kw = dict(graphdef=graphdef, loss=loss, loss_cfg=GRPO, accum_steps=1, remat=None)
    grads = jax.jit(lambda p, r, adapters: step.batch_grads(p, data, r, adapters=adapters, **kw)[2],
                    static_argnums=2)  # fmt: skip
    g_ad = grads(ad, (base, rest), SPEC)
    g_w = grads(jax.jit(lambda b, a: lora.merge(b, a, SPEC))(base, ad), rest, None)
    g_ad, g_w, a = host(g_ad), host(g_w), host(ad)
    for path in lora.targeted(base, SPEC):
        L, r = g_w[path].shape[0], SPEC.rank
        dw = g_w[path].reshape(L, -1, int(np.prod(g_w[path].shape[1 + lora.TARGETS[path[-1]] :])))
        A = a[(*path, "a")].reshape(L, -1, r)
        B = a[(*path, "b")].reshape(L, r, -1)
        want_a = SPEC.scale * np.einsum("lio,lro->lir", dw, B)
        want_b = SPEC.scale * np.einsum("lir,lio->lro", A, dw)
        np.testing.assert_allclose(g_ad[(*path, "a")].reshape(want_a.shape), want_a, atol=1e-6)
        np.testing.assert_allclose(g_ad[(*path, "b")].reshape(want_b.shape), want_b, atol=1e-6)
    assert max(np.abs(g).max() for g in g_ad.values()) > 0


def test_trainer_starts_at_the_model_and_moves_only_the_adapted_kernels():
    model = tiny_model()
    before = host(params_of(model))
    tr = Trainer(model, OPTIM, "sft")
    full = Trainer(tiny_model(), dataclasses.replace(OPTIM, lora_rank=0), "sft")
    data = batch(0)
    start = tr.logprobs(data)[0]
    np.testing.assert_allclose(start, full.logprobs(data)[0], atol=1e-6)
    embedding = model.embedding[...]
    model.embedding[...] = embedding + 1.0  # the caller's model, changed later
    np.testing.assert_array_equal(tr.logprobs(data)[0], start)  # the trainer's frozen copy
    model.embedding[...] = embedding
    frac = lora.trainable_fraction(params_of(model), tr.params)
    assert 0 < frac < 0.5
    losses = [tr.step(data)["loss"] for _ in range(5)]
    assert losses[-1] < losses[0]  # it learns
    after = host(tr.model_params())
    for path, w in before.items():
        if path[-1] in lora.TARGETS:
            assert np.abs(after[path] - w).max() > 1e-4
        else:
            np.testing.assert_array_equal(after[path], w)
    assert all(np.array_equal(host(params_of(model))[p], w) for p, w in before.items())
    # the model view runs on the merged weights
    np.testing.assert_allclose(
        Trainer(tr.model(), dataclasses.replace(OPTIM, lora_rank=0), "sft").logprobs(data)[0],
        tr.logprobs(data)[0],
        atol=1e-5,
    )


@pytest.mark.slow
def test_kl_reference_is_the_frozen_model_and_an_update_in_parts_equals_it_whole():
    cfg = GRPOConfig(group_size=4, kl_coef=0.1)
    tr = Trainer(tiny_model(), OPTIM, "grpo", loss_cfg=cfg)
    assert tr.ref_params is tr.rest[0]  # no copy of the weights
    data = batch(1)
    ref = lambda tr: tr.reference_logprobs(tr.place_batch(data))
    np.testing.assert_allclose(ref(tr), tr.logprobs(data)[0], atol=1e-6)
    parts = Trainer(tiny_model(), dataclasses.replace(OPTIM, length_split=2), "grpo", loss_cfg=cfg)
    for _ in range(3):
        m, m_parts = tr.step(data), parts.step(data)
    assert m["kl"] > 0
    np.testing.assert_allclose(m_parts["kl"], m["kl"], rtol=1e-4)
    got, want = host(parts.params), host(tr.params)
    assert max(np.abs(got[p] - w).max() for p, w in want.items()) < 1e-5
    full = Trainer(tiny_model(), dataclasses.replace(OPTIM, lora_rank=0), "sft")
    np.testing.assert_allclose(ref(tr), full.logprobs(data)[0], atol=1e-6)  # still the model's


def test_sharded_update_equals_the_plain_one():
    data = batch(3)  # the SFT loss: the adapters' placement does not depend on the loss
    plain = Trainer(tiny_model(), OPTIM, "sft")
    plain.step(data)
    mesh = parallel.make_mesh({"fsdp": 4, "tp": 2})
    sharded = Trainer(tiny_model(), OPTIM, "sft", mesh)
    b = sharded.params["layers"]["mlp"]["up"]["b"][...]
    assert b.sharding.spec != jax.sharding.PartitionSpec()  # really split over devices
    sharded.step(data)
    got, want = host(sharded.params), host(plain.params)
    assert np.abs(want[("layers", "mlp", "up", "b")]).max() > 1e-4  # B left zero: it moved
    assert max(np.abs(got[p] - w).max() for p, w in want.items()) < 1e-5


def test_checkpoint_round_trip_and_export(tmp_path):
    data = batch(4)
    tr = Trainer(tiny_model(), OPTIM, "sft")
    tr.step(data)
    tr.save(tmp_path / "ckpt", {"step": 1}, wait=True)
    again = Trainer(tiny_model(), OPTIM, "sft")
    assert again.restore(tmp_path / "ckpt") == {"step": 1}
    assert all(np.array_equal(host(again.params)[p], w) for p, w in host(tr.params).items())
    full = Trainer(tiny_model(), dataclasses.replace(OPTIM, lora_rank=0), "sft")
    with pytest.raises(CheckpointError):
        full.restore(tmp_path / "ckpt")
    from mapfjax.models import hf

    loaded = hf.from_pretrained(export_hf(tr, tmp_path / "export"), dtype=jnp.float32)
    got, want = host(params_of(loaded)), host(tr.model_params())
    assert all(np.allclose(got[p], w, atol=1e-6) for p, w in want.items())
    tr.close()
    again.close()


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("lora_rank", -1, "an int >= 0"),
        ("lora_rank", 1.5, "an int >= 0"),
        ("lora_alpha", 0.0, "a number > 0"),
        ("lora_targets", ("q", "wq"), "a non-empty tuple of kernel names from"),
        ("lora_targets", ["q"], "a non-empty tuple"),
        ("lora_targets", (), "a non-empty tuple"),
    ],
)
def test_bad_settings_are_refused(field, value, allowed):
    with pytest.raises(ValueError, match=f"OptimConfig.{field}=.*allowed {allowed}"):
        dataclasses.replace(OPTIM, **{field: value}).validate()
