"""The closed loop, rounds R0..Rk: generate -> GRPO -> validate -> context -> engineer -> project.

Every artifact of a round lands in `workdir/round_<n>/`; a round is finished when its `DONE`
file exists. Killing the process at any moment and rerunning the same command continues where
it stopped: finished rounds are loaded, an unfinished round resumes from the trainer's latest
checkpoint (its data position is saved with it) and nothing finished is recomputed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mapfjax import files, parallel, stats
from mapfjax.checks import is_finite_real, is_int, require, require_dtype, require_int
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer import engineers as eng_lib
from mapfjax.engineer import policy as policy_fns
from mapfjax.engineer.proposal import Decision
from mapfjax.env import config as env_config
from mapfjax.env import io, reward
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib
from mapfjax.presets import variants
from mapfjax.rl import driver, rollout
from mapfjax.rl.data import generate_problems, held_out
from mapfjax.rl.trainer import Trainer

log = logging.getLogger(__name__)

# Keys that may differ when an existing run directory is continued (everything else must match).
RESUMABLE_CHANGES = ("rounds",)


class RunDirError(ValueError):
    """The run directory belongs to a different config, or is corrupt."""


def _write_json(path: pathlib.Path, obj) -> None:
    files.atomic_write(
        path, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode()
    )


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


START_OVER = "start over: rerun the same command with a new --workdir"


# ------------------------------------------------------------------------ digests

DIGESTS = "digests.json"  # SHA-256 of the files a resume trusts, by path under the workdir


def _digests(workdir: pathlib.Path) -> dict:
    path = workdir / DIGESTS
    if not path.exists():
        return {}
    advice = "it records what this run wrote: restore it from a copy, or " + START_OVER
    digests = _read_json(path, advice)
    if not isinstance(digests, dict):
        raise RunDirError(f"{path}: not a JSON object; {advice}")
    return digests


def _record_digests(workdir: pathlib.Path, *paths: pathlib.Path) -> None:
    """Remember what `paths` hold now (checked by `_check_digest` when they are read back)."""
    digests = _digests(workdir)
    digests.update({p.relative_to(workdir).as_posix(): files.sha256(p) for p in paths})
    _write_json(workdir / DIGESTS, digests)


def _check_digest(workdir: pathlib.Path, path: pathlib.Path) -> None:
    """Refuse a file the run wrote and then someone changed: results paired over "the same
    puzzles" would silently compare different ones. A run written before digests existed gets
    its files recorded as they are."""
    want = _digests(workdir).get(path.relative_to(workdir).as_posix())
    if want is None:
        _record_digests(workdir, path)
    elif files.sha256(path) != want:
        raise RunDirError(
            f"{path}: changed since this run wrote it (its SHA-256 differs from the one in "
            f"{workdir / DIGESTS}); restore the original, or {START_OVER}"
        )


# ------------------------------------------------------------------------ the data position


def _check_position(position: dict, workdir: pathlib.Path, ckpt_dir: pathlib.Path, steps: int):
    """Refuse a checkpoint whose data position disagrees with the round records: training
    would skip updates (a step past the round's end) or redo finished rounds."""
    names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.is_dir() else []
    saved = sorted(int(n) for n in names if n.isdigit())
    where = f"{ckpt_dir / str(saved[-1])}" if saved else str(ckpt_dir)
    advice = (
        f"delete {where} to resume from the checkpoint before it, or {START_OVER}"
        if saved and len(saved) > 1
        else START_OVER
    )
    r, st = position.get("round"), position.get("step")
    if not (is_int(r) and is_int(st) and r >= 0 and 0 <= st <= steps):
        raise RunDirError(
            f"{where}: data position {position} is not a round >= 0 and a step in [0, {steps}] "
            f"(train.* gives {steps} updates per round); {advice}"
        )
    done = [p.parent.name[6:] for p in workdir.glob("round_*/DONE")]
    last = max((int(n) for n in done if n.isdigit()), default=-1)
    if r < last or (r == last and st != steps):
        raise RunDirError(
            f"{where}: data position {position} disagrees with the round records "
            f"({workdir / f'round_{last}' / 'DONE'} exists, so the checkpoint must be at round "
            f"{last} step {steps} or later); {advice}"
        )


VALIDATION_KEYS = (
    "num_agents", "sizes", "per_size", "hole_ratio", "hole_ratios", "wait_ratio", "samples",
    "seed", "max_new_tokens", "batch_size",
)  # fmt: skip
ENGINEER_KEYS = ("settings", "modules", "variant", "max_new_tokens", "temperature")


def _check_validation(v: ml_collections.ConfigDict, max_size: int) -> None:
    unknown = sorted(set(v.keys()) - set(VALIDATION_KEYS))
    require("validation: unknown key(s)", unknown, not unknown, str(list(VALIDATION_KEYS)))
    agents = v.get("num_agents")
    require("validation.num_agents", agents, is_int(agents) and 1 <= agents <= 5, "1 to 5")
    sizes = v.get("sizes")
    ok = isinstance(sizes, tuple | list) and len(sizes) > 0
    lo = env_config.MIN_SIZE
    require("validation.sizes", sizes, ok, f"a non-empty tuple of map sizes in [{lo}, {max_size}]")
    for n in sizes:
        ok = is_int(n) and lo <= n <= max_size and n * n >= 2 * agents
        require(
            "validation.sizes", sizes, ok,
            f"map sizes in [{lo}, env.max_size={max_size}] with room for {agents} starts and goals",
        )  # fmt: skip
    require_int("validation.per_size", v.get("per_size"), 1)
    env_config.check_hole_ratios((v.get("hole_ratio"),), "validation.hole_ratio")
    env_config.check_hole_ratios(v.get("hole_ratios", ()), "validation.hole_ratios")
    wait = v.get("wait_ratio")
    require("validation.wait_ratio", wait, is_finite_real(wait) and 0 <= wait <= 1, "[0, 1]")
    for key, least in (("samples", 0), ("seed", 0), ("max_new_tokens", 1), ("batch_size", 1)):
        require_int(f"validation.{key}", v.get(key, least), least)


def _check_engineer(e: ml_collections.ConfigDict) -> None:
    unknown = sorted(set(e.keys()) - set(ENGINEER_KEYS))
    require("engineer: unknown key(s)", unknown, not unknown, str(list(ENGINEER_KEYS)))
    eng_lib.make_engineer(e.settings)  # name, keys and values (functions are injected later)
    ctx_lib.check_modules(e.modules)
    tokens, temp = e.get("max_new_tokens", 1), e.get("temperature", 0.0)
    require_int("engineer.max_new_tokens", tokens, 1)
    require("engineer.temperature", temp, is_finite_real(temp) and temp >= 0, "a number >= 0")
    name = e.get("variant")
    if name is None or name == "custom":
        return
    allowed = f"one of {sorted(variants.VARIANTS)}, or 'custom' for hand-set modules"
    require("engineer.variant", name, name in variants.VARIANTS, allowed)

    want = ctx_lib.check_modules(variants.get_config(name).modules)
    have = ctx_lib.check_modules(e.modules)
    fixes = [
        f"--config.engineer.modules.{m}.{opt}={want.get(m, {}).get(opt, False)}"
        for m in ctx_lib.MODULES
        for opt in ("enabled", "include_default")  # what a variant decides (T's detail is free)
        if want.get(m, {}).get(opt, False) != have.get(m, {}).get(opt, False)
    ]
    if fixes:
        raise ValueError(
            f"engineer.variant = {name!r} but engineer.modules are not {name}'s (the variant is "
            f"only a label): add {' '.join(fixes)}, or set engineer.variant=custom"
        )


def check_config(c: ml_collections.ConfigDict) -> None:
    """Check a whole run config before anything is loaded or written (a bad key found after
    round 0's training would cost the round): raises ValueError naming the key, its value and
    what is allowed."""
    require_int("rounds", c.get("rounds"), 1)
    require_int("seed", c.get("seed"), 0)
    env_config.validate_at(c.env, "env")
    require_dtype("model.dtype", c.model.dtype)
    settings = driver.GRPOSettings.from_config(c)
    driver.optim_config(c, settings.steps, c.rounds).validate()
    _check_validation(c.validation, c.env.max_size)
    _check_engineer(c.engineer)
    try:  # a size that cannot take effect (mesh.tp=3 on one device) is refused, not ignored
        parallel.make_mesh(c.mesh.to_dict())
    except (ValueError, TypeError) as e:
        n = jax.device_count()
        raise ValueError(
            f"mesh = {c.mesh.to_dict()}: {e}; allowed: --config.mesh.data/fsdp/tp sizes whose "
            f"product is the {n} device(s) here (one of them may be -1)"
        ) from None


SECRET_KEYS = ("api_key",)  # never written to a run directory (results get copied and shared)


def redacted(obj):
    """A JSON-like value with every non-empty SECRET_KEYS entry replaced by "<set>"."""
    if isinstance(obj, dict):
        return {k: "<set>" if k in SECRET_KEYS and v else redacted(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redacted(v) for v in obj]
    return obj


def check_run_dir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """Record the run's config on first use; refuse a different one later, naming the keys."""
    try:
        files.check_dir(workdir, "--workdir")
    except NotADirectoryError as e:
        raise RunDirError(str(e)) from None
    path = workdir / "run_config.json"
    current = redacted(json.loads(config.to_json_best_effort()))
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
        if before.get(k) != now.get(k)
        and k not in RESUMABLE_CHANGES
        and k.rsplit(".", 1)[-1] not in SECRET_KEYS  # a key may move to the environment
    )
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in differ[:10])
        raise RunDirError(
            f"{workdir} holds a run with a different config ({len(differ)} key(s) differ: "
            f"{shown}); use another --workdir or the same config"
        )


