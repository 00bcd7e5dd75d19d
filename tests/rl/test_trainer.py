"""Trainer: sharded step == unsharded step, accumulation == one big batch, non-finite skips,
old log-probs across iterations, no reference pass without KL, GRPO loss vs a NumPy reference."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl import trainer as trainer_lib
from mapfjax.rl.batch import make_batch
from mapfjax.rl.grpo import GRPOConfig
from mapfjax.rl.trainer import OptimConfig, Trainer, lr_schedule

CFG = PRESETS["tiny"]
# eps = 1e-4: Adam's first update is ~lr * sign(g), so a gradient entry near 0 whose sign
# flips under another reduction order would move by 2 * lr; a larger eps keeps such entries'
# updates proportional to g and the comparison meaningful at 1e-5.
OPTIM = OptimConfig(lr=1e-3, eps=1e-4, grad_clip=1.0, weight_decay=0.01, total_steps=100)


def tiny_model(seed=0):
    return Qwen3(CFG, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def random_batch(seed=0, rows=8, max_prompt=9, max_completion=7, completion_bucket=8):
    rng = np.random.default_rng(seed)
    prompts = [
        list(rng.integers(1, CFG.vocab_size, rng.integers(2, max_prompt))) for _ in range(rows)
    ]
    comps = [
        list(rng.integers(1, CFG.vocab_size, rng.integers(1, max_completion))) for _ in range(rows)
    ]
    old = [list(rng.normal(-5.5, 0.3, len(c))) for c in comps]
    adv = rng.normal(size=rows)
    return make_batch(prompts, comps, 0, "pow2", completion_bucket, old, adv)


def loss_cfg(name, **kw):
    return GRPOConfig(group_size=4, **kw) if name == "grpo" else None


def max_diff(a, b):
    diffs = jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))),
        jax.device_get(a),
        jax.device_get(b),
    )
    return max(jax.tree.leaves(diffs))


def _cfg(loss, aggregation="token_mean"):
    return GRPOConfig(group_size=4, aggregation=aggregation) if loss == "grpo" else None


# Rows of very different lengths: micro-batches hold different token counts, so a mean of
# per-micro-batch token means would differ from the full-batch token mean.
BATCH = random_batch(3, rows=8, max_completion=8)


@functools.cache
def reference_step(loss, aggregation="token_mean"):
    """(params, metrics) after one unsharded, unaccumulated step on BATCH (shared by tests)."""
    tr = Trainer(tiny_model(), OPTIM, loss, loss_cfg=_cfg(loss, aggregation))
    metrics = tr.step(BATCH)
    return jax.device_get(tr.params), metrics


# --------------------------------------------------------------------------- losses vs NumPy


def _numpy_completion_logp(model, batch, temperature):
    """Full [B, L, V] logits from the plain forward, NumPy log-softmax, completion gather."""
    mask = np.asarray(batch.attention_mask)
    tokens = np.where(mask, batch.tokens, 0)
    logits, _ = nnx.jit(lambda m, *a: m(*a))(model, tokens, batch.positions, mask)
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    P, T = batch.prompt_len, batch.completion_len
    out = np.zeros((tokens.shape[0], T))
    for b in range(tokens.shape[0]):
        for j in range(T):
            out[b, j] = logsm[b, P + j - 1, tokens[b, P + j]]
    return out


def test_grpo_loss_matches_numpy_reference():
    model = tiny_model()
    batch = random_batch(1)
    cfg = GRPOConfig(group_size=4, temperature=0.7, clip_low=0.1, clip_high=0.3)
    loss, metrics = nnx.jit(trainer_lib.grpo_token_loss, static_argnums=2)(model, batch, cfg)
    logp = _numpy_completion_logp(model, batch, 0.7)
    mask = np.asarray(batch.loss_mask)
    ratio = np.exp(logp - batch.old_logprobs)
    adv = np.asarray(batch.advantages)[:, None]
    per = -np.minimum(ratio * adv, np.clip(ratio, 0.9, 1.3) * adv)
    want = (per * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    ent_ok = 0 < float(metrics["entropy"]) <= np.log(CFG.vocab_size) + 1e-4
    assert ent_ok
    mismatch = np.abs(logp - batch.old_logprobs)[mask].mean()
    np.testing.assert_allclose(float(metrics["logprob_mismatch"]), mismatch, rtol=1e-5)


# --------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("loss", ["grpo", "sft"])
@pytest.mark.parametrize(
    "mesh_shape",
    [{"fsdp": 4, "tp": 2}, pytest.param({"data": 2, "fsdp": 4}, marks=pytest.mark.slow)],
)
def test_sharded_step_equals_unsharded(loss, mesh_shape):
    ref_params, m_ref = reference_step(loss)
    mesh = parallel.make_mesh(mesh_shape)
    sharded = Trainer(tiny_model(), OPTIM, loss, mesh, loss_cfg=loss_cfg(loss))
    emb = sharded.params["embedding"][...]
    assert emb.sharding.spec != jax.sharding.PartitionSpec()  # really split over devices
    m = sharded.step(BATCH)
    assert max_diff(ref_params, sharded.params) < 1e-5
    assert max_diff(ref_params, nnx.state(tiny_model(), nnx.Param)) > 1e-4  # it did move
    np.testing.assert_allclose(m["loss"], m_ref["loss"], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- accumulation


@pytest.mark.parametrize(
    "loss,aggregation",
    [
        ("grpo", "token_mean"),
        pytest.param("grpo", "seq_mean_token_mean", marks=pytest.mark.slow),
        ("sft", None),
    ],
)
def test_accumulation_equals_one_big_batch(loss, aggregation):
    lens = np.asarray(BATCH.loss_mask).sum(1)
    assert lens[0::2].sum() != lens[1::2].sum()
    cfg = _cfg(loss, aggregation or "token_mean")
    big_params, m_big = reference_step(loss, aggregation or "token_mean")
    acc = Trainer(
        tiny_model(), OptimConfig(**{**OPTIM.__dict__, "accum_steps": 2}), loss, loss_cfg=cfg
    )
    m_acc = acc.step(BATCH)
    np.testing.assert_allclose(m_acc["loss"], m_big["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m_acc["grad_norm"], m_big["grad_norm"], rtol=1e-5)
    assert m_acc["num_tokens"] == m_big["num_tokens"] == lens.sum()
    assert max_diff(big_params, acc.params) < 1e-5


def test_accumulation_rejects_indivisible_batch():
    tr = Trainer(tiny_model(), OptimConfig(**{**OPTIM.__dict__, "accum_steps": 3}), "sft")
    with pytest.raises(ValueError, match="accum_steps=3"):
        tr.step(random_batch(0, rows=8))


# --------------------------------------------------------------------------- non-finite


def test_non_finite_update_is_skipped_then_raises():
    tr = Trainer(
        tiny_model(),
        OptimConfig(**{**OPTIM.__dict__, "max_bad_steps": 2}),
        "grpo",
        loss_cfg=loss_cfg("grpo"),
    )
    good = random_batch(4)
    bad = good.replace(advantages=np.full_like(good.advantages, np.nan))
    tr.step(good)
    before = jax.device_get(tr.params)
    opt_before = jax.device_get(tr.state.opt_state)
    m = tr.step(bad)
    assert m["update_skipped"] == 1.0 and m["skipped"] == 1 and m["bad_steps"] == 1
    assert m["update_norm"] == 0.0
    assert max_diff(before, tr.params) == 0.0
    assert max_diff(opt_before, tr.state.opt_state) == 0.0
    m = tr.step(good)  # a finite update resets the run of bad steps
    assert m["bad_steps"] == 0 and m["skipped"] == 1 and max_diff(before, tr.params) > 0
    # update_norm: the global norm of the change the update made to the parameters
    change = jax.tree.map(
        lambda a, b: np.asarray(b, np.float64) - a, before, jax.device_get(tr.params)
    )
    expected = np.sqrt(sum(np.sum(d**2) for d in jax.tree.leaves(change)))
    np.testing.assert_allclose(m["update_norm"], expected, rtol=1e-3)
    tr.step(bad)
    with pytest.raises(RuntimeError, match="2 non-finite updates in a row"):
        tr.step(bad)
    assert int(tr.state.skipped) == 3


# --------------------------------------------------------------------------- GRPO specifics


def test_second_iteration_uses_old_logprobs():
    tr = Trainer(
        tiny_model(),
        OptimConfig(**{**OPTIM.__dict__, "lr": 3e-2}),
        "grpo",
        loss_cfg=loss_cfg("grpo"),
    )
    batch = random_batch(5)
    logp, _ = tr.logprobs(batch)
    batch = batch.replace(old_logprobs=np.asarray(logp) * np.asarray(batch.loss_mask))
    first, second = tr.train_on(batch, num_iterations=2)
    np.testing.assert_allclose(first["ratio_mean"], 1.0, atol=1e-5)
    assert first["clip_frac"] == 0.0
    assert abs(second["ratio_mean"] - 1.0) > 1e-3
    assert second["clip_frac"] > 0.0
    np.testing.assert_allclose(
        second["clip_frac"], second["clip_frac_low"] + second["clip_frac_high"], rtol=1e-6
    )


def test_no_reference_forward_without_kl():
    calls = trainer_lib.REF_FORWARD_CALLS
    tr = Trainer(tiny_model(), OPTIM, "grpo", loss_cfg=loss_cfg("grpo", kl_coef=0.0))
    assert tr.ref_params is None
    m = tr.step(random_batch(6))
    assert trainer_lib.REF_FORWARD_CALLS == calls and "kl" not in m
    tr_kl = Trainer(tiny_model(), OPTIM, "grpo", loss_cfg=loss_cfg("grpo", kl_coef=0.1))
    m = tr_kl.step(random_batch(6))
    assert trainer_lib.REF_FORWARD_CALLS == calls + 1
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy still equals the reference
    m = tr_kl.step(random_batch(6))
    assert trainer_lib.REF_FORWARD_CALLS == calls + 2 and m["kl"] > 0.0


def test_model_view_and_config_errors():
    model = tiny_model()
    tr = Trainer(model, OPTIM, "sft", parallel.make_mesh({"fsdp": 4, "tp": 2}))
    tr.step(BATCH)
    # The step donates the trainer's own buffers, never those of the model it was built from.
    assert np.isfinite(np.asarray(model.embedding[...])).all()
    view = tr.model(rules="sample")
    emb = view.embedding[...]
    assert emb.sharding.spec == parallel.logical_to_spec(("vocab", "embed"), tr.mesh, "sample")
    np.testing.assert_array_equal(np.asarray(emb), np.asarray(tr.params["embedding"][...]))
    with pytest.raises(ValueError, match="OptimConfig.lr=0"):
        OptimConfig(lr=0).validate()
    with pytest.raises(ValueError, match="loss_fn='ppo'"):
        Trainer(tiny_model(), OPTIM, "ppo")
    with pytest.raises(ValueError, match="loss_fn='ppo'"):  # before any model is traced
        trainer_lib.lower_train_step(tiny_model, OPTIM, "ppo", None, None, 2, 8, 8)


def test_remat_policy_by_name_gives_the_same_update_and_state_is_donated():
    """OptimConfig.remat names a policy; the update equals the no-remat one, and the step
    donates the parameters and optimiser moments it replaces (no second copy lives on)."""
    params, metrics = reference_step("grpo")
    optim = dataclasses.replace(OPTIM, remat="dots_saveable")
    tr = Trainer(tiny_model(), optim, "grpo", loss_cfg=_cfg("grpo"))
    old = tr.state
    ours = tr.step(BATCH)
    assert max_diff(tr.params, params) < 1e-5
    assert ours["loss"] == pytest.approx(metrics["loss"], abs=1e-6)
    donated = jax.tree.leaves((old.params, old.opt_state))
    assert donated and all(x.is_deleted() for x in donated if x.ndim > 0)
    with pytest.raises(ValueError, match="OptimConfig.remat='all'"):
        OptimConfig(remat="all").validate()


@pytest.mark.slow
def test_forget_compiled_frees_a_finished_trainers_programs():
    """The jitted update is cached per setup (a fresh Trainer of the same setup reuses it), so
    a trainer no longer used keeps its programs alive through the cache (a notebook trying
    many settings); forget_compiled drops the cache and they go with the trainer, while a
    live trainer keeps and runs its own."""
    import gc
    import weakref

    kept = Trainer(tiny_model(), OPTIM, "sft")
    assert Trainer(tiny_model(1), OPTIM, "sft")._step is kept._step  # the cache serves it
    done = Trainer(tiny_model(), dataclasses.replace(OPTIM, lr=2e-3), "sft")  # another setup
    done.step(BATCH)
    program = weakref.ref(done._step)
    del done
    gc.collect()
    assert program() is not None  # held by the cache alone
    trainer_lib.forget_compiled()
    gc.collect()
    assert program() is None
    before = jax.device_get(kept.params)
    assert np.isfinite(kept.step(BATCH)["loss"])
    assert max_diff(kept.params, before) > 0


@pytest.mark.parametrize("length_split", [1, 2])
def test_schedules_of_any_length_share_one_program(length_split):
    """The schedule's length is an argument of the compiled update: trainers that differ only
    in total_steps (the stages of a staged recipe) run one program, compiled once per batch
    shape, and each follows its own schedule (lr_schedule of its config), also when the
    update is made of parts by length."""
    lrs, programs = {}, []
    for total in (100, 4):
        optim = dataclasses.replace(OPTIM, total_steps=total, length_split=length_split)
        tr = Trainer(tiny_model(), optim, "sft")
        lrs[total] = [tr.step(BATCH)["lr"] for _ in range(3)]
        assert lrs[total] == pytest.approx([float(lr_schedule(optim)(k)) for k in range(3)])
        programs.append(tr._step if length_split == 1 else tr._parts[2])
    assert programs[1] is programs[0]
    assert programs[0]._cache_size() == 1  # compiled once, for both schedules
    assert lrs[4][2] < lrs[100][2]  # the short schedule has decayed further
