"""Curriculum comparison across runs of the closed loop (one engineer x seed per run): small
per-run JSON records, means over seeds with 95 % intervals, paired differences against a
reference engineer on the same puzzles and seeds, and plots; the files that stay in results/
when run directories and checkpoints do not."""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from mapfjax import files, stats
from mapfjax.eval.report import needs_wait_labels, read_validation

# Keys of run_config.json that must agree for runs to be compared (the same held-out set and
# the same training budget); the engineer and the seed may differ.
SAME = (
    "rounds",
    "train.instances",
    "train.epochs",
    "train.problems_per_step",
    "train.group_size",
    "train.oversample",
    "model.path",
    "optim.lr",
)


class MismatchError(ValueError):
    """Runs that cannot be compared: another held-out set or another training budget."""


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _validation(rows: Sequence[dict]) -> dict:
    return {
        "greedy": "".join("1" if r["valid"] else "0" for r in rows),
        "samples": [r.get("samples_valid") for r in rows]
        if rows and "samples" in rows[0]
        else None,
        "k": rows[0].get("samples") if rows else None,
        "sizes": [r["size"] for r in rows],
    }


def _needs_wait(held: bytes, rows: Sequence[dict]) -> str | None:
    """The held-out set's `needs_wait` labels in the validation rows' order ("1" = the puzzle
    needs a wait), or None when the set has no such labels or rows name puzzles it lacks."""
    labels = needs_wait_labels(held)
    if labels is None or not rows or any(r.get("id") not in labels for r in rows):
        return None
    return "".join("1" if labels[r["id"]] else "0" for r in rows)


def run_record(workdir: pathlib.Path, name: str, engineer: str, seed: int) -> dict:
    """A run's small record: the budget and held-out set it used, per round (start included)
    the config, the per-puzzle greedy outcomes and sample counts on the held-out set, and the
    engineer's decision. No weights."""
    workdir = pathlib.Path(workdir)
    cfg = json.loads((workdir / "run_config.json").read_text())
    held = (workdir / "validation_set.jsonl").read_bytes()
    rec = {
        "run": name,
        "engineer": engineer,
        "seed": seed,
        "same": {k: _flat(cfg).get(k) for k in SAME},
        "held_out": hashlib.sha256(held).hexdigest()[:16],
        "rounds": [],
    }
    start = workdir / "start" / "validation.json"
    if start.exists():
        rows = read_validation(start)
        rec["start"] = _validation(rows)
        waits = _needs_wait(held, rows)
        if waits is not None:
            rec["needs_wait"] = waits
    for n in range(int(cfg["rounds"])):
        d = workdir / f"round_{n}"
        if not (d / "DONE").exists():
            break
        entry = {"round": n, "config": json.loads((d / "config.json").read_text())["sizes"]}
        entry["validation"] = _validation(read_validation(d / "validation.json"))
        if (d / "decision.json").exists():
            dec = json.loads((d / "decision.json").read_text())
            keep = ("engineer", "diff", "summary", "kept_current", "reason", "changes")
            entry["decision"] = {k: dec.get(k) for k in keep}
        rec["rounds"].append(entry)
    return rec


def _check_validation(v, where: str, n: int | None) -> int:
    """A record's validation entry (`_validation`): its greedy bits, one per held-out puzzle
    (`n` of them when known), and its sizes; returns the number of puzzles."""
    if not isinstance(v, dict):
        raise ValueError(f"{where}: a {type(v).__name__}; allowed: an object with 'greedy'")
    bits, sizes = v.get("greedy"), v.get("sizes")
    if not isinstance(bits, str) or not bits or set(bits) - {"0", "1"}:
        raise ValueError(f"{where}.greedy = {bits!r:.40}; allowed: a string of 0 and 1, one "
                         "per held-out puzzle")  # fmt: skip
    if n is not None and len(bits) != n:
        raise ValueError(f"{where}.greedy: {len(bits)} puzzles; allowed: the {n} of the "
                         "run's other validations")  # fmt: skip
    if not isinstance(sizes, list) or len(sizes) != len(bits):
        raise ValueError(f"{where}.sizes: allowed one map size per puzzle of 'greedy'")
    samples = v.get("samples")
    if samples is not None and (not isinstance(samples, list) or len(samples) != len(bits)):
        raise ValueError(f"{where}.samples: allowed null or one count per puzzle")
    return len(bits)


