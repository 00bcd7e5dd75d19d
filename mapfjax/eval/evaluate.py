"""Benchmark evaluation: a checkpoint or an API model answers each instance (resumable answer
JSONL, each answer tied to its puzzle by a hash), the answers are verified, and per-size
valid/optimal tables are written in the paper's layout (markdown, CSV, PNG, JSON), split by
wait-ratio subset (from each instance's `meta`), beside the paper's numbers."""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import io as std_io
import json
import logging
import math
import pathlib
import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from mapfjax import api_chat, files, stats
from mapfjax.checks import is_finite_real
from mapfjax.env import benchmark, dynamics, forms, io, text, types
from mapfjax.env import config as env_config
from mapfjax.env.cli import label_problems
from mapfjax.env.types import Problem
from mapfjax.eval import outcomes, paper
from mapfjax.files import CheckpointError
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import rollout

log = logging.getLogger(__name__)

# A solver maps a batch of problems (and the batch's start index, for per-batch sampling keys)
# to one raw response text per problem.
Solver = Callable[[Sequence[Problem], int], list[str]]


# Evaluation decodes greedily (temperature 0) with a longer budget than training; change
# fields with dataclasses.replace(EVAL_SAMPLING, max_new_tokens=..., temperature=...).
EVAL_SAMPLING = rollout.SamplingConfig(max_new_tokens=512, temperature=0.0, bucket="x64")


class ModelSolver:
    """A model in memory (an nnx model, or a `Trainer`, whose current weights answer) through
    our sampler with the trainer's exact prompt (`rl.data.encode_prompts`: chat template,
    thinking on or off) and stop tokens, via `rollout.sample`. seed: the sampling key's seed
    when `sampling.temperature` > 0."""

    def __init__(
        self,
        model,
        tokenizer,
        sampling: rollout.SamplingConfig = EVAL_SAMPLING,
        mesh=None,
        seed: int = 0,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.sampling, self.mesh, self.seed = sampling, mesh, seed

    def __call__(self, problems: Sequence[Problem], start: int) -> list[str]:
        cfg = self.sampling
        key = None if cfg.temperature == 0 else jax.random.fold_in(jax.random.key(self.seed), start)
        model = rollout.policy_model(self.model)
        samples = rollout.sample(model, self.tokenizer, problems, 1, cfg, key, mesh=self.mesh)
        return samples.texts[: len(problems)]


class CheckpointSolver(ModelSolver):
    """A Hugging Face Qwen3 checkpoint directory (or hub id) as a `ModelSolver`."""

    def __init__(
        self,
        path,
        sampling: rollout.SamplingConfig = EVAL_SAMPLING,
        dtype="float32",
        mesh=None,
        seed: int = 0,
    ):
        check_checkpoint_dir(path)
        dt = jnp.dtype(dtype)
        kw = {"mesh": mesh, "rules": "sample"} if mesh is not None else {}
        # The model first: its loader says clearly what is wrong with a path or hub id.
        model = hf.from_pretrained(path, dtype=dt, param_dtype=dt, **kw)
        super().__init__(model, tok_lib.load_tokenizer(path), sampling, mesh, seed)


def logit_bias_ids(tokenizer, specs: Sequence[str]) -> tuple[tuple[int, float], ...]:
    """`SamplingConfig.logit_bias` from "TEXT=VALUE" specs, each TEXT a string the tokenizer
    encodes as one token (e.g. "taken=1.5"); ValueError names a spec that is not TEXT=VALUE, a
    TEXT that is not one token (with its ids), or a value that is not a finite number."""
    out = {}
    for spec in specs:
        text, sep, value = spec.rpartition("=")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not sep or not text or not math.isfinite(v):
            raise ValueError(f"logit bias {spec!r}: expected TEXT=VALUE with a finite VALUE")
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"logit bias {spec!r}: {text!r} is {len(ids)} tokens {ids}; allowed: one token"
            )
        out[int(ids[0])] = v
    return tuple(sorted(out.items()))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_checkpoint_dir(path) -> None:
    """Refuse a local path that cannot hold a checkpoint, naming what is missing (CheckpointError,
    a ValueError). A path that does not exist is left to `hf.from_pretrained` only when it looks
    like a hub id ('org/name')."""
    p = pathlib.Path(path).expanduser()
    if not p.exists():
        if re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", str(path)) and not str(path).startswith("."):
            return  # maybe a Hugging Face hub id
        raise CheckpointError(f"--checkpoint {path}: no such directory")
    if not p.is_dir():
        raise CheckpointError(f"--checkpoint {path}: is a file; expected a checkpoint directory")
    missing = []
    if not (p / "config.json").is_file():
        missing.append("config.json")
    if not any(p.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    if missing:
        raise CheckpointError(
            f"--checkpoint {path}: not a model checkpoint, it has no {' and no '.join(missing)}"
            " (expected a Hugging Face Qwen3 directory, e.g. runs/<run>/round_<n>/model)"
        )


class ApiUnavailable(RuntimeError):
    """The endpoint kept failing with retryable errors; rerun to continue (answers are saved)."""


@dataclasses.dataclass
class ApiSolver(api_chat.Endpoint):
    """An OpenAI-compatible chat endpoint as a direct solver: the rendered prompt as the user
    message (settings and retry policy: `api_chat.Endpoint`; the model is required). Up to
    `concurrency` requests are in flight at once; answers keep the problems' order. A request
    that keeps failing with retryable errors raises ApiUnavailable (answers of earlier batches
    are saved; rerun to continue); any other error answers "" (scored as a parse error) and is
    logged with the instance id."""

    timeout: float = 300.0
    temperature: float = 0.0
    max_tokens: int = 8192
    concurrency: int = 8
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency}: allowed >= 1")

    def ask(self, client, pid: str, prompt: str) -> str:
        """One chat completion with retries; see the class docstring for the error policy."""
        try:
            return self.chat(client, prompt)[0]
        except api_chat.ChatError as e:
            if e.retryable:
                raise ApiUnavailable(
                    f"instance {pid}: {e}; rerun the same command to continue"
                ) from e
            self.errors[pid] = e.errors[-1]
            log.warning("instance %s: %s; answered as empty", pid, self.errors[pid])
            return ""

    def __call__(self, problems: Sequence[Problem], start: int) -> list[str]:
        if not self.settings()[1]:
            raise ValueError("ApiSolver: no model; pass model= or set OPENAI_MODEL")
        client = self.client()
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(self.concurrency, len(problems))))
        try:
            futures = [pool.submit(self.ask, client, p.id, text.render_prompt(p)) for p in problems]
            return [f.result() for f in futures]
        finally:  # on ApiUnavailable: drop the requests not yet started
            pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- answers file


