"""Deterministic builder of the paper's evaluation set: agents x sizes x wait-ratio subsets.

3 agents on 3x3..10x10, 4 on 4x4..10x10, 5 on 5x5..10x10 (21 cells) x wait-ratio subsets
0.25 / 0.50 / 0.75 x 50 instances = 3,150 labelled instances [paper]. Each cell is generated
by `generator.generate` from its own key, so any cell can be rebuilt alone. Each instance
carries its cell in `meta` (agents, size, hole_ratio, wait_ratio); evaluation reads the cell
from there and from the instance's own fields, never from the id.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tqdm.auto import tqdm

from mapfjax import stats, streams
from mapfjax.env import config as env_config
from mapfjax.env import generator
from mapfjax.env.types import Problem

PAPER_AGENTS = (3, 4, 5)
PAPER_WAIT_RATIOS = (0.25, 0.50, 0.75)
PER_CELL = 50


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """What to build. hole_ratio is our choice: the paper's sample ids (`..._hr0.1_...`)
    suggest 0.1; the paper does not say more [ours]."""

    agents: tuple[int, ...] = PAPER_AGENTS
    sizes: tuple[int, ...] = env_config.PAPER_SIZES
    wait_ratios: tuple[float, ...] = PAPER_WAIT_RATIOS
    per_cell: int = PER_CELL
    hole_ratio: float = 0.1
    seed: int = 0
    max_nodes: int = 50_000
    time_limit: float = 10.0
    processes: int = 0

    def cells(self) -> list[tuple[int, int, float]]:
        """(agents, size, wait_ratio) triples; a size below the agent count is skipped."""
        return [
            (k, n, w) for w in self.wait_ratios for k in self.agents for n in self.sizes if n >= k
        ]


def cell_id(agents: int, size: int, wait_ratio: float, hole_ratio: float, i: int) -> str:
    """Instance id, e.g. '3ag_5x5_hr0.1_wr0.50_007' (the paper's style plus the subset)."""
    return f"{agents}ag_{size}x{size}_hr{hole_ratio:g}_wr{wait_ratio:.2f}_{i:03d}"


def cell_config(spec: BenchmarkSpec, agents: int, size: int, wait_ratio: float):
    cfg = env_config.default_config(
        num_agents=agents, sizes=(size,), hole_ratio=spec.hole_ratio, wait_ratio=wait_ratio
    )
    cfg.seed = spec.seed
    cfg.max_size = max(cfg.max_size, size)
    cfg.oracle.max_nodes = spec.max_nodes
    cfg.oracle.time_limit = spec.time_limit
    cfg.oracle.processes = spec.processes
    return cfg


def cell_meta(spec: BenchmarkSpec, agents: int, size: int, wait_ratio: float) -> dict:
    """The `meta` object of every instance of a cell (written to the instance JSONL)."""
    return {"agents": agents, "size": size, "hole_ratio": spec.hole_ratio, "wait_ratio": wait_ratio}


def build_cell(spec: BenchmarkSpec, agents: int, size: int, wait_ratio: float):
    """Generate one (agents, size, wait_ratio) cell; returns (problems, report)."""
    cfg = cell_config(spec, agents, size, wait_ratio)
    key = streams.key(spec.seed, f"{agents}/{size}/{wait_ratio:.4f}")  # the cell's own stream
    out = generator.generate(key, cfg, spec.per_cell)
    meta = cell_meta(spec, agents, size, wait_ratio)
    problems = [
        dataclasses.replace(
            p, id=cell_id(agents, size, wait_ratio, spec.hole_ratio, i), meta=dict(meta)
        )
        for i, p in enumerate(out.problems)
    ]
    return problems, out.report


def build(
    spec: BenchmarkSpec = BenchmarkSpec(), progress: bool = True
) -> tuple[list[Problem], list]:
    """Build every cell in a fixed order; returns (problems, per-cell size reports)."""
    problems, reports = [], []
    cells = spec.cells()
    bar = None
    if progress:
        bar = tqdm(cells, desc="benchmark cells", unit="cell")
    for k, n, w in cells:
        probs, rep = build_cell(spec, k, n, w)
        problems += probs
        reports.append({"agents": k, "size": n, "wait_ratio": w, **rep.to_dict()})
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{k}ag {n}x{n} wr{w:.2f}")
    if bar is not None:
        bar.close()
    return problems, reports


_ID_PARTS = (
    (re.compile(r"(\d+)ag"), lambda m: {"agents": int(m[1])}),
    (re.compile(r"(\d+)x(\d+)"), lambda m: {"height": int(m[1]), "width": int(m[2])}),
    (re.compile(r"hr(\d+(?:\.\d+)?)"), lambda m: {"hole_ratio": float(m[1])}),
    (re.compile(r"wr(\d+(?:\.\d+)?)"), lambda m: {"wait_ratio": float(m[1])}),
)


def parse_id(sample_id: str) -> dict:
    """The fields an id in our or the paper's style spells ('3ag_5x5_hr0.1_wr0.50_007',
    '3ag_5x5_hr0.1_007'); parts of any other shape (e.g. 'wrong') are ignored. For display
    only: evaluation takes cells from the instance's fields and `meta`, never from its id."""
    out: dict = {}
    for part in sample_id.split("_"):
        for pattern, fields in _ID_PARTS:
            m = pattern.fullmatch(part)
            if m:
                out.update(fields(m))
    return out


def summarize(problems, rows) -> dict[int, dict[int, tuple[float, float | None, int]]]:
    """Per agents -> size -> (valid %, optimal %, count) from verdict rows (dicts). The optimal
    % is None (unknown) in a cell where some instance has no optimal_soc label (its row's
    "optimal" is None)."""
    cells = stats.tally(
        (
            {
                "agents": p.num_agents,
                "size": p.height,
                "valid": r["valid"],
                "optimal": r["optimal"],
                "labelled": r["optimal"] is not None,
            }
            for p, r in zip(problems, rows, strict=True)
        ),
        ("agents", "size"),
        flags=("valid", "optimal", "labelled"),
    )
    out: dict[int, dict[int, tuple[float, float | None, int]]] = {}
    for (k, n), c in cells.items():
        optimal = stats.rate(c, "optimal", 100.0) if c["labelled"] == c["n"] else None
        out.setdefault(k, {})[n] = (stats.rate(c, "valid", 100.0), optimal, c["n"])
    return out


def size_means(cells: dict[int, tuple[float, float | None, int]]) -> tuple[float, float | None]:
    """(mean valid %, mean optimal %) over the sizes of one agent count's `summarize` cells
    (the paper's mean); the optimal mean is None when some cell's optimal % is unknown."""
    optimal = [c[1] for c in cells.values()]
    mean_optimal = stats.cell_mean(optimal) if None not in optimal else None
    return stats.cell_mean(c[0] for c in cells.values()), mean_optimal


def table(summary: dict, sizes=env_config.PAPER_SIZES) -> str:
    """Markdown table in the paper's layout: one row per agent count, valid/optimal % per size
    and their mean over the sizes present; an unknown optimal % (unlabelled instances) is "?"
    and makes the mean's optimal part "?" too."""
    pct = lambda x: "?" if x is None else "-" if math.isnan(x) else f"{x:.1f}"
    rows = []
    for k, cells in summary.items():
        txt = [f"{pct(cells[n][0])} / {pct(cells[n][1])}" if n in cells else "-" for n in sizes]
        mean_v, mean_o = size_means({n: c for n, c in cells.items() if n in sizes})
        rows.append([k, *txt, f"{pct(mean_v)} / {pct(mean_o)}"])
    return stats.markdown_table(["agents", *(f"{n}x{n}" for n in sizes), "mean"], rows)
