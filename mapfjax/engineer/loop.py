"""The closed loop, rounds R0..Rk: generate -> GRPO -> validate -> context -> engineer -> project.

Every artifact of a round lands in `workdir/round_<n>/`; a round is finished when its `DONE`
file exists. Killing the process at any moment and rerunning the same command continues where
it stopped: finished rounds are loaded, an unfinished round resumes from the trainer's latest
checkpoint (its data position is saved with it) and nothing finished is recomputed. The run
directory's bookkeeping lives in `rundir.py`, round records in `records.py`, the held-out
validation in `validation.py` and the config's checks in `settings.py`.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mapfjax import files, parallel, streams
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer import engineers as eng_lib
from mapfjax.engineer import policy as policy_fns
from mapfjax.engineer import records as rec
from mapfjax.engineer import rundir
from mapfjax.engineer import validation as val_lib
from mapfjax.engineer.proposal import Decision, diff_dict
from mapfjax.engineer.records import ROUND_FILES, finished_round, records_summary
from mapfjax.engineer.rundir import RunDirError, check_run_dir, redacted
from mapfjax.engineer.settings import RunSettings, check_config
from mapfjax.engineer.validation import validation_summary, validation_table
from mapfjax.env import io
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import driver
from mapfjax.rl.data import generate_problems
from mapfjax.rl.trainer import Trainer

# The loop's names, and those of its siblings that callers reach through it.
__all__ = [
    "ROUND_FILES",
    "EngineerError",
    "RunDirError",
    "RunSettings",
    "check_config",
    "check_run_dir",
    "finished_round",
    "records_summary",
    "redacted",
    "run",
    "validation_summary",
    "validation_table",
]

log = logging.getLogger(__name__)


class EngineerError(RuntimeError):
    """The engineer could not run and the run was asked to stop then (strict_engineer)."""


def run(
    config: ml_collections.ConfigDict, workdir, progress: bool = True, strict_engineer=False
) -> list:
    """Run (or continue) the loop; returns the finished rounds' RoundRecords.

    The config is checked and typed once (`RunSettings`); everything below reads those
    settings. Before round 0 the starting model is validated (workdir/start/); each round
    trains with `driver.run_phase` on its own training set and is validated on the same
    held-out set. The workdir is locked meanwhile (`files.dir_lock`). An engineer that fails
    to run keeps the config with a warning, or with strict_engineer raises EngineerError. A
    finished run given more rounds continues, its engineer deciding first after what was its
    last round. progress: bars, and one console line per round's phase (what it trains on,
    the held-out rate, what the engineer proposed)."""
    workdir = pathlib.Path(workdir)
    s = RunSettings.from_config(config)
    tokenizer = tok_lib.load_tokenizer(s.model.path)  # a bad model.path fails before the record
    check_run_dir(workdir, config)  # the config as given is the run's record
    # One run per workdir (only process 0 of a multi-process job holds the lock).
    lock = files.dir_lock(workdir, "--workdir") if jax.process_index() == 0 else None
    with lock or contextlib.nullcontext():
        return _run(s, workdir, tokenizer, _console(progress), strict_engineer)


def _console(progress: bool):
    """One line to the console (beside the progress bars), from process 0, when progress."""

    def say(line: str) -> None:
        if progress and jax.process_index() == 0:
            from tqdm.auto import tqdm

            tqdm.write(f"mapfjax: {line}", file=sys.stderr)
        log.info(line)

    say.progress = progress
    return say


def _greedy_rate(rows) -> str:
    """ "71.2 % (285 of 400)": the held-out greedy valid rate of validation rows."""
    k = sum(bool(r.get("valid")) for r in rows)
    return f"{100 * k / max(1, len(rows)):.1f} % ({k} of {len(rows)})"


def _proposal_line(n: int, decision: Decision) -> str:
    """What round n's engineer proposed for round n + 1, in one line."""
    edits = ", ".join(f"{k}={v}" for k, v in diff_dict(decision.diff).items())
    if decision.kept_current or not edits:
        why = f": {decision.reason}" if decision.reason else ""
        return f"round {n}: the {decision.engineer} engineer keeps the config{why}"
    return f"round {n}: the {decision.engineer} engineer proposes {edits} for round {n + 1}"


