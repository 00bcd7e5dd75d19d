"""The jitted train step for GRPO and SFT: losses registered by name with their micro-batch
weighting, gradient accumulation with global loss normalisers, non-finite updates skipped, and
the state's shardings (also lowered ahead of time for memory planning)."""

from __future__ import annotations

import dataclasses
import functools
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
from mapfjax.checks import is_int
from mapfjax.models.sampler import BUCKETS
from mapfjax.rl import lora
from mapfjax.rl.batch import GroupBatch, SequenceBatch, row_view
from mapfjax.rl.grpo import GRPOConfig, grpo_loss, masked_mean
from mapfjax.rl.logprobs import completion_logprobs
from mapfjax.rl.optim import OptimConfig, lr_schedule, make_optimizer
from mapfjax.rl.sft import SFTConfig, loss_tokens, sft_loss

Array = jax.Array
LossFn = Callable[[nnx.Module, SequenceBatch, Any], tuple[Array, dict[str, Array]]]
# weighting(batch, cfg) -> f32[]: a loss's normaliser on a batch (see `Loss`).
Weighting = Callable[[SequenceBatch | GroupBatch, Any], Array]


@flax.struct.dataclass
class TrainState:
    """params: nnx.State of the trained nnx.Param variables (the model's, or its adapters' with
    OptimConfig.lora_rank > 0); opt_state: optax state over them;
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


@dataclasses.dataclass(frozen=True)
class Loss:
    """A loss the train step can run, with what accumulation needs to stay exact.

    fn(model, batch, cfg) -> (loss f32[], metrics). weighting(batch, cfg) -> f32[]: the
    loss's normaliser on a batch (its token count for a token mean, its non-empty rows for a
    sequence mean), so that micro-batch losses weighted by w_k / sum(w) equal the full-batch
    loss; `equal_weighting` for a loss whose micro-batches count equally. config() -> the
    loss's default config (None: the loss takes none).
    """

    name: str
    fn: LossFn
    weighting: Weighting
    config: Callable[[], Any] | None = None

    def __post_init__(self):
        if not callable(self.weighting):
            raise ValueError(
                f"loss {self.name!r}: weighting={self.weighting!r}; allowed: a function "
                "(batch, cfg) -> f32[] giving the loss's normaliser (its token or sequence "
                "count), or equal_weighting when micro-batches should count equally"
            )


# name -> the registered `Loss`; see `register_loss`.
LOSSES: dict[str, Loss] = {}


def register_loss(
    name: str, *, weighting: Weighting | None = None, config: Callable[[], Any] | None = None
) -> Callable[[LossFn], LossFn]:
    """Decorator registering fn(model, batch, cfg) -> (loss, metrics) under `name` with its
    micro-batch `weighting` (required: ValueError without one) and default `config`."""

    def deco(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = Loss(name, fn, weighting, config)
        return fn

    return deco


def equal_weighting(batch, cfg) -> Array:
    """Every micro-batch weighs the same (a loss that is a mean over micro-batches)."""
    return jnp.float32(1.0)


def _grpo_weight(batch: SequenceBatch | GroupBatch, cfg: GRPOConfig) -> Array:
    # The denominator of each aggregation: tokens for token_mean, non-empty rows otherwise.
    mask = jnp.asarray(row_view(batch)[0], bool)
    if cfg.aggregation == "token_mean":
        return jnp.sum(mask).astype(jnp.float32)
    return jnp.sum(jnp.any(mask, axis=1)).astype(jnp.float32)


@register_loss("grpo", weighting=_grpo_weight, config=GRPOConfig)
def grpo_token_loss(model, batch: SequenceBatch, cfg: GRPOConfig):
    """GRPO clipped surrogate over the completion tokens (`grpo.grpo_loss`).

    Log-probs use cfg.temperature, the sampler's. Extra metrics: entropy (mean over loss
    tokens), logprob_mismatch (mean |trainer - old| log-prob: the sampler/trainer gap on the
    first iteration over a batch), full_length_frac (rows whose loss mask fills all T columns:
    the truncation rate when T is the generation budget).
    """
    mask, old, adv, ref = row_view(batch)
    mask = jnp.asarray(mask, bool)
    logp, entropy = completion_logprobs(model, batch, cfg.temperature)
    t = mask.shape[-1]
    logp, entropy = logp.reshape(-1, t), entropy.reshape(-1, t)
    loss, metrics = grpo_loss(logp, old, adv, mask, cfg, ref)
    old = jnp.where(mask, old, 0.0)
    rows = jnp.any(mask, axis=1)
    metrics.update(
        entropy=masked_mean(lax.stop_gradient(entropy), mask),
        logprob_mismatch=masked_mean(jnp.abs(lax.stop_gradient(logp) - old), mask),
        full_length_frac=masked_mean(mask[:, -1], rows),
    )
    return loss, metrics


register_loss("sft", weighting=loss_tokens, config=SFTConfig)(sft_loss)


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


def _split_micro(batch, accum: int):
    """[B, ...] leaves -> [accum, B / accum, ...]; micro-batch k holds rows k, k + accum, ...
    (groups, for a `GroupBatch`), so a row-sharded batch gives every device an equal share of
    each micro-batch."""

    def split(x):
        x = jnp.asarray(x)
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return x

    return jax.tree.map(split, batch)


def _constrain_rows(batch):
    return jax.tree.map(lambda x: parallel.constrain(x, ("batch",) + (None,) * (x.ndim - 1)), batch)


def model_state(params, rest, adapters: lora.LoraSpec | None):
    """(the model's Params, the rest of its state) from a train state's params and the step's
    `rest`: the same two without adapters; with them, rest is (the frozen Params, the rest)
    and the Params are those merged with the adapters in `params` (`lora.merge`)."""
    if adapters is None:
        return params, rest
    frozen, rest = rest
    return lora.merge(frozen, params, adapters), rest


def batch_grads(
    params, batch, rest, *, graphdef, loss: Loss, loss_cfg, accum_steps: int, remat,
    adapters: lora.LoraSpec | None = None,
) -> tuple[Array, dict[str, Array], Any, Array]:  # fmt: skip
    """(loss, metrics, gradients, weight) of `batch` under `params` (pure): the first half of
    `train_step`. weight: `loss.weighting` of the batch, its share when several batches make
    one update (`Trainer` with OptimConfig.length_split). adapters: see `model_state`."""

    def micro_loss(params, mb):
        model = nnx.merge(graphdef, *model_state(params, rest, adapters))
        if remat is not None and hasattr(model, "remat"):
            model.remat = remat
        return loss.fn(model, mb, loss_cfg)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    if accum_steps == 1:
        (loss_value, metrics), grads = grad_fn(params, batch)
        return loss_value, metrics, grads, loss.weighting(batch, loss_cfg)
    micro = _split_micro(batch, accum_steps)
    # f32 [A] normalisers; counts, so their sum is exactly the full batch's.
    ws = jax.vmap(lambda mb: loss.weighting(mb, loss_cfg))(micro)
    total = jnp.sum(ws)
    ws = ws / jnp.where(total > 0, total, 1.0)

    def body(carry, xs):
        g_acc, l_acc = carry
        mb, w = xs
        mb = _constrain_rows(mb)
        (lk, m), g = grad_fn(params, mb)
        g_acc = jax.tree.map(lambda a, b: a + w * b.astype(jnp.float32), g_acc, g)
        return (g_acc, l_acc + w * lk), m

    # Accumulate in fp32 (bf16 sums of many micro-batches lose the small ones).
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    (grads, loss_value), ms = lax.scan(body, (zeros, jnp.float32(0.0)), (micro, ws))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    metrics = _combine(ms, ws)
    metrics["loss"] = loss_value
    return loss_value, metrics, grads, total


def apply_grads(
    state: TrainState, grads, loss_value, metrics, *, tx, schedule
) -> tuple[TrainState, dict[str, Array]]:
    """The optimiser update from `grads` (pure): the second half of `train_step`. A
    non-finite loss or gradient leaves params and optimiser state unchanged and counts the
    step in bad_steps / skipped. Metrics add grad_norm (before clipping) and update_norm, the
    global norm of the change made to the parameters (0 for a skipped update)."""
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss_value) & jnp.isfinite(grad_norm)
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
        loss=jnp.asarray(loss_value, jnp.float32),
        grad_norm=grad_norm,
        update_norm=jnp.where(ok, optax.tree.norm(updates), 0.0).astype(jnp.float32),
        lr=jnp.asarray(schedule(applied), jnp.float32),
        update_skipped=jnp.where(ok, 0.0, 1.0),
    )
    return new_state, metrics


def train_step(
    state: TrainState,
    batch: SequenceBatch,
    rest,
    *,
    graphdef,
    loss: Loss,
    loss_cfg,
    tx: optax.GradientTransformation,
    accum_steps: int,
    remat: bool | str | None,
    schedule: optax.Schedule,
    adapters: lora.LoraSpec | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser update on `batch` (pure; jit it with the keyword arguments static).

    With accum_steps = A the B rows are cut into A micro-batches (`_split_micro`) scanned with
    gradients accumulated as sum_k (w_k / sum w) * grad L_k, w_k = `loss.weighting` on
    micro-batch k (its normaliser), which equals the gradient of the full-batch loss for
    token-mean and sequence-mean aggregations. A non-finite loss or gradient leaves params
    and optimiser state unchanged and counts the step in bad_steps / skipped. remat: the
    model's remat setting for this step (True, False or a `qwen3.REMAT_POLICIES` name; None
    keeps the model's own). adapters: the LoRA spec when state.params are adapters and rest is
    (the frozen Params, the rest) (`model_state`).
    """
    loss_value, metrics, grads, _ = batch_grads(
        state.params, batch, rest, graphdef=graphdef, loss=loss, loss_cfg=loss_cfg,
        accum_steps=accum_steps, remat=remat, adapters=adapters,
    )  # fmt: skip
    return apply_grads(state, grads, loss_value, metrics, tx=tx, schedule=schedule)


def split_by_length(batch, parts: int, group_split: int = 1) -> list:
    """`batch` as `parts` batches of equal numbers of groups (rows, for a `SequenceBatch`)
    in order of their longest completion, each cut to its own completion width (the
    `pow2_mid` bucket of its longest completion, at most the batch's T), so that short
    completions are not padded to the longest of the whole batch. Groups (rows, pieces) with
    no token in the loss mask (dynamic sampling's padding groups) come after all the others,
    in their own order of length, so that they fill parts of their own, which carry no loss
    and which `Trainer` does not run. Host (NumPy) leaves out. One batch, the given one, when
    parts == 1 or the groups do not divide into `parts`.

    group_split (a `GroupBatch` only): first cut each group's G completions, sorted by
    length, into this many pieces of G / group_split rows, each a group of its own with the
    group's prompt, and make the parts of pieces: a completion that runs to the budget then
    widens its piece, not its whole group. ValueError when it does not divide G.
    """
    n = np.shape(batch.advantages)[0]
    group = isinstance(batch, GroupBatch)
    k = group_split if group else 1
    if group and (not is_int(k) or k < 1 or batch.group_size % k):
        raise ValueError(
            f"split_by_length: group_split={group_split!r}; allowed: an int >= 1 that divides "
            f"the group size G={batch.group_size}"
        )
    if parts == 1 or (n * k) % parts:
        return [batch]
    host = jax.tree.map(np.asarray, batch)
    if group:
        row_lengths = host.attention_mask.sum(-1)  # [Bg, G]
        g = batch.group_size
        if k > 1:
            within = np.argsort(row_lengths, axis=1, kind="stable")
        else:  # whole groups, their rows in order
            within = np.broadcast_to(np.arange(g), (n, g))
        rows = within.reshape(n * k, g // k)  # each piece's rows in its group
        owner = np.repeat(np.arange(n), k)  # each piece's group
        lengths = np.take_along_axis(row_lengths, within, 1).reshape(n * k, -1).max(1)
        in_loss = host.loss_mask.any(-1)  # [Bg, G]
        in_loss = np.take_along_axis(in_loss, within, 1).reshape(n * k, -1).any(1)
    else:
        lengths = host.attention_mask[:, batch.prompt_len :].sum(-1)
        in_loss = host.loss_mask.any(-1)
    # by length, those out of the loss last (lexsort: the last key first; stable)
    order = np.lexsort((lengths, ~in_loss)).reshape(parts, -1)
    out = []
    for idx in order:
        width = min(batch.completion_len, BUCKETS["pow2_mid"](max(int(lengths[idx].max()), 1)))

        if group:
            src, cols = owner[idx], rows[idx]

            def cut(x, src=src, cols=cols, width=width):
                return None if x is None else x[src[:, None], cols][..., :width]

            part = host.replace(
                prompt_tokens=host.prompt_tokens[src],
                prompt_mask=host.prompt_mask[src],
                tokens=cut(host.tokens),
                attention_mask=cut(host.attention_mask),
                loss_mask=cut(host.loss_mask),
                old_logprobs=cut(host.old_logprobs),
                advantages=host.advantages[src[:, None], cols],
                ref_logprobs=cut(host.ref_logprobs),
            )
        else:

            def cut(x, rows=idx, width=width):
                return None if x is None else x[rows][..., :width]

            end = batch.prompt_len + width
            part = host.replace(
                tokens=host.tokens[idx][:, :end],
                attention_mask=host.attention_mask[idx][:, :end],
                positions=host.positions[idx][:, :end],
                loss_mask=cut(host.loss_mask),
                old_logprobs=cut(host.old_logprobs),
                advantages=host.advantages[idx],
                ref_logprobs=cut(host.ref_logprobs),
            )
        out.append(part)
    return out


def batch_shardings(batch: SequenceBatch, mesh, rules):
    def one(x):
        axes = ("batch",) + (None,) * (np.ndim(x) - 1)
        return parallel.logical_to_sharding(axes, mesh, rules, np.shape(x))

    return jax.tree.map(one, batch)


def init_state(tx, params, rng) -> TrainState:
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


def resolve_loss(loss: str | Loss | LossFn, loss_cfg=None) -> tuple[Loss, Any]:
    """(the `Loss`, its validated config, default `loss.config()`): `loss` is a name in
    `LOSSES`, a `Loss`, or a registered loss function. Anything else raises ValueError: a
    loss without a registered weighting would weight accumulated micro-batches wrongly."""
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss_fn={loss!r}: allowed {sorted(LOSSES)}")
        loss = LOSSES[loss]
    elif not isinstance(loss, Loss):
        found = [x for x in LOSSES.values() if x.fn is loss]
        if not found:
            name = getattr(loss, "__qualname__", None) or repr(loss)
            raise ValueError(
                f"loss_fn={name}: not a registered loss; allowed: a name in {sorted(LOSSES)}, "
                "or a function registered with its micro-batch weighting by "
                "@step.register_loss(name, weighting=...)"
            )
        loss = found[0]
    if loss_cfg is None and loss.config is not None:
        loss_cfg = loss.config()
    if hasattr(loss_cfg, "validate"):
        loss_cfg.validate()
    return loss, loss_cfg


@dataclasses.dataclass(frozen=True)
class StepSetup:
    """Everything a train step needs besides the state, for one (model, optimiser, loss,
    placement). params: the trained nnx.Param state (the model's, or with OptimConfig.lora_rank
    the adapters', `lora.init`; arrays, or ShapeDtypeStructs for an abstract model); rest: the
    rest of the model's state, or (its frozen Params, the rest) with adapters;
    init(params, rng) -> TrainState; abstract: the state's
    ShapeDtypeStructs; shardings: the state's shardings (a TrainState of them); step: the
    jitted `train_step`, called as step(state, batch, rest, total_steps) (the schedule's length
    is an argument: one program serves every length); loss: the resolved `Loss`."""

    graphdef: Any
    params: Any
    rest: Any
    init: Callable
    abstract: TrainState
    shardings: TrainState
    step: Callable
    loss: Loss
    loss_cfg: Any


def setup_step(model, optim: OptimConfig, loss, loss_cfg, mesh, rules, rng=None) -> StepSetup:
    """Split `model` (concrete or `nnx.eval_shape`d), shape the train state, shard it and
    fetch the jitted step: the one setup `Trainer` and `lower_train_step` share."""
    loss, loss_cfg = resolve_loss(loss, loss_cfg)
    tx = make_optimizer(optim)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    init = functools.partial(init_state, tx)
    rng = jax.random.key(0) if rng is None else rng
    if (adapters := lora.spec_of(optim)) is not None:
        # Variables of its own (the caller's model may change later), on the same arrays.
        frozen, key = jax.tree.map(lambda x: x, params), jax.random.fold_in(rng, 1)
        make = functools.partial(lora.init, spec=adapters, rng=key)
        params = jax.eval_shape(make, frozen)
        if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(frozen)):
            out = None if mesh is None else parallel.model_shardings(params, mesh, rules)
            params = jax.jit(make, out_shardings=out)(frozen)  # one program, on their shards
        rest = (frozen, rest)
    abstract = jax.eval_shape(init, params, rng)
    shardings = train_state_shardings(abstract, tx, mesh, rules)
    leaves, treedef = jax.tree.flatten(shardings)
    step = jitted_step(graphdef, loss, loss_cfg, program_key(optim), treedef, tuple(leaves))
    return StepSetup(graphdef, params, rest, init, abstract, shardings, step, loss, loss_cfg)


def lower_train_step(
    make_model: Callable[[], nnx.Module],
    optim: OptimConfig,
    loss: str | Loss | LossFn,
    loss_cfg,
    mesh,
    rows: int,
    prompt_len: int,
    completion_len: int,
    rules="train",
    with_ref_logprobs: bool = False,
    group_size: int | None = None,
):
    """`jax.jit(train_step).lower(...)` on abstract inputs for ahead-of-time memory planning:
    the model, optimiser state and a batch of `rows` completions of `completion_len` tokens
    after `prompt_len`-token prompts exist only as ShapeDtypeStructs with their shardings
    (nothing is allocated). group_size=None lowers a `SequenceBatch` (every row carries its
    prompt); an int G lowers a `GroupBatch` of rows / G prompts, each run once."""
    setup = setup_step(nnx.eval_shape(make_model), optim, loss, loss_cfg, mesh, rules)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        setup.abstract,
        setup.shardings,
    )
    P, T = prompt_len, completion_len

    def spec(shape, dtype):
        axes = ("batch",) + (None,) * (len(shape) - 1)
        sh = parallel.logical_to_sharding(axes, mesh, rules, shape)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

    ref = with_ref_logprobs
    if group_size is None:
        batch = SequenceBatch(
            tokens=spec((rows, P + T), jnp.int32),
            attention_mask=spec((rows, P + T), jnp.bool_),
            positions=spec((rows, P + T), jnp.int32),
            loss_mask=spec((rows, T), jnp.bool_),
            old_logprobs=spec((rows, T), jnp.float32),
            advantages=spec((rows,), jnp.float32),
            ref_logprobs=spec((rows, T), jnp.float32) if ref else None,
            prompt_len=P,
        )
    else:
        if rows % group_size:
            raise ValueError(
                f"lower_train_step: rows={rows} not divisible by group_size={group_size}"
            )
        g, G = rows // group_size, group_size
        batch = GroupBatch(
            prompt_tokens=spec((g, P), jnp.int32),
            prompt_mask=spec((g, P), jnp.bool_),
            tokens=spec((g, G, T), jnp.int32),
            attention_mask=spec((g, G, T), jnp.bool_),
            loss_mask=spec((g, G, T), jnp.bool_),
            old_logprobs=spec((g, G, T), jnp.float32),
            advantages=spec((g, G), jnp.float32),
            ref_logprobs=spec((g, G, T), jnp.float32) if ref else None,
        )
    with jax.set_mesh(mesh):
        return setup.step.lower(state, batch, setup.rest, np.int32(optim.total_steps))


