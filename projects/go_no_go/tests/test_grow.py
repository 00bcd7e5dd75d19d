"""Growing a model deeper or wider keeps its function: same logits, more layers or width, and
the inserted layers still learn (their zero output projections get gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.configfile import ROOT
from mapfjax.models import hf
from projects.go_no_go import grow

TINY = ROOT / "mapfjax" / "assets" / "tiny"


def test_layer_plan_keeps_the_old_order_and_spreads_the_new_layers():
    assert grow.layer_plan(12, 18) == [0, 1, -1, 2, 3, -1, 4, 5, -1, 6, 7, -1, 8, 9, -1, 10, 11, -1]
    assert grow.layer_plan(4, 4) == [0, 1, 2, 3]
    assert grow.layer_plan(3, 4) == [0, 1, 2, -1]
    for bad in ((4, 3), (0, 2), (2.0, 3)):
        with pytest.raises(ValueError, match="allowed: 1 <= old <= new"):
            grow.layer_plan(*bad)


@pytest.fixture(scope="module")
def tiny():
    return hf.from_pretrained(TINY, dtype=jnp.float32)


@pytest.fixture(scope="module")
def models(tiny):
    return tiny, grow.deepen(tiny, 18, seed=3)


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


@pytest.fixture(scope="module")
def widened(tiny):
    return tiny, grow.widen(tiny, 2, seed=5)


def test_the_widened_model_computes_the_same_logits(widened):
    model, wide = widened
    c, w = model.config, wide.config
    assert (w.hidden_size, w.num_heads, w.num_kv_heads, w.intermediate_size) == (
        2 * c.hidden_size, 2 * c.num_heads, 2 * c.num_kv_heads, 2 * c.intermediate_size,
    )  # fmt: skip
    assert (w.head_dim, w.num_layers, w.vocab_size) == (c.head_dim, c.num_layers, c.vocab_size)
    tokens = jax.random.randint(jax.random.key(2), (3, 40), 0, c.vocab_size)
    want, _ = model(tokens)
    got, _ = wide(tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5, rtol=5e-5)
    h, f = c.hidden_size, c.intermediate_size
    # The trained block is kept; what reads the new dimensions is fresh, what writes them zero.
    up = np.asarray(wide.layers.mlp.up[...])
    np.testing.assert_array_equal(up[:, :h, :f], np.asarray(model.layers.mlp.up[...]))
    assert np.abs(up[:, h:, :]).sum() > 0 and np.abs(up[:, :, f:]).sum() > 0
    assert not np.asarray(wide.layers.mlp.down[...])[:, :, h:].any()
    assert not np.asarray(wide.layers.attn.o[...])[:, c.num_heads :].any()
    assert not np.asarray(wide.embedding[...])[:, h:].any()


def test_the_new_width_gets_gradients(widened):
    model, wide = widened
    h, n = model.config.hidden_size, model.config.num_heads
    tokens = jax.random.randint(jax.random.key(3), (2, 24), 0, wide.config.vocab_size)

    def loss(m):
        logits, _ = m(tokens)
        return -jax.nn.log_softmax(logits[:, :-1]).mean()

    grads = nnx.grad(loss)(wide)
    o = np.asarray(grads.layers.attn.o[...])
    down = np.asarray(grads.layers.mlp.down[...])
    assert np.abs(o[:, n:]).sum() > 0 and np.abs(o[:, :, :, h:]).sum() > 0
    assert np.abs(down[:, :, h:]).sum() > 0


def test_widen_refuses_a_bad_factor_and_the_command_line_widens(tiny, tmp_path):
    model = tiny
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="allowed an integer >= 1"):
            grow.widen(model, bad)
    dst = tmp_path / "wide"
    assert grow.main([str(TINY), str(dst), "--width", "2"]) == 0
    again = hf.from_pretrained(dst, dtype=jnp.float32)
    assert again.config.hidden_size == 2 * model.config.hidden_size
    assert grow.main([str(TINY), str(tmp_path / "y"), "--width", "2", "--layers", "14"]) == 2
    assert grow.main([str(TINY), str(tmp_path / "z")]) == 2
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
