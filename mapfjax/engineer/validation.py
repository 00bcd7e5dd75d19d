"""The closed loop's held-out validation: the fixed puzzle set (generated once, then read
back), greedy and sampled answers on it, and its rates with 95 % intervals per size and pooled
(validation.json, validation.md); and the optional final benchmark (`benchmark/`): the
starting and the final model on the same benchmark, paired per agent count, beside the
paper's section-5 table."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import jax
import numpy as np

from mapfjax import configfile, files, stats
from mapfjax.engineer.rundir import (
    START_OVER,
    RunDirError,
    check_digest,
    read_instances,
    record_digests,
    save_instances,
    write_json,
)
from mapfjax.engineer.settings import BenchmarkSettings, ValidationSettings
from mapfjax.env import benchmark, io, reward
from mapfjax.rl import rollout
from mapfjax.rl.data import generate_problems


def held_out_set(workdir: pathlib.Path, v: ValidationSettings) -> list:
    """The fixed held-out validation set (generated once, then read back): per_size puzzles
    per size, spread over `hole_ratios` when given (else `hole_ratio`), drawn with `v.seed`,
    then the same again from each of `v.extra_seeds` (ids prefixed `x<seed>_`; a puzzle
    already in the set is left out)."""
    path = workdir / "validation_set.jsonl"
    if path.exists():
        return read_instances(workdir, path)
    n = v.per_size * len(v.sizes)
    cfg, ratios = v.generator_config(), tuple(v.hole_ratios)
    probs = generate_problems(cfg, n, v.seed, 1, ratios)
    for seed in v.extra_seeds:
        drawn = generate_problems(cfg, n, seed, 1, ratios)
        drawn = [dataclasses.replace(p, id=f"x{seed}_{p.id}") for p in drawn]
        probs += io.held_out(drawn, {io.puzzle_hash(p) for p in probs})[0]
    save_instances(workdir, path, probs)
    return probs


def held_out_file(spec: str, root: pathlib.Path) -> pathlib.Path:
    """The held-out set of the training config `spec` (FILE.py or FILE.py:ARG) as an instance
    file under `root` (drawn as `held_out_set` draws it, in a folder keyed by the config's
    validation settings, so a changed config draws anew): what a tiny-model recipe keeps out
    of its SFT data (`sft.exclude`)."""
    path, _, arg = spec.partition(":")
    v = ValidationSettings.from_config(configfile.get_config(path, arg))
    key = json.dumps(dataclasses.asdict(v), sort_keys=True, default=list)
    where = root / hashlib.sha256(key.encode()).hexdigest()[:10]
    where.mkdir(parents=True, exist_ok=True)
    held_out_set(where, v)
    return where / "validation_set.jsonl"


def validate(trainer, tokenizer, problems, v: ValidationSettings, enable_thinking: bool,
             out_dir: pathlib.Path, key: jax.Array) -> list[dict]:  # fmt: skip
    """Greedy answers, and `v.samples` answers at temperature 1 drawn from `key`, on the
    held-out set; writes validation.json (one row per puzzle) and validation.md (rates with
    95 % intervals per size and pooled). Returns the rows."""
    greedy = rollout.greedy_eval(
        trainer,
        tokenizer,
        problems,
        max_new_tokens=v.max_new_tokens,
        batch_size=v.batch_size,
        enable_thinking=enable_thinking,
        bucket=v.bucket,
    )
    rows = [dict(r) for r in greedy.rows]
    k = int(v.samples)
    if k:
        hits = _sample_hits(trainer, tokenizer, problems, k, v, enable_thinking, key)
        for row, h in zip(rows, hits, strict=True):
            row["samples"], row["samples_valid"] = k, int(h)
    write_json(out_dir / "validation.json", {"rows": rows, **validation_summary(rows)})
    files.atomic_write(out_dir / "validation.md", (validation_table(rows) + "\n").encode())
    return rows


def _sample_hits(trainer, tokenizer, problems, k: int, v: ValidationSettings,
                 enable_thinking: bool, key: jax.Array) -> list[int]:  # fmt: skip
    """Valid answers among k samples at temperature 1, per problem."""
    cfg = rollout.SamplingConfig(
        max_new_tokens=v.max_new_tokens,
        temperature=1.0,
        enable_thinking=enable_thinking,
        bucket=v.bucket,
    )
    model = rollout.policy_model(trainer)
    per = max(1, v.batch_size // k)
    hits: list[int] = []
    for i in range(0, len(problems), per):
        chunk = problems[i : i + per]
        texts = rollout.sample(model, tokenizer, chunk, k, cfg, jax.random.fold_in(key, i)).texts
        verdict, _ = rollout.score(chunk, k, texts, reward.RewardConfig())
        hits += np.asarray(verdict.valid).reshape(-1, k).sum(1).tolist()
    return hits


def _estimates(rows) -> dict[str, stats.Estimate]:
    """Greedy valid (Wilson interval) and mean@k (bounded-mean interval) over `rows`."""
    out = {"greedy_valid": stats.proportion([r["valid"] for r in rows])}
    if rows and "samples" in rows[0]:
        out["mean_at_k"] = stats.bounded_mean([stats.sample_share(r) for r in rows])
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

    sampled = bool(rows) and "samples" in rows[0]
    header = ["size", "n", "greedy valid %"]
    if sampled:
        header.append(f"mean@{rows[0]['samples']} %")
    table = []
    for name, rs in [*_by_size(rows), ("all", rows)]:
        e = _estimates(rs)
        line = [name, len(rs), stats.interval_text(e["greedy_valid"])]
        table.append(line + ([stats.interval_text(e["mean_at_k"])] if sampled else []))
    return stats.markdown_table(header, table)


# ------------------------------------------------------------------------ the final benchmark

BENCHMARK_DIR = "benchmark"  # under the workdir: instances.jsonl, one folder per model, comparison
COMPARISON = "comparison.md"  # the paired comparison and the paper's table (the report shows it)


def benchmark_set(workdir: pathlib.Path, b: BenchmarkSettings, progress: bool = False) -> list:
    """The run's benchmark (`benchmark.build` of `b.spec()`; built once, then read back checked
    against its digest)."""
    path = workdir / BENCHMARK_DIR / "instances.jsonl"
    if path.exists():
        return read_instances(workdir, path)
    problems, _ = benchmark.build(b.spec(), progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_instances(workdir, path, problems)
    return problems


def benchmark_done(workdir: pathlib.Path, name: str) -> bool:
    """Whether the benchmark evaluation `name` (a folder under benchmark/) has finished."""
    return (workdir / BENCHMARK_DIR / name / "DONE").exists()


def benchmark_eval(workdir: pathlib.Path, name: str, model, tokenizer, problems,
                   b: BenchmarkSettings, enable_thinking: bool, label: str, family=None,
                   progress: bool = False) -> list[dict]:  # fmt: skip
    """Greedy answers of `model` (an nnx model or a Trainer) on the benchmark, resumable:
    answers are appended to benchmark/<name>/answers.jsonl after every batch (a rerun
    continues there), then verified and written as `evaluate.write_results` writes them
    (results.md beside the paper's numbers for the model's `family`); a finished evaluation
    (its DONE file) is read back, not redone. Returns the verdict rows in problem order."""
    from mapfjax.eval import evaluate  # the evaluation stack, only for runs with a benchmark

    out = workdir / BENCHMARK_DIR / name
    if (out / "DONE").exists():
        return benchmark_rows(workdir, name, problems)
    out.mkdir(parents=True, exist_ok=True)
    sampling = rollout.SamplingConfig(
        max_new_tokens=b.max_new_tokens, temperature=0.0, enable_thinking=enable_thinking,
        bucket=b.bucket,
    )  # fmt: skip
    solver = evaluate.ModelSolver(model, tokenizer, sampling)
    multi = jax.process_count() > 1
    answers = evaluate.generate_answers(
        solver, problems, out / "answers.jsonl", b.batch_size, progress,
        append=jax.process_index() == 0, after_read=_barrier(f"{out} read") if multi else None,
    )  # fmt: skip
    rows = evaluate.score_answers(problems, answers)
    evaluate.write_results(out, problems, rows, label, family)
    record_digests(workdir, out / "verdicts.jsonl")
    files.atomic_write(out / "DONE", b"")
    return rows


def benchmark_rows(workdir: pathlib.Path, name: str, problems) -> list[dict]:
    """A finished benchmark evaluation's verdict rows in problem order, checked against their
    digest and the puzzles (`outcomes.read_verdicts`)."""
    from mapfjax.eval import evaluate

    out = workdir / BENCHMARK_DIR / name
    check_digest(workdir, out / "verdicts.jsonl")
    by_id = evaluate.read_verdicts(out)
    missing = [p.id for p in problems if p.id not in by_id]
    if missing:
        raise RunDirError(
            f"{out / 'verdicts.jsonl'}: no verdict for {len(missing)} benchmark puzzle(s) "
            f"(e.g. {missing[0]}); {START_OVER}"
        )
    return [by_id[p.id] for p in problems]


def _barrier(name: str):
    """A function that waits until every process of the job has called it with `name`."""

    def wait() -> None:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)

    return wait


def benchmark_comparison(problems, runs: list[tuple[str, list[dict]]]) -> tuple[str, dict]:
    """(markdown, JSON-ready dict) comparing benchmark evaluations of the same puzzles: per
    agent count, each run's valid % and optimal % (95 % intervals) and its paired change
    against the first run (`stats.paired_proportion_difference`, with the puzzles only one
    side solves), then the paper's section-5 table with each run's means over map sizes."""
    from mapfjax.eval import evaluate, paper

    agents = sorted({p.num_agents for p in problems})
    first = runs[0][1]
    header = ["model"]
    for k in agents:
        n = sum(p.num_agents == k for p in problems)
        header += [f"{k} agents (n={n}): valid %", "change (points)", "discordant",
                   "optimal %", "change (points)"]  # fmt: skip
    table, data = [], {"agents": agents, "runs": {}}
    for label, rows in runs:
        line, entry = [label], {}
        for k in agents:
            at = [i for i, p in enumerate(problems) if p.num_agents == k]
            cell = {}
            for field in ("valid", "optimal"):
                mine = [bool(rows[i][field]) for i in at]
                base = [bool(first[i][field]) for i in at]
                rate = stats.proportion(mine)
                cell[field] = rate.as_dict()
                line.append(stats.interval_text(rate))
                if rows is first:
                    line += ["-", "-"] if field == "valid" else ["-"]
                    continue
                change = stats.paired_proportion_difference(mine, base)
                cell[f"{field}_change"] = change.as_dict()
                line.append(stats.interval_text(change, signed=True))
                if field == "valid":
                    line.append(sum(a != b for a, b in zip(mine, base, strict=True)))
            entry[str(k)] = cell
        table.append(line)
        data["runs"][label] = entry
    means = [(label, _size_means(problems, rows)) for label, rows in runs]
    cells = {(p.num_agents, p.height) for p in problems}
    waits = {w for w in map(evaluate.wait_subset, problems) if w is not None}
    full = paper.full_benchmark(cells, waits)
    data["means"] = {label: {str(k): v for k, v in m.items()} for label, m in means}
    data["full_benchmark"] = full
    note = (
        "the paper's 21 cells x 3 wait-ratio subsets"
        if full
        else "**a smaller benchmark than the paper's 21 cells x 3 wait-ratio subsets: the "
        "means are not comparable with the paper's**"
    )
    parts = [
        "## Final benchmark: the starting model against the final model",
        "",
        f"{len(problems)} puzzles, greedy; the change against `{runs[0][0]}` is paired over the "
        "same puzzles (95 % intervals; discordant: puzzles only one side solves).",
        "",
        stats.markdown_table(header, table),
        "",
        f"The paper's section-5 table (mean over map sizes, valid % / optimal %; {note}):",
        "",
        evaluate.section5_table(means),
    ]
    return "\n".join(parts), data


def _size_means(problems, rows) -> dict[int, tuple[float, float | None]]:
    """agents -> (mean valid %, mean optimal %) over map sizes: the paper's means."""
    return {k: benchmark.size_means(c) for k, c in benchmark.summarize(problems, rows).items()}
