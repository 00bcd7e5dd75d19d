"""Valid rates of sampled answers split by how each was written: after a reasoning trace,
after an empty think block, or with the think block never closed (the budget ran out inside
it). Reads evaluations of `launch/evaluate.py` (each with an answers.jsonl and verdicts.jsonl),
e.g. the same checkpoint sampled with several seeds.

    python -m projects.zero_shot.trace_split projects/zero_shot/results/evals/base_t1_s0 \
        projects/zero_shot/results/evals/base_t1_s1 [--out table.md]

The intervals are over samples (95 %, Wilson); samples of one puzzle are not independent, so
they are narrower than intervals over puzzles would be.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from mapfjax import files, stats
from mapfjax.env import trace
from mapfjax.eval import evaluate

MODES = ("after a trace", "after an empty think block", "think block not closed")


def mode(response: str) -> str:
    """Which of MODES a response is."""
    text = trace.thinking_text(response)
    if text is None:
        return MODES[2]
    return MODES[1] if text.strip() == "" else MODES[0]


def split(dirs) -> dict[str, list[bool]]:
    """{mode: valid flags of its samples} over every evaluation in `dirs`."""
    out: dict[str, list[bool]] = {m: [] for m in MODES}
    for d in map(pathlib.Path, dirs):
        verdicts = evaluate.read_verdicts(d)
        answers = evaluate.read_answers(d / "answers.jsonl")
        missing = sorted(set(verdicts) - set(answers))
        if missing:
            raise ValueError(f"{d}: no answer for {len(missing)} verdict(s), e.g. {missing[0]}")
        for pid, row in verdicts.items():
            out[mode(answers[pid].text or "")].append(bool(row["valid"]))
    return out


def table(groups: dict[str, list[bool]]) -> str:
    rows = []
    for m, hits in groups.items():
        rate = stats.interval_text(stats.proportion(hits)) if hits else "-"
        rows.append([m, len(hits), sum(hits), rate])
    return stats.markdown_table(["written", "samples", "valid", "valid % (95 %, over samples)"],
                                rows)  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evals", nargs="+", help="launch/evaluate.py --out_dir directories")
    ap.add_argument("--out", help="also write the table here")
    opts = ap.parse_args(argv)
    try:
        text = table(split(opts.evals))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    if opts.out:
        files.atomic_write(opts.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
