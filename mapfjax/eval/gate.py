"""The go / no-go gate for a starting policy (`launch/go_no_go.py`): does GRPO from it raise
held-out greedy valid, and does what it trains on matter?

Read from two run directories of `launch/train.py` that start from the same policy and are
validated on the same held-out puzzles: one trained on the held-out distribution ("matched"),
one on a mismatched one (e.g. 3x3 maps only). The criteria (all must hold):

- the starting policy parses on at least `min_parse` of the held-out puzzles (a gain is then
  solving, not format);
- the matched run's last validation beats the start by at least `min_gain` (paired, same
  puzzles), with the 95 % interval above 0;
- the matched and mismatched runs differ, paired, with an interval that excludes 0.

A reference model validated on the same puzzles (a third run directory's start, e.g. the
shipped model's) is reported beside them, not gated.
"""

from __future__ import annotations

import dataclasses
import pathlib

from mapfjax import stats
from mapfjax.eval.report import paired_change, valid_by_id, validation_rows

PARSE_ERROR = "parse_error"


@dataclasses.dataclass(frozen=True)
class Criterion:
    name: str
    measured: str  # the figure, with its 95 % interval
    required: str
    passed: bool


def _start_and_end(workdir: pathlib.Path) -> tuple[list[dict], list[dict]]:
    found = validation_rows(workdir)
    if len(found) < 2:
        raise ValueError(f"{workdir}: no finished round with a validation.json")
    return found[0][1], found[-1][1]


def evaluate(
    matched, mismatched, reference=None, min_gain: float = 0.05, min_parse: float = 0.95
) -> tuple[list[Criterion], list[list[str]], list[str]]:
    """(the criteria, table rows [model, greedy valid %, vs start], notes) for the two runs
    (and a reference run directory whose *start* validation is the reference model). Raises
    ValueError, naming the directories, when the runs start from different policies or were
    validated on different puzzles."""
    matched, mismatched = pathlib.Path(matched), pathlib.Path(mismatched)
    start_rows, end_rows = _start_and_end(matched)
    other_start_rows, other_end_rows = _start_and_end(mismatched)
    base, end = valid_by_id(start_rows), valid_by_id(end_rows)
    other_start, other_end = valid_by_id(other_start_rows), valid_by_id(other_end_rows)
    for where, by_id in [(mismatched, other_start), (mismatched, other_end), (matched, end)]:
        if set(by_id) != set(base):
            raise ValueError(f"{where} was validated on other puzzles than {matched}/start")
    if other_start != base:
        raise ValueError(f"{matched} and {mismatched} do not start from the same policy")
    parsed = stats.proportion([r.get("failure") != PARSE_ERROR for r in start_rows])
    gain, apart = paired_change(end, base), paired_change(end, other_end)
    pct = lambda x: f"{100 * x:g} %"
    criteria = [
        Criterion(
            "starting policy parses", stats.interval_text(parsed), f">= {pct(min_parse)}",
            parsed.value >= min_parse,
        ),
        Criterion(
            "matched GRPO vs start (paired, points)", stats.interval_text(gain, signed=True),
            f">= +{100 * min_gain:g}, interval above 0", gain.value >= min_gain and gain.low > 0,
        ),
        Criterion(
            "matched vs mismatched (paired, points)", stats.interval_text(apart, signed=True),
            "interval excludes 0", apart.low > 0 or apart.high < 0,
        ),
    ]  # fmt: skip
    notes: list[str] = []
    rate = lambda by_id: stats.interval_text(stats.proportion(list(by_id.values())))
    vs_start = lambda by_id: stats.interval_text(paired_change(by_id, base), signed=True)
    rows = [
        ["start", rate(base), "-"],
        [f"GRPO, matched ({matched.name})", rate(end), vs_start(end)],
        [f"GRPO, mismatched ({mismatched.name})", rate(other_end), vs_start(other_end)],
    ]
    if reference is not None:
        found = validation_rows(pathlib.Path(reference))
        if not found or found[0][0] != "start":
            raise ValueError(f"{reference}: no start/validation.json (the reference model)")
        ref = valid_by_id(found[0][1])
        if set(ref) != set(base):
            raise ValueError(f"{reference}/start was validated on other puzzles than {matched}")
        rows.append([f"reference ({pathlib.Path(reference).name} start)", rate(ref), vs_start(ref)])
        vs_ref = stats.interval_text(paired_change(end, ref), signed=True)
        notes.append(f"Matched GRPO against the reference, paired: {vs_ref} points (not gated).")
    return criteria, rows, notes


def markdown(criteria: list[Criterion], rows: list[list[str]], notes: list[str], n: int) -> str:
    """The verdict: GO when every criterion holds, then the criteria and the rates table."""
    go = all(c.passed for c in criteria)
    lines = [f"**{'GO' if go else 'NO-GO'}** ({n} held-out puzzles, greedy; 95 % intervals)", ""]
    lines.append(
        stats.markdown_table(
            ["criterion", "measured", "required", "holds"],
            [[c.name, c.measured, c.required, "yes" if c.passed else "no"] for c in criteria],
        )
    )
    lines += ["", stats.markdown_table(["model", "greedy valid %", "vs start (points)"], rows)]
    lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"
