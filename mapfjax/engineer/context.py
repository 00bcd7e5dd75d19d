"""The engineer's context: round records and the switchable modules F G H S T
(docs/paper.md section 4).

Each module renders one compact markdown section; `build_context` joins the enabled ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import ml_collections

from mapfjax.checks import did_you_mean
from mapfjax.env.config import RATIO_FIELDS, flatten, key_size, size_key
from mapfjax.env.types import FAILURE_NAMES
from mapfjax.stats import markdown_table, merge, tally

ROW_KEYS = ("size", "valid", "optimal", "failure")  # required in every validation row
T_DETAILS = ("bookkeeping", "full")
# Training keys the "bookkeeping" T module shows; everything else is an RL detail.
BOOKKEEPING_KEYS = ("round", "rounds", "epoch", "epochs")
# Per-size training-rollout statistics of a round (RoundRecord.rollouts["sizes"][<size>]).
ROLLOUT_KEYS = (
    "groups",
    "samples",
    "valid_rate",
    "mixed_groups",
    "learnability",
    "mean_abs_advantage",
)


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    """What one finished round leaves for the engineer.

    round: index n of the round (0 = the default config).
    config: the generator config C_n the round trained on, as a plain nested dict.
    validation: `failure_breakdown(rows)` of the validation after training on C_n.
    summary: the engineer's rationale for choosing C_n (empty for round 0).
    training: training facts, e.g. {"round": 1, "epoch": 2, "lr": 1e-6, "group_size": 8}.
    rollouts: the round's training-rollout statistics per map size, {"sizes": {"3": {"groups",
        "samples", "valid_rate", "mixed_groups", "learnability", "mean_abs_advantage"}}}
        (ROLLOUT_KEYS): learnability = mean over the size's groups of p(1 - p), p the group's
        share of valid samples; mixed_groups = share of groups with unequal rewards;
        mean_abs_advantage = mean |A| over the size's samples. Empty for older records.
    wait_split: `wait_breakdown(rows)` of the same validation, pooled over sizes: the puzzles
        that need a wait and the others. Empty for older records and unlabelled held-out sets.
    """

    round: int
    config: dict[str, Any]
    validation: dict[str, Any]
    summary: str = ""
    training: dict[str, Any] = dataclasses.field(default_factory=dict)
    rollouts: dict[str, Any] = dataclasses.field(default_factory=dict)
    wait_split: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoundRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"RoundRecord: unknown key(s) {unknown}; allowed: {sorted(fields)}")
        for key in ("round", "config", "validation"):
            if key not in d:
                raise ValueError(f"RoundRecord: missing key {key!r}")
        return cls(
            round=int(d["round"]),
            config=dict(d["config"]),
            validation=dict(d["validation"]),
            summary=str(d.get("summary", "")),
            training=dict(d.get("training", {})),
            rollouts=dict(d.get("rollouts", {})),
            wait_split=dict(d.get("wait_split", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RoundRecord:
        return cls.from_dict(json.loads(text))


def _check_rows(rows: Sequence[Mapping[str, Any]]) -> None:
    for i, row in enumerate(rows):
        for key in ROW_KEYS:
            if key not in row:
                raise ValueError(f"validation row {i}: missing key {key!r}; required: {ROW_KEYS}")
        valid, failure = bool(row["valid"]), row["failure"]
        if valid and failure is not None:
            raise ValueError(f"validation row {i}: valid but failure = {failure!r}")
        if not valid and failure not in FAILURE_NAMES:
            raise ValueError(
                f"validation row {i}: failure = {failure!r}; allowed: one of {FAILURE_NAMES}"
            )
        if row["optimal"] and not valid:
            raise ValueError(f"validation row {i}: optimal but not valid")


def _counts(rows: Sequence[Mapping[str, Any]], by) -> dict:
    return tally(
        rows,
        by,
        flags=("valid", "optimal", "truncated"),
        labels={"failures": ("failure", FAILURE_NAMES)},
        sums={"tokens": "response_tokens"},
    )


def failure_breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-size counts from validation rows; keys are config size keys ('s7'), sorted by size.

    Each entry: n, valid, optimal, failures {label: count for every FAILURE_NAMES label},
    truncated (count), tokens (summed response tokens) and tokens_n (rows that reported them).
    Counts rather than rates so that breakdowns can be merged and stored exactly.
    """
    _check_rows(rows)
    return {size_key(n): c for n, c in _counts(rows, lambda r: int(r["size"])).items()}


