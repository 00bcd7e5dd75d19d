"""Benchmark evaluation: a checkpoint or an API model answers each instance (resumable answer
JSONL), the answers are verified, and per-size valid/optimal tables are written in the paper's
layout (markdown, CSV, PNG, JSON), split by wait-ratio subset, beside the paper's numbers."""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import io as std_io
import json
import logging
import math
import os
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from mapfjax import api_chat
from mapfjax.env import benchmark, dynamics, io, text, types
from mapfjax.env import config as env_config
from mapfjax.env.types import Problem
from mapfjax.eval import paper

log = logging.getLogger(__name__)

# A solver maps a batch of problems (and the batch's start index, for per-batch sampling keys)
# to one raw response text per problem.
Solver = Callable[[Sequence[Problem], int], list[str]]


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings; temperature 0 is greedy (the default for evaluation)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    enable_thinking: bool = False
    seed: int = 0
    bucket: str = "x64"


class CheckpointSolver:
    """A Hugging Face Qwen3 checkpoint through our sampler, with the trainer's exact prompt
    (`rl.data.encode_prompts`: chat template, thinking on or off) and stop tokens."""

    def __init__(
        self, path, gen: GenerationConfig = GenerationConfig(), dtype="float32", mesh=None
    ):
        import jax.numpy as jnp

        from mapfjax.models import hf
        from mapfjax.models import tokenizer as tok_lib

        self.gen, self.mesh = gen, mesh
        self.tokenizer = tok_lib.load_tokenizer(path)
        dt = jnp.dtype(dtype)
        kw = {"mesh": mesh, "rules": "sample"} if mesh is not None else {}
        self.model = hf.from_pretrained(path, dtype=dt, param_dtype=dt, **kw)

    def __call__(self, problems: Sequence[Problem], start: int) -> list[str]:
        import jax

        from mapfjax.rl import rollout

        g = self.gen
        cfg = rollout.SamplingConfig(
            max_new_tokens=g.max_new_tokens,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            enable_thinking=g.enable_thinking,
            bucket=g.bucket,
        )
        key = None if g.temperature == 0 else jax.random.fold_in(jax.random.key(g.seed), start)
        _, _, _, texts = rollout.sample(
            self.model, self.tokenizer, problems, 1, cfg, key, mesh=self.mesh
        )
        return texts[: len(problems)]


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


def read_answers(path) -> dict[str, str]:
    """Answers already in `path` (id -> first text), {} when it does not exist. A torn last line
    (a crash while appending) is cut off; any other bad line raises JsonlError (file, line)."""
    path = pathlib.Path(path)
    if not path.exists():
        return {}
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw[: raw.rfind(b"\n") + 1]
        log.warning("%s: dropping a torn last line (%d bytes)", path, len(raw) - len(keep))
        io.atomic_write(path, keep)
    out: dict[str, str] = {}
    for aid, t in io.load_answers(path):
        out.setdefault(aid, t)
    return out


def append_answers(path, rows: Sequence[dict]) -> None:
    """Append `{"id", "text"}` rows, each line in one write to an O_APPEND file, then fsync."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for row in rows:
            os.write(fd, (json.dumps(row, ensure_ascii=False) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def generate_answers(
    solver: Solver,
    problems: Sequence[Problem],
    answers_out=None,
    batch_size: int = 32,
    progress: bool = True,
) -> dict[str, str]:
    """id -> response text for every problem. With `answers_out`, answers already there are
    reused and new ones are appended after each batch (rerunning continues where it stopped)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: allowed >= 1")
    known = {p.id for p in problems}
    answers = read_answers(answers_out) if answers_out else {}
    stray = sorted(set(answers) - known)
    if stray:
        raise ValueError(
            f"{answers_out}: field 'id': {stray[0]!r} (and {len(stray) - 1} more) not among the "
            "instances; use the answers file of this instance set or another --answers_out"
        )
    todo = [p for p in problems if p.id not in answers]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc="answers")
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        texts = solver(chunk, start)
        if len(texts) != len(chunk):
            raise RuntimeError(f"solver returned {len(texts)} texts for {len(chunk)} problems")
        rows = [{"id": p.id, "text": t} for p, t in zip(chunk, texts, strict=True)]
        if answers_out:
            append_answers(answers_out, rows)
        answers.update((r["id"], r["text"]) for r in rows)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return answers


