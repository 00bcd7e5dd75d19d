"""The frontier map: per (map size, hole ratio, needs-wait) cell, a checkpoint's greedy and
sampled valid rates, and how many puzzles a GRPO group can learn from (mixed rewards) or flip
(greedy fails, a sample succeeds). Statistics are pure functions of per-sample results."""

from __future__ import annotations

import csv
import dataclasses
import io as std_io
import json
import logging
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from mapfjax import env, files, stats
from mapfjax.env import RewardConfig
from mapfjax.env import config as env_config
from mapfjax.env.types import Problem
from mapfjax.rl import rollout
from mapfjax.stats import Estimate, bounded_mean, proportion

log = logging.getLogger(__name__)

SPLITS = ("no-wait", "needs-wait", "all")  # the needs_wait label's halves, then both pooled


# --------------------------------------------------------------------------- metrics


@dataclasses.dataclass(frozen=True)
class Metric:
    """One column of the map: a statistic of (samples bool [P, K], greedy bool [P])."""

    label: str  # "{k}" stands for the sample count
    fn: Callable[[np.ndarray, np.ndarray], Estimate]
    upper: float  # largest possible value (heatmap colour scale)
    percent: bool  # shown as a percentage

    def title(self, k: int) -> str:
        return self.label.format(k=k)


def _rate(samples: np.ndarray) -> np.ndarray:
    return samples.mean(axis=1) if samples.shape[1] else np.zeros(samples.shape[0])


METRICS: dict[str, Metric] = {
    "greedy_valid": Metric("greedy valid", lambda s, g: proportion(g), 1.0, True),
    "mean_at_k": Metric("mean@{k}", lambda s, g: bounded_mean(_rate(s)), 1.0, True),
    "pass_at_k": Metric("pass@{k}", lambda s, g: proportion(s.any(axis=1)), 1.0, True),
    "mixed": Metric("mixed", lambda s, g: proportion(s.any(1) & ~s.all(1)), 1.0, True),
    "learnability": Metric(
        "p(1-p)", lambda s, g: bounded_mean(_rate(s) * (1 - _rate(s)), 0.25), 0.25, False
    ),
    "flip": Metric("flip", lambda s, g: proportion(~g & s.any(1)), 1.0, True),
}


def cell_stats(samples, greedy) -> dict[str, Estimate]:
    """Every metric of one cell. samples: bool [P, K] (sample validity, K samples of each of P
    puzzles at temperature 1); greedy: bool [P]. P = 0 gives n=0 estimates (nan values)."""
    samples, greedy = np.asarray(samples, bool), np.asarray(greedy, bool)
    if samples.ndim != 2 or greedy.shape != samples.shape[:1]:
        raise ValueError(
            f"cell_stats: samples {samples.shape} and greedy {greedy.shape}; expected [P, K], [P]"
        )
    return {name: m.fn(samples, greedy) for name, m in METRICS.items()}


