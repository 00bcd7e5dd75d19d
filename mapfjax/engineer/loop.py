"""The closed loop, rounds R0..Rk: generate -> GRPO -> validate -> context -> engineer -> project.

Every artifact of a round lands in `workdir/round_<n>/`; a round is finished when its `DONE`
file exists. Killing the process at any moment and rerunning the same command continues where
it stopped: finished rounds are loaded, an unfinished round resumes from the trainer's latest
checkpoint (its data position is saved with it) and nothing finished is recomputed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mapfjax import parallel
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer import engineers as eng_lib
from mapfjax.engineer import policy as policy_fns
from mapfjax.engineer.proposal import Decision
from mapfjax.env import config as env_config
from mapfjax.env import io, reward
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import grpo, rollout
from mapfjax.rl.data import generate_problems
from mapfjax.rl.metrics import MetricsLogger
from mapfjax.rl.trainer import OptimConfig, Trainer

log = logging.getLogger(__name__)

# Keys that may differ when an existing run directory is continued (everything else must match).
RESUMABLE_CHANGES = ("rounds",)


class RunDirError(ValueError):
    """The run directory belongs to a different config, or is corrupt."""


def _write_json(path: pathlib.Path, obj) -> None:
    io.atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode())


def _read_json(path: pathlib.Path, advice: str):
    """The JSON in `path`; an unreadable file raises RunDirError saying what to do about it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"{path}: unreadable ({e}); {advice}") from e


def _redo_advice(workdir: pathlib.Path, n: int, position: dict) -> str:
    """What recomputes finished round n's validation, decision and record (which files to
    delete), or why nothing can."""
    if position["round"] == n:
        return (
            f"delete {workdir / f'round_{n}' / 'DONE'} and rerun: round {n}'s validation, "
            "decision.json and record.json are recomputed from its checkpoint (no retraining)"
        )
    return (
        f"round {n} cannot be recomputed (the checkpoint is at round {position['round']}); "
        "restore the file from a copy, or start another --workdir"
    )


def check_run_dir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """Record the run's config on first use; refuse a different one later, naming the keys."""
    for p in (workdir, *workdir.parents):
        if p.exists() and not p.is_dir():
            raise RunDirError(f"--workdir {workdir}: {p} is a file; expected a directory")
    path = workdir / "run_config.json"
    current = json.loads(config.to_json_best_effort())
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        _write_json(path, current)
        return
    # Never advise deleting run_config.json: a new one would skip this check.
    advice = "it records this run's config: restore it from a copy, or use another --workdir"
    before = env_config.flatten(_read_json(path, advice))
    now = env_config.flatten(current)
    differ = sorted(
        k
        for k in set(before) | set(now)
        if before.get(k) != now.get(k) and k not in RESUMABLE_CHANGES
    )
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in differ[:10])
        raise RunDirError(
            f"{workdir} holds a run with a different config ({len(differ)} key(s) differ: "
            f"{shown}); use another --workdir or the same config"
        )


def _optim(c: ml_collections.ConfigDict, total_steps: int) -> OptimConfig:
    return OptimConfig(**{**c.optim.to_dict(), "total_steps": max(total_steps, 1)})


def _grpo_cfg(c) -> grpo.GRPOConfig:
    return grpo.GRPOConfig(
        group_size=c.train.group_size, temperature=c.train.temperature, **c.grpo.to_dict()
    )


def _validation_set(workdir: pathlib.Path, c) -> list:
    """The fixed validation set (generated once, then read back)."""
    path = workdir / "validation_set.jsonl"
    if path.exists():
        return io.load_instances(path)
    v = c.validation
    cfg = env_config.default_config(v.num_agents, tuple(v.sizes), v.hole_ratio, v.wait_ratio)
    probs = generate_problems(cfg, v.per_size * len(v.sizes), seed=v.seed, processes=1)
    io.save_instances(path, probs)
    return probs