def score_answers(problems: Sequence[Problem], answers: dict[str, str], chunk: int = 1024):
    """Verdict rows (`dynamics.verdict_rows` plus "id") in problem order."""
    missing = [p.id for p in problems if p.id not in answers]
    if missing:
        raise ValueError(f"no answer for {len(missing)} instance(s), first {missing[0]!r}")
    out = []
    for i in range(0, len(problems), chunk):
        ps = problems[i : i + chunk]
        parsed = text.parse_answers([answers[p.id] for p in ps], [p.num_agents for p in ps])
        verdict = dynamics.verify(types.to_instances(ps), parsed)
        out += [{"id": p.id, **r} for p, r in zip(ps, dynamics.verdict_rows(verdict), strict=True)]
    return out


# --------------------------------------------------------------------------- tables


def wait_subset(p: Problem) -> float | None:
    """The wait-ratio subset from the instance id ('..._wr0.50_...'), None when absent."""
    return benchmark.parse_id(p.id).get("wait_ratio")


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


def _means(summary: dict) -> dict[int, tuple[float, float]]:
    """agents -> (mean valid %, mean optimal %) over the sizes present (the paper's mean)."""
    return {
        k: (float(np.mean([c[0] for c in s.values()])), float(np.mean([c[1] for c in s.values()])))
        for k, s in summary.items()
    }


def _aggregate_valid(summary: dict) -> float:
    """Mean valid % over (agents, size) cells: what the paper's ablation table aggregates."""
    cells = [c[0] for s in summary.values() for c in s.values()]
    return float(np.mean(cells)) if cells else math.nan


def _fmt(v: float | None, o: float | None) -> str:
    return "-" if v is None else f"{v:.2f} / {o:.2f}" if o is not None else f"{v:.2f}"


def comparison_table(ours: dict[int, tuple[float, float]], label: str, family) -> str:
    """Our means per agent count beside the paper's rows for the same model family."""
    agents = (3, 4, 5)
    lines = [
        "| source | " + " | ".join(f"{k} agents" for k in agents) + " |",
        "|---" * (len(agents) + 1) + "|",
        f"| ours: {label} | " + " | ".join(_fmt(*ours.get(k, (None, None))) for k in agents) + " |",
    ]
    by_model: dict[str, dict[int, paper.PaperRow]] = {}
    for r in paper.comparable_rows(family):
        by_model.setdefault(r.model, {})[r.agents] = r
    for model, rows in by_model.items():
        cells = [_fmt(rows[k].valid, rows[k].optimal) if k in rows else "-" for k in agents]
        lines.append(f"| paper: {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _per_size_paper_row(summary: dict) -> str:
    sizes = env_config.PAPER_SIZES
    ours = summary.get(3, {})
    head = "| 3 agents | " + " | ".join(f"{n}x{n}" for n in sizes) + " |"
    mine = " | ".join(f"{ours[n][0]:.1f} / {ours[n][1]:.1f}" if n in ours else "-" for n in sizes)
    theirs = " | ".join("{:.1f} / {:.1f}".format(*paper.PER_SIZE_3AG[n]) for n in sizes)
    return "\n".join(
        [head, "|---" * (len(sizes) + 1) + "|", f"| ours | {mine} |", f"| paper (V6) | {theirs} |"]
    )


def results_markdown(sums: dict, label: str, family, full: bool, api_errors: int = 0) -> str:
    """The whole report: overall table, the paper's rows where comparable, per-subset tables."""
    parts = [f"# Benchmark evaluation: {label}", ""]
    n = sum(c[2] for s in sums["all"].values() for c in s.values())
    parts.append(f"{n} instances; cells are valid % / optimal %; mean = unweighted over sizes.")
    if api_errors:
        parts.append(f"{api_errors} API request(s) failed without retry and count as wrong.")
    parts += ["", "## All instances", "", benchmark.table(sums["all"]), ""]
    if family is not None:
        note = (
            "same benchmark layout (21 cells x 3 wait-ratio subsets)"
            if full
            else "**not comparable as a mean**: these instances do not cover the paper's "
            "21 cells x 3 subsets"
        )
        parts += [f"## Paper's numbers for {family} (PAPER.md section 5; {note})", ""]
        parts += [comparison_table(_means(sums["all"]), label, family), ""]
        if family == "qwen3-4b":
            parts += ["Per map size, 3 agents, beside the paper's method (V6):", ""]
            parts += [_per_size_paper_row(sums["all"]), ""]
    for name, s in sums.items():
        if name == "all":
            continue
        w = float(name[2:])
        parts += [f"## Wait-ratio subset {w:.2f}", "", benchmark.table(s), ""]
        agg = f"Aggregate valid % (mean over cells): ours {_aggregate_valid(s):.1f}"
        if family == "qwen3-4b":
            theirs = "; ".join(f"{v} {d[w]:.1f}" for v, d in paper.ABLATION_VALID.items() if w in d)
            agg += f"; paper's context ablation (Qwen3-4B, PAPER.md section 4): {theirs}"
        parts += [agg, ""]
    return "\n".join(parts)


def results_csv(sums: dict) -> str:
    buf = std_io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["subset", "agents", "size", "n", "valid_pct", "optimal_pct"])
    for name, s in sums.items():
        for k, cells in s.items():
            for size, (v, o, c) in cells.items():
                w.writerow([name, k, size, c, f"{v:.4f}", f"{o:.4f}"])
    return buf.getvalue()