# --------------------------------------------------------------------------- grid and results


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """The requested grid and how each puzzle is answered. Every (size, hole ratio) cell gets
    `per_cell` generated puzzles, `wait_ratio` of them needing a wait where the generator can;
    each puzzle is answered greedily once and `samples` times at `temperature`."""

    agents: int = 2
    sizes: tuple[int, ...] = tuple(range(3, 11))
    hole_ratios: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    per_cell: int = 24
    samples: int = 8
    wait_ratio: float = 0.5
    temperature: float = 1.0
    max_new_tokens: int = 80
    batch_rows: int = 256  # sequences per sampler call
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field, its value and what is allowed."""
        checks = [
            ("agents", 1 <= self.agents <= 5, "an integer in [1, 5]"),
            ("sizes", len(self.sizes) > 0 and all(2 <= s <= 10 for s in self.sizes), "2..10"),
            (
                "hole_ratios",
                len(self.hole_ratios) > 0
                and all(0 <= h <= env_config.MAX_HOLE_RATIO for h in self.hole_ratios),
                f"numbers in [0, {env_config.MAX_HOLE_RATIO}]",
            ),
            ("per_cell", self.per_cell >= 1, ">= 1"),
            ("samples", self.samples >= 1, ">= 1"),
            ("wait_ratio", 0 <= self.wait_ratio <= 1, "[0, 1]"),
            ("temperature", self.temperature > 0, "> 0 (sampling; greedy is always run too)"),
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("batch_rows", self.batch_rows >= 1, ">= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"frontier: {name} = {getattr(self, name)!r}; allowed: {allowed}")
        for name in ("sizes", "hole_ratios"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"frontier: {name} = {values!r} repeats a value")


def parse_ratios(text: str) -> tuple[float, ...]:
    """'0,0.1,0.2' -> sorted hole ratios; ValueError names the bad part."""
    out = []
    for part in str(text).split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise ValueError(f"hole_ratios {text!r}: {part!r} is not a number") from None
    return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class PuzzleResults:
    """Per-puzzle results, the table every statistic is computed from (P puzzles, K samples).

    ids: P puzzle ids; size: int [P]; hole_ratio: f64 [P] (the requested ratio of the cell);
    needs_wait: bool [P]; greedy: bool [P] greedy validity; samples: bool [P, K] validity.
    """

    ids: tuple[str, ...]
    size: np.ndarray
    hole_ratio: np.ndarray
    needs_wait: np.ndarray
    greedy: np.ndarray
    samples: np.ndarray

    def select(self, mask) -> tuple[np.ndarray, np.ndarray]:
        """(samples [p, K], greedy [p]) of the puzzles where `mask` bool [P] holds."""
        mask = np.asarray(mask, bool)
        return self.samples[mask], self.greedy[mask]

    def split_mask(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise ValueError(f"split {split!r}; allowed: {SPLITS}")
        if split == "all":
            return np.ones(len(self.ids), bool)
        return self.needs_wait == (split == "needs-wait")

    def to_columns(self) -> dict:
        """JSON columns; bools as strings of 0/1 (samples: one string of K per puzzle)."""
        bits = lambda xs: "".join("1" if x else "0" for x in xs)
        return {
            "id": list(self.ids),
            "size": [int(x) for x in self.size],
            "hole_ratio": [float(x) for x in self.hole_ratio],
            "needs_wait": bits(self.needs_wait),
            "greedy": bits(self.greedy),
            "samples": [bits(row) for row in self.samples],
        }

    @classmethod
    def from_columns(cls, cols: dict, k: int) -> PuzzleResults:
        """Inverse of `to_columns`; k is the sample count (columns may be empty)."""
        bits = lambda text: np.array([c == "1" for c in text], bool)
        n = len(cols["id"])
        samples = np.array([[c == "1" for c in row] for row in cols["samples"]], bool)
        return cls(
            ids=tuple(cols["id"]),
            size=np.array(cols["size"], np.int64),
            hole_ratio=np.array(cols["hole_ratio"], np.float64),
            needs_wait=bits(cols["needs_wait"]),
            greedy=bits(cols["greedy"]),
            samples=samples.reshape(n, k),
        )


@dataclasses.dataclass(frozen=True)
class CellRow:
    """One row of the map: a (size, hole ratio, split) cell; size or hole_ratio None = pooled."""

    size: int | None
    hole_ratio: float | None
    split: str
    stats: dict[str, Estimate]

    @property
    def n(self) -> int:
        return next(iter(self.stats.values())).n


def _cell_name(size, hole_ratio, split: str | None = None) -> str:
    parts = [f"{size}x{size}" if size is not None else "all sizes"]
    parts.append(f"hole ratio {hole_ratio:g}" if hole_ratio is not None else "all hole ratios")
    return ", ".join(parts + ([split] if split else []))


def frontier_rows(
    results: PuzzleResults, sizes: Sequence[int], hole_ratios: Sequence[float]
) -> tuple[list[CellRow], list[str]]:
    """One row per requested (size, hole ratio, split), an n=0 row where no puzzle exists, and
    a message naming each n=0 cell of a (size, hole ratio) that has puzzles in another split
    (cells with no puzzle at all are reported by the generation step)."""
    rows, messages = [], []
    for s in sizes:
        for h in hole_ratios:
            in_cell = (results.size == s) & np.isclose(results.hole_ratio, h)
            for split in SPLITS:
                mask = in_cell & results.split_mask(split)
                rows.append(CellRow(s, h, split, cell_stats(*results.select(mask))))
                if not mask.any() and in_cell.any():
                    messages.append(
                        f"{_cell_name(s, h, split)}: n=0 (none of the cell's "
                        f"{int(in_cell.sum())} puzzle(s) is {split})"
                    )
    return rows, messages


def pooled_rows(results: PuzzleResults, by: str, values: Sequence) -> list[CellRow]:
    """Rows pooled over everything but `by` ("size" or "hole_ratio"), both splits together."""
    rows = []
    for v in values:
        mask = np.isclose(getattr(results, by), v)
        size, hole = (v, None) if by == "size" else (None, v)
        rows.append(CellRow(size, hole, "all", cell_stats(*results.select(mask))))
    return rows


# --------------------------------------------------------------------------- puzzles and model


def generate_grid(cfg: FrontierConfig, progress: bool = True):
    """Labelled puzzles for every (size, hole ratio) cell, each cell from its own key ->
    (problems ordered by cell, [(size, hole ratio)] per problem, messages naming every cell
    that got no puzzle and why)."""
    base = jax.random.key(cfg.seed)
    problems, cells, messages = [], [], []
    grid = [(s, h) for s in cfg.sizes for h in cfg.hole_ratios]
    bar = _bar(len(grid), "generate", progress)
    for s, h in grid:
        name = _cell_name(s, h)
        if 2 * cfg.agents > s * s:
            messages.append(
                f"{name}: n=0, no puzzle exists: {cfg.agents} agents need {2 * cfg.agents} "
                f"distinct start/goal cells, a {s}x{s} map has {s * s}"
            )
        else:
            gen_cfg = env.default_config(cfg.agents, (s,), h, cfg.wait_ratio, cfg.seed)
            key = jax.random.fold_in(jax.random.fold_in(base, s), round(h * 1000))
            got, error, want = [], None, cfg.per_cell
            # The generator raises when it cannot fill a request; ask for half as many until
            # it can, so a hard cell keeps the puzzles that exist.
            while want >= 1 and not got:
                try:
                    got = env.generate(key, gen_cfg, want, id_prefix=f"hr{h:g}_").problems
                except RuntimeError as e:
                    error, want = e, want // 2
                except env_config.ConfigError as e:
                    error, want = e, 0
            if not got:
                messages.append(f"{name}: n=0, the generator produced no solvable puzzle: {error}")
            elif len(got) < cfg.per_cell:
                messages.append(f"{name}: only {len(got)} of {cfg.per_cell} puzzles: {error}")
            problems += got
            cells += [(s, h)] * len(got)
        bar.update(1)
    bar.close()
    for m in messages:
        log.warning("frontier: %s", m)
    return problems, cells, messages


def answer_grid(
    model,
    tokenizer,
    problems: Sequence[Problem],
    cells: Sequence[tuple[int, float]],
    cfg: FrontierConfig,
    mesh=None,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Greedy and K sampled answers for every problem, in sampler calls of at most
    `cfg.batch_rows` sequences -> (greedy bool [P], samples bool [P, K], truncation shares).
    The bar counts finished cells; problems must be ordered by cell (`generate_grid` does)."""
    k, n = cfg.samples, len(problems)
    greedy, samples = np.zeros(n, bool), np.zeros((n, k), bool)
    cut = {"greedy": 0, "samples": 0}
    base = jax.random.fold_in(jax.random.key(cfg.seed), 1)

    def run(lo, hi, repeats, temperature, key):
        sampling = rollout.SamplingConfig(cfg.max_new_tokens, temperature)
        chunk = list(problems[lo:hi])
        samples = rollout.sample(model, tokenizer, chunk, repeats, sampling, key, mesh)
        out, texts = samples.output, samples.texts
        verdict, _ = rollout.score(chunk, repeats, texts, RewardConfig())
        finished = np.asarray(out.finished)[: len(texts)]
        return np.asarray(verdict.valid, bool).reshape(hi - lo, repeats), int((~finished).sum())

    # The last problem index of each cell: the bar advances once both passes are past it.
    ends = [i for i in range(n) if i + 1 == n or cells[i + 1] != cells[i]]
    bar = _bar(len(ends), "answer", progress)
    per_call, done_greedy, shown = max(1, cfg.batch_rows // k), 0, 0
    for call, lo in enumerate(range(0, n, per_call)):
        hi = min(n, lo + per_call)
        while done_greedy < hi:  # greedy runs ahead in full-size calls of its own
            g_hi = min(n, done_greedy + cfg.batch_rows)
            valid, c = run(done_greedy, g_hi, 1, 0.0, None)
            greedy[done_greedy:g_hi], done_greedy = valid[:, 0], g_hi
            cut["greedy"] += c
        samples[lo:hi], c = run(lo, hi, k, cfg.temperature, jax.random.fold_in(base, call))
        cut["samples"] += c
        now = sum(e < hi for e in ends)
        bar.update(now - shown)
        shown = now
    bar.close()
    shares = {
        "greedy": cut["greedy"] / n if n else 0.0,
        "samples": cut["samples"] / (n * k) if n else 0.0,
    }
    return greedy, samples, shares


@dataclasses.dataclass(frozen=True)
class Frontier:
    """Everything a frontier run found: its config, the per-puzzle table, the map's rows, the
    n=0 messages (`generation`: cells without any puzzle; `messages`: those plus empty
    splits), timings (s) and truncation shares (answers that hit max_new_tokens)."""

    config: FrontierConfig
    label: str
    results: PuzzleResults
    rows: list[CellRow]
    generation: list[str]
    messages: list[str]
    seconds: dict[str, float]
    truncated: dict[str, float]

    def by_size(self) -> list[CellRow]:
        return pooled_rows(self.results, "size", self.config.sizes)

    def by_hole_ratio(self) -> list[CellRow]:
        return pooled_rows(self.results, "hole_ratio", self.config.hole_ratios)


def build(
    cfg: FrontierConfig,
    label: str,
    results: PuzzleResults,
    messages: Sequence[str] = (),
    seconds=None,
    truncated=None,
) -> Frontier:
    """The map of a per-puzzle table (pure: no model involved)."""
    rows, extra = frontier_rows(results, cfg.sizes, cfg.hole_ratios)
    messages = list(messages)
    return Frontier(
        cfg, label, results, rows, messages, messages + extra, seconds or {}, truncated or {}
    )


def run(model, tokenizer, cfg: FrontierConfig, label: str, mesh=None, progress=True) -> Frontier:
    """Generate the grid's puzzles, answer them (greedy and K samples) and build the map."""
    cfg.validate()
    t0 = time.perf_counter()
    problems, cells, messages = generate_grid(cfg, progress)
    t1 = time.perf_counter()
    greedy, samples, truncated = answer_grid(model, tokenizer, problems, cells, cfg, mesh, progress)
    t2 = time.perf_counter()
    results = PuzzleResults(
        ids=tuple(p.id for p in problems),
        size=np.array([c[0] for c in cells], np.int64),
        hole_ratio=np.array([c[1] for c in cells], np.float64),
        needs_wait=np.array([bool(p.needs_wait) for p in problems], bool),
        greedy=greedy,
        samples=samples.reshape(len(problems), cfg.samples),
    )
    seconds = {"generate": t1 - t0, "answer": t2 - t1, "total": t2 - t0}
    return build(cfg, label, results, messages, seconds, truncated)


def _bar(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, unit="cell", disable=not enabled)


# --------------------------------------------------------------------------- outputs


def _fmt(e: Estimate, metric: Metric) -> str:
    if e.n == 0:
        return "n=0"
    if metric.percent:
        return f"{100 * e.value:.0f} [{100 * e.low:.0f}, {100 * e.high:.0f}]"
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def markdown_table(rows: Sequence[CellRow], k: int) -> str:
    """size | hole ratio | split | n | each metric as value [95 % interval] (rates in %);
    k (the sample count) names the @k columns."""
    header = ["size", "hole ratio", "wait", "n", *(m.title(k) for m in METRICS.values())]
    lines = []
    for r in rows:
        size = f"{r.size}x{r.size}" if r.size is not None else "all"
        hole = f"{r.hole_ratio:g}" if r.hole_ratio is not None else "all"
        cells = [_fmt(r.stats[name], m) for name, m in METRICS.items()]
        lines.append([size, hole, r.split, r.n, *cells])
    return stats.markdown_table(header, lines)


def markdown(f: Frontier, images: Sequence[str] = ()) -> str:
    """The whole report: settings, n=0 messages, per-size and per-hole-ratio summaries, the
    full table and the heatmaps."""
    c, k = f.config, f.config.samples
    n = len(f.results.ids)
    parts = [
        f"# Frontier map: {f.label}",
        "",
        f"{c.agents} agents; {n} generated puzzles, {c.per_cell} per (size, hole ratio) cell "
        f"(wait ratio {c.wait_ratio:g}, split by each puzzle's needs_wait label), seed {c.seed}; "
        f"each answered greedily and with k={k} samples at temperature {c.temperature:g} "
        f"(max_new_tokens {c.max_new_tokens}).",
        "",
        f"Columns: greedy valid rate; mean@{k} = mean valid rate of the {k} samples; pass@{k} = "
        "share of puzzles with a valid sample; mixed = share of puzzles whose samples are "
        "partly valid (the groups GRPO gets a gradient from); p(1-p) = mean over puzzles of "
        "p(1-p), p the puzzle's sample valid rate (learnability, at most 0.25); flip = share "
        "of puzzles that greedy fails but a sample solves (what GRPO can flip). Rates in %, "
        "[95 % interval]: Wilson over the n puzzles (for mean@k and p(1-p) the Wilson interval "
        "of the mean scaled to [0, 1], conservative). `n=0`: no puzzle in the cell.",
        "",
    ]
    if f.seconds:
        t = f.seconds
        parts += [
            f"Time: {t['total']:.0f} s ({t['generate']:.0f} s generating, "
            f"{t['answer']:.0f} s answering).",
            "",
        ]
    if f.truncated and max(f.truncated.values()) > 0:
        parts += [
            f"Answers cut at max_new_tokens: greedy {100 * f.truncated['greedy']:.1f} %, "
            f"samples {100 * f.truncated['samples']:.1f} %.",
            "",
        ]
    if f.messages:
        parts += ["## Cells with no puzzle", ""] + [f"- {m}" for m in f.messages] + [""]
    parts += ["## Per map size (hole ratios and wait halves pooled)", ""]
    parts += [markdown_table(f.by_size(), k), ""]
    parts += ["## Per hole ratio (sizes and wait halves pooled)", ""]
    parts += [markdown_table(f.by_hole_ratio(), k), ""]
    parts += ["## Every cell", "", markdown_table(f.rows, k), ""]
    if images:
        parts += ["## Heatmaps", ""] + [f"![{p}]({p})" for p in images] + [""]
    return "\n".join(parts)


def csv_text(rows: Sequence[CellRow]) -> str:
    buf = std_io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = ["size", "hole_ratio", "wait", "n"]
    for name in METRICS:
        head += [name, f"{name}_low", f"{name}_high"]
    w.writerow(head)
    for r in rows:
        line = [r.size, r.hole_ratio, r.split, r.n]
        for name in METRICS:
            e = r.stats[name]
            line += ["" if e.n == 0 else f"{x:.6f}" for x in (e.value, e.low, e.high)]
        w.writerow(line)
    return buf.getvalue()


def _row_dict(r: CellRow) -> dict:
    head = {"size": r.size, "hole_ratio": r.hole_ratio, "wait": r.split, "n": r.n}
    return head | {name: e.as_dict() for name, e in r.stats.items()}


def to_json(f: Frontier) -> dict:
    return {
        "label": f.label,
        "config": dataclasses.asdict(f.config),
        "seconds": f.seconds,
        "truncated": f.truncated,
        "generation_messages": f.generation,
        "messages": f.messages,
        "cells": [_row_dict(r) for r in f.rows],
        "by_size": [_row_dict(r) for r in f.by_size()],
        "by_hole_ratio": [_row_dict(r) for r in f.by_hole_ratio()],
        "puzzles": f.results.to_columns(),
    }


def json_text(data: dict) -> str:
    """JSON with a line per top-level key, per list item and per column of a top-level
    object (small and diffable)."""

    def block(value, indent: str) -> str:
        if isinstance(value, list) and value and isinstance(value[0], (dict, str)):
            items = ",\n".join(indent + " " + json.dumps(v) for v in value)
            return f"[\n{items}\n{indent}]"
        if isinstance(value, dict) and value and indent == " ":
            items = ",\n".join(f"  {json.dumps(k)}: {block(v, '  ')}" for k, v in value.items())
            return f"{{\n{items}\n }}"
        return json.dumps(value)

    parts = [f" {json.dumps(key)}: {block(value, ' ')}" for key, value in data.items()]
    return "{\n" + ",\n".join(parts) + "\n}\n"


def from_json(data: dict) -> Frontier:
    """Rebuild a Frontier from `to_json` output (the statistics are recomputed)."""
    c = data["config"]
    cfg = FrontierConfig(
        **(c | {"sizes": tuple(c["sizes"]), "hole_ratios": tuple(c["hole_ratios"])})
    )
    results = PuzzleResults.from_columns(data["puzzles"], cfg.samples)
    gen = data["generation_messages"]
    return build(cfg, data["label"], results, gen, data["seconds"], data["truncated"])


_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}


