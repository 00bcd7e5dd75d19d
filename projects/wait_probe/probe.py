"""Linear probes: does a policy's representation of a prompt carry a puzzle label (for
example `needs_wait`) where the policy starts to answer?

Features per prompt and layer: the residual stream after `layer` decoder layers and the final
norm, at the prompt's last token (the position that writes the first answer token) next to
its mean over the prompt's tokens: 2 x hidden values. A probe is an L2-regularised logistic
regression on standardised features, its weight chosen by k-fold cross-validation on the
fitting set; it is scored on a separate test set by AUC with a bootstrap interval, paired
across models on the same resamples.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mapfjax import stats
from mapfjax.models.sampler import BUCKETS
from mapfjax.rl.data import chunks_by_length, encode_prompts

L2_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def truncated(model: nnx.Module, layers: int | None) -> nnx.Module:
    """A copy of a stacked-layer Qwen3 that runs only its first `layers` decoder layers (then
    the final norm); None or the full depth returns the model itself."""
    depth = model.config.num_layers
    if layers is None or layers == depth:
        return model
    if not 1 <= layers <= depth:
        raise ValueError(f"layers={layers}; allowed: 1 to {depth} (the model's depth) or None")
    copy = nnx.clone(model)
    for _, var in nnx.iter_graph(copy.layers):
        if isinstance(var, nnx.Param):
            var.set_value(var[...][:layers])
    return copy


@jax.jit
def _features(graphdef, state, tokens, mask):
    hidden, _ = nnx.merge(graphdef, state).hidden_states(tokens, attention_mask=mask)
    hidden = hidden.astype(jnp.float32)
    weights = mask[..., None].astype(jnp.float32)
    mean = (hidden * weights).sum(1) / weights.sum(1)
    return jnp.concatenate([hidden[:, -1], mean], axis=-1)  # left-padded: the last is real


def prompt_features(
    model: nnx.Module,
    tokenizer,
    problems: Sequence,
    layers: Sequence[int | None] = (None,),
    batch_size: int = 128,
    bucket: str = "x8",
) -> dict[int | None, np.ndarray]:
    """{layer: float32 [N, 2 x hidden]} for `problems` (rows in the given order): the last
    prompt token's state and the prompt's mean state after `layer` layers (None: all).
    Prompts are run in order of length, each chunk left-padded to its `bucket`."""
    prompts = encode_prompts(tokenizer, list(problems), False)
    out = {}
    for layer in layers:
        graphdef, state = nnx.split(truncated(model, layer))
        feats = np.zeros((len(prompts), 2 * model.config.hidden_size), np.float32)
        for at in chunks_by_length(prompts, batch_size):
            width = BUCKETS[bucket](max(len(prompts[j]) for j in at))
            tokens = np.zeros((batch_size, width), np.int32)
            mask = np.zeros((batch_size, width), bool)
            mask[:, -1] = True  # rows past the chunk: one dummy token, dropped below
            for r, j in enumerate(at):
                tokens[r, width - len(prompts[j]) :] = prompts[j]
                mask[r, width - len(prompts[j]) :] = True
            feats[at] = np.asarray(_features(graphdef, state, tokens, mask))[: len(at)]
        out[layer] = feats
    return out


@dataclasses.dataclass(frozen=True)
class Probe:
    """A fitted logistic probe: standardisation (mean, scale) then weights w and bias b."""

    mean: np.ndarray
    scale: np.ndarray
    w: np.ndarray
    b: float
    l2: float

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Log-odds of the positive label per row."""
        return ((np.asarray(x, np.float64) - self.mean) / self.scale) @ self.w + self.b


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(0)
    scale = x.std(0)
    return mean, np.where(scale > 1e-8, scale, 1.0)


def _checked(name: str, x, y) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) as float64 arrays; ValueError unless x is [N, D] and y [N] of 0s and 1s, N > 0."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"{name}: x {x.shape} and y {y.shape}: allowed [N, D] and [N]")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"{name}: y must hold only 0 and 1")
    return x, y


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, iterations: int = 50) -> Probe:
    """L2-regularised logistic regression (penalty l2/2 |w|^2 on the mean log-loss, bias
    free) on standardised x, by Newton's method."""
    x, y = _checked("fit_logistic", x, y)
    mean, scale = _standardise(x)
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    n, d = z.shape
    penalty = np.full(d, l2)
    penalty[-1] = 0.0
    theta = np.zeros(d)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(z @ theta)))
        grad = z.T @ (p - y) / n + penalty * theta
        hess = (z * (p * (1 - p))[:, None]).T @ z / n + np.diag(penalty) + 1e-9 * np.eye(d)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return Probe(mean, scale, theta[:-1], float(theta[-1]), float(l2))


