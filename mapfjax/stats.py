"""Result statistics in one place: result rows -> per-cell counts -> rates with 95 % intervals,
means over seeds and paired differences, and the one markdown table writer.

Counts are plain dicts (JSON-ready, mergeable); rates are computed from them when shown.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from mapfjax.checks import is_int

LEVEL = 0.95  # the confidence level of every interval unless a caller asks for another
Z95 = NormalDist().inv_cdf(0.5 + LEVEL / 2)  # 1.959963984540054


# --------------------------------------------------------------------------- counts


def count_labels(values: Iterable, allowed: Sequence[str]) -> dict[str, int]:
    """Occurrences of each allowed label (zeros included, in `allowed` order); None values are
    skipped and any other value raises ValueError naming it and the allowed labels."""
    out = dict.fromkeys(allowed, 0)
    for i, v in enumerate(values):
        if v is None:
            continue
        if v not in out:
            raise ValueError(f"item {i}: label {v!r}; allowed: one of {tuple(allowed)} or None")
        out[v] += 1
    return out


def _cell_of(by) -> Callable[[Mapping], Hashable]:
    if callable(by):
        return by
    if isinstance(by, str):
        return lambda row: row[by]
    keys = tuple(by)
    return lambda row: tuple(row[k] for k in keys)


def tally(
    rows: Iterable[Mapping[str, Any]],
    by: str | Sequence[str] | Callable[[Mapping], Hashable],
    *,
    flags: Sequence[str] = (),
    labels: Mapping[str, tuple[str, Sequence[str]]] | None = None,
    sums: Mapping[str, str] | None = None,
) -> dict[Hashable, dict[str, Any]]:
    """Counts per cell of result rows (dicts), cells sorted by key.

    by: the cell of a row: a field name, a tuple of field names (the key is then a tuple) or
      a function of the row.
    flags: boolean fields; each cell gets `flag: rows where it is true` (a missing or None
      value counts as false).
    labels: {name: (field, allowed labels)}; each cell gets `name: {label: count}` over every
      allowed label; rows whose field is None are not counted, any other label raises.
    sums: {name: field}; each cell gets `name: sum of the field` and `name_n: rows that have
      it` (missing or None values are left out), e.g. for mean response lengths.
    Every cell also has `n`, its number of rows.
    """
    labels, sums, cell_of = labels or {}, sums or {}, _cell_of(by)
    cells: dict[Hashable, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        try:
            key = cell_of(row)
        except KeyError as e:
            raise ValueError(f"row {i}: missing field {e.args[0]!r} (the cell key)") from None
        c = cells.get(key)
        if c is None:
            c = cells[key] = {"n": 0, **dict.fromkeys(flags, 0)}
            c |= {name: dict.fromkeys(allowed, 0) for name, (_, allowed) in labels.items()}
            for name in sums:
                c[name], c[f"{name}_n"] = 0, 0
        c["n"] += 1
        for f in flags:
            c[f] += bool(row.get(f))
        for name, (field, allowed) in labels.items():
            v = row.get(field)
            if v is None:
                continue
            if v not in c[name]:
                raise ValueError(f"row {i}: {field} = {v!r}; allowed: one of {tuple(allowed)}")
            c[name][v] += 1
        for name, field in sums.items():
            if row.get(field) is not None:
                c[name] += row[field]
                c[f"{name}_n"] += 1
    return {k: cells[k] for k in sorted(cells)}


def merge(cells: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The counts of several cells added up key by key (nested label counts too); a key that
    some cells lack counts as 0 there."""
    out: dict[str, Any] = {}
    for c in cells:
        for k, v in c.items():
            if isinstance(v, Mapping):
                out[k] = merge([out.get(k, {}), v])
            else:
                out[k] = out.get(k, 0) + v
    return out


def rate(counts: Mapping[str, Any], flag: str, scale: float = 1.0) -> float:
    """Share of a cell's rows where `flag` holds (times `scale`: 100 for a percentage); NaN
    for an empty cell."""
    n = counts.get("n", 0)
    return scale * counts.get(flag, 0) / n if n else math.nan


def sample_share(row: Mapping[str, Any]) -> float:
    """A validation row's share of valid samples (`samples_valid` of `samples`): what the row
    adds to mean@k."""
    return row["samples_valid"] / row["samples"]