def check_record(r, where: str) -> dict:
    """A run record (`run_record`) read back from a file: the fields the summaries read, of
    the right types and lengths; ValueError naming `where` and the field otherwise."""
    if not isinstance(r, dict):
        raise ValueError(f"{where}: a {type(r).__name__}; allowed: a run record (an object)")
    for field, kind in (("run", str), ("engineer", str), ("seed", int), ("same", dict),
                        ("held_out", str), ("rounds", list)):  # fmt: skip
        if not isinstance(r.get(field), kind) or isinstance(r.get(field), bool):
            raise ValueError(f"{where}: field {field!r} = {r.get(field)!r:.40}; allowed: "
                             f"a {kind.__name__}")  # fmt: skip
    n = _check_validation(r["start"], f"{where}: start", None) if "start" in r else None
    for k, entry in enumerate(r["rounds"]):
        if not isinstance(entry, dict) or "validation" not in entry:
            raise ValueError(f"{where}: rounds[{k}]: allowed an object with 'validation'")
        n = _check_validation(entry["validation"], f"{where}: rounds[{k}].validation", n)
    return r


def check_comparable(records: Sequence[dict]) -> None:
    """MismatchError naming the runs and keys when records differ in held-out set or budget."""
    if not records:
        return
    ref = records[0]
    for r in records[1:]:
        keys = [k for k in SAME if r["same"].get(k) != ref["same"].get(k)]
        if r["held_out"] != ref["held_out"]:
            keys.insert(0, "validation_set.jsonl")
        if keys:
            value = lambda rec, k: rec["same"].get(k, rec["held_out"])
            shown = ", ".join(f"{k}: {value(ref, k)!r} vs {value(r, k)!r}" for k in keys)
            raise MismatchError(
                f"runs {ref['run']!r} and {r['run']!r} cannot be compared: they differ in "
                f"{shown} (same held-out set and training budget needed)"
            )


def _greedy(v: dict, size: int | None = None) -> np.ndarray:
    bits = np.array([c == "1" for c in v["greedy"]])
    return bits if size is None else bits[np.array(v["sizes"]) == size]


def _mean_at_k(v: dict) -> float:
    if v["samples"] is None:
        return math.nan
    return float(np.mean(v["samples"]) / v["k"])


def _finished(records: Sequence[dict]) -> list[dict]:
    """The records with a start and at least one finished round."""
    return [r for r in records if r["rounds"] and "start" in r]


def _ends(r: dict) -> tuple[np.ndarray, np.ndarray]:
    """A finished record's greedy bits after its last round and at its start."""
    return _greedy(r["rounds"][-1]["validation"]), _greedy(r["start"])


def _change(r: dict) -> float:
    """Final greedy valid minus the run's start, from the counts (a change of exactly 3.75
    points stays 3.75, not 3.7499...)."""
    final, start = _ends(r)
    return (int(final.sum()) - int(start.sum())) / final.size


def curves(records: Sequence[dict]) -> dict[str, dict[str, list[stats.Estimate]]]:
    """Per engineer, per metric ("greedy", "mean_at_k"): one estimate per point (start, R0,
    R1, ...): the mean over seeds with its Student t 95 % interval."""
    out: dict[str, dict[str, list[stats.Estimate]]] = {}
    for engineer in sorted({r["engineer"] for r in records}):
        runs = [r for r in records if r["engineer"] == engineer]
        points = min(len(r["rounds"]) for r in runs) + 1
        per = {"greedy": [], "mean_at_k": []}
        for i in range(points):
            vs = [r["start"] if i == 0 else r["rounds"][i - 1]["validation"] for r in runs]
            per["greedy"].append(stats.mean_interval([_greedy(v).mean() for v in vs]))
            per["mean_at_k"].append(stats.mean_interval([_mean_at_k(v) for v in vs]))
        out[engineer] = per
    return out


