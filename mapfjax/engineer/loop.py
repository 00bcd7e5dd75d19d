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
import dataclasses
import json
import logging
import math
import pathlib
import sys
import time

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
from mapfjax.models import hf, sampler
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
    config: ml_collections.ConfigDict,
    workdir,
    progress: bool = True,
    strict_engineer=False,
    check_memory_plan: bool = True,
) -> list:
    """Run (or continue) the loop; returns the finished rounds' RoundRecords.

    The config is checked and typed once (`RunSettings`); everything below reads those
    settings. Before round 0 the starting model is validated (workdir/start/); each round
    trains with `driver.run_phase` on its own training set and is validated on the same
    held-out set. The workdir is locked meanwhile (`files.dir_lock`). An engineer that fails
    to run keeps the config with a warning, or with strict_engineer raises EngineerError. A
    finished run given more rounds continues, its engineer deciding first after what was its
    last round. progress: bars, and one console line per round's phase (what it trains on,
    the held-out rate, what the engineer proposed). check_memory_plan: on devices that report
    how much memory they allow (accelerators), refuse with MemoryPlanError, before anything is
    written, a run one of whose phases would not fit (`memory_plan`, `check_memory`)."""
    workdir = pathlib.Path(workdir)
    s = RunSettings.from_config(config)
    tokenizer = tok_lib.load_tokenizer(s.model.path)  # a bad model.path fails before the record
    limit = parallel.device_bytes_limit()
    if check_memory_plan and limit is not None:  # CPU keeps no memory statistics: no check
        mesh = parallel.make_mesh(dict(s.mesh)) if jax.device_count() > 1 else None
        model_config, _ = hf.read_config(hf._resolve(s.model.path))
        tokens = prompt_tokens(tokenizer, s.grpo.sampling.bucket, s.grpo.sampling.enable_thinking)
        kind = jax.devices()[0].device_kind
        plans = memory_plan(s, mesh, model_config, tokens, shard_rows=jax.process_count() == 1)
        check_memory(plans, limit, f"a {kind} here")
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
    mesh = parallel.make_mesh(dict(s.mesh)) if jax.device_count() > 1 else None
    # Under the mesh every sampler call (rollouts, validation, the engineer, the benchmark)
    # shards its rows and caches over data x fsdp, as the trainer shards its batches; without
    # it each device decodes every row. One process only: the sampler reads its rows' stop
    # flags on the host as a local array (`sampler.generate`), which a job of several
    # processes holds in parts.
    shard_rows = mesh is not None and jax.process_count() == 1
    with jax.set_mesh(mesh) if shard_rows else contextlib.nullcontext():
        return _rounds(s, workdir, tokenizer, say, strict_engineer, mesh)


def _rounds(s: RunSettings, workdir: pathlib.Path, tokenizer, say, strict_engineer: bool,
            mesh) -> list:  # fmt: skip
    dtype = jnp.dtype(s.model.dtype)
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

    timed = _phase_timer(workdir)
    with timed("start validation", when=not (workdir / "start" / "DONE").exists()):
        start_rows = _validate_start(workdir, position, ckpt_dir, s, validate)
    say(f"start: held-out greedy valid {_greedy_rate(start_rows)}")
    if s.benchmark is not None:
        built = (workdir / val_lib.BENCHMARK_DIR / "instances.jsonl").exists()
        with timed("benchmark build", when=not built):
            bench_set = val_lib.benchmark_set(workdir, s.benchmark, say.progress)
        with timed("start benchmark", when=not val_lib.benchmark_done(workdir, "start")):
            _benchmark(workdir, "start", trainer, tokenizer, bench_set, s, position, say)
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
        with timed(f"round {n} training set"):
            problems = _train_set(out, current, s, n, held)
        sizes = sorted({max(p.height, p.width) for p in problems})
        say(
            f"round {n}: GRPO on {len(problems)} puzzles of sizes {sizes[0]}x{sizes[0]}-"
            f"{sizes[-1]}x{sizes[-1]} ({out / 'config.json'}), from update {done_steps}"
        )
        # 2. GRPO on it.
        with timed(f"round {n} GRPO", updates=steps - done_steps):
            driver.run_phase(
                trainer, tokenizer, problems, settings, seed=_phase_seed(s, n),
                position={"round": n}, out_dir=out, ckpt_dir=ckpt_dir, start_step=done_steps,
                progress=say.progress, label=f"round {n} GRPO", hooks=s.hooks,
            )  # fmt: skip
        position = rundir.Position(n, steps)
        # 3. Validate on the held-out set; the round's record is what the context reads.
        with timed(f"round {n} validation"):
            rows = validate(out, streams.key(s.seed, "validation", n))
        say(f"round {n}: held-out greedy valid {_greedy_rate(rows)}")
        counts = rec.validation_counts(rows)
        record = rec.round_record(workdir, n, s, current.to_dict(), counts, position)
        records.append(record)
        # 4. Context -> engineer -> projected config C_{n+1}.
        if n + 1 < s.rounds:
            with timed(f"round {n} engineer"):
                decision = _engineer(
                    n, records, current, s, trainer, tokenizer, base_model, out, strict_engineer
                )
            current = decision.config
            say(_proposal_line(n, decision))
        rundir.write_json(out / "record.json", record.to_dict())
        if export:
            with timed(f"round {n} export"):
                _export(trainer, out, s)
        rundir.record_digests(workdir, *(out / f for f in ROUND_FILES if (out / f).exists()))
        files.atomic_write(out / "DONE", b"")
    if s.benchmark is not None:
        last = f"round_{s.rounds - 1}"
        with timed("final benchmark", when=not val_lib.benchmark_done(workdir, last)):
            _benchmark(workdir, last, trainer, tokenizer, bench_set, s, position, say)
        _benchmark_comparison(workdir, bench_set, ("start", last))
    trainer.close()
    return records


