"""Sharded train step for GRPO and SFT: AdamW with warmup + cosine decay, gradient accumulation
with global loss normalisers, non-finite updates skipped; `Trainer` owns the `TrainState`."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from mapfjax import parallel
from mapfjax.rl.batch import SequenceBatch, completion_logprobs
from mapfjax.rl.grpo import GRPOConfig, grpo_loss, masked_mean
from mapfjax.rl.sft import SFTConfig, sft_loss

Array = jax.Array
log = logging.getLogger(__name__)
LossFn = Callable[[nnx.Module, SequenceBatch, Any], tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimiser and update-loop settings.

    lr: peak learning rate, reached after `warmup_steps` linear steps from 0, then cosine decay
        over the remaining `total_steps - warmup_steps` updates to `lr * end_lr_ratio`.
    weight_decay: decoupled AdamW decay, applied to matrices only (not norms).
    grad_clip: maximum global gradient norm (0 disables clipping).
    accum_steps: micro-batches per update; the batch's rows must divide by it.
    max_bad_steps: `Trainer.step` raises RuntimeError after this many non-finite updates in a
        row (each one is skipped: parameters and optimiser state stay unchanged).
    remat: rematerialise each layer in the backward pass (None keeps the model's setting).
    """

    lr: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    accum_steps: int = 1
    max_bad_steps: int = 5
    remat: bool | None = None

    def validate(self) -> OptimConfig:
        """Raise ValueError naming the first bad field, its value and what is allowed."""
        checks = [
            ("lr", self.lr > 0, "a number > 0"),
            ("warmup_steps", _int(self.warmup_steps) and self.warmup_steps >= 0, "an int >= 0"),
            (
                "total_steps",
                _int(self.total_steps) and self.total_steps > self.warmup_steps,
                f"an int > warmup_steps={self.warmup_steps}",
            ),
            ("end_lr_ratio", 0 <= self.end_lr_ratio <= 1, "a number in [0, 1]"),
            ("weight_decay", self.weight_decay >= 0, "a number >= 0"),
            ("b1", 0 <= self.b1 < 1, "a number in [0, 1)"),
            ("b2", 0 <= self.b2 < 1, "a number in [0, 1)"),
            ("eps", self.eps > 0, "a number > 0"),
            ("grad_clip", self.grad_clip >= 0, "a number >= 0 (0 disables clipping)"),
            ("accum_steps", _int(self.accum_steps) and self.accum_steps >= 1, "an int >= 1"),
            ("max_bad_steps", _int(self.max_bad_steps) and self.max_bad_steps >= 1, "an int >= 1"),
            ("remat", self.remat in (None, True, False), "None, True or False"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                value = getattr(self, name)
                raise ValueError(f"OptimConfig.{name}={value!r} is invalid: allowed {allowed}")
        return self


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Learning rate as a function of the number of applied updates."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps,
        end_value=cfg.lr * cfg.end_lr_ratio,
    )


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the warmup + cosine schedule."""
    cfg.validate()
    adamw = optax.adamw(
        lr_schedule(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=lambda params: jax.tree.map(lambda p: jnp.ndim(p) >= 2, params),
    )
    if cfg.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)
    return adamw


@flax.struct.dataclass
class TrainState:
    """params: nnx.State of the model's nnx.Param variables; opt_state: optax state over them;
    step: int32 [] number of `step` calls (applied or skipped: the data position);
    rng: a PRNG key for the caller's sampling (`Trainer.next_key`); bad_steps: int32 []
    non-finite updates in a row; skipped: int32 [] non-finite updates in total."""

    params: Any
    opt_state: Any
    step: Array
    rng: Array
    bad_steps: Array
    skipped: Array


# --------------------------------------------------------------------------- losses


def grpo_token_loss(model, batch: SequenceBatch, cfg: GRPOConfig):
    """GRPO clipped surrogate over the completion tokens (`grpo.grpo_loss`).

    Log-probs use cfg.temperature, the sampler's. Extra metrics: entropy (mean over loss
    tokens), logprob_mismatch (mean |trainer - old| log-prob: the sampler/trainer gap on the
    first iteration over a batch), full_length_frac (rows whose loss mask fills all T columns:
    the truncation rate when T is the generation budget).
    """
    mask = jnp.asarray(batch.loss_mask, bool)
    logp, entropy = completion_logprobs(model, batch, cfg.temperature)
    loss, metrics = grpo_loss(
        logp, batch.old_logprobs, batch.advantages, mask, cfg, batch.ref_logprobs
    )
    old = jnp.where(mask, batch.old_logprobs, 0.0)
    rows = jnp.any(mask, axis=1)
    metrics.update(
        entropy=masked_mean(lax.stop_gradient(entropy), mask),
        logprob_mismatch=masked_mean(jnp.abs(lax.stop_gradient(logp) - old), mask),
        full_length_frac=masked_mean(mask[:, -1], rows),
    )
    return loss, metrics


def _grpo_weight(batch: SequenceBatch, cfg: GRPOConfig) -> Array:
    # The denominator of each aggregation: tokens for token_mean, non-empty rows otherwise.
    mask = jnp.asarray(batch.loss_mask, bool)
    if cfg.aggregation == "token_mean":
        return jnp.sum(mask).astype(jnp.float32)
    return jnp.sum(jnp.any(mask, axis=1)).astype(jnp.float32)


grpo_token_loss.weight = _grpo_weight

# name -> fn(model, batch, cfg) -> (loss f32[], metrics). An optional `fn.weight(batch, cfg)`
# gives the loss's normaliser (token or sequence count), so that accumulated micro-batch losses
# weighted by weight_k / sum(weight) equal the full-batch loss; without it micro-batches count
# equally.
LOSSES: dict[str, LossFn] = {"grpo": grpo_token_loss, "sft": sft_loss}
DEFAULT_LOSS_CONFIGS: dict[str, Callable[[], Any]] = {"grpo": GRPOConfig, "sft": SFTConfig}


def _loss_weight(loss_fn, batch, cfg) -> Array:
    weight = getattr(loss_fn, "weight", None)
    return jnp.float32(1.0) if weight is None else weight(batch, cfg)


def _combine(metrics: dict[str, Array], weights: Array) -> dict[str, Array]:
    """Per-micro-batch metrics [A] -> one value: sums for counts, max for *_max, else weighted
    means with the loss weights (so token means stay token means over the whole batch)."""
    total = jnp.sum(weights)
    w = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 1.0 / weights.shape[0])
    out = {}
    for k, v in metrics.items():
        if k.startswith("num_"):
            out[k] = jnp.sum(v)
        elif k.endswith("_max"):
            out[k] = jnp.max(v)
        else:
            out[k] = jnp.sum(w * v)
    return out


# --------------------------------------------------------------------------- the step


def _split_micro(batch: SequenceBatch, accum: int) -> SequenceBatch:
    """[B, ...] leaves -> [accum, B / accum, ...]; micro-batch k holds rows k, k + accum, ...,
    so a row-sharded batch gives every device an equal share of each micro-batch."""

    def split(x):
        x = jnp.asarray(x)
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return x

    return jax.tree.map(split, batch)


def _constrain_rows(batch: SequenceBatch) -> SequenceBatch:
    return jax.tree.map(
        lambda x: parallel.constrain(x, ("batch",) + ("seq",) * (x.ndim - 1)), batch
    )


def train_step(
    state: TrainState,
    batch: SequenceBatch,
    rest,
    *,
    graphdef,
    loss_fn: LossFn,
    loss_cfg,
    tx: optax.GradientTransformation,
    accum_steps: int,
    remat: bool | None,
    schedule: optax.Schedule,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser update on `batch` (pure; jit it with the keyword arguments static).

    With accum_steps = A the B rows are cut into A micro-batches (`_split_micro`) scanned with
    gradients accumulated as sum_k (w_k / sum w) * grad L_k, w_k = the loss's normaliser on
    micro-batch k, which equals the gradient of the full-batch loss for token-mean and
    sequence-mean aggregations. A non-finite loss or gradient leaves params and optimiser state
    unchanged and counts the step in bad_steps / skipped.
    """

    def micro_loss(params, mb):
        model = nnx.merge(graphdef, params, rest)
        if remat is not None and hasattr(model, "remat"):
            model.remat = remat
        return loss_fn(model, mb, loss_cfg)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    if accum_steps == 1:
        (loss, metrics), grads = grad_fn(state.params, batch)
    else:
        total = _loss_weight(loss_fn, batch, loss_cfg)
        total = jnp.where(total > 0, total, 1.0)
        micro = _split_micro(batch, accum_steps)

        def body(carry, mb):
            g_acc, l_acc = carry
            mb = _constrain_rows(mb)
            w = _loss_weight(loss_fn, mb, loss_cfg)
            if getattr(loss_fn, "weight", None) is None:
                w = w / accum_steps
            else:
                w = w / total
            (lk, m), g = grad_fn(state.params, mb)
            g_acc = jax.tree.map(lambda a, b: a + w * b.astype(jnp.float32), g_acc, g)
            return (g_acc, l_acc + w * lk), (m, w)

        # Accumulate in fp32 (bf16 sums of many micro-batches lose the small ones).
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        (grads, loss), (ms, ws) = lax.scan(body, (zeros, jnp.float32(0.0)), micro)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        metrics = _combine(ms, ws)
        metrics["loss"] = loss

    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    def keep(new, old):
        return jnp.where(ok, new, old)

    applied = state.step - state.skipped  # updates applied before this one
    new_state = state.replace(
        params=jax.tree.map(keep, params, state.params),
        opt_state=jax.tree.map(keep, opt_state, state.opt_state),
        step=state.step + 1,
        bad_steps=jnp.where(ok, 0, state.bad_steps + 1).astype(jnp.int32),
        skipped=state.skipped + jnp.where(ok, 0, 1).astype(jnp.int32),
    )
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    metrics.update(
        loss=jnp.asarray(loss, jnp.float32),
        grad_norm=grad_norm,
        lr=jnp.asarray(schedule(applied), jnp.float32),
        update_skipped=jnp.where(ok, 0.0, 1.0),
    )
    return new_state, metrics


