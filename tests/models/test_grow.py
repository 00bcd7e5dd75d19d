"""Growing a model deeper keeps its function: same logits and greedy answers, more layers, and
the inserted layers still learn (their zero output projections get gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.configfile import ROOT
from mapfjax.models import grow, hf

TINY = ROOT / "mapfjax" / "assets" / "tiny"


def test_layer_plan_keeps_the_old_order_and_spreads_the_new_layers():
    assert grow.layer_plan(12, 18) == [0, 1, -1, 2, 3, -1, 4, 5, -1, 6, 7, -1, 8, 9, -1, 10, 11, -1]
    assert grow.layer_plan(4, 4) == [0, 1, 2, 3]
    assert grow.layer_plan(3, 4) == [0, 1, 2, -1]
    for bad in ((4, 3), (0, 2), (2.0, 3)):
        with pytest.raises(ValueError, match="allowed: 1 <= old <= new"):
            grow.layer_plan(*bad)


@pytest.fixture(scope="module")
def models():
    model = hf.from_pretrained(TINY, dtype=jnp.float32)
    return model, grow.deepen(model, 18, seed=3)


def test_the_grown_model_computes_the_same_logits(models):
    model, grown = models
    assert grown.config.num_layers == 18 and model.config.num_layers == 12
    tokens = jax.random.randint(jax.random.key(0), (3, 40), 0, model.config.vocab_size)
    want, _ = model(tokens)
    got, _ = grown(tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)
    # The copied layers are the trained ones, in order; the inserted ones are not copies.
    old = np.asarray(model.layers.mlp.up[...])
    new = np.asarray(grown.layers.mlp.up[...])
    np.testing.assert_array_equal(new[[0, 1, 3, 4, 16]], old[[0, 1, 2, 3, 11]])
    assert not np.allclose(new[2], old[1]) and not np.allclose(new[2], old[2])
    assert not np.asarray(grown.layers.attn.o[...])[2].any()


def test_the_inserted_layers_get_gradients(models):
    _, grown = models
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, grown.config.vocab_size)

    def loss(m):
        logits, _ = m(tokens)
        return -jax.nn.log_softmax(logits[:, :-1]).mean()

    grads = nnx.grad(loss)(grown)
    for name in ("o", "down"):
        g = np.asarray((grads.layers.attn if name == "o" else grads.layers.mlp)[name][...])
        assert np.abs(g[2]).sum() > 0 and np.abs(g[5]).sum() > 0, name


def test_command_line_writes_a_loadable_checkpoint(tmp_path):
    dst = tmp_path / "grown"
    assert grow.main([str(TINY), str(dst), "--layers", "14"]) == 0
    again = hf.from_pretrained(dst, dtype=jnp.float32)
    assert again.config.num_layers == 14 and (dst / "tokenizer.json").is_file()
    assert grow.main([str(TINY), str(tmp_path / "x"), "--layers", "6"]) == 2
    assert not (tmp_path / "x").exists()