def _phase_timer(workdir: pathlib.Path):
    """timed(phase, when=True, **extra): a context manager that appends the phase's wall
    seconds and, where the device keeps memory statistics, its high-water mark of allocated
    bytes so far (the largest over this process's devices) to workdir/phases.jsonl (process 0),
    beside `extra`: what each phase of a run costs, for comparison with the memory plan. A
    phase with `when` False (finished earlier, read back) is not logged."""

    @contextlib.contextmanager
    def timed(phase: str, when: bool = True, **extra):
        start = time.perf_counter()
        yield
        if not when or jax.process_index() != 0:
            return
        row = {"phase": phase, "seconds": round(time.perf_counter() - start, 3), **extra}
        peak = parallel.peak_bytes_in_use()
        if peak is not None:
            row["peak_bytes"] = peak
        files.append_lines(workdir / PHASES, [json.dumps(row) + "\n"])

    return timed


PHASES = "phases.jsonl"  # one line per phase of the run: seconds and the device's peak bytes


def _benchmark(workdir, name: str, trainer, tokenizer, problems, s: RunSettings, position,
               say) -> None:  # fmt: skip
    """The benchmark evaluation `name` ("start": the starting model, before round 0 trains;
    "round_<n>": round n's model, the trainer's after the last round), unless finished."""
    if val_lib.benchmark_done(workdir, name):
        val_lib.benchmark_rows(workdir, name, problems)  # read back, checked
        return
    want = rundir.Position(0, 0) if name == "start" else rundir.Position(s.rounds - 1, s.grpo.steps)
    if position != want:
        raise RunDirError(
            f"{workdir / val_lib.BENCHMARK_DIR / name} is not DONE and the checkpoint (at "
            f"{position.to_dict()}) no longer holds that model's weights; {rundir.START_OVER}"
        )
    from mapfjax.eval import paper

    family = paper.model_family(checkpoint=s.model.path)
    say(f"benchmark: {len(problems)} puzzles answered by the {name} model")
    rows = val_lib.benchmark_eval(
        workdir, name, trainer, tokenizer, problems, s.benchmark,
        s.grpo.sampling.enable_thinking, "start" if name == "start" else name, family,
        say.progress,
    )  # fmt: skip
    say(f"benchmark: the {name} model is valid on {_greedy_rate(rows)}")


def _benchmark_comparison(workdir: pathlib.Path, problems, names: tuple[str, ...]) -> None:
    """benchmark/comparison.md and .json: the finished evaluations `names`, paired."""
    runs = [(name, val_lib.benchmark_rows(workdir, name, problems)) for name in names]
    text, data = val_lib.benchmark_comparison(problems, runs)
    where = workdir / val_lib.BENCHMARK_DIR
    files.atomic_write(where / val_lib.COMPARISON, text + "\n")
    rundir.write_json(where / "comparison.json", data)


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


# ------------------------------------------------------------------------ the memory plan