# --------------------------------------------------------------------------- Trainer

# Reference-policy forward passes run so far (tests assert none run when kl_coef == 0).
REF_FORWARD_CALLS = 0


def _batch_shardings(batch: SequenceBatch, mesh, rules):
    def one(x):
        axes = ("batch",) + (None,) * (np.ndim(x) - 1)
        return parallel.logical_to_sharding(axes, mesh, rules, np.shape(x))

    return jax.tree.map(one, batch)


def _init_state(tx, params, rng) -> TrainState:
    # Own buffers: the step donates the state, which must not free the caller's model arrays.
    params = jax.tree.map(jnp.copy, params)
    zero = jnp.zeros((), jnp.int32)
    return TrainState(params, tx.init(params), zero, rng, zero, zero)


def train_state_shardings(abstract: TrainState, tx, mesh, rules) -> TrainState:
    """Shardings of a (possibly abstract) TrainState: parameters and their optimiser moments by
    the parameters' logical axes, counters and RNG replicated; one device without a mesh."""
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda _: device, abstract)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    param_sh = parallel.model_shardings(abstract.params, mesh, rules)
    opt_sh = optax.tree_map_params(
        tx,
        lambda _, s: s,
        abstract.opt_state,
        param_sh,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    return TrainState(param_sh, opt_sh, replicated, replicated, replicated, replicated)


def lower_train_step(
    make_model: Callable[[], nnx.Module],
    optim: OptimConfig,
    loss: str,
    loss_cfg,
    mesh,
    rows: int,
    prompt_len: int,
    completion_len: int,
    rules="train",
    with_ref_logprobs: bool = False,
):
    """`jax.jit(train_step).lower(...)` on abstract inputs for ahead-of-time memory planning:
    the model, optimiser state and a [rows, prompt_len + completion_len] batch exist only as
    ShapeDtypeStructs with their shardings (nothing is allocated)."""
    tx = make_optimizer(optim)
    graphdef, params, rest = nnx.split(nnx.eval_shape(make_model), nnx.Param, ...)
    abstract = jax.eval_shape(functools.partial(_init_state, tx), params, jax.random.key(0))
    shardings = train_state_shardings(abstract, tx, mesh, rules)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    L, T = prompt_len + completion_len, completion_len

    def spec(shape, dtype):
        axes = ("batch",) + (None,) * (len(shape) - 1)
        sh = parallel.logical_to_sharding(axes, mesh, rules, shape)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

    batch = SequenceBatch(
        tokens=spec((rows, L), jnp.int32),
        attention_mask=spec((rows, L), jnp.bool_),
        positions=spec((rows, L), jnp.int32),
        loss_mask=spec((rows, T), jnp.bool_),
        old_logprobs=spec((rows, T), jnp.float32),
        advantages=spec((rows,), jnp.float32),
        ref_logprobs=spec((rows, T), jnp.float32) if with_ref_logprobs else None,
        prompt_len=prompt_len,
    )
    if loss_cfg is None:
        loss_cfg = DEFAULT_LOSS_CONFIGS[loss]()
    leaves, treedef = jax.tree.flatten(shardings)
    step = _jitted_step(graphdef, LOSSES[loss], loss_cfg, optim, treedef, tuple(leaves))
    with jax.set_mesh(mesh):
        return step.lower(state, batch, rest)


@functools.lru_cache(maxsize=32)
def _jitted_step(graphdef, loss_fn, loss_cfg, optim: OptimConfig, treedef, sharding_leaves):
    """The jitted `train_step` for one (model graph, loss, optimiser, placement); cached so a
    fresh Trainer of the same setup (e.g. after a restore) reuses the compiled step."""
    state_shardings = jax.tree.unflatten(treedef, sharding_leaves)
    step = functools.partial(
        train_step,
        graphdef=graphdef,
        loss_fn=loss_fn,
        loss_cfg=loss_cfg,
        tx=make_optimizer(optim),
        accum_steps=optim.accum_steps,
        remat=optim.remat,
        schedule=lr_schedule(optim),
    )
    return jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, None))