def _validation_set(workdir: pathlib.Path, c) -> list:
    """The fixed held-out validation set (generated once, then read back): per_size puzzles
    per size, spread over validation.hole_ratios when given (else validation.hole_ratio)."""
    path = workdir / "validation_set.jsonl"
    if path.exists():
        return _read_instances(workdir, path)
    v = c.validation
    cfg = env_config.default_config(v.num_agents, tuple(v.sizes), v.hole_ratio, v.wait_ratio)
    holes = tuple(v.get("hole_ratios", ()))
    probs = generate_problems(cfg, v.per_size * len(v.sizes), v.seed, 1, holes)
    io.save_instances(path, probs)
    _record_digests(workdir, path)
    return probs


def _read_instances(workdir: pathlib.Path, path: pathlib.Path) -> list:
    """A problem set this run wrote, checked against its digest."""
    _check_digest(workdir, path)
    problems = io.load_instances(path)
    if not problems:
        raise RunDirError(f"{path}: no instances; {START_OVER}")
    return problems


def _steps_per_round(c) -> int:
    return driver.GRPOSettings.from_config(c).steps


def _training_info(c, n: int) -> dict:
    """The T module's facts about round n's training (part of its record)."""
    return {
        "round": n,
        "epoch": c.train.epochs,
        "steps": _steps_per_round(c),
        "lr": c.optim.lr,
        "group_size": c.train.group_size,
        "num_iterations": c.train.get("num_iterations", 1),
        "temperature": c.train.temperature,
        **c.grpo.to_dict(),
    }


