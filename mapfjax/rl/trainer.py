"""`Trainer`: owns the sharded `TrainState` and runs the jitted update of `step.py` (GRPO or SFT
loss, optimiser of `optim.py`), reference log-probs, checkpoints and the model's export.
The names of `optim` and `step` are re-exported here."""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mapfjax import parallel
from mapfjax.checks import is_int
from mapfjax.rl import lora
from mapfjax.rl.batch import SequenceBatch
from mapfjax.rl.lora import num_params
from mapfjax.rl.optim import OptimConfig, lr_schedule, make_optimizer
from mapfjax.rl.step import (
    LOSSES,
    Loss,
    LossFn,
    TrainState,
    batch_shardings,
    forget_compiled,
    grpo_token_loss,
    jitted_logprobs,
    jitted_parts,
    lower_train_step,
    program_key,
    register_loss,
    resolve_loss,
    setup_step,
    split_by_length,
    train_state_shardings,
    train_step,
)

__all__ = [
    "LOSSES",
    "Loss",
    "OptimConfig",
    "TrainState",
    "Trainer",
    "forget_compiled",
    "grpo_token_loss",
    "lower_train_step",
    "lr_schedule",
    "make_optimizer",
    "num_params",
    "register_loss",
    "resolve_loss",
    "train_state_shardings",
    "train_step",
]

Array = jax.Array
log = logging.getLogger(__name__)

# Reference-policy forward passes run so far (tests assert none run when kl_coef == 0).
REF_FORWARD_CALLS = 0