def results_plot(sums: dict, path, family=None) -> None:
    """valid % and optimal % per map size, one line per agent count (all instances); the
    paper's 3-agent row dashed for Qwen3-4B."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for j, (ax, field) in enumerate(zip(axes, ("valid", "optimal"), strict=True)):
        for k, cells in sums["all"].items():
            xs = sorted(cells)
            ax.plot(xs, [cells[n][j] for n in xs], marker="o", label=f"{k} agents")
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(
    out_dir, problems, rows, label: str, family=None, api_errors: int = 0
) -> dict[str, pathlib.Path]:
    """results.{md,csv,png,json} and verdicts.jsonl in `out_dir`; returns their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sums = summaries(problems, rows)
    cells = {(p.num_agents, p.height) for p in problems}
    waits = {w for w in map(wait_subset, problems) if w is not None}
    full = paper.full_benchmark(cells, waits)
    paths = {ext: out / f"results.{ext}" for ext in ("md", "csv", "png", "json")}
    io.atomic_write(paths["md"], results_markdown(sums, label, family, full, api_errors))
    io.atomic_write(paths["csv"], results_csv(sums))
    results_plot(sums, paths["png"], family)
    summary = {
        "label": label,
        "family": family,
        "full_benchmark": full,
        "n": len(problems),
        "api_errors": api_errors,
        "means": {g: {str(k): v for k, v in _means(s).items()} for g, s in sums.items()},
        "aggregate_valid": {g: _aggregate_valid(s) for g, s in sums.items()},
        "cells": {
            g: {str(k): {str(n): list(c) for n, c in cs.items()} for k, cs in s.items()}
            for g, s in sums.items()
        },
    }
    io.atomic_write(paths["json"], json.dumps(summary, indent=1) + "\n")
    paths["verdicts"] = out / "verdicts.jsonl"
    io.save_jsonl(paths["verdicts"], rows)
    return paths


def evaluate(
    solver: Solver,
    problems: Sequence[Problem],
    out_dir,
    label: str,
    family=None,
    answers_out=None,
    batch_size: int = 32,
    progress: bool = True,
) -> dict[str, pathlib.Path]:
    """Answer (resumably), verify and write the result tables; returns the written paths."""
    unlabelled = [p.id for p in problems if p.optimal_soc is None]
    if unlabelled:
        raise ValueError(
            f"{len(unlabelled)} instance(s) have no optimal_soc label (first {unlabelled[0]!r}); "
            "optimal rates need labelled instances (python -m mapfjax.env benchmark)"
        )
    answers = generate_answers(solver, problems, answers_out, batch_size, progress)
    rows = score_answers(problems, answers)
    errors = len(getattr(solver, "errors", {}) or {})
    return write_results(out_dir, problems, rows, label, family, errors)
