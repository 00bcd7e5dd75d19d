"""The loss registry of the train step: a loss without a micro-batch weighting is refused, and
a registered weighting decides how accumulated micro-batches combine."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl import step as step_lib
from mapfjax.rl.batch import make_batch
from mapfjax.rl.sft import sft_loss
from mapfjax.rl.trainer import OptimConfig, Trainer

CFG = PRESETS["tiny"]


def _model():
    return Qwen3(CFG, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry, so that the losses a test registers do not outlive it."""
    monkeypatch.setattr(step_lib, "LOSSES", dict(step_lib.LOSSES))
    return step_lib.LOSSES


def test_a_loss_without_a_weighting_is_refused(registry):
    def my_loss(model, batch, cfg):
        return sft_loss(model, batch)

    with pytest.raises(ValueError, match=r"loss 'mine': weighting=None; allowed: a function"):
        step_lib.register_loss("mine")(my_loss)
    assert "mine" not in registry
    with pytest.raises(ValueError, match=r"loss_fn=.*my_loss: not a registered loss; allowed"):
        step_lib.resolve_loss(my_loss)
    with pytest.raises(ValueError, match=r"loss_fn=.*my_loss: not a registered loss"):
        Trainer(_model(), OptimConfig(total_steps=2), my_loss)
    with pytest.raises(ValueError, match="weighting=None"):
        step_lib.Loss("direct", my_loss, None)
    with pytest.raises(ValueError, match="'sft' is already registered"):
        step_lib.register_loss("sft", weighting=step_lib.equal_weighting)(my_loss)


def test_registered_losses_resolve_by_name_object_or_function():
    grpo = step_lib.LOSSES["grpo"]
    assert step_lib.resolve_loss(step_lib.grpo_token_loss)[0] is grpo
    assert step_lib.resolve_loss(grpo)[0] is grpo
    loss, cfg = step_lib.resolve_loss("sft")
    assert loss.fn is sft_loss and cfg == step_lib.LOSSES["sft"].config()
    assert {n: x.weighting.__name__ for n, x in step_lib.LOSSES.items()} == {
        "grpo": "_grpo_weight",
        "sft": "loss_tokens",
    }


@pytest.mark.slow
def test_equal_weighting_averages_micro_batch_losses(registry):
    """The same token-mean loss registered with equal weighting: accumulated over two
    micro-batches of unequal token counts it is the mean of their losses, not the token mean."""
    step_lib.register_loss("sft_equal", weighting=step_lib.equal_weighting)(
        lambda model, batch, cfg: sft_loss(model, batch)
    )
    rng = np.random.default_rng(0)
    lens = [1, 6, 1, 6]  # micro-batch k holds rows k, k + 2: 2 and 12 loss tokens
    prompts = [list(rng.integers(1, CFG.vocab_size, 3)) for _ in lens]
    comps = [list(rng.integers(1, CFG.vocab_size, n)) for n in lens]
    batch = make_batch(prompts, comps, 0, "pow2", 8)
    optim = OptimConfig(lr=1e-3, total_steps=4, accum_steps=2)
    got = Trainer(_model(), optim, "sft_equal").step(batch)["loss"]
    parts = [
        float(sft_loss(_model(), jax.tree.map(lambda x, k=k: x[k::2], batch))[0]) for k in (0, 1)
    ]
    np.testing.assert_allclose(got, np.mean(parts), rtol=1e-5)
    token_mean = float(sft_loss(_model(), batch)[0])
    assert abs(np.mean(parts) - token_mean) > 1e-3  # the weighting made a difference
    np.testing.assert_allclose(
        Trainer(_model(), optim, "sft").step(batch)["loss"], token_mean, rtol=1e-5
    )


def _ragged_group_batch(seed=0, groups=4, g=3):
    """A GroupBatch whose groups' completions have very different lengths (1-4 vs 20-30)."""
    rng = np.random.default_rng(seed)
    prompts, comps = [], []
    for i in range(groups):
        p = list(rng.integers(1, CFG.vocab_size, int(rng.integers(3, 9))))
        short = i % 2 == 0
        for _ in range(g):
            n = int(rng.integers(1, 5) if short else rng.integers(20, 31))
            prompts.append(p)
            comps.append(list(rng.integers(1, CFG.vocab_size, n)))
    n = len(comps)
    return make_batch(
        prompts, comps, 0, "pow2", "pow2",
        old_logprobs=[list(-rng.random(len(c))) for c in comps],
        advantages=rng.standard_normal(n), group_size=g, shared_prefix=True,
    )  # fmt: skip