def _run(s: RunSettings, workdir: pathlib.Path, tokenizer, say, strict_engineer: bool) -> list:
    dtype = jnp.dtype(s.model.dtype)
    mesh = parallel.make_mesh(dict(s.mesh)) if jax.device_count() > 1 else None
    opts = s.model.options.kwargs()  # how it computes: attention_impl
    model = hf.from_pretrained(s.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh, **opts)
    base_model = (
        hf.from_pretrained(s.model.path, dtype=dtype, param_dtype=dtype, mesh=mesh, **opts)
        if s.engineer.name == "base"
        else None
    )
    settings = s.grpo
    steps = settings.steps
    loss_name, loss_cfg = settings.trainer_loss()
    trainer = Trainer(model, s.optim, loss_name, mesh, loss_cfg=loss_cfg, seed=s.seed)
    ckpt_dir = (workdir / "checkpoints").absolute()
    position = rundir.Position.of(driver.restore(trainer, ckpt_dir))
    if not all((workdir / f"round_{n}" / "DONE").exists() for n in range(s.rounds)):
        rundir.check_position(position, workdir, ckpt_dir, steps)  # training continues from it
    val = s.validation
    val_set = val_lib.held_out_set(workdir, val)
    held = {io.puzzle_hash(p) for p in val_set}
    say(
        f"{workdir}: {s.rounds} rounds of {steps} GRPO updates ({settings.problems_per_step} "
        f"puzzles x {settings.group_size} samples) from {s.model.path}, the {s.engineer.name} "
        f"engineer, {len(val_set)} held-out puzzles"
    )

    def validate(out_dir: pathlib.Path, key: jax.Array) -> list[dict]:
        thinking = settings.sampling.enable_thinking
        return val_lib.validate(trainer, tokenizer, val_set, val, thinking, out_dir, key)

    start_rows = _validate_start(workdir, position, ckpt_dir, s, validate)
    say(f"start: held-out greedy valid {_greedy_rate(start_rows)}")
    records: list[ctx_lib.RoundRecord] = []
    current = start_config(s)
    for n in range(s.rounds):
        out = workdir / f"round_{n}"
        out.mkdir(exist_ok=True)
        export = s.export_every_round or n + 1 == s.rounds
        if (out / "DONE").exists():
            record, decision = finished_round(workdir, n, s, position)
            records.append(record)
            if decision is None and n + 1 < s.rounds and position == (n, steps):
                # A finished run given more rounds: round n was its last, so its engineer never
                # ran; it runs now, on round n's weights (still the checkpoint's).
                decision = _engineer(
                    n, records, current, s, trainer, tokenizer, base_model, out, strict_engineer
                )
                rundir.record_digests(workdir, out / "decision.json")
                say(_proposal_line(n, decision))
            if decision is not None:
                current = decision.config
            if export and not (out / "model").exists():
                _export_again(trainer, out, s, position, n, steps)
            say(f"round {n}: finished earlier, read back from {out}")
            continue
        # 1. Generate round n's training set from the current config C_n.
        rundir.write_json(out / "config.json", current.to_dict())
        done_steps = position.step if position.round == n else 0
        if position.round > n:
            raise RunDirError(f"{ckpt_dir} is at round {position.round} but {out} is not DONE")
        problems = _train_set(out, current, s, n, held)
        sizes = sorted({max(p.height, p.width) for p in problems})
        say(
            f"round {n}: GRPO on {len(problems)} puzzles of sizes {sizes[0]}x{sizes[0]}-"
            f"{sizes[-1]}x{sizes[-1]} ({out / 'config.json'}), from update {done_steps}"
        )
        # 2. GRPO on it.
        driver.run_phase(
            trainer, tokenizer, problems, settings, seed=_phase_seed(s, n),
            position={"round": n}, out_dir=out, ckpt_dir=ckpt_dir, start_step=done_steps,
            progress=say.progress, label=f"round {n} GRPO", hooks=s.hooks,
        )  # fmt: skip
        position = rundir.Position(n, steps)
        # 3. Validate on the held-out set; the round's record is what the context reads.
        rows = validate(out, streams.key(s.seed, "validation", n))
        say(f"round {n}: held-out greedy valid {_greedy_rate(rows)}")
        counts = rec.validation_counts(rows)
        record = rec.round_record(workdir, n, s, current.to_dict(), counts, position)
        records.append(record)
        # 4. Context -> engineer -> projected config C_{n+1}.
        if n + 1 < s.rounds:
            decision = _engineer(
                n, records, current, s, trainer, tokenizer, base_model, out, strict_engineer
            )
            current = decision.config
            say(_proposal_line(n, decision))
        rundir.write_json(out / "record.json", record.to_dict())
        if export:
            _export(trainer, out, s)
        rundir.record_digests(workdir, *(out / f for f in ROUND_FILES if (out / f).exists()))
        files.atomic_write(out / "DONE", b"")
    trainer.close()
    return records


def start_config(s: RunSettings) -> ml_collections.ConfigDict:
    """Round 0's generator config: `env` itself, or with `env_start = "random"` a random
    config over env's sizes drawn from the seed (the random engineer's distribution, as the
    paper's round 0: data ~ Dirichlet(1), holes ~ U[0, 0.5], waits ~ U[0, 1], or U[0,
    env_start_max_wait]); the same seed gives the same config, so a resumed run starts from the
    config it started from."""
    if s.env_start == "config":
        return s.env_config()
    seed = streams.int_seed(streams.key(s.seed, "round-0 config"))
    draw = eng_lib.RandomEngineer(max_wait=s.env_start_max_wait)
    return draw.propose(None, s.env_config(), seed).config