def cell_mean(values: Iterable[float]) -> float:
    """Unweighted mean over cells (the paper's aggregate over map sizes); NaN values are left
    out and NaN is returned when nothing is left."""
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def mean_rate(cells: Iterable[Mapping[str, Any]], flag: str) -> float:
    """Unweighted mean over non-empty cells of `rate(cell, flag)`; NaN when there are none."""
    return cell_mean(rate(c, flag) for c in cells)


# --------------------------------------------------------------------------- intervals


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A rate, mean or difference over n items with its interval; value, low, high are NaN at
    n=0 (and low, high at n=1 for intervals that need a spread)."""

    value: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict:
        nan = lambda x: None if math.isnan(x) else round(x, 5)
        return {"value": nan(self.value), "low": nan(self.low), "high": nan(self.high), "n": self.n}


def z_value(level: float = LEVEL) -> float:
    """Two-sided normal critical value: P(|Z| <= z) = level."""
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}; allowed: a number in (0, 1)")
    return Z95 if level == LEVEL else NormalDist().inv_cdf(0.5 + level / 2)


def wilson(value: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion `value` observed over n trials; (nan, nan) at
    n=0. Unlike the normal interval it stays inside [0, 1] and is not a point at 0 or 1."""
    if n == 0:
        return math.nan, math.nan
    z = z_value(level)
    denom = 1.0 + z * z / n
    center = (value + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(max(value * (1 - value), 0.0) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def proportion(hits, level: float = LEVEL) -> Estimate:
    """Share of True in `hits` bool [P] with its Wilson interval."""
    hits = np.asarray(hits, bool)
    n = int(hits.size)
    value = float(hits.mean()) if n else math.nan
    return Estimate(value, *wilson(value, n, level), n)


def rate_estimate(counts: Mapping[str, Any], flag: str, level: float = LEVEL) -> Estimate:
    """`rate(counts, flag)` with its Wilson interval over the cell's n rows."""
    n, value = int(counts.get("n", 0)), rate(counts, flag)
    return Estimate(value, *wilson(value, n, level), n)


def bounded_mean(values, upper: float = 1.0, level: float = LEVEL) -> Estimate:
    """Mean of per-item values in [0, upper] ([P]) with the Wilson interval of mean/upper over
    n = P. Conservative: a [0, 1] variable with mean m has variance at most m(1-m), the
    binomial variance Wilson assumes; unlike a normal interval it never shrinks to a point
    when every item gives the same value."""
    values = np.asarray(values, np.float64)
    n = int(values.size)
    value = float(values.mean()) if n else math.nan
    low, high = wilson(value / upper, n, level) if n else (math.nan, math.nan)
    return Estimate(value, low * upper, high * upper, n)


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df (Abramowitz & Stegun 26.7.3 and 26.7.4:
    a finite series in cos(theta), theta = atan(t / sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * sum_k [(1*3*..*(2k-1)) / (2*4*..*2k)] cos^2k(theta)
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    # odd df: (2/pi) [theta + sin cos sum_k [(2*4*..*2k) / (3*5*..*(2k+1))] cos^2k(theta)]
    term = total = 1.0
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


def t_value(df: int, level: float = LEVEL) -> float:
    """Two-sided Student t critical value: P(|T| <= t) = level with `df` (an int >= 1)
    degrees of freedom, e.g. 2.776 for df=4 at 95 %; found by bisection on the exact CDF."""
    if not is_int(df) or df < 1:
        raise ValueError(f"df={df!r}; allowed: an integer >= 1")
    z_value(level)  # checks level
    lo, hi = 0.0, math.tan(math.pi * level / 2)  # the df=1 (Cauchy) value, the largest
    while hi - lo > 1e-13 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def mean_interval(values, level: float = LEVEL) -> Estimate:
    """Mean of independent values (one per seed) with the Student t interval
    mean +- t(n-1) * s / sqrt(n), s the sample standard deviation (ddof 1). One value gives
    a NaN interval (no spread to judge by); none gives NaN throughout."""
    values = np.asarray(values, np.float64).ravel()
    n = int(values.size)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = float(values.mean())
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1)
    half = t_value(n - 1, level) * float(values.std(ddof=1)) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)


def detectable_difference(sd: float, n: int, power: float = 0.8, level: float = LEVEL) -> float:
    """The smallest true mean difference a paired t test over n pairs whose differences have
    standard deviation `sd` detects with probability `power` at two-sided `level`:
    (t(n-1, level) + t_one_sided(n-1, power)) * sd / sqrt(n); NaN below 2 pairs."""
    if not 0 < power < 1:
        raise ValueError(f"power={power!r}; allowed: a number in (0, 1)")
    if n < 2 or math.isnan(sd):
        return math.nan
    # The one-sided power quantile is the two-sided critical value at level 2 * power - 1.
    return (t_value(n - 1, level) + t_value(n - 1, 2 * power - 1)) * sd / math.sqrt(n)


def _paired(a, b, what: str) -> np.ndarray:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"{what}: {a.size} and {b.size} values; pairs need equal counts")
    return a - b


def paired_difference(a, b, level: float = LEVEL) -> Estimate:
    """Mean of a - b over pairs run on the same seeds (a[i] and b[i] share seed i) with the
    Student t interval of the differences (`mean_interval`): pairing removes the seed-to-seed
    spread that two separate intervals would both carry."""
    return mean_interval(_paired(a, b, "paired_difference"), level)


def paired_proportion_difference(a, b, level: float = LEVEL) -> Estimate:
    """Difference of two success rates on the same puzzles: a, b bool [P] (puzzle p solved by
    each side) -> mean of a - b with the normal interval of the per-puzzle differences,
    mean +- z * sd / sqrt(P), sd with ddof 0, clipped to [-1, 1].

    We use this closed form rather than a paired bootstrap: it is deterministic (no resampling
    seed) and equals the usual Wald interval of paired proportions,
    (b - c) / P +- z * sqrt(b + c - (b - c)^2 / P) / P with b, c the puzzles only one side
    solves. Like every Wald interval it is a point when no puzzle is discordant (b = c = 0),
    so read it together with b + c; it is reliable when b + c is at least about 10.
    """
    d = _paired(a, b, "paired_proportion_difference")
    n = int(d.size)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = float(d.mean())
    half = z_value(level) * float(d.std()) / math.sqrt(n)
    return Estimate(mean, max(-1.0, mean - half), min(1.0, mean + half), n)


def mean_difference(a, b, level: float = LEVEL) -> Estimate:
    """Mean of a minus mean of b for two independent samples of items (e.g. per-puzzle valid
    shares early and late in training) with the normal (Welch) interval
    diff +- z * sqrt(var_a / n_a + var_b / n_b), variances with ddof 1; n = n_a + n_b. NaN
    throughout when either side is empty, a NaN interval when either has a single item."""
    a, b = (np.asarray(x, np.float64).ravel() for x in (a, b))
    if a.size == 0 or b.size == 0:
        return Estimate(math.nan, math.nan, math.nan, int(a.size + b.size))
    diff = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Estimate(diff, math.nan, math.nan, int(a.size + b.size))
    half = z_value(level) * math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return Estimate(diff, diff - half, diff + half, int(a.size + b.size))


def auc(scores, labels) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative, ties counted half (the Mann-Whitney U over n_pos x n_neg); NaN when either
    class is absent."""
    s = np.asarray(scores, np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    if s.shape != y.shape:
        raise ValueError(f"auc: {s.size} scores and {y.size} labels; allowed: one label per score")
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), np.float64)
    ranks[order] = np.arange(1, len(s) + 1)
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    sums = np.zeros(len(counts), np.float64)  # tied scores share their mean rank
    np.add.at(sums, inverse, ranks)
    ranks = (sums / counts)[inverse]
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


# --------------------------------------------------------------------------- tables


def interval_text(e: Estimate, signed: bool = False) -> str:
    """ "37.5 [29, 47]": an estimate of a share in percent with its interval (whole points);
    signed: a "+" before a positive value (a change); "-" for an empty estimate (n = 0)."""
    if e.n == 0:
        return "-"
    sign = "+" if signed and e.value > 0 else ""
    return f"{sign}{percent(e.value)} [{percent(e.low, 0)}, {percent(e.high, 0)}]"


def percent(value: float | None, digits: int = 1) -> str:
    """A share as a percentage string ("37.5"); "-" for None or NaN (an empty cell)."""
    if value is None or math.isnan(value):
        return "-"
    return f"{100.0 * value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table (no trailing newline): the header, a `|---|` rule, one line per row;
    cells are written with str() (callers format numbers first), an empty one as `| |`."""
    line = lambda cells: "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
    header = [str(h) for h in header]
    lines = [line(header), "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"table row {i}: {len(cells)} cells for {len(header)} columns")
        lines.append(line(cells))
    return "\n".join(lines)