# The halves of a held-out set by the generator's label: a puzzle "needs a wait" when its optimal
# sum of costs exceeds the agents' separate shortest paths (`mapfjax.env.types.needs_wait`).
WAIT_HALVES = ("needs_wait", "no_wait")


def wait_breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The same counts as `failure_breakdown`, pooled over sizes and split by each row's
    `needs_wait` label: {"needs_wait": {...}, "no_wait": {...}} (a half with no puzzle is left
    out). Rows without the label (missing or None) are not counted; {} when none has it."""
    _check_rows(rows)
    labelled = [r for r in rows if r.get("needs_wait") is not None]
    counts = _counts(labelled, lambda r: WAIT_HALVES[not bool(r["needs_wait"])])
    return {half: counts[half] for half in WAIT_HALVES if half in counts}


# ----------------------------------------------------------------------------- signals


@dataclasses.dataclass(frozen=True)
class SizeSignal:
    """What one round says about one map size, for the curriculum engineers.

    valid_rate: share of valid answers p. learnability: mean over groups of p(1 - p)
    (rollouts) or p(1 - p) of the validation rate. mean_abs_advantage: mean |A| (rollouts) or
    2 sqrt(p(1 - p)), the mean |A| of a std-scaled group of binary rewards with success share
    p (validation). n: rollout samples or validation rows. source: 'rollouts' or 'validation'.
    """

    valid_rate: float
    learnability: float
    mean_abs_advantage: float
    n: int
    source: str


def rollout_stats(record: RoundRecord) -> dict[str, dict[str, float]]:
    """record.rollouts per config size key ('s3'), sorted by size; {} when there are none.

    Size keys may be written '3', 's3' or '3x3'; a size without samples, or whose statistics
    lack a ROLLOUT_KEYS entry or hold a non-number, is left out.
    """
    sizes = record.rollouts.get("sizes", {}) if isinstance(record.rollouts, Mapping) else {}
    out = {}
    for key, stats in sizes.items() if isinstance(sizes, Mapping) else ():
        try:
            values = {k: float(stats[k]) for k in ROLLOUT_KEYS}
            n = key_size(key)
        except (KeyError, TypeError, ValueError):
            continue
        if values["samples"] > 0 and all(math.isfinite(v) for v in values.values()):
            out[size_key(n)] = values
    return {k: out[k] for k in sorted(out, key=key_size)}


def size_signals(record: RoundRecord) -> dict[str, SizeSignal]:
    """Per config size key: the record's rollouts when it has any, else its validation."""
    stats = rollout_stats(record)
    if stats:
        return {
            k: SizeSignal(
                e["valid_rate"],
                e["learnability"],
                e["mean_abs_advantage"],
                int(e["samples"]),
                "rollouts",
            )
            for k, e in stats.items()
        }
    out = {}
    for k, e in record.validation.items():
        if e.get("n", 0) > 0:
            p = e["valid"] / e["n"]
            out[k] = SizeSignal(p, p * (1 - p), 2 * math.sqrt(p * (1 - p)), e["n"], "validation")
    return out


# ----------------------------------------------------------------------------- rendering


def _pct(num: float, den: float, digits: int = 1) -> str:
    return "-" if den == 0 else f"{100.0 * num / den:.{digits}f}"


def _sorted_sizes(keys) -> list[str]:
    return sorted(keys, key=key_size)


def _size_label(key: str) -> str:
    n = key_size(key)
    return f"{size_key(n)} ({n}x{n})"


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _sizes_of(config: Mapping[str, Any] | ml_collections.ConfigDict) -> dict[str, Any]:
    d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    return dict(d.get("sizes", {}))


def render_config(config: Mapping[str, Any] | ml_collections.ConfigDict) -> str:
    """The per-size ratios of a config as a markdown table."""
    sizes = _sizes_of(config)
    rows = [
        [_size_label(k)] + [f"{float(sizes[k][f]):.3g}" for f in RATIO_FIELDS]
        for k in _sorted_sizes(sizes)
    ]
    return markdown_table(["size", *RATIO_FIELDS], rows)


def _failure_cell(count: int, n: int) -> str:
    return "0" if count == 0 else f"{count} ({_pct(count, n, 0)}%)"


def _breakdown_row(label: str, e: Mapping[str, Any]) -> list[str]:
    n = e["n"]
    tokens = "-" if not e.get("tokens_n") else f"{e['tokens'] / e['tokens_n']:.0f}"
    return [
        label,
        str(n),
        _pct(e["valid"], n),
        _pct(e["optimal"], n),
        *[_failure_cell(e["failures"].get(f, 0), n) for f in FAILURE_NAMES],
        tokens,
        _pct(e.get("truncated", 0), n, 0),
    ]