def read_answers(path, duplicates: str = "error") -> dict[str, io.Answer]:
    """Answers already in `path` (id -> its `io.Answer`), {} when it does not exist. An id on
    several lines is refused, naming the ids, unless `duplicates` is "first" or "last".

    A last line without a newline is kept when it parses (valid JSONL may end that way); only
    an unparseable one, torn by a crash while appending, is cut off, with a warning naming the
    file, the line and the bytes dropped. Any other bad line raises JsonlError (file, line).
    """
    path = pathlib.Path(path)
    if not path.exists():
        return {}
    io.read_bytes(path)  # a directory in the way is one error
    files.drop_torn_tail(path, "its answer will be generated again")
    answers = io.one_answer_per_id(path, io.read_answer_lines(path), duplicates)
    return {a.id: a for a in answers}


def append_answers(path, rows: Sequence[dict]) -> None:
    """Append `{"id", "text", "puzzle_hash"}` rows, each line in one write to an O_APPEND file,
    then fsync. A file whose last line has no newline gets one first."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.append_lines(path, [json.dumps(row, ensure_ascii=False) + "\n" for row in rows], True)


def generate_answers(
    solver: Solver,
    problems: Sequence[Problem],
    answers_out=None,
    batch_size: int = 32,
    progress: bool = True,
    duplicates: str = "error",
    append: bool = True,
    after_read=None,
) -> dict[str, str]:
    """id -> response text for every problem. With `answers_out`, answers already there are
    reused and new ones are appended after each batch (rerunning continues where it stopped);
    an id already there on several lines is refused unless `duplicates` picks "first"/"last".

    Each written answer carries `io.puzzle_hash` of its puzzle; an answer already in the file is
    reused only when that hash matches its instance (same id, same grid, starts and goals), so
    a file written for another instance set with the same ids is refused, naming the ids.

    For the processes of one multi-process job, which all sample together: `append` False
    reads the file but leaves the appending to one process, and `after_read()`, called once the
    file is read and before anything is appended, is where they wait for each other (so that
    every process answers the same puzzles).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: allowed >= 1")
    by_id = {p.id: p for p in problems}
    found = read_answers(answers_out, duplicates) if answers_out else {}
    stray = sorted(set(found) - set(by_id))
    if stray:
        raise ValueError(
            f"{answers_out}: field 'id': {stray[0]!r} (and {len(stray) - 1} more) not among the "
            "instances; use the answers file of this instance set or another --answers_out"
        )
    unhashed = [a for a in found.values() if a.puzzle_hash is None]
    if unhashed:
        a = unhashed[0]
        raise ValueError(
            f"{answers_out}:{a.line}: field 'puzzle_hash': missing ({len(unhashed)} answer(s) "
            "without it); a reused answer must carry the hash of the puzzle it answers, so this "
            "file cannot be resumed: score it with `python -m mapfjax.env verify` or use "
            "another --answers_out"
        )
    io.check_answers_match(answers_out, list(found.values()), by_id)
    if after_read is not None:
        after_read()
    answers = {aid: a.text for aid, a in found.items()}
    todo = [p for p in problems if p.id not in answers]
    bar = None
    if progress:
        bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc="answers")
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        texts = solver(chunk, start)
        if len(texts) != len(chunk):
            raise RuntimeError(f"solver returned {len(texts)} texts for {len(chunk)} problems")
        rows = [
            {"id": p.id, "text": t, "puzzle_hash": io.puzzle_hash(p)}
            for p, t in zip(chunk, texts, strict=True)
        ]
        if answers_out and append:
            append_answers(answers_out, rows)
        answers.update((r["id"], r["text"]) for r in rows)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return answers