def program_key(optim: OptimConfig) -> OptimConfig:
    """`optim` with what the compiled update does not depend on normalised: max_bad_steps (the
    host checks it), total_steps (an argument of the update, see `jitted_step`) and how a
    batch is cut into parts (length_split, group_split: the host cuts it)."""
    return dataclasses.replace(
        optim, max_bad_steps=1, total_steps=optim.warmup_steps + 1, length_split=1, group_split=1
    )


@functools.lru_cache(maxsize=32)
def jitted_step(graphdef, loss: Loss, loss_cfg, optim: OptimConfig, treedef, sharding_leaves):
    """The jitted `train_step` for one (model graph, loss, optimiser, placement), called as
    step(state, batch, rest, total_steps): the schedule's length is an argument, so one
    program serves schedules of every length (the stages of a staged recipe, a run extended
    by more rounds); cached so a fresh Trainer of the same setup (e.g. after a restore, or the
    next stage) reuses the compiled step. optim: its `program_key`."""
    state_shardings = jax.tree.unflatten(treedef, sharding_leaves)
    static = dict(
        graphdef=graphdef, loss=loss, loss_cfg=loss_cfg, accum_steps=optim.accum_steps,
        remat=optim.remat, adapters=lora.spec_of(optim),
    )  # fmt: skip

    def step(state, batch, rest, total_steps):
        tx, schedule = make_optimizer(optim, total_steps), lr_schedule(optim, total_steps)
        return train_step(state, batch, rest, tx=tx, schedule=schedule, **static)

    return jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, None))