def paired_vs(records: Sequence[dict], reference: str = "fixed", at: int = -1) -> dict[str, dict]:
    """Per engineer: its greedy valid rate after round `at` (-1: the last) minus the reference
    engineer's, paired by seed (the same held-out puzzles): the mean over seeds with the t
    interval of the per-seed differences, and the difference over all (seed, puzzle) pairs with
    its normal interval. With at >= 0, runs that have not finished round `at` are left out."""
    has = (lambda r: bool(r["rounds"])) if at < 0 else (lambda r: len(r["rounds"]) > at)
    ref = {r["seed"]: r for r in records if r["engineer"] == reference and has(r)}
    out = {}
    for engineer in sorted({r["engineer"] for r in records} - {reference}):
        pairs = [
            (
                _greedy(r["rounds"][at]["validation"]),
                _greedy(ref[r["seed"]]["rounds"][at]["validation"]),
            )
            for r in records
            if r["engineer"] == engineer and has(r) and r["seed"] in ref
        ]
        if not pairs:
            continue
        diffs = [float(x.mean() - y.mean()) for x, y in pairs]  # one per seed
        a = np.concatenate([x for x, _ in pairs])
        b = np.concatenate([y for _, y in pairs])
        out[engineer] = {
            "seeds": stats.mean_interval(diffs),  # = stats.paired_difference of the rates
            "seed_differences": diffs,
            "puzzles": stats.paired_proportion_difference(a, b),
            "discordant": int((a != b).sum()),
        }
    return out


def gains_vs_start(records: Sequence[dict]) -> dict[str, stats.Estimate]:
    """Per engineer: final greedy valid minus the run's own start on the same puzzles, the mean
    over its seeds with the t interval (the runs are the replicates)."""
    out = {}
    for engineer in sorted({r["engineer"] for r in records}):
        ends = [_ends(r) for r in _finished(records) if r["engineer"] == engineer]
        out[engineer] = stats.paired_difference(
            [final.mean() for final, _ in ends], [start.mean() for _, start in ends]
        )
    return out


def gain_vs_training(records: Sequence[dict], field: str = "wait_ratio") -> list[dict]:
    """Per run with a start and rounds: the training `field` it had (`mixed_ratio`, mean over
    its rounds) and its final greedy valid minus its own start on the same puzzles."""
    out = []
    for r in _finished(records):
        x = float(np.mean([mixed_ratio(e["config"], field) for e in r["rounds"]]))
        out.append({"run": r["run"], "engineer": r["engineer"], "seed": r["seed"], field: x,
                    "gain": _change(r)})  # fmt: skip
    return out


def _correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; nan with fewer than 3 points or no spread in either."""
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def gain_correlations(rows: Sequence[dict], field: str = "wait_ratio") -> tuple[float, float]:
    """Pearson's r between `gain_vs_training` rows' training `field` and gain: over all runs,
    and within seeds (each seed's mean of both removed, so that what a seed's round 0 shares
    with all its runs does not count). nan where undefined."""
    x = np.array([r[field] for r in rows], np.float64)
    y = np.array([r["gain"] for r in rows], np.float64)
    seeds = np.array([r["seed"] for r in rows])
    xw, yw = x.copy(), y.copy()
    for s in set(seeds.tolist()):
        m = seeds == s
        xw[m] -= x[m].mean()
        yw[m] -= y[m].mean()
    within = _correlation(xw, yw) if len(set(seeds.tolist())) < len(rows) else math.nan
    return _correlation(x, y), within


def gain_text(records: Sequence[dict], field: str = "wait_ratio") -> str:
    """A sentence for summary.md: how the final change goes with the training `field`."""
    rows = gain_vs_training(records, field)
    over, within = gain_correlations(rows, field)
    if math.isnan(over):
        return ""
    share = "share of puzzles that need a wait" if field == "wait_ratio" else field
    within_text = "" if math.isnan(within) else f", r = {within:.2f} within seeds"
    return (
        f"\n\nFinal change vs start against the training {share} (data-weighted over sizes, "
        f"mean over rounds; `gain_vs_wait.png`): r = {over:.2f} over the {len(rows)} runs"
        f"{within_text} (each seed's means removed). The runs of a seed share its round 0, so "
        "this is an association, not a controlled comparison."
    )


def _fmt(e: stats.Estimate, signed: bool = False) -> str:
    if e.n == 0 or math.isnan(e.value):
        return "-"
    lo, hi = stats.percent(e.low), stats.percent(e.high)
    sign = "+" if signed and e.value > 0 else ""
    return f"{sign}{stats.percent(e.value)} [{lo}, {hi}]"


def summary_markdown(records: Sequence[dict], reference: str = "fixed") -> str:
    """Tables: per engineer the held-out rates (start and last round, mean over seeds with 95 %
    intervals) and the paired difference against `reference`."""
    c = curves(records)
    p = paired_vs(records, reference)
    n_seeds = {e: sum(r["engineer"] == e for r in records) for e in c}
    gain = gains_vs_start(records)
    rows = []
    for e, per in c.items():
        d = p.get(e)
        rows.append([
            e, n_seeds[e], len(per["greedy"]) - 1,
            _fmt(per["greedy"][0]), _fmt(per["greedy"][-1]), _fmt(gain[e], True),
            _fmt(per["mean_at_k"][-1]),
            "-" if d is None else _fmt(d["seeds"], True),
            "-" if d is None else f"{_fmt(d['puzzles'], True)} ({d['discordant']})",
        ])  # fmt: skip
    header = [
        "engineer", "seeds", "rounds", "start greedy %", "final greedy %",
        "change vs start (points, per seed)", "final mean@k %",
        f"vs {reference}: per seed (points)", f"vs {reference}: per puzzle (discordant)",
    ]  # fmt: skip
    table = stats.markdown_table(header, rows)
    parts = [table, per_seed_markdown(records), by_round_markdown(records, reference)]
    parts.append(wait_split_markdown(records))
    return "".join(parts) + detectable_text(p, reference) + gain_text(records)


def per_seed_markdown(records: Sequence[dict]) -> str:
    """A table: per engineer (rows) and seed (columns), the final greedy valid % with the
    change against the run's own start in points; "-" where a seed has no finished run."""
    runs = {(r["engineer"], r["seed"]): r for r in _finished(records)}
    if not runs:
        return ""
    seeds = sorted({s for _, s in runs})
    rows = []
    for e in sorted({e for e, _ in runs}):
        cells = [e]
        for s in seeds:
            r = runs.get((e, s))
            if r is None:
                cells.append("-")
                continue
            final, _ = _ends(r)
            cells.append(f"{stats.percent(final.mean())} ({100 * _change(r):+.1f})")
        rows.append(cells)
    header = ["engineer", *(f"seed {s}" for s in seeds)]
    return (
        "\n\nFinal greedy valid % per seed (change vs the run's start, points):\n\n"
        + stats.markdown_table(header, rows)
    )