def _previous_summary(workdir: pathlib.Path, n: int, position: dict) -> str:
    """S: the engineer's rationale for choosing C_n, written at the end of round n - 1."""
    prev = workdir / f"round_{n - 1}" / "decision.json"
    if n == 0 or not prev.exists():
        return ""
    return _read_json(prev, _redo_advice(workdir, n - 1, position)).get("summary", "")


# A finished round's files that its successors and the report trust (record.json is derived
# from them and recomputed when unreadable).
ROUND_FILES = ("config.json", "validation.json", "decision.json")


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
            rollouts=_rollouts(out, c),
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
    # The report reads the rows: a torn file is named here, not in a traceback later.
    _read_json(out / "validation.json", advice)
    for name in ROUND_FILES:
        if (out / name).exists():
            _check_digest(workdir, out / name)
    return record, decision


def _rollouts(out_dir: pathlib.Path, c) -> dict:
    """The round's per-size training-rollout statistics (`RoundRecord.rollouts`)."""
    per_size = driver.phase_size_stats(out_dir / "metrics.jsonl", c.train.group_size)
    return driver.size_summary(per_size)


def _validate(trainer, tokenizer, problems, c, out_dir: pathlib.Path, key_seed: int):
    """Greedy answers, and `validation.samples` answers at temperature 1, on the held-out set;
    writes validation.json (one row per puzzle) and validation.md (rates with 95 % intervals
    per size and pooled). Returns the rows."""
    v = c.validation
    greedy = rollout.greedy_eval(
        trainer,
        tokenizer,
        problems,
        max_new_tokens=v.max_new_tokens,
        batch_size=v.batch_size,
        enable_thinking=c.train.get("enable_thinking", False),
    )
    rows = [dict(r) for r in greedy.rows]
    k = int(v.get("samples", 0))
    if k:
        hits = _sample_hits(trainer, tokenizer, problems, k, c, key_seed)
        for row, h in zip(rows, hits, strict=True):
            row["samples"], row["samples_valid"] = k, int(h)
    _write_json(out_dir / "validation.json", {"rows": rows, **validation_summary(rows)})
    files.atomic_write(out_dir / "validation.md", (validation_table(rows) + "\n").encode())
    return rows