def score_answers(problems: Sequence[Problem], answers: dict[str, str], chunk: int = 1024):
    """Verdict rows (`dynamics.verdict_rows` plus "id" and "puzzle", its content hash) in
    problem order."""
    missing = [p.id for p in problems if p.id not in answers]
    if missing:
        raise ValueError(f"no answer for {len(missing)} instance(s), first {missing[0]!r}")
    out = []
    for i in range(0, len(problems), chunk):
        ps = problems[i : i + chunk]
        parsed = text.parse_answers([answers[p.id] for p in ps], [p.num_agents for p in ps])
        verdict = dynamics.verify(types.to_instances(ps), parsed)
        rows = dynamics.verdict_rows(verdict)
        # each row names the puzzle it answered by content, for comparisons to hold it to theirs
        out += [
            {"id": p.id, "puzzle": io.puzzle_hash(p), **r} for p, r in zip(ps, rows, strict=True)
        ]
    return out


# --------------------------------------------------------------------------- tables


def wait_subset(p: Problem) -> float | None:
    """The wait-ratio subset the instance was drawn for, from its `meta` (written by the
    benchmark builder); None when it has none. Never read from the id."""
    w = (p.meta or {}).get("wait_ratio")
    return float(w) if is_finite_real(w) else None


def label_errors(problems: Sequence[Problem], rows: Sequence[dict]) -> list[tuple[str, int, int]]:
    """(id, soc, optimal_soc) where a valid plan costs less than the "optimal" label: proof
    that the label is wrong."""
    return [
        (p.id, r["soc"], p.optimal_soc)
        for p, r in zip(problems, rows, strict=True)
        if r["valid"] and None not in (p.optimal_soc, r.get("soc")) and r["soc"] < p.optimal_soc
    ]