def by_round_markdown(records: Sequence[dict], reference: str = "fixed") -> str:
    """A table: per engineer (rows) and round (columns), the greedy valid difference against
    `reference` after that round over all (seed, puzzle) pairs, with its 95 % interval and the
    number of seeds; "" without a reference run, another engineer's run, or a second round."""
    rounds = max((len(r["rounds"]) for r in records), default=0)
    others = {r["engineer"] for r in records} - {reference}
    if rounds < 2 or not others or not any(r["engineer"] == reference for r in records):
        return ""
    by = [paired_vs(records, reference, at) for at in range(rounds)]
    rows = []
    for e in sorted(others):
        cells = [e]
        for p in by:
            d = p.get(e)
            cells.append("-" if d is None else f"{_fmt(d['puzzles'], True)} ({d['seeds'].n})")
        rows.append(cells)
    header = ["engineer", *(f"after R{i}" for i in range(rounds))]
    return (
        f"\n\nAgainst {reference} after each round, per (seed, puzzle) pair, points [95 % "
        "interval] (seeds); round 0 trains before any engineer decides:\n\n"
        + stats.markdown_table(header, rows)
    )


def wait_split_markdown(records: Sequence[dict]) -> str:
    """A table: per engineer, the final change against the run's own start on the held-out
    puzzles that need a wait and on those that need none (mean over seeds, t 95 % interval);
    "" unless every finished record carries the same `needs_wait` labels."""
    runs = _finished(records)
    labels = {r.get("needs_wait") for r in runs}
    if not runs or len(labels) != 1 or None in labels:
        return ""
    waits = np.array([c == "1" for c in labels.pop()])
    rows = []
    for e in sorted({r["engineer"] for r in runs}):
        mine = [r for r in runs if r["engineer"] == e]
        cells = [e, len(mine)]
        ends = [_ends(r) for r in mine]
        for part in (waits, ~waits):
            start = [s[part].mean() for _, s in ends]
            final = [f[part].mean() for f, _ in ends]
            cells += [
                stats.percent(float(np.mean(start))),
                _fmt(stats.paired_difference(final, start), True),
            ]
        rows.append(cells)
    n_wait, n_none = int(waits.sum()), int((~waits).sum())
    header = [
        "engineer", "seeds", f"needs a wait (n={n_wait}): start %", "change (points)",
        f"needs none (n={n_none}): start %", "change (points)",
    ]  # fmt: skip
    return (
        "\n\nFinal change vs start on the held-out puzzles that need a wait and on the others "
        "(mean over seeds, 95 % interval):\n\n" + stats.markdown_table(header, rows)
    )