def _steps_per_round(c) -> int:
    return max(1, (c.train.instances * c.train.epochs) // c.train.problems_per_step)


def _training_info(c, n: int) -> dict:
    """The T module's facts about round n's training (part of its record)."""
    return {
        "round": n,
        "epoch": c.train.epochs,
        "steps": _steps_per_round(c),
        "lr": c.optim.lr,
        "group_size": c.train.group_size,
        "num_iterations": c.train.num_iterations,
        "temperature": c.train.temperature,
        **c.grpo.to_dict(),
    }


def _previous_summary(workdir: pathlib.Path, n: int, position: dict) -> str:
    """S: the engineer's rationale for choosing C_n, written at the end of round n - 1."""
    prev = workdir / f"round_{n - 1}" / "decision.json"
    if n == 0 or not prev.exists():
        return ""
    return _read_json(prev, _redo_advice(workdir, n - 1, position)).get("summary", "")


def finished_round(workdir: pathlib.Path, n: int, c, position: dict):
    """(record, decision or None) of a round with a DONE file.

    A missing or unreadable record.json is recomputed from the round's config.json and
    validation.json (and the previous decision's summary) and written back, with a warning;
    any other unreadable file raises RunDirError naming it and what to delete.
    """
    out = workdir / f"round_{n}"
    advice = _redo_advice(workdir, n, position)
    path = out / "record.json"
    try:
        record = ctx_lib.RoundRecord.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        config = _read_json(out / "config.json", f"{path} cannot be recomputed: {advice}")
        val = _read_json(out / "validation.json", f"{path} cannot be recomputed: {advice}")
        try:
            validation = ctx_lib.failure_breakdown(val["rows"])
        except (KeyError, TypeError, ValueError) as bad:
            raise RunDirError(
                f"{out / 'validation.json'}: no usable 'rows' ({bad!r}); {path} cannot be "
                f"recomputed: {advice}"
            ) from bad
        record = ctx_lib.RoundRecord(
            round=n,
            config=config,
            validation=validation,
            summary=_previous_summary(workdir, n, position),
            training=_training_info(c, n),
        )
        _write_json(path, record.to_dict())
        log.warning("%s: unreadable (%s); recomputed from config.json and validation.json", path, e)
    decision = None
    if (out / "decision.json").exists():
        d = _read_json(out / "decision.json", advice)
        try:
            decision = Decision.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise RunDirError(f"{out / 'decision.json'}: not a decision ({e!r}); {advice}") from e
    return record, decision


def _validate(trainer, tokenizer, problems, c, out_dir: pathlib.Path):
    val = rollout.validate(
        trainer,
        tokenizer,
        problems,
        max_new_tokens=c.validation.max_new_tokens,
        batch_size=c.validation.batch_size,
        enable_thinking=c.train.enable_thinking,
    )
    rows = val.rows
    _write_json(
        out_dir / "validation.json",
        {"rows": rows, "mean_valid": val.mean_valid, "mean_optimal": val.mean_optimal},
    )
    io.atomic_write(out_dir / "validation.md", (val.table() + "\n").encode())
    return val, rows


def _train_round(trainer: Trainer, tokenizer, n: int, cfg_n, c, out_dir, ckpt_dir, start_step):
    """GRPO on round n's training set, from `start_step`; checkpoints with the data position."""
    train_path = out_dir / "train_set.jsonl"
    if train_path.exists():
        problems = io.load_instances(train_path)
    else:
        gen = cfg_n.copy_and_resolve_references()
        problems = generate_problems(gen, c.train.instances, seed=c.seed * 1000 + n, processes=0)
        io.save_instances(train_path, problems)
    steps = _steps_per_round(c)
    per = c.train.problems_per_step
    sampling = rollout.SamplingConfig(
        max_new_tokens=c.train.max_new_tokens,
        temperature=c.train.temperature,
        top_p=c.train.top_p,
        enable_thinking=c.train.enable_thinking,
    )
    reward_cfg = reward.RewardConfig(**c.reward.to_dict())
    gcfg = _grpo_cfg(c)
    # metrics.jsonl (+ TensorBoard/wandb when installed) and the progress bar.
    logger = MetricsLogger(out_dir, total_steps=steps, initial_step=start_step)
    for s in range(start_step, steps):
        order = np.random.default_rng([c.seed, n, s // max(1, len(problems) // per)])
        idx = order.permutation(len(problems))
        chunk = [problems[i] for i in idx[(s % max(1, len(problems) // per)) * per :][:per]]
        key = jax.random.fold_in(jax.random.key(c.seed), n * 100_000 + s)
        t0 = time.perf_counter()
        batch, stats = rollout.rollout(
            trainer, tokenizer, chunk, c.train.group_size, sampling, reward_cfg, key, grpo_cfg=gcfg
        )
        updates = trainer.train_on(batch, c.train.num_iterations)
        row = {
            "round": n,
            "seconds": time.perf_counter() - t0,
            **stats.as_dict(),
            **{f"train_{k}": v for k, v in updates[-1].items()},
        }
        logger.log(s + 1, row)  # step = updates done in this round
        if (s + 1) % c.train.checkpoint_every == 0 or s + 1 == steps:
            trainer.save(ckpt_dir, {"round": n, "step": s + 1}, wait=True)
    logger.close()


def _engineer(n, records, current, c, trainer, tokenizer, base_model, out_dir) -> Decision:
    inject = {}
    name = c.engineer.settings.name
    if name in ("policy", "base"):
        model_fn = trainer.model if name == "policy" else (lambda: base_model)
        e = c.engineer
        inject["generate_fn"] = policy_fns.make_generate_fn(
            model_fn, tokenizer, e.max_new_tokens, e.temperature, seed=c.seed * 1000 + n
        )
        inject["score_fn"] = policy_fns.make_score_fn(model_fn, tokenizer)
    engineer = eng_lib.make_engineer(c.engineer.settings, **inject)
    context = ctx_lib.build_context(records, current, c.engineer.modules)
    from mapfjax.engineer.prompt import build_prompt

    prompt = build_prompt(context, current)
    io.atomic_write(out_dir / "engineer_prompt.md", prompt.encode())
    rng = np.random.default_rng([c.seed, n, 7])
    decision = engineer.propose(context, current, rng, records=tuple(records))
    _write_json(out_dir / "decision.json", decision.to_dict())
    return decision


def run(config: ml_collections.ConfigDict, workdir, progress: bool = True) -> list:
    """Run (or continue) the loop; returns the finished rounds' RoundRecords."""
    c = config
    workdir = pathlib.Path(workdir)
    check_run_dir(workdir, c)
    tokenizer = tok_lib.load_tokenizer(c.model.path)
    dtype = jnp.dtype(c.model.dtype)
    mesh = parallel.make_mesh(c.mesh.to_dict()) if jax.device_count() > 1 else None
    model = hf.from_pretrained(c.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh)
    base_model = (
        hf.from_pretrained(c.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh)
        if c.engineer.settings.name == "base"
        else None
    )
    steps = _steps_per_round(c)
    trainer = Trainer(
        model, _optim(c, steps * c.rounds), "grpo", mesh, loss_cfg=_grpo_cfg(c), seed=c.seed
    )
    ckpt_dir = (workdir / "checkpoints").absolute()
    position = {"round": 0, "step": 0}
    if ckpt_dir.exists() and any(ckpt_dir.iterdir()):
        position = trainer.restore(ckpt_dir)
        log.info("resumed from %s at %s", ckpt_dir, position)
    val_set = _validation_set(workdir, c)
    records: list[ctx_lib.RoundRecord] = []
    current = c.env.copy_and_resolve_references()
    for n in range(c.rounds):
        out = workdir / f"round_{n}"
        out.mkdir(exist_ok=True)
        if (out / "DONE").exists():
            record, decision = finished_round(workdir, n, c, position)
            records.append(record)
            if decision is not None:
                current = decision.config
            continue
        _write_json(out / "config.json", current.to_dict())
        done_steps = position["step"] if position["round"] == n else 0
        if position["round"] > n:
            raise RunDirError(f"{ckpt_dir} is at round {position['round']} but {out} is not DONE")
        _train_round(trainer, tokenizer, n, current, c, out, ckpt_dir, done_steps)
        position = {"round": n, "step": steps}
        val, rows = _validate(trainer, tokenizer, val_set, c, out)
        record = ctx_lib.RoundRecord(
            round=n,
            config=current.to_dict(),
            validation=ctx_lib.failure_breakdown(rows),
            summary=_previous_summary(workdir, n, position),
            training=_training_info(c, n),
        )
        records.append(record)
        if n + 1 < c.rounds:
            decision = _engineer(n, records, current, c, trainer, tokenizer, base_model, out)
            current = decision.config
        _write_json(out / "record.json", record.to_dict())
        if c.export_every_round or n + 1 == c.rounds:
            hf.save_pretrained(trainer.model(), out / "model", copy_from=c.model.path)
        io.atomic_write(out / "DONE", b"")
    trainer.close()
    return records


def records_summary(records) -> list[dict]:
    """Per round: mean valid/optimal over sizes (for logs and tests)."""
    return [
        dataclasses.asdict(r) | {"mean_valid": ctx_lib.mean_valid_rate(r.validation)}
        for r in records
    ]