def test_split_by_length_cuts_each_part_to_its_own_longest():
    batch = _ragged_group_batch()
    assert batch.completion_len == 32
    parts = step_lib.split_by_length(batch, 2)
    assert [p.completion_len for p in parts] == [4, 32]  # pow2_mid of 4 and of <= 30
    host = jax.tree.map(np.asarray, batch)
    rows = [
        np.flatnonzero((host.prompt_tokens == pt).all(1))[0]
        for p in parts
        for pt in p.prompt_tokens
    ]
    assert sorted(rows) == [0, 1, 2, 3] and set(rows[:2]) == {0, 2}  # the short groups first
    for part, idx in zip(parts, (rows[:2], rows[2:]), strict=True):
        w = part.completion_len
        np.testing.assert_array_equal(part.tokens, host.tokens[idx][..., :w])
        np.testing.assert_array_equal(part.loss_mask, host.loss_mask[idx][..., :w])
        np.testing.assert_array_equal(part.advantages, host.advantages[idx])
        assert not host.loss_mask[idx][..., w:].any()  # nothing in the loss was cut
    assert step_lib.split_by_length(batch, 3) == [batch]  # 4 groups do not split in 3


def _straggler_group_batch(groups=8, g=4, seed=1):
    """A GroupBatch of short completions (1-4 tokens) where one row of every odd group runs
    long (20-30): traces that wander to the budget."""
    rng = np.random.default_rng(seed)
    prompts, comps = [], []
    for i in range(groups):
        p = list(rng.integers(1, CFG.vocab_size, int(rng.integers(3, 9))))
        for j in range(g):
            n = int(rng.integers(20, 31) if i % 2 and j == 1 else rng.integers(1, 5))
            prompts.append(p)
            comps.append(list(rng.integers(1, CFG.vocab_size, n)))
    return make_batch(
        prompts, comps, 0, "pow2", "pow2",
        old_logprobs=[list(-rng.random(len(c))) for c in comps],
        advantages=rng.standard_normal(len(comps)), group_size=g, shared_prefix=True,
    )  # fmt: skip


def test_group_split_cuts_groups_into_pieces_by_row_length():
    """OptimConfig.group_split: every completion lands in exactly one piece with its own
    prompt, values and advantage; pieces are a group's rows sorted by length, so a long row
    widens only its piece; the padded columns drop against whole groups."""
    batch = _straggler_group_batch()
    host = jax.tree.map(np.asarray, batch)
    pieces = step_lib.split_by_length(batch, 4, group_split=2)
    groups = step_lib.split_by_length(batch, 4)
    assert [p.completion_len for p in pieces] == [2, 4, 4, 32]
    assert [p.completion_len for p in groups] == [4, 4, 32, 32]
    assert [p.group_size for p in pieces] == [2] * 4 and [p.group_size for p in groups] == [4] * 4

    def padded(parts):
        return sum(p.tokens.size + p.prompt_tokens.size for p in parts)

    assert padded(pieces) < padded(groups)
    seen = []
    for part in pieces:
        for prompt, toks, mask, old, adv in zip(
            part.prompt_tokens, part.tokens, part.loss_mask, part.old_logprobs,
            part.advantages, strict=True,
        ):  # fmt: skip
            (src,) = np.flatnonzero((host.prompt_tokens == prompt).all(1))
            piece = []
            for row_tokens, row_mask, row_old, a in zip(toks, mask, old, adv, strict=True):
                (j,) = np.flatnonzero(host.advantages[src] == a)
                w = row_tokens.shape[-1]
                np.testing.assert_array_equal(row_tokens, host.tokens[src, j, :w])
                np.testing.assert_array_equal(row_mask, host.loss_mask[src, j, :w])
                np.testing.assert_array_equal(row_old, host.old_logprobs[src, j, :w])
                assert not host.loss_mask[src, j, w:].any()  # nothing in the loss was cut
                seen.append((int(src), int(j)))
                piece.append(int(j))
            by_length = np.argsort(host.loss_mask[src].sum(-1), kind="stable").tolist()
            assert sorted(piece) in (sorted(by_length[:2]), sorted(by_length[2:]))
    assert sorted(seen) == [(i, j) for i in range(8) for j in range(4)]
    with pytest.raises(ValueError, match="group_split=3.*divides the group size G=4"):
        step_lib.split_by_length(batch, 2, group_split=3)
    assert step_lib.split_by_length(batch, 3, group_split=2) == [batch]  # 16 pieces, 3 parts