def summaries(problems: Sequence[Problem], rows: Sequence[dict]) -> dict[str, dict]:
    """ "all" and one entry per wait-ratio subset ("wr0.25", ...) -> `benchmark.summarize`."""
    groups: dict[str, list[int]] = {"all": list(range(len(problems)))}
    for i, p in enumerate(problems):
        w = wait_subset(p)
        if w is not None:
            groups.setdefault(f"wr{w:.2f}", []).append(i)
    return {
        name: benchmark.summarize([problems[i] for i in idx], [rows[i] for i in idx])
        for name, idx in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0]))
    }


def _means(summary: dict) -> dict[int, tuple[float, float | None]]:
    """agents -> (mean valid %, mean optimal %) over the sizes present (the paper's mean); the
    optimal mean is None when a cell's optimal % is unknown (unlabelled instances)."""
    return {k: benchmark.size_means(s) for k, s in summary.items()}


def _aggregate_valid(summary: dict) -> float:
    """Mean valid % over (agents, size) cells: what the paper's ablation table aggregates."""
    return stats.cell_mean(c[0] for s in summary.values() for c in s.values())


def _fmt(v: float | None, o: float | None) -> str:
    return "-" if v is None else f"{v:.2f} / {o:.2f}" if o is not None else f"{v:.2f} / ?"


def comparison_table(ours: dict[int, tuple[float, float]], label: str, family) -> str:
    """Our means per agent count beside the paper's rows for the same model family."""
    agents = (3, 4, 5)
    lines = [[f"ours: {label}", *(_fmt(*ours.get(k, (None, None))) for k in agents)]]
    by_model: dict[str, dict[int, paper.PaperRow]] = {}
    for r in paper.comparable_rows(family):
        by_model.setdefault(r.model, {})[r.agents] = r
    for model, rows in by_model.items():
        cells = [_fmt(rows[k].valid, rows[k].optimal) if k in rows else "-" for k in agents]
        lines.append([f"paper: {model}", *cells])
    return stats.markdown_table(["source", *(f"{k} agents" for k in agents)], lines)


def section5_table(ours: Sequence[tuple[str, dict[int, tuple[float, float | None]]]]) -> str:
    """The paper's main results (docs/paper.md section 5: mean over map sizes, valid % /
    optimal % for 3, 4 and 5 agents, every model it reports) with our rows appended: `ours`
    holds (label, {agents: (mean valid %, mean optimal %)}) pairs (`benchmark.size_means`)."""
    agents = (3, 4, 5)
    by_model: dict[str, dict[int, paper.PaperRow]] = {}
    for r in paper.MAIN:
        by_model.setdefault(r.model, {})[r.agents] = r
    lines = [
        [f"paper: {model}", *(_fmt(rows[k].valid, rows[k].optimal) if k in rows else "-"
                              for k in agents)]
        for model, rows in by_model.items()
    ]  # fmt: skip
    for label, means in ours:
        lines.append([f"ours: {label}", *(_fmt(*means.get(k, (None, None))) for k in agents)])
    return stats.markdown_table(["model", *(f"{k} agents" for k in agents)], lines)


def _per_size_paper_row(summary: dict) -> str:
    sizes = env_config.PAPER_SIZES
    ours = summary.get(3, {})
    opt = lambda o: "?" if o is None else f"{o:.1f}"
    mine = [f"{ours[n][0]:.1f} / {opt(ours[n][1])}" if n in ours else "-" for n in sizes]
    theirs = ["{:.1f} / {:.1f}".format(*paper.PER_SIZE_3AG[n]) for n in sizes]
    header = ["3 agents", *(f"{n}x{n}" for n in sizes)]
    return stats.markdown_table(header, [["ours", *mine], ["paper (V6)", *theirs]])


def _sizes(summary: dict) -> tuple[int, ...]:
    """The paper's sizes plus any other size present, so no instance drops out of a table."""
    present = {n for cells in summary.values() for n in cells}
    return tuple(sorted(set(env_config.PAPER_SIZES) | present))