class Trainer:
    """Holds the sharded `TrainState` and the model's static graph; runs jitted updates.

    model: an nnx model (Qwen3) whose nnx.Param variables are trained; the trainer keeps its
    own copy of them. loss_fn: a name in `LOSSES`, a `Loss`, or a function registered with
    `register_loss` (one registered with no micro-batch weighting is refused). loss_cfg: the
    loss's config (default: the registered one, `LOSSES[name].config()`). mesh: a
    `parallel.make_mesh` mesh, or None for the default device; rules: a name in
    `parallel.RULES` or a dict. When the loss config has kl_coef > 0, the initial parameters
    are kept as the reference policy; with kl_coef == 0 no reference copy exists and no
    reference forward pass ever runs.
    """

    def __init__(
        self,
        model: nnx.Module,
        optim: OptimConfig,
        loss_fn: str | Loss | LossFn = "grpo",
        mesh=None,
        rules="train",
        *,
        loss_cfg=None,
        seed: int = 0,
    ):
        self.optim = optim.validate()
        rng = jax.random.key(seed)
        setup = setup_step(model, self.optim, loss_fn, loss_cfg, mesh, rules, rng)
        self.loss, self.loss_cfg = setup.loss, setup.loss_cfg
        self.mesh, self.rules = mesh, rules
        self.graphdef, self.rest, self._step = setup.graphdef, setup.rest, setup.step
        self.state_shardings = setup.shardings
        # Copy the parameters into trainer-owned (donatable) buffers on their shards.
        self.state = jax.jit(setup.init, out_shardings=setup.shardings)(setup.params, rng)
        self.adapters = lora.spec_of(self.optim)
        kl = getattr(setup.loss_cfg, "kl_coef", 0.0)
        # The model's state besides its Params (with adapters, rest is (frozen Params, that)).
        self._model_rest = self.rest if self.adapters is None else self.rest[1]
        if not (kl and kl > 0):
            self.ref_params = None
        elif self.adapters is None:
            self.ref_params = jax.tree.map(jnp.copy, self.state.params)
        else:  # the frozen weights are the starting policy
            self.ref_params = self.rest[0]
        self._logprobs = jitted_logprobs(self.graphdef, self.adapters)
        self._ref_logprobs = jitted_logprobs(self.graphdef)
        self._merge = None  # the jitted adapter merge (`model()`), made on first use
        self._checkpointers: dict[str, Any] = {}
        self._warned_rows = False
        self._parts = None  # the jitted pieces of a length-split update, made on first use
        self._total = np.int32(self.optim.total_steps)  # an argument: one program per setup

    # ---------------------------------------------------------------- placement

    def place_batch(self, batch: SequenceBatch) -> SequenceBatch:
        """Puts a (host) batch on the mesh, rows split over data x fsdp."""
        if self.mesh is None:
            return jax.device_put(batch)
        return jax.device_put(batch, batch_shardings(batch, self.mesh, self.rules))

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
        return self._update(self._prepare(batch))

    def _prepare(self, batch: SequenceBatch) -> list:
        """`batch` checked and placed on the mesh with its reference log-probs (when the loss
        has a KL term), as one batch or, with OptimConfig.length_split, as its parts by
        completion length (`split_by_length`, cut on the host before placing): what one or
        several updates (`train_on`) run on."""
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
        parts = split_by_length(batch, self.optim.length_split, self.optim.group_split)
        if any(np.shape(p.advantages)[0] % (self.optim.accum_steps * shards) for p in parts):
            parts = [batch]
        if len(parts) > 1:
            parts = self._runnable(parts)
        placed = []
        for part in parts:
            if part is None:
                placed.append(None)
                continue
            part = self.place_batch(part)
            if self.ref_params is not None and part.ref_logprobs is None:
                part = part.replace(ref_logprobs=self.reference_logprobs(part))
            placed.append(part)
        return placed

    def _runnable(self, parts: list) -> list:
        """`parts` with None for those whose loss weight is 0 (no token in the loss: dynamic
        sampling's padding groups, which `split_by_length` packs together), the first kept
        where all are: a part of weight 0 adds nothing to the update's gradient, loss or
        weighted metrics (`jitted_parts`), so it is not run; its place stays, so that the
        update's program does not change with the number of parts that run."""
        weights = [float(self.loss.weighting(p, self.loss_cfg)) for p in parts]
        if not any(weights):
            return [parts[0], *[None] * (len(parts) - 1)]
        return [p if w else None for p, w in zip(parts, weights, strict=True)]

    def _update(self, parts: list) -> dict[str, float]:
        """One update on prepared batches (`_prepare`); host metrics."""
        if len(parts) == 1:
            with self._in_mesh():
                self.state, metrics = self._step(self.state, parts[0], self.rest, self._total)
        else:
            metrics = self._step_parts(parts)
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

    def _step_parts(self, parts) -> dict:
        """One update from the gradients of several placed batches (OptimConfig.length_split)."""
        if self._parts is None:
            leaves, treedef = jax.tree.flatten(self.state_shardings)
            optim = program_key(self.optim)
            self._parts = jitted_parts(
                self.graphdef, self.loss, self.loss_cfg, optim, treedef, tuple(leaves)
            )
        grads, accumulate, apply = self._parts
        acc, metrics, weights = None, [None] * len(parts), [None] * len(parts)
        with self._in_mesh():
            params = self.state.params
            for i, part in enumerate(parts):
                if part is not None:
                    loss_value, metrics[i], g, weights[i] = grads(params, part, self.rest)
                    acc = accumulate(acc, loss_value, g, weights[i])
            # a part not run (`_runnable`) weighs 0: zeros in its place count for nothing
            ran = next(i for i, part in enumerate(parts) if part is not None)
            zero_metrics = jax.tree.map(jnp.zeros_like, metrics[ran])
            zero_weight = jnp.zeros_like(weights[ran])
            metrics = [zero_metrics if m is None else m for m in metrics]
            weights = [zero_weight if w is None else w for w in weights]
            self.state, out = apply(self.state, acc, metrics, weights, self._total)
        return out

    def lower_step(self, batch: SequenceBatch):
        """The jitted update lowered on the current state and `batch` (nothing runs): feed it
        to `parallel.memory_per_device` for XLA's plan of exactly this step; after a `step` on
        the same shapes its compiled program is reused, not compiled again."""
        with self._in_mesh():
            return self._step.lower(self.state, self.place_batch(batch), self.rest, self._total)

    def train_on(self, batch: SequenceBatch, num_iterations: int = 1) -> list[dict[str, float]]:
        """`num_iterations` updates on one batch (PPO-style). Its old_logprobs stay those of
        the sampling policy, so from the second iteration on the ratio moves away from 1."""
        if not is_int(num_iterations) or num_iterations < 1:
            raise ValueError(f"num_iterations={num_iterations!r}: allowed an int >= 1")
        parts = self._prepare(batch)  # placed (and split) once for every iteration
        return [self._update(parts) for _ in range(num_iterations)]

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
            logp, _ = self._ref_logprobs(
                self.ref_params, batch, self._model_rest, jnp.float32(self._temperature())
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
        which donates them; with adapters, new buffers of the merged weights). rules: a rule
        set to reshard to (e.g. "sample"), which copies."""
        params, rest = self.model_params(), self._model_rest
        if rules is not None and self.mesh is not None and rules != self.rules:
            params = jax.device_put(params, parallel.model_shardings(params, self.mesh, rules))
        return nnx.merge(self.graphdef, params, rest)

    def model_params(self):
        """nnx.State of the model's current weights: the trained ones, or with adapters the
        frozen ones merged with them (`lora.merge`)."""
        if self.adapters is None:
            return self.state.params
        if self._merge is None:
            frozen, spec = self.rest[0], self.adapters
            shardings = jax.tree.map(lambda x: x.sharding, frozen)
            self._merge = jax.jit(lambda f, a: lora.merge(f, a, spec), out_shardings=shardings)
        with self._in_mesh():
            return self._merge(self.rest[0], self.state.params)

    @property
    def params(self):
        """nnx.State of the trained parameters (the adapters with OptimConfig.lora_rank > 0;
        `model_params` for the model's weights)."""
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