_BREAKDOWN_COLUMNS = ["n", "valid %", "optimal %", *FAILURE_NAMES, "mean tokens", "truncated %"]


def render_breakdown(breakdown: Mapping[str, Mapping[str, Any]]) -> str:
    """A failure breakdown as a markdown table, one row per size plus an `all` row."""
    keys = _sorted_sizes(breakdown)
    rows = [_breakdown_row(_size_label(k), breakdown[k]) for k in keys]
    if len(keys) > 1:
        rows.append(_breakdown_row("all", merge(breakdown[k] for k in keys)))
    return markdown_table(["size", *_BREAKDOWN_COLUMNS], rows)


WAIT_LABELS = {"needs_wait": "needs a wait", "no_wait": "needs none"}


def failure_shares(split: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each half's share of the failed puzzles in a `wait_breakdown`; {} when none failed."""
    failed = {h: e["n"] - e["valid"] for h, e in split.items()}
    total = sum(failed.values())
    return {h: f / total for h, f in failed.items()} if total else {}


def render_wait_split(split: Mapping[str, Mapping[str, Any]]) -> str:
    """`wait_breakdown` as a markdown table: one row per half, and what share of the failures
    each half holds."""
    shares = failure_shares(split)
    rows = [
        _breakdown_row(WAIT_LABELS[h], split[h]) + [_pct(shares[h], 1, 0) if shares else "-"]
        for h in WAIT_HALVES
        if h in split
    ]
    return markdown_table(["puzzles", *_BREAKDOWN_COLUMNS, "share of failures %"], rows)


def _main_failure(e: Mapping[str, Any]) -> str:
    counts = e.get("failures", {})
    best = max(FAILURE_NAMES, key=lambda f: (counts.get(f, 0), -FAILURE_NAMES.index(f)))
    return "-" if counts.get(best, 0) == 0 else f"{best} {_pct(counts[best], e['n'], 0)}%"


# ----------------------------------------------------------------------------- modules


def render_rollouts(stats: Mapping[str, Mapping[str, float]]) -> str:
    """`rollout_stats` as a markdown table, one row per size."""
    rows = [
        [
            _size_label(k),
            f"{e['groups']:.0f}",
            f"{e['samples']:.0f}",
            f"{100 * e['valid_rate']:.1f}",
            f"{100 * e['mixed_groups']:.0f}",
            f"{e['learnability']:.3f}",
            f"{e['mean_abs_advantage']:.3f}",
        ]
        for k, e in stats.items()
    ]
    header = ["size", "groups", "samples", "valid %", "mixed groups %", "p(1-p)", "mean |A|"]
    return markdown_table(header, rows)


def _module_f(records: Sequence[RoundRecord], current, opts) -> str:
    if not records:
        return "No validation results yet."
    last = records[-1]
    text = f"Validation after round {last.round}:\n\n" + render_breakdown(last.validation)
    stats = rollout_stats(last)
    if stats:
        text += (
            f"\n\nTraining rollouts of round {last.round} (p(1-p): mean over groups of the "
            "valid share times its complement; mixed groups: groups whose rewards differ, the "
            "only ones that teach):\n\n" + render_rollouts(stats)
        )
    if opts.get("wait_split", False) and last.wait_split:
        text += (
            f"\n\nValidation after round {last.round} by whether a puzzle needs a wait (its "
            "optimal sum of costs exceeds the agents' separate shortest paths; the config's "
            "wait_ratio sets the share of such puzzles in training):\n\n"
            + render_wait_split(last.wait_split)
        )
    return text


def _module_g(records, current, opts) -> str:
    text = str(opts.get("text", "") or "")
    if not text:
        path = str(opts.get("path", "") or "")
        if not path:
            raise ValueError("modules.G: set modules.G.path (a guideline file) or modules.G.text")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"modules.G.path = {path!r}: cannot read the guideline ({e})") from e
    return text.strip()


def _module_h(records: Sequence[RoundRecord], current, opts) -> str:
    chosen = [r for r in records if opts.get("include_default", True) or r.round != 0]
    limit = int(opts.get("max_rounds", 0) or 0)
    if limit > 0:
        chosen = chosen[-limit:]
    if not chosen:
        return "No earlier rounds to show."
    rows = []
    for r in chosen:
        sizes = _sizes_of(r.config)
        for k in _sorted_sizes(set(sizes) | set(r.validation)):
            cfg = sizes.get(k, {})
            e = r.validation.get(k)
            rows.append(
                [str(r.round), _size_label(k)]
                + [f"{float(cfg[f]):.3g}" if f in cfg else "-" for f in RATIO_FIELDS]
                + (
                    [_pct(e["valid"], e["n"], 0), _pct(e["optimal"], e["n"], 0), _main_failure(e)]
                    if e
                    else ["-", "-", "-"]
                )
            )
    header = ["round", "size", "data", "hole", "wait", "valid %", "optimal %", "main failure"]
    return markdown_table(header, rows)