def _sample_hits(trainer, tokenizer, problems, k: int, c, key_seed: int) -> list[int]:
    """Valid answers among k samples at temperature 1, per problem."""
    v = c.validation
    cfg = rollout.SamplingConfig(
        max_new_tokens=v.max_new_tokens,
        temperature=1.0,
        enable_thinking=c.train.get("enable_thinking", False),
    )
    model = rollout.policy_model(trainer)
    per = max(1, v.batch_size // k)
    hits: list[int] = []
    for i in range(0, len(problems), per):
        chunk = problems[i : i + per]
        key = jax.random.fold_in(jax.random.key(key_seed), i)
        texts = rollout.sample(model, tokenizer, chunk, k, cfg, key).texts
        verdict, _ = rollout.score(chunk, k, texts, reward.RewardConfig())
        hits += np.asarray(verdict.valid).reshape(-1, k).sum(1).tolist()
    return hits


def _estimates(rows) -> dict[str, stats.Estimate]:
    """Greedy valid (Wilson interval) and mean@k (bounded-mean interval) over `rows`."""
    out = {"greedy_valid": stats.proportion([r["valid"] for r in rows])}
    if rows and "samples" in rows[0]:
        out["mean_at_k"] = stats.bounded_mean([r["samples_valid"] / r["samples"] for r in rows])
    return out


def _by_size(rows) -> list[tuple[str, list]]:
    sizes = sorted({r["size"] for r in rows})
    return [(f"{n}x{n}", [r for r in rows if r["size"] == n]) for n in sizes]


def validation_summary(rows) -> dict:
    """JSON-ready estimates ({"value", "low", "high", "n"}), pooled and per size."""

    def as_dicts(rs):
        return {k: e.as_dict() for k, e in _estimates(rs).items()}

    return {"pooled": as_dicts(rows), "per_size": {n: as_dicts(rs) for n, rs in _by_size(rows)}}


def validation_table(rows) -> str:
    """Markdown: per size and pooled, n, greedy valid % and mean@k % with 95 % intervals."""

    def cell(e: stats.Estimate) -> str:
        return f"{stats.percent(e.value)} [{stats.percent(e.low, 0)}, {stats.percent(e.high, 0)}]"

    sampled = bool(rows) and "samples" in rows[0]
    header = ["size", "n", "greedy valid %"]
    if sampled:
        header.append(f"mean@{rows[0]['samples']} %")
    table = []
    for name, rs in [*_by_size(rows), ("all", rows)]:
        e = _estimates(rs)
        line = [name, len(rs), cell(e["greedy_valid"])]
        table.append(line + ([cell(e["mean_at_k"])] if sampled else []))
    return stats.markdown_table(header, table)


class EngineerError(RuntimeError):
    """The engineer could not run and the run was asked to stop then (strict_engineer)."""


def _engineer(n, records, current, c, trainer, tokenizer, base_model, out_dir, strict) -> Decision:
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
    rng = np.random.default_rng([c.seed, n, 7])
    decision = engineer.propose(context, current, rng, records=tuple(records))
    failed = eng_lib.failure(decision)
    if failed and strict:
        raise EngineerError(
            f"round {n}: the {name} engineer failed ({failed}); fix it and rerun (round {n} "
            "resumes at its engineer step), or run without --strict_engineer to keep the config"
        )
    if failed:  # else a long run quietly becomes the fixed baseline
        log.warning(
            "round %d: the %s engineer failed (%s); the config is kept for round %d "
            "(--strict_engineer stops the run instead)", n, name, failed, n + 1,
        )  # fmt: skip
    # The prompt the engineer actually sent (its context when it sends none).
    files.atomic_write(out_dir / "engineer_prompt.md", (decision.prompt or context).encode())
    _write_json(out_dir / "decision.json", decision.to_dict())
    return decision


def _train_set(out_dir: pathlib.Path, cfg_n, c, n: int, held: set[str]) -> list:
    """Round n's training set (generated once, then read back), without any puzzle of the
    held-out validation set."""
    path = out_dir / "train_set.jsonl"
    if path.exists():
        return _read_instances(out_dir.parent, path)
    gen = cfg_n.copy_and_resolve_references()
    drawn = generate_problems(gen, c.train.instances, seed=c.seed * 1000 + n, processes=0)
    problems, dropped = held_out(drawn, held)
    if dropped:
        log.info("round %d: %d training puzzles are in the validation set; dropped", n, dropped)
    io.save_instances(path, problems)
    _record_digests(out_dir.parent, path)
    return problems


def run(
    config: ml_collections.ConfigDict, workdir, progress: bool = True, strict_engineer=False
) -> list:
    """Run (or continue) the loop; returns the finished rounds' RoundRecords.

    Before round 0 the starting model is validated (workdir/start/); each round trains with
    `driver.run_phase` on its own training set and is validated on the same held-out set.
    The workdir is locked meanwhile (`files.dir_lock`). An engineer that fails to run keeps the
    config with a warning, or with strict_engineer raises EngineerError."""
    c = config
    workdir = pathlib.Path(workdir)
    check_config(c)
    tokenizer = tok_lib.load_tokenizer(c.model.path)  # a bad model.path fails before the record
    check_run_dir(workdir, c)
    # One run per workdir (only process 0 of a multi-process job holds the lock).
    lock = files.dir_lock(workdir, "--workdir") if jax.process_index() == 0 else None
    with lock or contextlib.nullcontext():
        return _run(c, workdir, tokenizer, progress, strict_engineer)


def _run(c, workdir: pathlib.Path, tokenizer, progress: bool, strict_engineer: bool) -> list:
    dtype = jnp.dtype(c.model.dtype)
    mesh = parallel.make_mesh(c.mesh.to_dict()) if jax.device_count() > 1 else None
    model = hf.from_pretrained(c.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh)
    base_model = (
        hf.from_pretrained(c.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh)
        if c.engineer.settings.name == "base"
        else None
    )
    settings = driver.GRPOSettings.from_config(c)
    steps = settings.steps
    optim = driver.optim_config(c, steps, c.rounds)
    loss_name, loss_cfg = settings.trainer_loss()
    trainer = Trainer(model, optim, loss_name, mesh, loss_cfg=loss_cfg, seed=c.seed)
    ckpt_dir = (workdir / "checkpoints").absolute()
    position = driver.restore(trainer, ckpt_dir) or {"round": 0, "step": 0}
    if not all((workdir / f"round_{n}" / "DONE").exists() for n in range(c.rounds)):
        _check_position(position, workdir, ckpt_dir, steps)  # training continues from it
    val_set = _validation_set(workdir, c)
    held = {io.puzzle_hash(p) for p in val_set}
    start = workdir / "start"
    if not (start / "DONE").exists():
        if position != {"round": 0, "step": 0}:
            raise RunDirError(f"{start} is not DONE but {ckpt_dir} has trained past it")
        start.mkdir(exist_ok=True)
        _validate(trainer, tokenizer, val_set, c, start, key_seed=c.seed * 1000 - 1)
        _record_digests(workdir, start / "validation.json")
        files.atomic_write(start / "DONE", b"")
    else:
        _check_digest(workdir, start / "validation.json")
        _read_json(start / "validation.json", f"restore it from a copy, or {START_OVER}")
    records: list[ctx_lib.RoundRecord] = []
    current = c.env.copy_and_resolve_references()
    for n in range(c.rounds):
        out = workdir / f"round_{n}"
        out.mkdir(exist_ok=True)
        export = c.export_every_round or n + 1 == c.rounds
        if (out / "DONE").exists():
            record, decision = finished_round(workdir, n, c, position)
            records.append(record)
            if decision is not None:
                current = decision.config
            if export and not (out / "model").exists():
                _export_again(trainer, out, c, position, n, steps)
            continue
        _write_json(out / "config.json", current.to_dict())
        done_steps = position["step"] if position["round"] == n else 0
        if position["round"] > n:
            raise RunDirError(f"{ckpt_dir} is at round {position['round']} but {out} is not DONE")
        problems = _train_set(out, current, c, n, held)
        driver.run_phase(
            trainer, tokenizer, problems, settings, seed=[c.seed, n], position={"round": n},
            out_dir=out, ckpt_dir=ckpt_dir, start_step=done_steps, progress=progress,
        )  # fmt: skip
        position = {"round": n, "step": steps}
        rows = _validate(trainer, tokenizer, val_set, c, out, key_seed=c.seed * 1000 + n)
        record = ctx_lib.RoundRecord(
            round=n,
            config=current.to_dict(),
            validation=ctx_lib.failure_breakdown(rows),
            summary=_previous_summary(workdir, n, position),
            training=_training_info(c, n),
            rollouts=_rollouts(out, c),
        )
        records.append(record)
        if n + 1 < c.rounds:
            decision = _engineer(
                n, records, current, c, trainer, tokenizer, base_model, out, strict_engineer
            )
            current = decision.config
        _write_json(out / "record.json", record.to_dict())
        if export:
            hf.save_pretrained(trainer.model(), out / "model", copy_from=c.model.path)
        _record_digests(workdir, *(out / f for f in ROUND_FILES if (out / f).exists()))
        files.atomic_write(out / "DONE", b"")
    trainer.close()
    return records


def _export_again(trainer, out: pathlib.Path, c, position: dict, n: int, steps: int) -> None:
    """A finished round's exported model that was deleted: written again from the checkpoint
    when it still holds that round's weights, else a warning."""
    if position == {"round": n, "step": steps}:
        log.warning("%s: missing; exported again from the round's checkpoint", out / "model")
        hf.save_pretrained(trainer.model(), out / "model", copy_from=c.model.path)
    else:
        log.warning(
            "%s: missing and cannot be exported again (the checkpoint is at round %s)",
            out / "model", position["round"],
        )  # fmt: skip


def records_summary(records) -> list[dict]:
    """Per round: mean valid/optimal over sizes (for logs and tests)."""
    return [
        dataclasses.asdict(r) | {"mean_valid": stats.mean_rate(r.validation.values(), "valid")}
        for r in records
    ]