# The engineer's prompt, planned generously: the V6 context of a round over 8 map sizes is
# about 2,500 tokens [ours].
ENGINEER_PROMPT_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    """One phase of a run on one device: XLA's peak for its program (`program`: arguments +
    outputs - donated + temporaries, plus the sampler's last cache growth), the bytes that
    stay allocated beside it (`resident`: the optimiser moments, a reference or base model),
    what it runs and the settings that make it smaller."""

    phase: str
    program: int
    resident: int
    what: str
    settings: str

    @property
    def total(self) -> int:
        return self.program + self.resident


def prompt_tokens(tokenizer, bucket: str, enable_thinking: bool):
    """tokens(agents, size): the padded length of the prompt of a puzzle of that many agents
    on that size (chat-formatted, padded by the length rule `bucket`; the text's length
    depends on the size and the agents, not on where they stand). Without a tokenizer: the
    prompt's characters / 2.5, a bound on byte-level BPEs for this text."""
    from mapfjax.env import text
    from mapfjax.env.types import Problem
    from mapfjax.rl.data import encode_prompts

    def tokens(agents: int, size: int) -> int:
        cells = [divmod(i, size) for i in range(size * size)]  # starts first, goals last
        grid = tuple("F" * size for _ in range(size))
        problem = Problem("plan", grid, tuple(cells[:agents]), tuple(cells[-agents:]))
        if tokenizer is None:
            n = math.ceil(len(text.render_prompt(problem)) / 2.5) + 32  # + the chat template
        else:
            n = len(encode_prompts(tokenizer, [problem], enable_thinking)[0])
        return sampler.BUCKETS[bucket](n)

    return tokens