def results_markdown(
    sums: dict,
    label: str,
    family,
    full: bool,
    api_errors: int = 0,
    unlabelled: int = 0,
    wrong_labels: Sequence[tuple[str, int, int]] = (),
) -> str:
    """The whole report: overall table, the paper's rows where comparable, per-subset tables."""
    parts = [f"# Benchmark evaluation: {label}", ""]
    n = sum(c[2] for s in sums["all"].values() for c in s.values())
    parts.append(f"{n} instances; cells are valid % / optimal %; mean = unweighted over sizes.")
    if api_errors:
        parts.append(f"{api_errors} API request(s) failed without retry and count as wrong.")
    if unlabelled:
        parts.append(
            f"{unlabelled} instance(s) have no optimal_soc label: optimal % is unknown (?) in "
            "their cells; label them with `python -m mapfjax.env label` or `--label`."
        )
    if wrong_labels:
        shown = "; ".join(f"{i}: soc {s} < optimal_soc {o}" for i, s, o in wrong_labels[:5])
        parts.append(
            f"**{len(wrong_labels)} optimal_soc label(s) are wrong**: a valid answer costs less "
            f"({shown}); relabel the instances with `python -m mapfjax.env label`."
        )
    parts += ["", "## All instances", "", benchmark.table(sums["all"], _sizes(sums["all"])), ""]
    if family is not None:
        note = (
            "same benchmark layout (21 cells x 3 wait-ratio subsets)"
            if full
            else "**not comparable as a mean**: these instances do not cover the paper's "
            "21 cells x 3 subsets"
        )
        parts += [f"## Paper's numbers for {family} (docs/paper.md section 5; {note})", ""]
        parts += [comparison_table(_means(sums["all"]), label, family), ""]
        if family == "qwen3-4b":
            parts += ["Per map size, 3 agents, beside the paper's method (V6):", ""]
            parts += [_per_size_paper_row(sums["all"]), ""]
    for name, s in sums.items():
        if name == "all":
            continue
        w = float(name[2:])
        parts += [f"## Wait-ratio subset {w:.2f}", "", benchmark.table(s, _sizes(s)), ""]
        agg = f"Aggregate valid % (mean over cells): ours {_aggregate_valid(s):.1f}"
        if family == "qwen3-4b":
            theirs = "; ".join(f"{v} {d[w]:.1f}" for v, d in paper.ABLATION_VALID.items() if w in d)
            agg += f"; paper's context ablation (Qwen3-4B, docs/paper.md section 4): {theirs}"
        parts += [agg, ""]
    return "\n".join(parts)


def results_csv(sums: dict) -> str:
    buf = std_io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["subset", "agents", "size", "n", "valid_pct", "optimal_pct"])
    for name, s in sums.items():
        for k, cells in s.items():
            for size, (v, o, c) in cells.items():
                w.writerow([name, k, size, c, f"{v:.4f}", "" if o is None else f"{o:.4f}"])
    return buf.getvalue()


def results_plot(sums: dict, path, family=None) -> None:
    """`results_png` written to `path`, atomically."""
    files.atomic_write(path, results_png(sums, family))