def detectable_difference(paired: dict[str, dict]) -> tuple[float, int]:
    """The design's detectable difference against the reference (80 % power, two-sided 5 %,
    paired by seed) from the spread of the per-seed differences, pooled over engineers (their
    variances averaged); and the number of seeds it assumes (the fewest any engineer has)."""
    diffs = [np.asarray(d["seed_differences"]) for d in paired.values()]
    diffs = [d for d in diffs if d.size >= 2]
    if not diffs:
        return math.nan, 0
    sd = math.sqrt(float(np.mean([d.var(ddof=1) for d in diffs])))
    n = min(d.size for d in diffs)
    return stats.detectable_difference(sd, n), n


def detectable_text(paired: dict[str, dict], reference: str) -> str:
    mdd, n = detectable_difference(paired)
    if math.isnan(mdd):
        return ""
    return (
        f"\n\nDetectable difference of this design: {stats.percent(mdd)} points against "
        f"{reference} (paired over {n} seeds, 80 % power at two-sided 5 %, from the spread of "
        "the per-seed differences pooled over engineers); a smaller true difference would "
        "usually read as no difference."
    )


def summary_rows(records: Sequence[dict]) -> list[dict]:
    """CSV rows: one per run and point (start, R0, ...)."""
    out = []
    for r in records:
        vs = [("start", r.get("start"))] + [
            (f"R{e['round']}", e["validation"]) for e in r["rounds"]
        ]
        for point, v in vs:
            if v is None:
                continue
            out.append({
                "run": r["run"], "engineer": r["engineer"], "seed": r["seed"], "point": point,
                "greedy_valid": round(float(_greedy(v).mean()), 5),
                "mean_at_k": round(_mean_at_k(v), 5), "n": len(v["greedy"]),
            })  # fmt: skip
    return out