def memory_plan(
    s: RunSettings, mesh, config, prompt_len, accelerator_graph: bool = False,
    shard_rows: bool = True,
):  # fmt: skip
    """The run's phases on `mesh` (None: one device) as XLA plans them, bytes per device
    (`PhasePlan`s): a GRPO step's rollout (every sampled row to the token budget, the cache's
    last growth included) and update (its micro-batches, remat and parts), a validation
    chunk, the engineer's sampling and a benchmark chunk. `config`: the model's Qwen3Config;
    prompt_len(agents, size): padded prompt tokens (`prompt_tokens`). Nothing is allocated:
    the programs are lowered on abstract arrays and compiled for the devices of `mesh`.
    accelerator_graph: plan an accelerator's attention (no CPU score blocks) while compiling
    on CPU devices. shard_rows: the sampler's rows split over the mesh, as in a job of one
    process (`_run`); else every device decodes every row."""
    from flax import nnx

    from mapfjax.models.qwen3 import Qwen3
    from mapfjax.rl import step as step_lib

    dtype = jnp.dtype(s.model.dtype)
    kw = {"attention_block": 0} if accelerator_graph else {}

    def make():
        return Qwen3(config, dtype=dtype, param_dtype=dtype,
                     attention_impl=s.model.options.attention_impl, **kw)  # fmt: skip

    mesh = mesh if mesh is not None else parallel.make_mesh({}, devices=jax.devices()[:1])
    g = s.grpo
    graphdef, state = parallel.abstract_sharded_state(make, mesh, "train")
    per_device = lambda tree: sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
    )  # fmt: skip
    params = per_device(state)
    loss_name, loss_cfg = g.trainer_loss()
    setup = step_lib.setup_step(nnx.eval_shape(make), s.optim, loss_name, loss_cfg, mesh, "train")
    train_state = jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
        setup.abstract, setup.shardings,
    )  # fmt: skip
    resident = per_device(train_state) - params  # the moments, step and rng beside the weights
    if g.loss.kl_coef > 0:
        resident += params  # the reference model's weights
    if s.engineer.name == "base":
        resident += params  # the base engineer's model
    shards = math.prod(mesh.shape[a] for a in ("data", "fsdp"))
    env_agents = int(s.env.num_agents)
    env_size = max(int(k[1:]) for k in s.env.sizes)
    val = s.validation

    rows_mesh = mesh if shard_rows else None

    def sample(prompts: int, group: int, prompt: int, budget: int) -> int:
        if shard_rows:
            prompts = shards * math.ceil(prompts / shards)  # the sampler pads its groups so
        lowered = sampler.lower_generate(
            graphdef, state, batch=prompts * group, prompt_len=prompt, max_new_tokens=budget,
            mesh=rows_mesh, num_samples=group,
        )  # fmt: skip
        with jax.set_mesh(mesh) if shard_rows else contextlib.nullcontext():
            peak = parallel.memory_per_device(lowered)["peak"]
        grow = sampler.growth_bytes(
            config, batch=prompts * group, max_new_tokens=budget, mesh=rows_mesh,
            num_samples=group,
        )  # fmt: skip
        return peak + grow

    plans = []
    p_train = prompt_len(env_agents, env_size)
    t = g.sampling.max_new_tokens
    plans.append(PhasePlan(
        "rollout", sample(g.drawn_per_step, g.group_size, p_train, t), resident,
        f"{g.drawn_per_step} puzzles x {g.group_size} samples, {p_train} + {t} tokens",
        "train.problems_per_step (or train.oversample), train.max_new_tokens, more devices in "
        "mesh.data x mesh.fsdp",
    ))  # fmt: skip
    width = min(sampler.BUCKETS[g.sampling.completion_bucket](t), t)
    groups = g.problems_per_step // max(1, s.optim.length_split)
    lowered = step_lib.lower_train_step(
        make, s.optim, loss_name, loss_cfg, mesh, groups * g.group_size, p_train, width,
        with_ref_logprobs=g.loss.kl_coef > 0, group_size=g.group_size,
    )  # fmt: skip
    extra = params * ((g.loss.kl_coef > 0) + (s.engineer.name == "base"))
    plans.append(PhasePlan(
        "update", parallel.memory_per_device(lowered)["peak"], extra,
        f"{groups} puzzles x {g.group_size} completions of {width} tokens in "
        f"{s.optim.accum_steps} micro-batch(es), remat {s.optim.remat}",
        f"optim.accum_steps (now {s.optim.accum_steps}: micro-batches of "
        f"{groups // s.optim.accum_steps} puzzles, which shard over the mesh's {shards} data x "
        f"fsdp devices only in multiples of {shards}), optim.remat (now {s.optim.remat!r}; "
        "'full' keeps least), optim.length_split, mesh.tp",
    ))  # fmt: skip
    p_val = prompt_len(val.num_agents, max(val.sizes))
    rows = min(val.batch_size, val.per_size * len(val.sizes) * (1 + len(val.extra_seeds)))
    plans.append(PhasePlan(
        "validation", sample(rows, 1, p_val, val.max_new_tokens), resident,
        f"{rows} puzzles, {p_val} + {val.max_new_tokens} tokens",
        "validation.batch_size, validation.max_new_tokens",
    ))  # fmt: skip
    e = s.engineer
    if e.name in ("policy", "base"):
        n = int(e.settings.get("num_samples", 1))
        # the engineer's prompt is cut to what the model's positions leave (policy._fit)
        room = config.max_position_embeddings - e.max_new_tokens
        p_e = min(sampler.BUCKETS["pow2"](max(1, min(ENGINEER_PROMPT_TOKENS, room))), room)
        plans.append(PhasePlan(
            "engineer", sample(n, 1, p_e, e.max_new_tokens), resident,
            f"{n} proposals, {p_e} + {e.max_new_tokens} tokens",
            "engineer.settings.num_samples, engineer.max_new_tokens",
        ))  # fmt: skip
    b = s.benchmark
    if b is not None:
        p_b = prompt_len(max(b.agents), max(b.sizes))
        rows = min(b.batch_size, b.per_cell * len(b.spec().cells()))
        plans.append(PhasePlan(
            "benchmark", sample(rows, 1, p_b, b.max_new_tokens), resident,
            f"{rows} puzzles, {p_b} + {b.max_new_tokens} tokens",
            "benchmark.batch_size, benchmark.max_new_tokens",
        ))  # fmt: skip
    return plans


class MemoryPlanError(ValueError):
    """A phase of the run does not fit the devices it would run on."""


def check_memory(plans, limit: int, where: str) -> None:
    """MemoryPlanError, one line, for the first phase whose planned bytes exceed `limit` (bytes
    a device may allocate), naming the settings that make it smaller."""
    for p in plans:
        if p.total > limit:
            raise MemoryPlanError(
                f"memory plan: the {p.phase} ({p.what}) needs {size_text(p.total)} per device "
                f"but {where} allows {size_text(limit)}; change {p.settings} (python "
                "launch/memory_plan.py --config FILE --target NAME prints every phase)"
            )


def size_text(n: int) -> str:
    """Bytes as "12.3 GiB" (or MiB below a tenth of a GiB)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"