def results_png(sums: dict, family=None) -> bytes:
    """valid % and optimal % per map size, one line per agent count (all instances); the
    paper's 3-agent row dashed for Qwen3-4B; PNG bytes."""
    # Local: matplotlib takes seconds to import, and Agg must be chosen before pyplot loads.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for j, (ax, field) in enumerate(zip(axes, ("valid", "optimal"), strict=True)):
        for k, cells in sums["all"].items():
            xs = sorted(cells)
            ys = [math.nan if cells[n][j] is None else cells[n][j] for n in xs]
            ax.plot(xs, ys, marker="o", label=f"{k} agents")
        if family == "qwen3-4b":
            xs = sorted(paper.PER_SIZE_3AG)
            ys = [paper.PER_SIZE_3AG[n][j] for n in xs]
            ax.plot(xs, ys, "k--", label="paper, 3 agents (V6)")
        ax.set_title(f"{field} % per map size")
        ax.set_xlabel("map size N (NxN)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("%")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    buf = std_io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_results(
    out_dir, problems, rows, label: str, family=None, api_errors: int = 0
) -> dict[str, pathlib.Path]:
    """results.{md,csv,png,json} and verdicts.jsonl in `out_dir`; returns their paths."""
    out = pathlib.Path(out_dir)
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    sums = summaries(problems, rows)
    unlabelled = sum(p.optimal_soc is None for p in problems)
    wrong = label_errors(problems, rows)
    cells = {(p.num_agents, p.height) for p in problems}
    waits = {w for w in map(wait_subset, problems) if w is not None}
    full = paper.full_benchmark(cells, waits)
    paths = {ext: out / f"results.{ext}" for ext in ("md", "csv", "png", "json")}
    # Every file made first, then written: a failure leaves the directory as it was.
    data = {"md": results_markdown(sums, label, family, full, api_errors, unlabelled, wrong)}
    data["csv"] = results_csv(sums)
    data["png"] = results_png(sums, family)
    summary = {
        "label": label,
        "family": family,
        "full_benchmark": full,
        "n": len(problems),
        "api_errors": api_errors,
        "unlabelled": unlabelled,
        "wrong_labels": [{"id": i, "soc": s, "optimal_soc": o} for i, s, o in wrong],
        "means": {g: {str(k): v for k, v in _means(s).items()} for g, s in sums.items()},
        "aggregate_valid": {g: _aggregate_valid(s) for g, s in sums.items()},
        "cells": {
            g: {str(k): {str(n): list(c) for n, c in cs.items()} for k, cs in s.items()}
            for g, s in sums.items()
        },
    }
    data["json"] = json.dumps(summary, indent=1) + "\n"
    for ext, content in data.items():
        files.atomic_write(paths[ext], content)
    paths["verdicts"] = out / "verdicts.jsonl"
    io.save_jsonl(paths["verdicts"], rows)
    return paths


def check_out_dir(path) -> None:
    """Refuse an output directory that is a file (or lies under one), before any work."""
    files.check_dir(path, "--out_dir")


def label_unlabelled(
    problems: Sequence[Problem], max_nodes: int = 50_000, time_limit: float = 30.0, processes=None
) -> tuple[list[Problem], dict]:
    """Label the problems without optimal_soc with the exact oracle (`env.cli.label_problems`);
    the others are kept as they are. Returns (problems, the oracle's summary)."""
    todo = [i for i, p in enumerate(problems) if p.optimal_soc is None]
    labelled, summary = label_problems(
        [problems[i] for i in todo], max_nodes, time_limit, processes
    )
    out = list(problems)
    for i, p in zip(todo, labelled, strict=True):
        out[i] = p
    return out, summary


def evaluate(
    solver: Solver,
    problems: Sequence[Problem],
    out_dir,
    label: str,
    family=None,
    answers_out=None,
    batch_size: int = 32,
    progress: bool = True,
    duplicates: str = "error",
) -> dict[str, pathlib.Path]:
    """Answer (resumably), verify and write the result tables; returns the written paths.
    Unlabelled instances are scored for validity; their optimal % is reported as unknown.
    duplicates: for ids answered on several lines of `answers_out` (`generate_answers`)."""
    check_out_dir(out_dir)
    answers = generate_answers(solver, problems, answers_out, batch_size, progress, duplicates)
    rows = score_answers(problems, answers)
    errors = len(getattr(solver, "errors", {}) or {})
    return write_results(out_dir, problems, rows, label, family, errors)


def read_verdicts(out_dir) -> dict[str, dict]:
    """An evaluation's verdict rows by puzzle id, checked (`outcomes.read_verdicts`)."""
    return outcomes.read_verdicts(out_dir)


def read_outcomes(path) -> dict[str, dict]:
    """Per-puzzle rows by id from an evaluation's --out_dir or a run's validation.json, each
    with its "valid" flag and "failure" label, checked (`outcomes.read_outcomes`)."""
    return outcomes.read_outcomes(path)


# How a joined evaluation (seeds "+"-joined) scores a puzzle: its share of valid samples
# (mean@k) or whether any sample is valid (pass@k).
SOLVED_BY = ("mean", "any")
# What a puzzle's answer is scored on: a valid plan, or a valid plan of optimal cost.
METRICS = ("valid", "optimal")