@pytest.mark.parametrize(
    "accum, sharded, group_split", [(1, False, 1), (2, False, 1), (1, True, 1), (2, False, 2)]
)
@pytest.mark.slow
def test_a_length_split_update_equals_the_whole_batch_update(accum, sharded, group_split):
    """OptimConfig.length_split: the update from the parts' gradients equals one update on the
    whole batch (token-mean GRPO loss, with and without micro-batches inside each part, on one
    device and with each part's groups over 4 data x fsdp devices; and from pieces of groups,
    OptimConfig.group_split)."""
    batch = _ragged_group_batch(groups=8) if group_split == 1 else _straggler_group_batch()
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2}, jax.devices()[:4]) if sharded else None
    optim = OptimConfig(lr=1e-3, total_steps=4, accum_steps=accum)
    whole = Trainer(_model(), optim, "grpo", mesh=mesh)
    cut = dataclasses.replace(optim, length_split=2, group_split=group_split)
    split = Trainer(_model(), cut, "grpo", mesh=mesh)
    for _ in range(2):  # the second step from the updated parameters and optimiser state
        a, b = whole.step(batch), split.step(batch)
        for k in ("loss", "grad_norm", "entropy", "lr"):
            np.testing.assert_allclose(b[k], a[k], rtol=2e-5, atol=1e-7, err_msg=k)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6),
        split.state.params, whole.state.params,
    )  # fmt: skip
    assert split._parts is not None and whole._parts is None


def _masked_groups(batch, groups):
    """`batch` with the loss mask of `groups` cleared, as dynamic sampling pads its batch."""
    host = jax.tree.map(np.asarray, batch)
    loss_mask = host.loss_mask.copy()
    loss_mask[list(groups)] = False
    return host.replace(loss_mask=loss_mask)


def test_groups_out_of_the_loss_fill_parts_of_their_own():
    """split_by_length: pieces with no loss token come last, so that 5 of 8 groups out of the
    loss fill the last two of four parts; with every group in the loss the order is by length
    alone, as before."""
    batch = _ragged_group_batch(groups=8)
    masked = _masked_groups(batch, [0, 2, 3, 5, 6])
    parts = step_lib.split_by_length(masked, 4)
    assert [bool(np.asarray(p.loss_mask).any()) for p in parts] == [True, True, False, False]
    assert [int(np.asarray(p.loss_mask).any(-1).any(-1).sum()) for p in parts] == [2, 1, 0, 0]
    lengths = [p.completion_len for p in step_lib.split_by_length(batch, 4)]
    assert lengths == sorted(lengths)


@pytest.mark.parametrize(
    "group_split, masked", [(1, [0, 2, 3, 5, 6]), (2, [1, 2, 4, 7]), (1, range(8))]
)
@pytest.mark.slow
def test_parts_out_of_the_loss_are_not_run_and_the_update_is_the_same(group_split, masked):
    """Trainer: the parts of a length-split update with no token in the loss are not run (the
    first part runs where none has one); the update, its loss and metrics are those of the
    same parts all run, to the bit, and of the whole batch, padding groups included."""
    base = _ragged_group_batch(groups=8) if group_split == 1 else _straggler_group_batch()
    batch = _masked_groups(base, masked)
    optim = OptimConfig(lr=1e-3, total_steps=4)
    cut = dataclasses.replace(optim, length_split=4, group_split=group_split)
    whole, split, every = (Trainer(_model(), o, "grpo") for o in (optim, cut, cut))
    every._runnable = lambda parts: parts  # every part run, those out of the loss too
    ran = [p is not None for p in split._prepare(batch)]
    assert ran == ([True, False, False, False] if len(masked) == 8 else [True, True, False, False])
    keys = ("loss", "grad_norm", "entropy", "lr", "num_tokens", "ratio_max", "clip_frac")
    for _ in range(2):  # the second step from the updated parameters and optimiser state
        a, b, c = whole.step(batch), split.step(batch), every.step(batch)
        for k in keys:
            assert b[k] == c[k], k
            np.testing.assert_allclose(b[k], a[k], rtol=2e-5, atol=1e-7, err_msg=k)
    jax.tree.map(np.testing.assert_array_equal, split.state.params, every.state.params)
    # Adam's steps of 1e-3 from small gradients: the sums' order moves the sixth decimal
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-6),
        split.state.params, whole.state.params,
    )  # fmt: skip