def _module_s(records: Sequence[RoundRecord], current, opts) -> str:
    summary = records[-1].summary.strip() if records else ""
    return summary or "No summary from a previous round."


def _module_t(records: Sequence[RoundRecord], current, opts) -> str:
    detail = opts.get("detail", "bookkeeping")
    if not records:
        return "Training has not started yet."
    last = records[-1]
    info = {"round": last.round, **flatten(last.training)}
    if detail == "bookkeeping":
        info = {k: v for k, v in info.items() if k in BOOKKEEPING_KEYS}
    lines = [f"- {k}: {_num(v)}" for k, v in sorted(info.items())]
    return f"Finished round {last.round}; the config you write is for round {last.round + 1}.\n" + (
        "\n".join(lines)
    )


class ContextModule(NamedTuple):
    header: str
    render: Callable[[Sequence[RoundRecord], Any, Mapping[str, Any]], str]


# Rendering order: principles first, then where training stands, then evidence.
MODULES: dict[str, ContextModule] = {
    "G": ContextModule("## Guideline", _module_g),
    "T": ContextModule("## Training progress", _module_t),
    "H": ContextModule("## History of earlier rounds", _module_h),
    "S": ContextModule("## Your summary from the previous round", _module_s),
    "F": ContextModule("## Failure breakdown", _module_f),
}
CURRENT_HEADER = "## Current config"
MODULE_OPTIONS = {
    "F": ("enabled", "wait_split"),
    "G": ("enabled", "path", "text"),
    "H": ("enabled", "include_default", "max_rounds"),
    "S": ("enabled",),
    "T": ("enabled", "detail"),
}


def check_modules(modules: ml_collections.ConfigDict | Mapping[str, Any]) -> dict[str, dict]:
    """Validate a modules config; return it as {name: options}. Missing modules are off."""
    d = modules.to_dict() if isinstance(modules, ml_collections.ConfigDict) else dict(modules)
    unknown = sorted(set(d) - set(MODULES))
    if unknown:
        raise ValueError(
            f"modules: unknown module(s) {unknown}; allowed: {sorted(MODULES)}"
            + did_you_mean(unknown, MODULES)
        )
    out = {}
    for name, opts in d.items():
        opts = dict(opts) if isinstance(opts, Mapping) else {"enabled": opts}
        extra = sorted(set(opts) - set(MODULE_OPTIONS[name]))
        if extra:
            raise ValueError(
                f"modules.{name}: unknown option(s) {extra}; allowed: {list(MODULE_OPTIONS[name])}"
                + did_you_mean(extra, MODULE_OPTIONS[name])
            )
        if not isinstance(opts.get("enabled", False), bool):
            raise ValueError(f"modules.{name}.enabled = {opts['enabled']!r}; allowed: True/False")
        for flag in ("include_default", "wait_split"):
            if not isinstance(opts.get(flag, False), bool):
                raise ValueError(f"modules.{name}.{flag} = {opts[flag]!r}; allowed: True/False")
        if name == "T" and opts.get("detail", "bookkeeping") not in T_DETAILS:
            raise ValueError(f"modules.T.detail = {opts['detail']!r}; allowed: {list(T_DETAILS)}")
        out[name] = opts
    return out


def enabled_modules(modules) -> list[str]:
    """Names of the enabled modules in rendering order."""
    opts = check_modules(modules)
    return [m for m in MODULES if opts.get(m, {}).get("enabled", False)]


def build_context(
    records: Sequence[RoundRecord],
    current_config: ml_collections.ConfigDict | Mapping[str, Any],
    modules: ml_collections.ConfigDict | Mapping[str, Any],
) -> str:
    """Deterministic markdown: the enabled modules in MODULES order, then the current config.

    records: the finished rounds, oldest first (records[-1] is the round just validated).
    The current config section is always present: a diff needs something to apply to.
    """
    opts = check_modules(modules)
    parts = []
    for name in enabled_modules(opts):
        module = MODULES[name]
        parts.append(f"{module.header}\n{module.render(records, current_config, opts[name])}")
    parts.append(f"{CURRENT_HEADER}\n{render_config(current_config)}")
    return "\n\n".join(parts) + "\n"
