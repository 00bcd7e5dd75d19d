"""The loss registry of the train step: a loss without a micro-batch weighting is refused, and
a registered weighting decides how accumulated micro-batches combine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

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