@functools.lru_cache(maxsize=32)
def _jitted_logprobs(graphdef):
    def fn(params, batch, rest, temperature):
        return completion_logprobs(nnx.merge(graphdef, params, rest), batch, temperature)

    return jax.jit(fn)


class Trainer:
    """Holds the sharded `TrainState` and the model's static graph; runs jitted updates.

    model: an nnx model (Qwen3) whose nnx.Param variables are trained; the trainer keeps its
    own copy of them. loss_fn: a name in `LOSSES` or fn(model, batch, cfg) -> (loss, metrics).
    loss_cfg: the loss's config (default `DEFAULT_LOSS_CONFIGS[name]()`). mesh: a
    `parallel.make_mesh` mesh, or None for the default device; rules: a name in
    `parallel.RULES` or a dict. When the loss config has kl_coef > 0, the initial parameters
    are kept as the reference policy; with kl_coef == 0 no reference copy exists and no
    reference forward pass ever runs.
    """

    def __init__(
        self,
        model: nnx.Module,
        optim: OptimConfig,
        loss_fn: str | LossFn = "grpo",
        mesh=None,
        rules="train",
        *,
        loss_cfg=None,
        seed: int = 0,
    ):
        self.optim = optim.validate()
        if isinstance(loss_fn, str):
            if loss_fn not in LOSSES:
                raise ValueError(f"Trainer: loss_fn={loss_fn!r}: allowed {sorted(LOSSES)}")
            if loss_cfg is None:
                loss_cfg = DEFAULT_LOSS_CONFIGS[loss_fn]()
            loss_fn = LOSSES[loss_fn]
        if hasattr(loss_cfg, "validate"):
            loss_cfg.validate()
        self.loss_fn, self.loss_cfg, self.mesh, self.rules = loss_fn, loss_cfg, mesh, rules
        self.tx = make_optimizer(optim)
        self.schedule = lr_schedule(optim)
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)

        init = functools.partial(_init_state, self.tx)
        rng = jax.random.key(seed)
        abstract = jax.eval_shape(init, params, rng)
        self.state_shardings = train_state_shardings(abstract, self.tx, mesh, rules)
        # Copy the parameters into trainer-owned (donatable) buffers on their shards.
        self.state = jax.jit(init, out_shardings=self.state_shardings)(params, rng)
        kl = getattr(loss_cfg, "kl_coef", 0.0)
        self.ref_params = jax.tree.map(jnp.copy, self.state.params) if kl and kl > 0 else None
        leaves, treedef = jax.tree.flatten(self.state_shardings)
        # max_bad_steps is checked on the host: normalised so it does not force a recompile.
        key_optim = dataclasses.replace(self.optim, max_bad_steps=1)
        self._step = _jitted_step(
            self.graphdef, self.loss_fn, self.loss_cfg, key_optim, treedef, tuple(leaves)
        )
        self._logprobs = _jitted_logprobs(self.graphdef)
        self._checkpointers: dict[str, Any] = {}
        self._warned_rows = False

    # ---------------------------------------------------------------- placement

    def place_batch(self, batch: SequenceBatch) -> SequenceBatch:
        """Puts a (host) batch on the mesh, rows split over data x fsdp."""
        if self.mesh is None:
            return jax.device_put(batch)
        return jax.device_put(batch, _batch_shardings(batch, self.mesh, self.rules))

    def _in_mesh(self):
        if self.mesh is None:
            import contextlib

            return contextlib.nullcontext()
        return jax.set_mesh(self.mesh)

    # ---------------------------------------------------------------- training

    def step(self, batch: SequenceBatch) -> dict[str, float]:
        """One update on `batch` (rows must divide by accum_steps); returns host metrics.

        Raises RuntimeError when the last `max_bad_steps` updates in a row were non-finite.
        """
        rows = np.shape(batch.tokens)[0]
        if rows % self.optim.accum_steps:
            raise ValueError(
                f"Trainer.step: batch of {rows} rows does not divide into "
                f"OptimConfig.accum_steps={self.optim.accum_steps} micro-batches"
            )
        shards = 1 if self.mesh is None else self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if (rows // self.optim.accum_steps) % shards and not self._warned_rows:
            self._warned_rows = True
            log.warning(
                "micro-batches of %d rows do not split over the %d data x fsdp devices: they "
                "are replicated (slow, memory-hungry); use rows per micro-batch divisible by %d",
                rows // self.optim.accum_steps, shards, shards,
            )  # fmt: skip
        batch = self.place_batch(batch)
        if self.ref_params is not None and batch.ref_logprobs is None:
            batch = batch.replace(ref_logprobs=self.reference_logprobs(batch))
        with self._in_mesh():
            self.state, metrics = self._step(self.state, batch, self.rest)
        out = {k: float(v) for k, v in jax.device_get(metrics).items()}
        out.update(
            step=int(self.state.step),
            skipped=int(self.state.skipped),
            bad_steps=int(self.state.bad_steps),
        )
        if out["update_skipped"]:
            log.warning(
                "step %d: non-finite loss %s / grad_norm %s, update skipped (%d in a row)",
                out["step"], out["loss"], out["grad_norm"], out["bad_steps"],
            )  # fmt: skip
        if out["bad_steps"] >= self.optim.max_bad_steps:
            raise RuntimeError(
                f"Trainer.step: {out['bad_steps']} non-finite updates in a row (loss "
                f"{out['loss']}, grad_norm {out['grad_norm']}) reached OptimConfig.max_bad_steps="
                f"{self.optim.max_bad_steps} at step {out['step']}; parameters are those of the "
                "last finite update. Lower the learning rate or check the batch for inf/NaN."
            )
        return out

    def train_on(self, batch: SequenceBatch, num_iterations: int = 1) -> list[dict[str, float]]:
        """`num_iterations` updates on one batch (PPO-style). Its old_logprobs stay those of
        the sampling policy, so from the second iteration on the ratio moves away from 1."""
        if not _int(num_iterations) or num_iterations < 1:
            raise ValueError(f"num_iterations={num_iterations!r}: allowed an int >= 1")
        batch = self.place_batch(batch)
        if self.ref_params is not None and batch.ref_logprobs is None:
            batch = batch.replace(ref_logprobs=self.reference_logprobs(batch))
        return [self.step(batch) for _ in range(num_iterations)]

    def logprobs(self, batch: SequenceBatch, temperature: float | None = None):
        """Current-policy (logp, entropy) f32[B, T] of the completion tokens (no gradient)."""
        temperature = self._temperature() if temperature is None else temperature
        with self._in_mesh():
            return self._logprobs(
                self.state.params, self.place_batch(batch), self.rest, jnp.float32(temperature)
            )

    def reference_logprobs(self, batch: SequenceBatch) -> Array:
        """Reference-policy log-probs f32[B, T]; only exists when the loss's kl_coef > 0."""
        global REF_FORWARD_CALLS
        if self.ref_params is None:
            raise RuntimeError("reference_logprobs: the loss has kl_coef == 0, no reference kept")
        REF_FORWARD_CALLS += 1
        with self._in_mesh():
            logp, _ = self._logprobs(
                self.ref_params, batch, self.rest, jnp.float32(self._temperature())
            )
        return logp

    def _temperature(self) -> float:
        return float(getattr(self.loss_cfg, "temperature", 1.0))

    def next_key(self) -> Array:
        """A fresh PRNG key for sampling; advances the (checkpointed) state RNG."""
        rng, key = jax.random.split(self.state.rng)
        self.state = self.state.replace(rng=rng)
        return key

    # ---------------------------------------------------------------- views

    def model(self, rules=None) -> nnx.Module:
        """An nnx model on the current parameters (same buffers; valid until the next `step`,
        which donates them). rules: a rule set to reshard to (e.g. "sample"), which copies."""
        params = self.state.params
        if rules is not None and self.mesh is not None and rules != self.rules:
            params = jax.device_put(params, parallel.model_shardings(params, self.mesh, rules))
        return nnx.merge(self.graphdef, params, self.rest)

    @property
    def params(self):
        """nnx.State of the current parameters."""
        return self.state.params

    # ---------------------------------------------------------------- checkpoints

    def save(self, directory, data: dict | None = None, *, keep: int = 3, wait: bool = False):
        """Saves the state (+ a JSON `data` dict, e.g. the data position) under directory/<step>
        asynchronously; see `mapfjax.rl.checkpoint`."""
        from mapfjax.rl import checkpoint

        ckpt = self._checkpointer(directory, keep)
        checkpoint.save_state(ckpt, self.state, data or {})
        if wait:
            ckpt.wait()

    def restore(self, directory, step: int | None = None) -> dict:
        """Loads the latest (or given) step's state; returns its JSON data dict. Raises
        CheckpointError (and leaves this trainer unchanged) on a mismatch or corruption."""
        from mapfjax.rl import checkpoint

        ckpt = self._checkpointer(directory, None)
        self.state, data = checkpoint.restore_state(ckpt, self.state, step)
        return data

    def wait(self):
        """Blocks until pending asynchronous checkpoint writes are finished."""
        for ckpt in self._checkpointers.values():
            ckpt.wait()

    def close(self):
        """Finishes pending writes and releases checkpoint managers."""
        for ckpt in self._checkpointers.values():
            ckpt.close()
        self._checkpointers.clear()

    def _checkpointer(self, directory, keep):
        from mapfjax.rl import checkpoint

        key = str(directory)
        if key not in self._checkpointers:
            self._checkpointers[key] = checkpoint.Checkpointer(directory, keep=keep or 3)
        return self._checkpointers[key]


def num_params(state) -> int:
    """Number of scalars in a parameter tree."""
    return sum(math.prod(np.shape(x)) for x in jax.tree.leaves(state))
