"""Which sampled groups carry a lesson greedy decoding can use.

A GRPO group of k samples of one puzzle carries a gradient only when it is mixed (some samples
valid, some not). On a puzzle the greedy answer already solves, a mixed group's failures are
the sampler's slips (tokens greedy never writes), and its lesson cannot change a greedy
answer; on a puzzle greedy fails, it can. `repeat_instances` writes each puzzle k times under
suffixed ids so that one `launch/evaluate.py` call at temperature > 0 samples every group;
`group_counts` sorts the groups by the greedy verdict on their puzzle."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

SEP = "#"  # a copy's id: "<puzzle id>#<copy>"


def repeat_instances(rows: Sequence[dict], k: int, every: int = 1) -> list[dict]:
    """Every `every`-th row of an instance file, each k times as "<id>#<j>" (j < k); with k=1
    the rows themselves, ids unchanged (the puzzles a greedy evaluation answers)."""
    if k < 1 or every < 1:
        raise ValueError(f"k={k}, every={every}: both must be >= 1")
    if k == 1:
        return list(rows[::every])
    out = []
    for row in rows[::every]:
        if SEP in row["id"]:
            raise ValueError(f"id {row['id']!r} holds {SEP!r}, which marks a copy")
        out += [row | {"id": f"{row['id']}{SEP}{j}"} for j in range(k)]
    return out


@dataclasses.dataclass(frozen=True)
class GroupCounts:
    """Groups of one sampled evaluation, by the greedy verdict on their puzzle."""

    k: int
    puzzles: int
    mixed_greedy_valid: int  # the failures are slips
    mixed_greedy_fails: int  # a lesson greedy can use
    all_valid: int
    none_valid: int

    @property
    def mixed(self) -> int:
        return self.mixed_greedy_valid + self.mixed_greedy_fails

    @property
    def fails_share(self) -> float:
        """The share of mixed groups on puzzles greedy fails (0 without mixed groups)."""
        return self.mixed_greedy_fails / self.mixed if self.mixed else 0.0


def group_counts(greedy: Mapping[str, bool], sampled: Mapping[str, bool]) -> GroupCounts:
    """greedy: puzzle id -> valid; sampled: copy id ("<id>#<j>") -> valid, every puzzle with
    the same number of copies, each puzzle in `greedy`."""
    groups: dict[str, list[bool]] = {}
    for cid, valid in sampled.items():
        pid, sep, _ = cid.rpartition(SEP)
        if not sep:
            raise ValueError(f"sampled id {cid!r} is not a copy id ('<puzzle id>{SEP}<j>')")
        groups.setdefault(pid, []).append(bool(valid))
    sizes = {len(v) for v in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"groups of different sizes {sorted(sizes)}: every puzzle needs k copies")
    missing = sorted(set(groups) - set(greedy))
    if missing:
        raise ValueError(f"{len(missing)} puzzle(s) without a greedy verdict, e.g. {missing[0]!r}")
    counts = dict.fromkeys(("mgv", "mgf", "all", "none"), 0)
    for pid, xs in groups.items():
        n = sum(xs)
        key = "all" if n == len(xs) else "none" if n == 0 else "mgv" if greedy[pid] else "mgf"
        counts[key] += 1
    return GroupCounts(
        sizes.pop(), len(groups), counts["mgv"], counts["mgf"], counts["all"], counts["none"]
    )


def read_valid(path) -> dict[str, bool]:
    """id -> valid from an evaluation directory or a run's validation.json
    (`evaluate.read_outcomes`)."""
    from mapfjax.eval import evaluate  # imports JAX: only when verdicts are read

    return {pid: bool(r["valid"]) for pid, r in evaluate.read_outcomes(path).items()}


def table(rows: Sequence[tuple[str, GroupCounts, float | None]]) -> str:
    """Markdown: one line per (label, counts, decode seconds or None)."""
    lines = [
        "| sampling | puzzles | mixed groups | on puzzles greedy fails | share | on puzzles "
        "greedy solves | all valid | none valid | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, c, secs in rows:
        s = "-" if secs is None else f"{secs:.0f}"
        lines.append(
            f"| {label} | {c.puzzles} | {c.mixed} | {c.mixed_greedy_fails} | "
            f"{100 * c.fails_share:.1f} % | {c.mixed_greedy_valid} | {c.all_valid} | "
            f"{c.none_valid} | {s} |"
        )
    return "\n".join(lines) + "\n"