def _validate_start(workdir: pathlib.Path, position, ckpt_dir: pathlib.Path, s, validate):
    """The starting model's held-out rows, validated in workdir/start/ once (before round 0
    trains) and read back after."""
    start = workdir / "start"
    if (start / "DONE").exists():
        rundir.check_digest(workdir, start / "validation.json")
        advice = f"restore it from a copy, or {rundir.START_OVER}"
        return rundir.read_json(start / "validation.json", advice).get("rows", [])
    if position != (0, 0):
        raise RunDirError(f"{start} is not DONE but {ckpt_dir} has trained past it")
    start.mkdir(exist_ok=True)
    rows = validate(start, streams.key(s.seed, "start validation"))
    rundir.record_digests(workdir, start / "validation.json")
    files.atomic_write(start / "DONE", b"")
    return rows


def _phase_seed(s: RunSettings, n: int) -> list[int]:
    """Round n's GRPO phase seed: its problem order and sampling keys (`driver.run_phase`)."""
    return [streams.int_seed(streams.key(s.seed, "training", n))]


def _train_set(out_dir: pathlib.Path, cfg_n, s: RunSettings, n: int, held: set[str]) -> list:
    """Round n's training set (generated once, then read back), without any puzzle of the
    held-out validation set."""
    path = out_dir / "train_set.jsonl"
    if path.exists():
        return rundir.read_instances(out_dir.parent, path)
    gen = cfg_n.copy_and_resolve_references()
    seed = streams.int_seed(streams.key(s.seed, "train set", n))
    drawn = generate_problems(gen, s.instances, seed=seed, processes=0)
    problems, dropped = io.held_out(drawn, held)
    if dropped:
        log.info("round %d: %d training puzzles are in the validation set; dropped", n, dropped)
    rundir.save_instances(out_dir.parent, path, problems)
    return problems


def _engineer(n, records, current, s, trainer, tokenizer, base_model, out_dir, strict) -> Decision:
    """Round n's engineer: context from the records -> a decision whose config is C_{n+1}
    (engineer_prompt.md and decision.json written to out_dir)."""
    e = s.engineer
    inject = {}
    if e.name in ("policy", "base"):
        model_fn = trainer.model if e.name == "policy" else (lambda: base_model)
        key = streams.key(s.seed, "engineer sampling", n)
        inject["generate_fn"] = policy_fns.make_generate_fn(
            model_fn, tokenizer, e.max_new_tokens, e.temperature, key=key
        )
        inject["score_fn"] = policy_fns.make_score_fn(model_fn, tokenizer)
    engineer = eng_lib.make_engineer(e.settings, **inject)
    context = ctx_lib.build_context(records, current, e.modules)
    rng = np.random.default_rng(streams.int_seed(streams.key(s.seed, "engineer choice", n)))
    decision = engineer.propose(context, current, rng, records=tuple(records))
    failed = eng_lib.failure(decision)
    if failed and strict:
        raise EngineerError(
            f"round {n}: the {e.name} engineer failed ({failed}); fix it and rerun (round {n} "
            "resumes at its engineer step), or run without --strict_engineer to keep the config"
        )
    if failed:  # else a long run quietly becomes the fixed baseline
        log.warning(
            "round %d: the %s engineer failed (%s); the config is kept for round %d "
            "(--strict_engineer stops the run instead)", n, e.name, failed, n + 1,
        )  # fmt: skip
    # The prompt the engineer actually sent (its context when it sends none).
    files.atomic_write(out_dir / "engineer_prompt.md", (decision.prompt or context).encode())
    rundir.write_json(out_dir / "decision.json", decision.to_dict())
    return decision


def _export(trainer, out: pathlib.Path, s: RunSettings) -> None:
    """Round `out`'s model as a Hugging Face checkpoint that says how it is decoded (the run's
    prompt mode and validation budget)."""
    generation = hf.GenerationSettings(
        enable_thinking=s.grpo.sampling.enable_thinking,
        max_new_tokens=int(s.validation.max_new_tokens),
    )
    hf.save_pretrained(trainer.model(), out / "model", copy_from=s.model.path,
                       generation=generation)  # fmt: skip


def _export_again(trainer, out: pathlib.Path, s, position, n: int, steps: int) -> None:
    """A finished round's exported model that was deleted: written again from the checkpoint
    when it still holds that round's weights, else a warning."""
    if position == (n, steps):
        log.warning("%s: missing; exported again from the round's checkpoint", out / "model")
        _export(trainer, out, s)
    else:
        log.warning(
            "%s: missing and cannot be exported again (the checkpoint is at round %s)",
            out / "model", position.round,
        )  # fmt: skip