def plot(records: Sequence[dict], images: dict[str, bytes]) -> list[str]:
    """held_out.png (greedy valid and, when sampled, mean@k per point, mean and 95 % interval
    over seeds), final_sizes.png (last-round greedy valid per size), data_ratio.png (data_ratio
    chosen per round, seed mean), wait_and_holes.png (the training wait share and hole ratio
    per round, data-weighted, seed mean), gain_vs_wait.png (each run's final change against its
    training wait share, `gain_vs_training`), each as PNG bytes into `images` by file name;
    returns the names."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing Agg

    def save(fig, name):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        images[name] = buf.getvalue()
        return name

    def finish(fig, ax, title, axes_text, name, legend_size):
        ax.set_title(title)
        ax.set_xlabel(axes_text[0])
        ax.set_ylabel(axes_text[1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
        fig.tight_layout()
        return save(fig, name)

    names = []
    c = curves(records)
    panels = [("greedy", "greedy valid"), ("mean_at_k", "mean@k")]
    if all(math.isnan(x.value) for per in c.values() for x in per["mean_at_k"]):
        panels = panels[:1]  # greedy-only validation: no mean@k panel
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    axes = axes[0]
    for ax, (metric, title) in zip(axes, panels, strict=True):
        for e, per in c.items():
            es = per[metric]
            xs = np.arange(len(es))
            ys = np.array([x.value for x in es]) * 100
            lo = np.array([x.low for x in es]) * 100
            hi = np.array([x.high for x in es]) * 100
            ax.plot(xs, ys, marker="o", label=e)
            ax.fill_between(xs, lo, hi, alpha=0.15)
            ax.set_xticks(xs, ["start", *(f"R{i}" for i in range(len(es) - 1))])
        ax.set_title(f"held-out {title} (mean, 95 % interval over seeds)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("%")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    names.append(save(fig, "held_out.png"))

    sizes = sorted(
        {s for r in records for s in r["rounds"][-1]["validation"]["sizes"]} if records else []
    )
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for e in c:
        runs = [r for r in records if r["engineer"] == e and r["rounds"]]
        ys = [
            100 * np.mean([_greedy(r["rounds"][-1]["validation"], s).mean() for r in runs])
            for s in sizes
        ]
        ax.plot(sizes, ys, marker="o", label=e)
    names.append(finish(fig, ax, "final greedy valid per map size (mean over seeds)",
                        ("map size N", "%"), "final_sizes.png", 8))  # fmt: skip

    engineers = list(c)
    fig, axes = plt.subplots(
        1, len(engineers), figsize=(3 * len(engineers), 3.2), sharey=True, squeeze=False
    )
    for ax, e in zip(axes[0], engineers, strict=True):
        runs = [r for r in records if r["engineer"] == e and r["rounds"]]
        n_rounds = min(len(r["rounds"]) for r in runs)
        keys = sorted(runs[0]["rounds"][0]["config"], key=lambda k: int(k[1:]))
        bottom = np.zeros(n_rounds)
        for k in keys:
            ys = np.array(
                [
                    np.mean([r["rounds"][i]["config"][k]["data_ratio"] for r in runs])
                    for i in range(n_rounds)
                ]
            )
            ax.bar(range(n_rounds), ys, bottom=bottom, label=f"{k[1:]}x{k[1:]}")
            bottom += ys
        ax.set_title(e)
        ax.set_xticks(range(n_rounds), [f"R{i}" for i in range(n_rounds)])
    axes[0][0].set_ylabel("data_ratio (seed mean)")
    axes[0][-1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    names.append(save(fig, "data_ratio.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, field in zip(axes, ("wait_ratio", "hole_ratio"), strict=True):
        for e in engineers:
            runs = [r for r in records if r["engineer"] == e and r["rounds"]]
            n_rounds = min(len(r["rounds"]) for r in runs)
            ys = [np.mean([mixed_ratio(r["rounds"][i]["config"], field) for r in runs])
                  for i in range(n_rounds)]  # fmt: skip
            ax.plot(range(n_rounds), ys, marker="o", label=e)
            ax.set_xticks(range(n_rounds), [f"R{i}" for i in range(n_rounds)])
        ax.set_title(f"training {field}, data-weighted over sizes (seed mean)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    names.append(save(fig, "wait_and_holes.png"))

    rows = gain_vs_training(records)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for e in engineers:
        mine = [r for r in rows if r["engineer"] == e]
        xs = [r["wait_ratio"] for r in mine]
        ax.scatter(xs, [100 * r["gain"] for r in mine], label=e, s=28)
        for r in mine:
            ax.annotate(f"s{r['seed']}", (r["wait_ratio"], 100 * r["gain"]), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")  # fmt: skip
    over, within = gain_correlations(rows)
    ax.axhline(0, color="0.5", lw=0.8)
    axes_text = ("training wait share, data-weighted, mean over rounds", "greedy valid, points")
    r_text = [f"r = {over:.2f}"] * (not math.isnan(over))
    r_text += [f"within seeds {within:.2f}"] * (not math.isnan(within))
    title = "final change vs start" + (f" ({'; '.join(r_text)})" if r_text else "")
    names.append(finish(fig, ax, title, axes_text, "gain_vs_wait.png", 7))
    return names


def mixed_ratio(config_sizes: dict, field: str) -> float:
    """A round's `field` (wait_ratio, hole_ratio) averaged over sizes weighted by data_ratio:
    the share or ratio its training puzzles have as a whole."""
    w = np.array([v["data_ratio"] for v in config_sizes.values()], np.float64)
    x = np.array([v[field] for v in config_sizes.values()], np.float64)
    return float((w * x).sum() / w.sum())


def write_results(
    records: Sequence[dict], out_dir, reference: str = "fixed", note: str = ""
) -> pathlib.Path:
    """results/<experiment>/: runs/<run>.json, summary.md, summary.csv and the plots."""
    import csv
    import io

    check_comparable(records)
    out_dir = pathlib.Path(out_dir)
    # Every file is made in memory first: a record that breaks a table or a plot fails here,
    # with nothing written, never after a part of the directory was rewritten.
    written = {f"runs/{r['run']}.json": json.dumps(r, indent=1) + "\n" for r in records}
    rows = summary_rows(records)
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    written["summary.csv"] = buf.getvalue()
    images: dict[str, bytes] = {}
    plots = plot(records, images) if records else []
    md = ["# Curriculum comparison", "", note, "", summary_markdown(records, reference), ""]
    md += [f"![{p}]({p})" for p in plots]
    written["summary.md"] = "\n".join(md) + "\n"
    for name, data in {**images, **written}.items():  # summary.md last
        files.atomic_write(out_dir / name, data)
    return out_dir / "summary.md"
