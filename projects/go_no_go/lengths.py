"""How long the response a policy is trained to write is, against a generation budget
(`trace_lengths.py`)."""

from __future__ import annotations

from collections.abc import Sequence

from mapfjax import stats
from mapfjax.env.types import Problem


def response_length_table(
    problems: Sequence[Problem], lengths: Sequence[int], budget: int, failures=None
) -> str:
    """Markdown: per map size and whether the puzzle needs a wait, how many puzzles and the
    tokens of the response the policy is trained to write for the oracle's plan (`lengths`, in
    `problems`' order: median, 90th percentile, max) and how many exceed `budget` new tokens.
    With `failures` (puzzle id -> an evaluation's failure label), also its parse errors and how
    many of them are puzzles whose oracle response does not fit the budget either."""
    if len(lengths) != len(problems):
        raise ValueError(f"{len(lengths)} lengths for {len(problems)} puzzles")
    groups: dict[tuple, list[tuple[Problem, int]]] = {}
    for p, n in zip(problems, lengths, strict=True):
        wait = {True: "yes", False: "no", None: "?"}[p.needs_wait]
        groups.setdefault((p.width, wait), []).append((p, n))
    header = ["size", "needs a wait", "puzzles", "median", "p90", "max", f"> {budget}"]
    if failures is not None:
        header += ["parse errors", f"of them > {budget}"]
    rows = []
    for key in [*sorted(groups), None]:
        items = [x for g in sorted(groups) for x in groups[g]] if key is None else groups[key]
        ns = sorted(n for _, n in items)
        median, p90 = (ns[min(len(ns) - 1, int(f * len(ns)))] for f in (0.5, 0.9))
        row = ["all", ""] if key is None else [f"{key[0]}x{key[0]}", key[1]]
        row += [len(ns), median, p90, ns[-1], sum(n > budget for n in ns)]
        if failures is not None:
            parse = [n for p, n in items if failures.get(p.id) == "parse_error"]
            row += [len(parse), sum(n > budget for n in parse)]
        rows.append(row)
    return stats.markdown_table(header, rows)
