"""The paper's published benchmark numbers (docs/paper.md sections 4-5) as data, each row tagged
with the setting it belongs to, and the rule that picks the rows comparable to one evaluation."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from mapfjax.env import config as env_config

# Qwen3-4B's architecture (docs/paper.md section 7): how a local checkpoint is recognised.
QWEN3_4B = {"num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728}


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """Mean over map sizes of one (model, agent count) on the full benchmark [paper].

    model: the paper's name; base: the base model family ("qwen3-4b" or the API model's
    alias), used to match an evaluation; role: "solver" (a model answering directly),
    "base" (untrained), "fixed" (GRPO on a fixed random config) or "engineer" (GRPO + V6).
    valid / optimal: percentages; None when the paper does not give the number.
    """

    model: str
    base: str
    role: str
    agents: int
    valid: float | None
    optimal: float | None


def _rows(model, base, role, cells) -> list[PaperRow]:
    return [PaperRow(model, base, role, k, v, o) for k, (v, o) in zip((3, 4, 5), cells)]


# Section 5, main results: mean over map sizes, valid % / optimal %.
MAIN: tuple[PaperRow, ...] = tuple(
    _rows("GPT-5.4 (solver)", "gpt-5.4", "solver", [(32.50, 20.58), (17.05, 10.86), (9.11, 6.00)])
    + _rows("Grok-4.2", "grok-4.2", "solver", [(33.42, 21.00), (23.43, 15.33), (12.89, 8.78)])
    + _rows(
        "Gemini-3.1-Pro", "gemini-3.1-pro", "solver", [(24.50, 15.33), (12.95, 10.10), (4.78, 3.56)]
    )
    + _rows("Kimi-K2.5", "kimi-k2.5", "solver", [(46.17, 29.25), (26.95, 17.90), (13.47, 8.78)])
    + _rows("Qwen3-4B base", "qwen3-4b", "base", [(14.83, 14.00), (3.43, 3.05), (1.44, 1.22)])
    + _rows(
        "Qwen3-4B + GRPO, fixed random config",
        "qwen3-4b",
        "fixed",
        [(40.42, 26.08), (26.67, 16.10), (15.11, 9.11)],
    )
    + _rows(
        "Qwen3-4B + GRPO + engineer (V6)",
        "qwen3-4b",
        "engineer",
        [(51.67, 31.67), (33.14, 21.33), (18.67, 11.00)],
    )
)

# Section 5: per-size 3-agent row of the paper's method (Qwen3-4B + GRPO + engineer V6).
PER_SIZE_3AG: dict[int, tuple[float, float]] = {
    3: (68.67, 48.00),
    4: (64.67, 41.33),
    5: (62.67, 35.33),
    6: (52.67, 37.33),
    7: (46.00, 26.00),
    8: (42.67, 24.00),
    9: (44.00, 25.33),
    10: (32.00, 16.00),
}

# Section 4, context ablation: aggregate valid % per wait-ratio subset (0.25, 0.50, 0.75) of
# Qwen3-4B trained with the engineer seeing each context variant.
ABLATION_VALID: dict[str, dict[float, float]] = {
    name: dict(zip((0.25, 0.50, 0.75), vals))
    for name, vals in {
        "V1 F only": (25.2, 18.4, 14.9),
        "V2 +G": (36.6, 26.9, 19.7),
        "V3 +H with default": (38.8, 31.0, 23.9),
        "V4 H without default": (41.4, 33.6, 25.2),
        "V5 +S": (32.6, 24.6, 19.7),
        "V6 +T bookkeeping": (45.2, 35.7, 27.3),
    }.items()
}

# Section 4, engineer ablations (Qwen3-4B, full benchmark), per agent count valid / optimal.
ENGINEER_ABLATION: tuple[PaperRow, ...] = tuple(
    _rows(
        "engineer sees full RL details in T",
        "qwen3-4b",
        "engineer_full_T",
        [(38.83, 26.50), (24.76, 18.19), (14.22, 10.11)],
    )
    + _rows(
        "untrained base model as the engineer",
        "qwen3-4b",
        "engineer_base",
        [(45.21, 30.00), (27.62, 19.62), (16.00, 10.89)],
    )
)


def model_family(checkpoint: str | None = None, api_model: str | None = None) -> str | None:
    """The paper's base name an evaluation belongs to: "qwen3-4b" for a checkpoint with Qwen3-4B's
    architecture (read from its config.json), an API model's alias when its name contains one
    ("gpt-5.4", "grok-4.2", ...), else None (nothing in the paper is comparable)."""
    if api_model:
        name = api_model.lower().replace("_", "-")
        for base in sorted({r.base for r in MAIN if r.role == "solver"}, key=len, reverse=True):
            if base in name:
                return base
        return "qwen3-4b" if "qwen3-4b" in name else None
    if checkpoint:
        path = pathlib.Path(checkpoint) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if all(cfg.get(k) == v for k, v in QWEN3_4B.items()):
            return "qwen3-4b"
    return None


def full_benchmark(cells: set[tuple[int, int]], wait_ratios: set[float]) -> bool:
    """True when the evaluated (agents, size) cells and wait-ratio subsets cover the paper's
    benchmark (21 cells x 3 subsets), so its means over sizes are comparable to ours."""
    want = {(k, n) for k in (3, 4, 5) for n in env_config.PAPER_SIZES if n >= k}
    return want <= cells and {0.25, 0.5, 0.75} <= {round(w, 2) for w in wait_ratios}


def comparable_rows(family: str | None) -> list[PaperRow]:
    """The paper's rows for one model family (all of them for Qwen3-4B: base, fixed, engineer
    and the engineer ablations; one solver row set for an API model)."""
    if family is None:
        return []
    return [r for r in (*MAIN, *ENGINEER_ABLATION) if r.base == family]