def heatmap_png(f: Frontier, metric: str) -> bytes:
    """PNG bytes: size (rows) x hole ratio (columns) heatmaps of one metric, one panel per
    split; each cell shows the value and n, n=0 cells are grey and hatched."""
    # Local: matplotlib takes seconds to import, and Agg must be chosen before pyplot loads.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, k = METRICS[metric], f.config.samples
    scale = 100.0 if m.percent else 1.0
    sizes, holes = f.config.sizes, f.config.hole_ratios
    by_cell = {(r.size, r.hole_ratio, r.split): r.stats[metric] for r in f.rows}
    # Square cells of about 0.55 inch (room for two lines of text), plus axes and colour bar.
    w, h = max(1.8, 0.55 * len(holes) + 0.5), max(1.8, 0.55 * len(sizes) + 0.9)
    fig, axes = plt.subplots(
        1, len(SPLITS), figsize=(w * len(SPLITS) + 1.6, h), sharey=True, layout="constrained"
    )
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")
    for ax, split in zip(axes, SPLITS, strict=True):
        cells = [[by_cell[(s, hr, split)] for hr in holes] for s in sizes]
        grid = np.array([[e.value * scale if e.n else np.nan for e in row] for row in cells])
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=m.upper * scale)
        for (i, j), e in np.ndenumerate(np.array(cells, dtype=object)):
            if e.n == 0:
                box = plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0)
                ax.add_patch(box)
                ax.text(j, i, "n=0", ha="center", va="center", fontsize=7, bbox=_LABEL_BOX)
                continue
            txt = f"{e.value * scale:.0f}%" if m.percent else f"{e.value:.3f}"
            color = "white" if e.value < 0.6 * m.upper else "black"  # viridis is dark low
            ax.text(j, i, f"{txt}\nn={e.n}", ha="center", va="center", fontsize=6.5, color=color)
        ax.set_xticks(range(len(holes)), [f"{x:g}" for x in holes])
        ax.set_yticks(range(len(sizes)), [f"{s}x{s}" for s in sizes])
        ax.set_xlabel("hole ratio")
        ax.set_title("both pooled" if split == "all" else split, fontsize=9)
    axes[0].set_ylabel("map size")
    unit = " (%)" if m.percent else ""
    fig.colorbar(image, ax=list(axes), shrink=0.85, label=m.title(k) + unit)
    fig.suptitle(f"{f.label}: {m.title(k)} (grey, hatched: no puzzle)", fontsize=9)
    buf = std_io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    # A 256-colour palette keeps the file about 3x smaller with no visible change.
    buf.seek(0)
    out = std_io.BytesIO()
    Image.open(buf).convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def write(f: Frontier, out_dir) -> dict[str, pathlib.Path]:
    """frontier.{md,csv,json} and frontier_<metric>.png in `out_dir`, each written atomically
    (temp file in the same directory, then os.replace); returns the paths by name."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for metric in METRICS:
        paths[metric] = out / f"frontier_{metric}.png"
        files.atomic_write(paths[metric], heatmap_png(f, metric))
    images = [paths[m].name for m in METRICS]
    paths |= {ext: out / f"frontier.{ext}" for ext in ("md", "csv", "json")}
    files.atomic_write(paths["csv"], csv_text(f.rows))
    files.atomic_write(paths["json"], json_text(to_json(f)))
    files.atomic_write(paths["md"], markdown(f, images))
    return paths
