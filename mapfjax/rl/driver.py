"""The one GRPO driver: steps of rollout -> (dynamic sampling) -> update on a problem set, with
checkpoints that carry the data position, metrics, and per-size rollout statistics. The closed
loop (`engineer/loop.py`, one phase per round) and the tiny-model recipe
(`launch/train_tiny.py`, one GRPO phase after SFT) both run it, from one config schema:

    c.train:  steps (or instances x epochs / problems_per_step), problems_per_step, group_size,
              num_iterations, max_new_tokens, temperature, top_p, enable_thinking,
              checkpoint_every, oversample (dynamic sampling; 1 = off), objective ("grpo";
              "rft": rejection-sampling fine-tuning on the same rollouts)
    c.grpo:   clip_low, clip_high, kl_coef, aggregation, scale_by_std
    c.optim:  `OptimConfig` fields (lr, warmup_steps, schedule, cycle_steps, ...)
    c.reward: `RewardConfig` fields
    c.phase_hooks (optional): `PhaseHooks`, what an experiment changes in a phase
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import ml_collections
import numpy as np

from mapfjax import configfile, files
from mapfjax.checks import is_finite_real, is_int, is_real, require, require_int
from mapfjax.env import reward
from mapfjax.env.types import Problem
from mapfjax.models.sampler import BUCKETS
from mapfjax.rl import checkpoint, grpo, metrics, rollout
from mapfjax.rl.batch import GroupBatch
from mapfjax.rl.optim import OptimConfig
from mapfjax.rl.sft import SFTConfig

log = logging.getLogger(__name__)

# What a phase optimises on its rollouts: "grpo" (group-relative policy gradient) or "rft"
# (rejection-sampling fine-tuning: cross-entropy on the policy's own valid samples).
OBJECTIVES = ("grpo", "rft")
# Training puzzles per round at most: generating more takes hours before the first update
# (the paper: 4,000).
MAX_INSTANCES = 1_000_000


def drawn_per_step(oversample: float, problems_per_step: int) -> int:
    """Problems a step samples under dynamic sampling: ceil(oversample x problems_per_step)."""
    return math.ceil(oversample * problems_per_step)


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """One phase of GRPO steps. oversample: each step samples ceil(oversample x
    problems_per_step) problems and trains on problems_per_step groups, those with mixed
    rewards first (DAPO's dynamic sampling); the rest of the batch is masked out of the loss,
    so shapes stay fixed (an update in parts, OptimConfig.length_split, does not run those
    groups: `Trainer._runnable`). 1.0 trains on every sampled group. objective "rft" replaces the
    GRPO update by rejection-sampling fine-tuning on the same rollouts: cross-entropy on the
    valid samples, groups with at least one valid sample kept first (logged as kept_mixed).
    What an experiment changes beyond these (which puzzles a step samples, how, the batch an
    update trains on, when a phase stops) comes as `PhaseHooks`."""

    steps: int
    problems_per_step: int
    group_size: int
    sampling: rollout.SamplingConfig
    loss: grpo.GRPOConfig
    reward: reward.RewardConfig
    num_iterations: int = 1
    checkpoint_every: int = 10
    oversample: float = 1.0
    objective: str = "grpo"

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict, steps: int | None = None) -> GRPOSettings:
        t = c.train
        check_train(t)
        if steps is None:
            steps = t.get("steps") or max(1, (t.instances * t.epochs) // t.problems_per_step)
        sampling = rollout.SamplingConfig(
            max_new_tokens=t.max_new_tokens,
            temperature=t.temperature,
            top_p=t.get("top_p", 1.0),
            enable_thinking=t.get("enable_thinking", False),
            trace_loss=t.get("trace_loss", "all"),
            bucket=t.get("bucket", rollout.SamplingConfig.bucket),
            completion_bucket=t.get("completion_bucket", rollout.SamplingConfig.completion_bucket),
            steps_per_loop=t.get("steps_per_loop", 1),
        )
        loss = grpo.GRPOConfig(
            group_size=t.group_size, temperature=t.temperature, **c.grpo.to_dict()
        )
        oversample = float(t.get("oversample", 1.0))
        if not math.isfinite(oversample) or oversample < 1:
            raise ValueError(f"train.oversample = {oversample!r}; allowed: a number >= 1")
        objective = t.get("objective", "grpo")
        if objective not in OBJECTIVES:
            raise ValueError(f"train.objective = {objective!r}; allowed: {', '.join(OBJECTIVES)}")
        return cls(
            steps=int(steps),
            problems_per_step=t.problems_per_step,
            group_size=t.group_size,
            sampling=sampling,
            loss=loss.validate(),
            reward=reward.RewardConfig(**c.reward.to_dict()),
            num_iterations=t.get("num_iterations", 1),
            checkpoint_every=t.get("checkpoint_every", 10),
            oversample=oversample,
            objective=objective,
        )

    def trainer_loss(self) -> tuple[str, object]:
        """(loss name for `Trainer`, its config): the clipped GRPO loss, or for "rft" the SFT
        cross-entropy on the valid samples (`imitate_valid` masks the rest)."""
        return ("sft", SFTConfig()) if self.objective == "rft" else ("grpo", self.loss)

    @property
    def drawn_per_step(self) -> int:
        return drawn_per_step(self.oversample, self.problems_per_step)


FINE_BUCKET_BUDGET = 256  # the longest completion budget `train.completion_bucket = "x8"` takes


def require_bucket(key: str, rule) -> None:
    """ValueError naming `key` unless `rule` names a padding rule of `sampler.BUCKETS`."""
    require(key, rule, rule in BUCKETS, f"one of {', '.join(map(repr, BUCKETS))}")


def check_train(t: ml_collections.ConfigDict) -> None:
    """The c.train values nothing else checks before they are divided by or sampled with;
    ValueError naming the key, its value and what is allowed."""
    if t.get("steps") is None:  # the closed loop: steps = instances x epochs / problems_per_step
        n = t.get("instances")
        ok = is_int(n) and 1 <= n <= MAX_INSTANCES
        require("train.instances", n, ok, f"an integer in [1, {MAX_INSTANCES}] (per round)")
        require_int("train.epochs", t.get("epochs"), 1)
    else:
        require_int("train.steps", t.get("steps"), 1)
    require_int("train.problems_per_step", t.get("problems_per_step"), 1)
    require_int("train.checkpoint_every", t.get("checkpoint_every", 10), 1)
    require_int("train.num_iterations", t.get("num_iterations", 1), 1)
    require_int("train.max_new_tokens", t.get("max_new_tokens"), 1)
    # decode steps per iteration of the sampler's loop: speed only, the same completions
    require_int("train.steps_per_loop", t.get("steps_per_loop", 1), 1)
    loss_of = t.get("trace_loss", "all")
    allowed = ", ".join(map(repr, rollout.TRACE_LOSSES))
    require("train.trace_loss", loss_of, loss_of in rollout.TRACE_LOSSES, f"one of {allowed}")
    top_p = t.get("top_p", 1.0)
    require("train.top_p", top_p, is_finite_real(top_p) and 0 < top_p <= 1, "a number in (0, 1]")
    for key in ("bucket", "completion_bucket"):  # padding rules: speed only, never the result
        require_bucket(f"train.{key}", t.get(key, getattr(rollout.SamplingConfig, key)))
    # A fine completion rule compiles one update per width: with a long budget, dozens of
    # programs (each costs seconds to compile and holds hundreds of memory maps on CPU).
    rule = t.get("completion_bucket", rollout.SamplingConfig.completion_bucket)
    budget = t.max_new_tokens
    require(
        "train.completion_bucket", rule, rule != "x8" or budget <= FINE_BUCKET_BUDGET,
        f"'x8' only with train.max_new_tokens <= {FINE_BUCKET_BUDGET} (here {budget}: up to "
        f"{-(-budget // 8)} compiled update shapes); else 'pow2', 'pow2_mid' or 'x64'",
    )  # fmt: skip


def optim_config(c: ml_collections.ConfigDict, steps_per_phase: int, phases: int) -> OptimConfig:
    """`OptimConfig` from c.optim; a "constant" schedule restarts every phase (its warmup
    included), "cosine" spans all phases (the old behaviour). A learning rate that is not
    finite, micro-batches that would split a step's groups, or pieces that would not divide a
    group, raise ValueError naming the key."""
    o = c.optim.to_dict()
    lr = o.get("lr")
    # inf passes OptimConfig's lr > 0, then every update is non-finite and skipped.
    require("optim.lr", lr, not is_real(lr) or is_finite_real(lr), "a finite number > 0")
    accum, groups = o.get("accum_steps", 1), c.train.problems_per_step
    require(
        "optim.accum_steps", accum, not is_int(accum) or accum < 1 or groups % accum == 0,
        f"a divisor of train.problems_per_step = {groups} (micro-batches take whole groups)",
    )  # fmt: skip
    pieces, g = o.get("group_split", 1), c.train.group_size
    require(
        "optim.group_split", pieces, not is_int(pieces) or pieces < 1 or g % pieces == 0,
        f"a divisor of train.group_size = {g} (a group is cut into that many equal pieces)",
    )  # fmt: skip
    total = max(1, steps_per_phase * phases)
    if isinstance(o.get("lora_targets"), list):  # a config file's list of kernel names
        o["lora_targets"] = tuple(o["lora_targets"])
    if o.get("schedule", "cosine") == "constant":
        o.setdefault("cycle_steps", steps_per_phase)
    return OptimConfig(**{**o, "total_steps": max(total, o.get("warmup_steps", 0) + 1)})


def restore(trainer, ckpt_dir: pathlib.Path) -> dict:
    """Loads the latest readable checkpoint in `ckpt_dir` into `trainer` and returns its data
    position (e.g. {"round": 2, "step": 40}); {} when there is none yet.

    A newer step that cannot be read (a crash or a full disk mid-write) is renamed
    `<step>.corrupt`, with a warning, once an older one has loaded; when none can be read,
    CheckpointError names the directory to delete."""
    if not (ckpt_dir.exists() and any(p.name.isdigit() for p in ckpt_dir.iterdir())):
        return {}
    ckpt = checkpoint.Checkpointer(ckpt_dir)
    bad: list[int] = []
    try:
        for step in reversed(ckpt.steps()):
            try:
                trainer.state, data = checkpoint.restore_state(ckpt, trainer.state, step)
                break
            except checkpoint.CorruptCheckpoint as e:
                log.warning("%s; trying the checkpoint before it", e)
                bad.append(step)
        else:
            raise checkpoint.CheckpointError(
                f"{ckpt_dir}: no readable checkpoint (steps {bad} are corrupt); restore the "
                "directory from a copy, or start the training over in a new directory"
            )
    finally:
        ckpt.close()
    for step in bad:  # set aside: the step is saved again when training reaches it
        (ckpt_dir / str(step)).rename(ckpt_dir / f"{step}.corrupt")
    return data


def step_problems(problems: Sequence[Problem], n: int, step: int, seed) -> list[Problem]:
    """The `n` problems of a step: epoch after epoch over a fixed permutation per epoch
    (deterministic in seed and step, so a resumed phase draws the same ones)."""
    total = len(problems)
    out = []
    start = step * n
    while len(out) < n:
        epoch, offset = divmod(start + len(out), total)
        order = np.random.default_rng([*np.atleast_1d(seed), epoch]).permutation(total)
        out += [problems[i] for i in order[offset : offset + n - len(out)]]
    return out


def useful_groups(objective: str, valid: np.ndarray, rewards: np.ndarray, g: int) -> np.ndarray:
    """bool [groups]: the groups that carry a gradient. GRPO: rewards that differ within the
    group (equal rewards give zero advantages); RFT: at least one valid sample to imitate."""
    if objective == "rft":
        return valid.reshape(-1, g).any(1)
    grouped = rewards.reshape(-1, g)
    return grouped.max(1) > grouped.min(1)


def imitate_valid(batch, valid: np.ndarray, order: np.ndarray, g: int):
    """RFT: `batch` (the groups `order` picked by `select_groups`) with the loss mask cleared
    on every sample whose plan is not valid (valid: bool [drawn groups x g])."""
    keep = np.asarray(valid, bool).reshape(-1, g)[order]  # [kept groups, g]
    if not isinstance(batch, GroupBatch):
        keep = keep.reshape(-1)  # one row per sample
    return batch.replace(loss_mask=np.asarray(batch.loss_mask) & keep[..., None])


def objective_batch(objective: str, batch, valid: np.ndarray, order: np.ndarray, g: int):
    """The batch an update of `objective` trains on, from the groups `select_groups` kept
    (`order`): unchanged for "grpo", only the valid samples in the loss for "rft"
    (`imitate_valid`)."""
    if objective == "rft":
        return imitate_valid(batch, valid, order, g)
    return batch


def select_groups(batch, useful: np.ndarray, keep: int, g: int):
    """(batch of `keep` groups, indices kept, number of useful groups kept): the `useful`
    groups (bool [groups], see `useful_groups`) come first, in sampled order; any remaining
    slots take other groups with their loss mask cleared, so they change neither the loss
    nor its normaliser."""
    useful = np.asarray(useful, bool)
    order = np.concatenate([np.flatnonzero(useful), np.flatnonzero(~useful)])[:keep]
    n_useful = int(useful[order].sum())
    if isinstance(batch, GroupBatch):
        picked = jax.tree.map(lambda x: np.asarray(x)[order], batch)
        loss_mask = np.asarray(picked.loss_mask).copy()
        loss_mask[n_useful:] = False
        return picked.replace(loss_mask=loss_mask), order, n_useful
    rows = (order[:, None] * g + np.arange(g)[None]).reshape(-1)
    picked = jax.tree.map(lambda x: np.asarray(x)[rows], batch)
    loss_mask = np.asarray(picked.loss_mask).copy()
    loss_mask[n_useful * g :] = False
    return picked.replace(loss_mask=loss_mask), order, n_useful


@dataclasses.dataclass
class SizeStats:
    """Per map size, over a phase's rollouts: groups, samples, valid samples, groups with
    mixed rewards, sum of p(1-p) over groups, sum of |advantage| over samples."""

    groups: int = 0
    samples: int = 0
    valid: int = 0
    mixed: int = 0
    learnability: float = 0.0
    abs_advantage: float = 0.0

    def summary(self) -> dict:
        """The `RoundRecord.rollouts` entry of one size."""
        return {
            "groups": self.groups,
            "samples": self.samples,
            "valid_rate": self.valid / max(self.samples, 1),
            "mixed_groups": self.mixed / max(self.groups, 1),
            "learnability": self.learnability / max(self.groups, 1),
            "mean_abs_advantage": self.abs_advantage / max(self.samples, 1),
        }


def size_summary(stats: dict[int, SizeStats]) -> dict:
    """{"sizes": {"3": {...}, ...}} (the `RoundRecord.rollouts` layout)."""
    return {"sizes": {str(n): s.summary() for n, s in sorted(stats.items())}}


def _plain_draw(trainer, tokenizer, problems, step: int, settings, seed) -> tuple[list, dict]:
    return step_problems(problems, settings.drawn_per_step, step, [*seed, 1]), {}


@dataclasses.dataclass(frozen=True)
class PhaseHooks:
    """What an experiment changes in a GRPO phase without the package knowing it; each default
    is the plain phase. A run config names them in an optional `phase_hooks` section: its
    `factory` ("package.module:function", `configfile.load_object`) is called with the
    section's other keys and returns a PhaseHooks (`from_config`).

    draw(trainer, tokenizer, problems, step, settings, seed) -> (puzzles, metrics): the
        `settings.drawn_per_step` puzzles step `step` samples groups on, and metrics to log
        with the step (default: the problem stream's order, `step_problems`; deterministic in
        seed and step).
    sampling(SamplingConfig) -> SamplingConfig: how the phase's rollouts sample.
    batch(batch, settings, step_seed) -> batch: the batch an update trains on, after the
        objective's (`step_seed`: [*seed, step]).
    stop(elapsed, last) -> bool: True ends the phase after this step (`elapsed`: its logged
        seconds so far, a resumed phase's earlier steps included; `last`: this step's); the
        phase then counts as finished and STOP_FILE says where it ended.
    name: what the hooks do, in a few words (logged in STOP_FILE)."""

    draw: Callable = _plain_draw
    sampling: Callable | None = None
    batch: Callable | None = None
    stop: Callable | None = None
    name: str = ""

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict) -> PhaseHooks:
        """The hooks of a run config's `phase_hooks` section (none: the plain phase)."""
        section = c.get("phase_hooks")
        if not section:
            return cls()
        options = section.to_dict()
        factory = configfile.load_object(options.pop("factory", ""), "phase_hooks.factory")
        try:
            hooks = factory(**options)
        except (TypeError, ValueError) as e:
            raise ValueError(f"phase_hooks: {e}") from None
        require("phase_hooks.factory", section.factory, isinstance(hooks, cls),
                "a function that returns a driver.PhaseHooks")  # fmt: skip
        return hooks


def run_phase(
    trainer,
    tokenizer,
    problems: Sequence[Problem],
    settings: GRPOSettings,
    *,
    seed: Sequence[int],
    position: dict,
    out_dir: pathlib.Path,
    ckpt_dir: pathlib.Path,
    start_step: int = 0,
    progress: bool = True,
    label: str = "GRPO",
    hooks: PhaseHooks = PhaseHooks(),
) -> None:
    """GRPO steps [start_step, settings.steps) on `problems` (`label`: the progress bar's;
    `hooks`: what an experiment changes, `PhaseHooks`).

    seed: ints that fix the phase's problem order and sampling keys. position: the data
    position saved with each checkpoint, e.g. {"round": 3}; "step" (updates done in the
    phase) is added. Each step's metrics, the kept share of dynamic sampling and its sampled
    groups' outcomes ("groups": `metrics.GroupOutcome` records) go to
    out_dir/metrics.jsonl, from which `phase_size_stats` rebuilds the per-size statistics
    (a resumed phase included).
    """
    s = settings
    sampling = hooks.sampling(s.sampling) if hooks.sampling else s.sampling
    elapsed = phase_seconds(out_dir / "metrics.jsonl", start_step) if hooks.stop else 0.0
    logger = metrics.MetricsLogger(
        out_dir, total_steps=s.steps, initial_step=start_step, progress=progress, desc=label
    )
    for step in range(start_step, s.steps):
        key = jax.random.key(seed[0])
        for x in (*seed[1:], step):
            key = jax.random.fold_in(key, x)
        t0 = time.perf_counter()
        drawn, drew = hooks.draw(trainer, tokenizer, problems, step, s, seed)
        batch, rs = rollout.rollout(
            trainer, tokenizer, drawn, s.group_size, sampling, s.reward, key, grpo_cfg=s.loss
        )
        adv = _advantages(batch)
        g = s.group_size
        useful = useful_groups(s.objective, rs.valid, rs.rewards, g)
        batch, kept, n_useful = select_groups(batch, useful, s.problems_per_step, g)
        batch = objective_batch(s.objective, batch, rs.valid, kept, g)
        if hooks.batch:
            batch = hooks.batch(batch, s, [*seed, step])
        groups = [
            metrics.GroupOutcome(
                size=max(p.height, p.width),
                valid=int(rs.valid[j * g : (j + 1) * g].sum()),
                abs_advantage=float(np.abs(adv[j * g : (j + 1) * g]).sum()),
                mixed=bool(np.ptp(rs.rewards[j * g : (j + 1) * g]) > 0),
            ).to_record()
            for j, p in enumerate(drawn)
        ]
        t1 = time.perf_counter()  # sampling, rewards and the groups chosen, all on the host
        updates = trainer.train_on(batch, s.num_iterations)
        t2 = time.perf_counter()  # the updates' metrics too
        row = {
            **position,
            "seconds": t2 - t0,
            "rollout_seconds": t1 - t0,
            "update_seconds": t2 - t1,
            **rs.as_dict(),
            "kept_mixed": n_useful / s.problems_per_step,
            "drawn": len(drawn),
            **drew,
            "groups": groups,
            **{f"train_{k}": v for k, v in updates[-1].items()},
        }
        logger.log(step + 1, row)
        elapsed += row["seconds"]
        # a stop hook's end: the phase counts as finished (its checkpoint says so)
        stop = step + 1 < s.steps and bool(hooks.stop) and hooks.stop(elapsed, row["seconds"])
        last = stop or step + 1 == s.steps
        if (step + 1) % s.checkpoint_every == 0 or last:
            done = s.steps if last else step + 1
            trainer.save(ckpt_dir, {**position, "step": done}, wait=True)
        if stop:
            ended = {"updates": step + 1, "of": s.steps, "seconds": elapsed, "by": hooks.name}
            files.atomic_write(out_dir / STOP_FILE, json.dumps(ended))
            log.info("%s: the phase ends after %d of %d updates", hooks.name or "stop hook",
                     step + 1, s.steps)  # fmt: skip
            break
    logger.close()


STOP_FILE = "time_budget.json"  # where a phase that a stop hook ended says so


def phase_rows(metrics_path: pathlib.Path) -> dict[int, dict]:
    """A phase's metrics rows by step, from its metrics.jsonl ({} before its first step): the
    last row of each step counts, a step logged again after a resume replacing the earlier."""
    if not metrics_path.exists():
        return {}
    return {row["step"]: row for row in metrics.read_metrics(metrics_path)}


def phase_seconds(metrics_path: pathlib.Path, through_step: int) -> float:
    """The logged seconds of a phase's steps 1..through_step (`phase_rows`)."""
    rows = phase_rows(metrics_path)
    return float(sum(r["seconds"] for step, r in rows.items() if step <= through_step))


def _advantages(batch) -> np.ndarray:
    """Per-response advantages [B] in sampled order."""
    return np.asarray(batch.advantages).reshape(-1)


def phase_size_stats(metrics_path: pathlib.Path, group_size: int) -> dict[int, SizeStats]:
    """Per-size rollout statistics of a phase, from its metrics.jsonl (`phase_rows`)."""
    stats: dict[int, SizeStats] = {}
    for row in phase_rows(metrics_path).values():
        for o in metrics.group_outcomes(row):
            s = stats.setdefault(o.size, SizeStats())
            p = o.valid / group_size
            s.groups += 1
            s.samples += group_size
            s.valid += o.valid
            s.mixed += int(o.mixed)
            s.learnability += p * (1 - p)
            s.abs_advantage += o.abs_advantage
    return stats