def _require_wait_labels(ids: Sequence[str], wait: dict) -> None:
    """A ValueError naming how many of `ids` (and one of them) have no needs_wait label."""
    unlabelled = sorted(i for i in ids if wait[i] is None)
    if unlabelled:
        raise ValueError(
            f"{len(unlabelled)} instances (e.g. {unlabelled[0]}) have no needs_wait "
            "label; label the instance file or leave out the split by waits"
        )


def compare_evaluations(
    out_dirs: Sequence,
    labels: Sequence[str],
    problems: Sequence[Problem],
    groups,
    split_wait: bool = False,
    solved_by: str = "mean",
    metric: str = "valid",
    subset: bool = False,
) -> str:
    """Markdown: for each evaluation (all of the same `problems`; with `subset`, of a set that
    holds them, compared on them alone) and each group of map sizes,
    valid % [95 %] and the paired change against the first evaluation on the same puzzles
    [95 %], with the number of puzzles on which the two sides differ.

    An evaluation is one `launch/evaluate.py` directory (or a run's validation.json), or several
    joined by "+" (the same
    checkpoint sampled with different seeds): then each puzzle counts the share of its samples
    that are valid (mean@k), rates are means (`stats.bounded_mean`) and the paired change is the
    mean per-puzzle difference with its t interval (`stats.paired_difference`); single
    directories keep the Wilson and paired-proportion intervals. split_wait: each size group
    also as its puzzles that need a wait and those that need none (`Problem.needs_wait`; a
    ValueError when an instance has no such label). solved_by (SOLVED_BY) "any": a puzzle of a
    joined evaluation counts as solved when any of its samples is valid (pass@k, with the
    Wilson and paired-proportion intervals): how much a policy could reach by sharpening
    towards answers it already samples. metric (METRICS) "optimal": every rate counts optimal
    plans instead of valid ones (a valid plan longer than the oracle's counts 0)."""
    if metric not in METRICS:
        raise ValueError(f"metric = {metric!r}: allowed {', '.join(METRICS)}")
    if len(labels) != len(out_dirs):
        raise ValueError(
            f"{len(out_dirs)} evaluations but {len(labels)} labels {list(labels)}: one label per"
            " evaluation (a comma in --labels starts a new label)"
        )
    if solved_by not in SOLVED_BY:
        raise ValueError(f"solved_by = {solved_by!r}: allowed {', '.join(SOLVED_BY)}")
    ids = {p.id for p in problems}
    verdicts, joined = [], False
    for spec in out_dirs:
        parts = str(spec).split("+")
        joined |= len(parts) > 1
        sums = dict.fromkeys(ids, 0.0)
        for d in parts:
            rows = read_outcomes(d)
            outcomes.check_puzzles(d, problems)  # the same ids on other puzzles: refused
            if subset and ids <= set(rows):
                rows = {i: rows[i] for i in ids}
            if set(rows) != ids:
                raise ValueError(
                    f"{d}: {len(set(rows) - ids)} answered puzzles are not in the instances and "
                    f"{len(ids - set(rows))} instances have no answer; compare evaluations of "
                    f"the same instance file"
                    + ("" if subset else " (or of a part of it, with subset)")
                )
            for i in ids:
                sums[i] += bool(rows[i]["valid"]) and bool(rows[i].get(metric))
        if solved_by == "any":
            verdicts.append({i: float(v > 0) for i, v in sums.items()})
        else:
            verdicts.append({i: v / len(parts) for i, v in sums.items()})
    what = f"mean {metric} %" if joined else f"{metric} %"
    if solved_by == "any":  # pass@k: proportions, whatever the number of samples
        what, joined = (f"pass@k {metric} %" if joined else what), False
    wait = {p.id: p.needs_wait for p in problems}
    header, cols = ["model"], []
    for group in groups:
        members = [p.id for p in problems if p.height in set(group)]
        if not members:
            raise ValueError(f"sizes {group}: no puzzle of these sizes in the instances")
        name = f"{min(group)}x{min(group)}-{max(group)}x{max(group)}"
        columns = [(name, members)]
        if split_wait:
            _require_wait_labels(members, wait)
            columns += [
                (f"{name} needs a wait", [i for i in members if wait[i]]),
                (f"{name} needs none", [i for i in members if not wait[i]]),
            ]
        for title, chosen in columns:
            header += [f"{title} {what} (n={len(chosen)})", f"vs {labels[0]} (points)"]
            header.append("discordant")
            cols.append(chosen)

    table = []
    for label, rows in zip(labels, verdicts, strict=True):
        line = [label]
        for members in cols:
            mine = [rows[i] for i in members]
            base = [verdicts[0][i] for i in members]
            rate = stats.bounded_mean(mine) if joined else stats.proportion(mine)
            line.append(stats.interval_text(rate))
            if rows is verdicts[0]:
                line += ["-", "-"]
                continue
            paired = stats.paired_difference if joined else stats.paired_proportion_difference
            line.append(stats.interval_text(paired(mine, base), signed=True))
            line.append(sum(a != b for a, b in zip(mine, base, strict=True)))
        table.append(line)
    return stats.markdown_table(header, table)