@functools.lru_cache(maxsize=32)
def jitted_parts(graphdef, loss: Loss, loss_cfg, optim: OptimConfig, treedef, sharding_leaves):
    """(grads, accumulate, apply): one update from several batches of different shapes
    (`split_by_length`), jitted per shape. grads(params, batch, rest) -> (loss, metrics,
    gradients, weight) of one batch; accumulate(acc, loss, gradients, weight) adds it to acc
    (None at first) as weight-scaled fp32 sums; apply(state, acc, metrics, weights) divides
    by the total weight, combines the batches' metrics and updates: the gradient and loss of
    the batches taken together, as `train_step`'s micro-batches give them; apply's last
    argument is the schedule's length, as `jitted_step`'s. optim: its `program_key`."""
    state_shardings = jax.tree.unflatten(treedef, sharding_leaves)
    f32 = jnp.float32
    grads = jax.jit(
        functools.partial(
            batch_grads,
            graphdef=graphdef,
            loss=loss,
            loss_cfg=loss_cfg,
            accum_steps=optim.accum_steps,
            remat=optim.remat,
            adapters=lora.spec_of(optim),
        )  # fmt: skip
    )

    def accumulate(acc, loss_value, g, weight):
        if acc is None:
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, f32), g)
            acc = (zeros, f32(0.0), f32(0.0))
        total, loss_sum, weights = acc
        total = jax.tree.map(lambda a, b: a + weight * b.astype(f32), total, g)
        return total, loss_sum + weight * loss_value, weights + weight

    def apply(state, acc, metrics, weights, total_steps):
        total, loss_sum, w = acc
        norm = jnp.where(w > 0, w, 1.0)
        g = jax.tree.map(lambda a, p: (a / norm).astype(p.dtype), total, state.params)
        stacked = {k: jnp.stack([m[k] for m in metrics]) for k in metrics[0]}
        combined = _combine(stacked, jnp.stack(weights))
        return apply_grads(
            state, g, loss_sum / norm, combined, tx=make_optimizer(optim, total_steps),
            schedule=lr_schedule(optim, total_steps),
        )  # fmt: skip

    return (
        grads,
        jax.jit(accumulate, donate_argnums=0),
        jax.jit(apply, donate_argnums=0, out_shardings=(state_shardings, None)),
    )


@functools.lru_cache(maxsize=32)
def jitted_logprobs(graphdef, adapters: lora.LoraSpec | None = None):
    """The jitted completion log-probs and entropies, called as fn(params, batch, rest,
    temperature); adapters: as `model_state`."""

    def fn(params, batch, rest, temperature):
        model = nnx.merge(graphdef, *model_state(params, rest, adapters))
        return completion_logprobs(model, batch, temperature)

    return jax.jit(fn)


def forget_compiled() -> None:
    """Drops the cached jitted updates (`jitted_step`, `jitted_parts`, `jitted_logprobs`), so
    that a `Trainer` no longer used frees its compiled programs with it (live trainers keep
    theirs). For a setup that will not come back (another model, loss or optimiser setting):
    the caches keep the programs of every setup used, one per batch shape. The stages of a
    staged recipe share theirs (`jitted_step`); when each stage had its own, the trace recipe
    on CPU grew from 4.6 GB resident in its first stage to 9.3 GB in its fourth."""
    for cached in (jitted_step, jitted_parts, jitted_logprobs):
        cached.cache_clear()