def log_loss(scores: np.ndarray, y: np.ndarray) -> float:
    """Mean logistic loss of log-odds `scores` against 0/1 labels."""
    s = np.asarray(scores, np.float64)
    y = np.asarray(y, np.float64)
    return float(np.mean(np.logaddexp(0.0, s) - y * s))


def choose_l2(
    x, y, grid: Sequence[float] = L2_GRID, folds: int = 5, seed: int = 0, fit=None
) -> float:
    """The grid's L2 weight with the lowest k-fold cross-validated log-loss (ties: the larger)
    for the probe `fit(x, y, l2)` (default `fit_logistic`)."""
    fit = fit_logistic if fit is None else fit
    y = np.asarray(y)
    parts = np.array_split(np.random.default_rng(seed).permutation(len(y)), folds)
    losses = []
    for l2 in grid:
        total = 0.0
        for k, test in enumerate(parts):
            train = np.concatenate([p for i, p in enumerate(parts) if i != k])
            total += log_loss(fit(x[train], y[train], l2).scores(x[test]), y[test])
        losses.append(total / folds)
    best = min(losses)
    return max(l2 for l2, loss in zip(grid, losses, strict=True) if loss <= best + 1e-12)


MLP_L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)


@dataclasses.dataclass(frozen=True)
class MLPProbe:
    """A fitted one-hidden-layer probe (ReLU): standardisation, then w2 . relu(W1 z + b1) + b2."""

    mean: np.ndarray
    scale: np.ndarray
    params: dict
    l2: float

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Log-odds of the positive label per row."""
        z = (np.asarray(x, np.float64) - self.mean) / self.scale
        return np.asarray(_mlp(self.params, jnp.asarray(z, jnp.float32)), np.float64)


def _mlp(params, z):
    h = jax.nn.relu(z @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


@functools.partial(jax.jit, static_argnames=("steps",))
def _train_mlp(params, z, y, l2, steps):
    import optax

    opt = optax.adam(1e-2)

    def loss(p):
        s = _mlp(p, z)
        fit = jnp.mean(jnp.logaddexp(0.0, s) - y * s)
        return fit + 0.5 * l2 * (jnp.sum(p["w1"] ** 2) + jnp.sum(p["w2"] ** 2))

    def step(carry, _):
        p, state = carry
        updates, state = opt.update(jax.grad(loss)(p), state)
        return (optax.apply_updates(p, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return params


def fit_mlp(x, y, l2: float, hidden: int = 64, steps: int = 500, seed: int = 0) -> MLPProbe:
    """A one-hidden-layer ReLU probe on standardised x: full-batch Adam (lr 1e-2, `steps`
    updates) on the mean log-loss plus l2/2 times the squared weights (biases free)."""
    x, y = _checked("fit_mlp", x, y)
    mean, scale = _standardise(x)
    k1, k2 = jax.random.split(jax.random.key(seed))
    d = x.shape[1]
    params = {
        "w1": jax.random.normal(k1, (d, hidden)) * np.sqrt(2.0 / d),
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden,)) * np.sqrt(1.0 / hidden),
        "b2": jnp.zeros(()),
    }
    z = jnp.asarray((x - mean) / scale, jnp.float32)
    params = _train_mlp(params, z, jnp.asarray(y, jnp.float32), jnp.float32(l2), steps)
    return MLPProbe(mean, scale, jax.tree.map(np.asarray, params), float(l2))


PROBES = {"logistic": (fit_logistic, L2_GRID), "mlp": (fit_mlp, MLP_L2_GRID)}


def bootstrap_aucs(
    scores: Mapping[str, np.ndarray],
    y: np.ndarray,
    reference: str | None = None,
    resamples: int = 2000,
    seed: int = 0,
    level: float = stats.LEVEL,
) -> dict[str, tuple[stats.Estimate, stats.Estimate | None]]:
    """{label: (AUC with a percentile bootstrap interval, AUC - reference's AUC on the same
    resamples or None)}: puzzles resampled with replacement, the same draws for every model."""
    y = np.asarray(y).astype(bool)
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(y), len(y)) for _ in range(resamples)]
    draws = [d for d in draws if 0 < y[d].sum() < len(d)]  # both labels present
    boot = {k: np.array([stats.auc(v[d], y[d]) for d in draws]) for k, v in scores.items()}
    lo, hi = (1 - level) / 2, (1 + level) / 2

    def estimate(value, samples):
        return stats.Estimate(
            float(value), float(np.quantile(samples, lo)), float(np.quantile(samples, hi)),
            len(y),
        )  # fmt: skip

    out = {}
    for k, v in scores.items():
        full = stats.auc(v, y)
        diff = None
        if reference is not None and k != reference:
            d = boot[k] - boot[reference]
            diff = estimate(full - stats.auc(scores[reference], y), d)
        out[k] = (estimate(full, boot[k]), diff)
    return out
