"""Shared-prefix GRPO: a `GroupBatch` (each prompt run once, its G completions attending to its
keys and values) gives the same log-probs, loss, gradients and updates as the same rows laid
out one prompt per row, on ragged prompts and completions, several group sizes, the train
mesh and gradient accumulation; bad layouts are refused; shapes come from a few buckets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models import sampler
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl import step as step_lib
from mapfjax.rl.batch import GroupBatch, SequenceBatch, make_batch
from mapfjax.rl.grpo import GRPOConfig
from mapfjax.rl.logprobs import completion_logprobs
from mapfjax.rl.trainer import OptimConfig, Trainer
from tests.rl.test_trainer import max_diff

CFG = PRESETS["tiny"]
OPTIM = OptimConfig(lr=1e-3, eps=1e-4, grad_clip=1.0, total_steps=100)


def tiny_model(seed=0):
    return Qwen3(CFG, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def grouped_rows(seed, groups, g, max_prompt=11, max_completion=9):
    """Ragged prompts (one per group, repeated G times) and ragged completions."""
    rng = np.random.default_rng(seed)
    prompts, comps = [], []
    for _ in range(groups):
        prompt = list(rng.integers(1, CFG.vocab_size, rng.integers(1, max_prompt)))
        for _ in range(g):
            prompts.append(prompt)
            comps.append(list(rng.integers(1, CFG.vocab_size, rng.integers(1, max_completion))))
    old = [list(rng.normal(-5.5, 0.3, len(c))) for c in comps]
    adv = rng.normal(size=len(comps))
    return prompts, comps, old, adv


def both_layouts(seed, groups, g, **kw):
    prompts, comps, old, adv = grouped_rows(seed, groups, g)
    args = (prompts, comps, 0, "pow2", "pow2", old, adv)
    shared = make_batch(*args, group_size=g, shared_prefix=True, **kw)
    plain = make_batch(*args, group_size=g, shared_prefix=False, **kw)
    assert isinstance(shared, GroupBatch) and isinstance(plain, SequenceBatch)
    return shared, plain


def flat(x):
    x = np.asarray(x)
    return x.reshape(-1, x.shape[-1])


@pytest.mark.slow
@pytest.mark.parametrize("g", [1, 2, 5])
def test_logprobs_loss_and_gradients_equal_the_unshared_path(g):
    shared, plain = both_layouts(seed=g, groups=3, g=g)
    model = tiny_model(1)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    cfg = GRPOConfig(group_size=max(g, 2))

    def logp(p, batch):
        return completion_logprobs(nnx.merge(graphdef, p, rest), batch)

    mask = flat(plain.loss_mask)
    lp_s, ent_s = jax.jit(logp)(params, shared)
    lp_p, ent_p = jax.jit(logp)(params, plain)
    assert lp_s.shape == (3, g, plain.completion_len)
    np.testing.assert_allclose(flat(lp_s)[mask], np.asarray(lp_p)[mask], atol=1e-5)
    np.testing.assert_allclose(flat(ent_s)[mask], np.asarray(ent_p)[mask], atol=1e-5)

    def loss(p, batch):
        return step_lib.grpo_token_loss(nnx.merge(graphdef, p, rest), batch, cfg)[0]

    (l_s, g_s), (l_p, g_p) = (jax.jit(jax.value_and_grad(loss))(params, b) for b in (shared, plain))
    assert abs(float(l_s) - float(l_p)) < 1e-5
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), g_s, g_p)
    assert max(jax.tree.leaves(diffs)) < 1e-5
    # Gradients reach the prompt pass: the embedding rows of prompt-only tokens move.
    assert float(jnp.abs(g_s["embedding"][...]).sum()) > 0


@pytest.mark.parametrize(
    "mesh_shape, accum",
    [(None, 2), ({"fsdp": 4, "tp": 2}, 1), ({"data": 2, "fsdp": 2, "tp": 2}, 2)],
)
@pytest.mark.slow
def test_update_equals_unshared_on_the_train_mesh_and_with_accumulation(mesh_shape, accum):
    shared, plain = both_layouts(seed=7, groups=8, g=4)
    cfg = GRPOConfig(group_size=4)
    mesh = None if mesh_shape is None else parallel.make_mesh(mesh_shape)
    optim = OptimConfig(**{**OPTIM.__dict__, "accum_steps": accum})
    results = []
    for batch in (shared, plain):
        tr = Trainer(tiny_model(), optim, "grpo", mesh, loss_cfg=cfg)
        metrics = tr.step(batch)
        results.append((jax.device_get(tr.params), metrics))
    (p_s, m_s), (p_p, m_p) = results
    # Accumulation weights micro-batches to equal one big batch, and the layouts cut
    # micro-batches differently (groups vs rows): compare both with one unsharded update.
    ref = Trainer(tiny_model(), OPTIM, "grpo", loss_cfg=cfg)
    ref_metrics = ref.step(plain)
    assert max_diff(p_s, jax.device_get(ref.params)) < 1e-5
    assert max_diff(p_p, jax.device_get(ref.params)) < 1e-5
    assert m_s["loss"] == pytest.approx(ref_metrics["loss"], abs=1e-5)
    assert m_s["num_tokens"] == m_p["num_tokens"] == ref_metrics["num_tokens"]


def test_batch_multiple_pads_whole_empty_groups():
    shared, _ = both_layouts(seed=3, groups=3, g=2, batch_multiple=4)
    assert shared.tokens.shape[:2] == (4, 2) and shared.prompt_tokens.shape[0] == 4
    assert not shared.loss_mask[3].any() and not shared.attention_mask[3].any()
    assert shared.prompt_mask[3].sum() == 1  # an empty group still sees one token
    lp, _ = completion_logprobs(tiny_model(), shared)
    assert np.isfinite(np.asarray(lp)).all()


def test_bad_group_layouts_are_refused_or_fall_back():
    prompts, comps, old, adv = grouped_rows(seed=4, groups=3, g=3)
    with pytest.raises(ValueError, match="9 rows do not split into groups of group_size=2"):
        make_batch(prompts, comps, 0, group_size=2, shared_prefix=True)
    swapped = list(prompts)
    swapped[4] = prompts[0]  # row 4 belongs to group 1 (rows 3..5)
    with pytest.raises(
        ValueError, match=r"row 4 \(\d+ prompt tokens\) has another prompt than row 3"
    ):
        make_batch(swapped, comps, 0, group_size=3, shared_prefix=True)
    # "auto" falls back to one prompt per row rather than building a wrong mask.
    assert isinstance(make_batch(swapped, comps, 0, group_size=3), SequenceBatch)
    assert isinstance(make_batch(prompts, comps, 0, group_size=3), GroupBatch)
    with pytest.raises(ValueError, match="completion_bucket=4 is shorter than the longest row"):
        make_batch(prompts, [c + [1] * 5 for c in comps], 0, "pow2", 4, group_size=3)
    with pytest.raises(ValueError, match="shared_prefix='yes'"):
        make_batch(prompts, comps, 0, group_size=3, shared_prefix="yes")


def test_completion_width_follows_the_longest_completion_in_buckets():
    prompts = [[1, 2, 3]] * 4
    for longest, width in [(3, 4), (5, 8), (9, 16), (17, 24)]:
        comps = [[5] * longest] + [[5]] * 3
        batch = make_batch(prompts, comps, 0, "pow2", "pow2", group_size=4, max_completion_len=24)
        assert batch.completion_len == width
    assert sampler.BUCKETS["pow2_mid"](100) == 128 and sampler.BUCKETS["pow2_mid"](90) == 96
    assert [sampler.BUCKETS["pow2_mid"](n) for n in (1, 3, 5, 7, 13, 25)] == [1, 3, 6, 8, 16, 32]
    assert [sampler.BUCKETS["x8"](n) for n in (1, 8, 9, 135, 165)] == [8, 8, 16, 136, 168]


@pytest.mark.slow
def test_a_stream_of_ragged_steps_compiles_a_handful_of_times():
    tr = Trainer(tiny_model(), OPTIM, "grpo", loss_cfg=GRPOConfig(group_size=4))
    shapes = set()
    before = tr._step._cache_size()  # the jitted step is shared with earlier trainers
    for i in range(12):
        prompts, comps, old, adv = grouped_rows(i, 2, 4, max_prompt=30, max_completion=20)
        batch = make_batch(prompts, comps, 0, "pow2_mid", "pow2", old, adv, group_size=4)
        shapes.add((batch.prompt_tokens.shape[1], batch.completion_len))
        tr.step(batch)
    compiled = tr._step._cache_size() - before
    assert compiled <= len(shapes) <= 8
