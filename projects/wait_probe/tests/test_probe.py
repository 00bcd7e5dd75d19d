"""Linear probes (`projects.wait_probe.probe`): the logistic fit is the penalised optimum and
finds a
linear label, shuffled labels give chance, features do not depend on how prompts are batched,
and a truncated model is the first layers of the full one."""

import itertools
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import stats
from mapfjax.models.qwen3 import Qwen3, Qwen3Config
from projects.wait_probe import probe
from tests.models.test_bpe import random_problems
from tests.rl.test_data import make_tokenizer


def test_auc_counts_pairs_with_ties_as_half():
    rng = np.random.default_rng(0)
    for _ in range(30):
        s, y = rng.integers(0, 4, 25).astype(float), rng.integers(0, 2, 25)
        pairs = [1.0 if a > b else 0.5 if a == b else 0.0
                 for (a, ya), (b, yb) in itertools.product(zip(s, y), zip(s, y))
                 if ya and not yb]  # fmt: skip
        assert stats.auc(s, y) == pytest.approx(np.mean(pairs))
    assert np.isnan(stats.auc([1.0, 2.0], [True, True]))
    with pytest.raises(ValueError, match="3 scores and 2 labels"):
        stats.auc([1, 2, 3], [0, 1])


def _linear_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)) * np.linspace(0.5, 3.0, 10) + 4.0  # unscaled, off-centre
    w = np.random.default_rng(0).normal(size=10)  # one labelling rule for every draw
    y = ((x - 4.0) @ w + 0.3 * rng.normal(size=n)) > 0
    return x, y


def test_the_fit_is_the_penalised_optimum_and_finds_a_linear_label():
    x, y = _linear_data(600, 1)
    fitted = probe.fit_logistic(x, y, l2=0.01)
    z = (x - fitted.mean) / fitted.scale
    p = 1 / (1 + np.exp(-(z @ fitted.w + fitted.b)))
    grad_w = z.T @ (p - y) / len(y) + 0.01 * fitted.w  # zero at the optimum
    assert np.abs(grad_w).max() < 1e-6 and abs(np.mean(p - y)) < 1e-6
    l2 = probe.choose_l2(x, y)
    assert l2 in probe.L2_GRID
    x_test, y_test = _linear_data(400, 2)
    assert stats.auc(probe.fit_logistic(x, y, l2).scores(x_test), y_test) > 0.9


def test_labels_unrelated_to_the_features_give_chance_and_the_bootstrap_pairs_models():
    x, y = _linear_data(600, 3)
    x_test, y_test = _linear_data(600, 4)
    rng = np.random.default_rng(5)
    noise_fit, noise_test = rng.random(600) < 0.5, rng.random(600) < 0.5
    chance = probe.fit_logistic(x, noise_fit, 0.1).scores(x_test)
    auc = probe.bootstrap_aucs({"chance": chance}, noise_test, resamples=300)["chance"][0]
    assert auc.low < 0.5 < auc.high
    good = probe.fit_logistic(x, y, 0.1).scores(x_test)
    weak = good + rng.normal(scale=5 * good.std(), size=600)
    boot = probe.bootstrap_aucs({"good": good, "weak": weak, "same": good.copy()}, y_test,
                                reference="good", resamples=300)  # fmt: skip
    assert boot["good"][0].value > 0.9 and boot["good"][1] is None
    assert boot["weak"][1].high < 0
    assert boot["same"][1].value == boot["same"][1].low == boot["same"][1].high == 0.0
    for est, _ in boot.values():
        assert est.low <= est.value <= est.high and est.n == 600
    with pytest.raises(ValueError, match="fit_logistic: y must hold only 0 and 1"):
        probe.fit_logistic(x[:3], np.array([0, 2, 1]), 0.1)
    with pytest.raises(ValueError, match=r"fit_mlp: x \(3, 10\) and y \(2,\)"):
        probe.fit_mlp(x[:3], np.array([0, 1]), 0.1)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model(tok):
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=3,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4,
                      max_position_embeddings=512)  # fmt: skip
    return Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(2))


def test_features_do_not_depend_on_batching_and_truncation_keeps_the_first_layers(model, tok):
    probs = random_problems(5, seed=7, sizes=(3, 5, 4))
    together = probe.prompt_features(model, tok, probs, layers=(None, 1), batch_size=2)
    alone = [probe.prompt_features(model, tok, [p], layers=(None, 1), batch_size=1)
             for p in probs]  # fmt: skip
    for layer in (None, 1):
        assert together[layer].shape == (5, 64)
        np.testing.assert_allclose(together[layer], np.concatenate([a[layer] for a in alone]),
                                   atol=1e-5)  # fmt: skip
    assert not np.allclose(together[None], together[1])
    assert probe.truncated(model, 3) is model and probe.truncated(model, None) is model
    one = probe.truncated(model, 1)
    again = probe.prompt_features(one, tok, probs, layers=(None,), batch_size=4)[None]
    np.testing.assert_allclose(again, together[1], atol=1e-5)
    with pytest.raises(ValueError, match="layers=4; allowed: 1 to 3"):
        probe.truncated(model, 4)


def test_the_script_writes_its_table_and_a_rerun_reads_the_features_back(tmp_path):
    """projects/wait_probe/probe_wait.py end to end on the shipped model and its random twin,
    small sets."""
    import json
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[3]
    test = tmp_path / "test.jsonl"
    rows = (root / "projects/go_no_go/results/held_out_400.jsonl").read_text().splitlines()[:60]
    test.write_text("\n".join(rows) + "\n")
    cmd = [sys.executable, "-m", "projects.wait_probe.probe_wait", "--test", str(test),
           "--out", str(tmp_path),
           "--cache", str(tmp_path / "cache"), "--fit_n", "60", "--layers", "3",
           "--resamples", "50", "--models",
           "random:mapfjax/assets/tiny,shipped:mapfjax/assets/tiny"]  # fmt: skip
    first = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    table = (tmp_path / "probe.md").read_text()
    assert table.startswith("| model | layers | AUC [95 %]") and "| shipped | 3 |" in table
    record = json.loads((tmp_path / "probe.json").read_text())
    shipped = record["models"]["shipped"]["layer3"]
    assert record["test_n"] == 60 and shipped["minus_reference"] is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["random.npz", "shipped.npz"]
    again = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert again.returncode == 0 and (tmp_path / "probe.md").read_text() == table
    bad = subprocess.run([*cmd[:-1], "shipped=mapfjax/assets/tiny"], cwd=root,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "--models: 'shipped=mapfjax/assets/tiny'; allowed" in bad.stderr


def test_the_mlp_probe_reads_a_label_no_line_separates():
    """An XOR of two feature signs: the logistic probe stays near chance, the one-hidden-layer
    probe finds it (and cross-validation picks one of its grid's weights)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(1200, 6))
    y = (x[:, 0] > 0) ^ (x[:, 1] > 0)
    fit, test = slice(0, 800), slice(800, None)
    flat = probe.fit_logistic(x[fit], y[fit], 0.01).scores(x[test])
    l2 = probe.choose_l2(x[fit], y[fit], probe.MLP_L2_GRID, fit=probe.fit_mlp)
    assert l2 in probe.MLP_L2_GRID
    bent = probe.fit_mlp(x[fit], y[fit], l2).scores(x[test])
    assert stats.auc(flat, y[test]) < 0.65 < 0.85 < stats.auc(bent, y[test])