def trace_comparison(
    answer_files: Sequence,
    labels: Sequence[str],
    problems: Sequence[Problem],
    form: forms.TraceForm = forms.GRID_RELAY,
) -> str:
    """Markdown: for each answers file (launch/evaluate.py --answers_out) of a policy that
    writes a reasoning trace, how its answers relate to the plans its traces choose, read as
    `form` writes them (`TraceForm.plan_outcome`): readable traces, answers that copy them,
    and the valid rate of the trace plans against that of the answers (95 % intervals).
    Puzzles without an answer count as no trace."""
    if len(labels) != len(answer_files):
        raise ValueError(f"{len(answer_files)} answer files but {len(labels)} labels")
    header = ["model", "n", "readable trace", "answer = trace plan", "trace plan valid %",
              "answer valid %"]  # fmt: skip
    table = []
    for label, path in zip(labels, answer_files, strict=True):
        found = read_answers(path)
        if not found:
            raise ValueError(f"{path}: no answers (an --answers_out file of launch/evaluate.py)")
        texts = {p.id: found[p.id].text if p.id in found else "" for p in problems}
        out = [form.plan_outcome(p, texts[p.id]) for p in problems]
        valid = [bool(r["valid"]) for r in score_answers(problems, texts)]
        table.append([
            label, len(problems), sum(o != "no_plan" for o, _ in out),
            sum(o == "copied" for o, _ in out),
            stats.interval_text(stats.proportion([bool(v) for _, v in out])),
            stats.interval_text(stats.proportion(valid)),
        ])  # fmt: skip
    return stats.markdown_table(header, table)


def wait_usage(answer_files: Sequence, labels: Sequence[str], problems: Sequence[Problem]) -> str:
    """Markdown: for each answers file (launch/evaluate.py --answers_out), the share of its
    answers that write at least one WAIT, on the puzzles that need a wait and on those that
    need none (`Problem.needs_wait`), with 95 % intervals; an answer that does not parse counts
    as writing none. Whether a policy waits where a wait is needed or everywhere alike."""
    if len(labels) != len(answer_files):
        raise ValueError(f"{len(answer_files)} answer files but {len(labels)} labels")
    _require_wait_labels([p.id for p in problems], {p.id: p.needs_wait for p in problems})
    kinds = [("needs a wait", True), ("needs none", False)]
    count = lambda w: sum(p.needs_wait == w for p in problems)
    header = ["model"] + [f"{name}: answers with a WAIT % (n={count(w)})" for name, w in kinds]
    table = []
    for label, path in zip(labels, answer_files, strict=True):
        found = read_answers(path)
        missing = [p.id for p in problems if p.id not in found]
        if missing:
            raise ValueError(f"{path}: no answer for {len(missing)} puzzles (e.g. {missing[0]})")
        waits = {}
        for p in problems:
            plans, _ = text.parse_answer(found[p.id].text, p.num_agents)
            waits[p.id] = plans is not None and any(types.WAIT in plan for plan in plans)
        shares = [
            stats.proportion([waits[p.id] for p in problems if p.needs_wait == w]) for _, w in kinds
        ]
        table.append([label, *(stats.interval_text(x) for x in shares)])
    return stats.markdown_table(header, table)
