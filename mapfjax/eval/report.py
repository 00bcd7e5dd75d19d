"""Run reports: per-round validation tables, the configs chosen and what the engineer said,
as markdown plus PNG plots, read back from a run directory written by `engineer.loop`."""

from __future__ import annotations

import gzip
import io as std_io
import json
import math
import pathlib

import numpy as np

from mapfjax import files, stats
from mapfjax.engineer.context import RoundRecord
from mapfjax.eval import outcomes
from mapfjax.rl import metrics


def _rounds(workdir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    out = []
    for d in workdir.glob("round_*"):
        if d.is_dir() and d.name.split("_")[-1].isdigit() and (d / "record.json").exists():
            out.append((int(d.name.split("_")[-1]), d))
    return sorted(out)


def _sizes(records: list[RoundRecord]) -> list[str]:
    keys = {k for r in records for k in r.validation}
    return sorted(keys, key=lambda k: int(k.lstrip("s")))


def _both(valid: float, optimal: float) -> str:
    return "-" if math.isnan(valid) else f"{valid:.1f} / {optimal:.1f}"


def validation_table(records: list[RoundRecord]) -> str:
    """Rows: rounds; columns: map sizes; cells: valid % / optimal %; last column: the mean
    over the sizes present."""
    sizes = _sizes(records)
    rows = []
    for r in records:
        entries = [r.validation.get(s) or {} for s in sizes]
        valid = [stats.rate(e, "valid", 100.0) for e in entries]
        optimal = [stats.rate(e, "optimal", 100.0) for e in entries]
        cells = [_both(v, o) for v, o in zip(valid, optimal, strict=True)]
        rows.append(
            [f"R{r.round}", *cells, _both(stats.cell_mean(valid), stats.cell_mean(optimal))]
        )
    return stats.markdown_table(["round", *(f"{s[1:]}x{s[1:]}" for s in sizes), "mean"], rows)


def config_table(records: list[RoundRecord]) -> str:
    """The generator config of each round: data / hole / wait ratio per size."""
    sizes = sorted({k for r in records for k in r.config["sizes"]}, key=lambda k: int(k[1:]))
    ratios = lambda e: f"{e['data_ratio']:.2f} / {e['hole_ratio']:.2f} / {e['wait_ratio']:.2f}"
    rows = [
        [
            f"R{r.round}",
            *("-" if s not in r.config["sizes"] else ratios(r.config["sizes"][s]) for s in sizes),
        ]
        for r in records
    ]
    return stats.markdown_table(["round", *(f"{s[1:]}x{s[1:]}" for s in sizes)], rows)


def read_validation(path) -> list[dict]:
    """The per-puzzle rows of a validation.json, checked (`outcomes.read_validation`)."""
    return outcomes.read_validation(path)


def start_rows(found: list[tuple[str, list[dict]]], workdir) -> list[dict]:
    """The starting model's rows among `validation_rows(workdir)`; ValueError when the run has
    none (round 0 read as the start would give every change against the wrong base)."""
    if not found or found[0][0] != "start":
        raise ValueError(
            f"{workdir}: no start/validation.json (the starting model's held-out rows), so no "
            "change against the start can be read; restore start/ from a copy of the run"
        )
    return found[0][1]


def validation_rows(workdir: pathlib.Path) -> list[tuple[str, list[dict]]]:
    """(label, per-puzzle rows) of the starting model and every finished round, in order."""
    out = []
    for label, d in [("start", workdir / "start"), *((f"R{n}", d) for n, d in _rounds(workdir))]:
        path = d / "validation.json"
        if path.exists():
            out.append((label, read_validation(path)))
    return out


def valid_by_id(rows) -> dict[str, bool]:
    """Puzzle id -> greedy valid, from validation rows."""
    return {r["id"]: bool(r["valid"]) for r in rows}


def paired_change(a: dict[str, bool], b: dict[str, bool]) -> stats.Estimate:
    """a - b over the same puzzles (`valid_by_id` maps with the same ids), paired."""
    ids = sorted(a)
    return stats.paired_proportion_difference([a[i] for i in ids], [b[i] for i in ids])


def needs_wait_labels(held: bytes) -> dict[str, bool] | None:
    """Puzzle id -> needs a wait, from a held-out JSONL's bytes (`validation_set.jsonl`); None
    when a line is not a labelled puzzle (no `id`, or `needs_wait` missing or null)."""
    labels = {}
    for line in held.decode(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            return None
        if not isinstance(item, dict) or item.get("needs_wait") is None or "id" not in item:
            return None
        labels[item["id"]] = bool(item["needs_wait"])
    return labels or None


def wait_split_table(runs: list[tuple[str, list[dict]]], labels: dict[str, bool]) -> str:
    """Rows: the starting model and each round; columns, for the held-out puzzles that need a
    wait and for those that need none: greedy valid % (95 % interval) and the paired change
    against the starting model on the same puzzles. "" when a part is empty."""
    if not runs:
        return ""
    first = valid_by_id(runs[0][1])
    parts = [{i for i in first if labels.get(i) is want} for want in (True, False)]
    if not all(parts):
        return ""
    table = []
    for label, rows in runs:
        mine = valid_by_id(rows)
        line = [label]
        for ids in parts:
            shared = sorted(ids & set(mine))
            line.append(stats.interval_text(stats.proportion([mine[i] for i in shared])))
            same = label == runs[0][0]
            change = paired_change({i: mine[i] for i in shared}, {i: first[i] for i in shared})
            line.append("-" if same else stats.interval_text(change, signed=True))
        table.append(line)
    header = [
        "model", f"needs a wait (n={len(parts[0])}): greedy valid %", "change vs start (points)",
        f"needs none (n={len(parts[1])}): greedy valid %", "change vs start (points)",
    ]  # fmt: skip
    return stats.markdown_table(header, table)


def held_out_table(runs: list[tuple[str, list[dict]]]) -> str:
    """Rows: the starting model and each round; columns: n, greedy valid %, mean@k % (95 %
    intervals), the paired change of greedy valid against the starting model on the same
    puzzles (mean difference and its 95 % interval; `stats.paired_proportion_difference`), and
    when the rounds sampled, the paired change of mean@k (each puzzle's share of valid samples;
    `stats.paired_difference`, a t interval)."""
    if not runs:
        return "No validation yet."
    first = {r["id"]: r for r in runs[0][1]}
    sampled = "samples" in runs[0][1][0] if runs[0][1] else False
    k = runs[0][1][0]["samples"] if sampled else 0
    header = ["model", "n", "greedy valid %"]
    header += [f"mean@{k} %"] if sampled else []
    header += ["change vs start (points)", "puzzles solved only by one side"]
    header += [f"mean@{k} change vs start (points)"] if sampled else []
    table = []
    for label, rows in runs:
        line = [label, len(rows), stats.interval_text(stats.proportion([r["valid"] for r in rows]))]
        if sampled:
            line.append(
                stats.interval_text(
                    stats.bounded_mean([stats.sample_share(r) for r in rows if "samples" in r])
                )
            )
        both = [r for r in rows if r["id"] in first]
        paired = [(bool(r["valid"]), bool(first[r["id"]]["valid"])) for r in both]
        a, b = [x for x, _ in paired], [y for _, y in paired]
        if label == runs[0][0]:
            line += ["-", "-"] + (["-"] if sampled else [])
            table.append(line)
            continue
        d = stats.paired_proportion_difference(a, b)
        line += [stats.interval_text(d, signed=True), str(sum(x != y for x, y in paired))]
        if sampled:
            pairs = [
                (r, first[r["id"]]) for r in both if "samples" in r and "samples" in first[r["id"]]
            ]
            ds = stats.paired_difference(
                [stats.sample_share(x) for x, _ in pairs], [stats.sample_share(y) for _, y in pairs]
            )
            line.append(stats.interval_text(ds, signed=True) if pairs else "-")
        table.append(line)
    return stats.markdown_table(header, table)


def training_curves(workdir: pathlib.Path) -> list[tuple[int, dict]]:
    """(global step, metrics row) of every logged training step, rounds in order."""
    out, offset = [], 0
    for _, d in _rounds(workdir):
        found = [p for p in (d / "metrics.jsonl", d / "metrics.jsonl.gz") if p.exists()]
        if not found:
            continue
        rows = {r["step"]: r for r in metrics.read_metrics(found[0])}
        out += [(offset + s, r) for s, r in sorted(rows.items())]
        offset += max(rows, default=0)
    return out


# The stop criterion (projects/grpo_effect/README.md: training mean@G rising by less than
# STALL_POINTS over STALL_UPDATES updates).
STALL_POINTS, STALL_UPDATES = 10.0, 300


def window_shares(curve: list[tuple[int, dict]], group_size: int, window: int = 30):
    """(w, first, last): each sampled group's valid share over the first and the last w
    updates, w = `window` or a quarter of the run when it is shorter than 4 x window."""
    w = max(1, min(window, len(curve) // 4))
    shares = lambda rows: [o.valid / group_size for _, r in rows for o in metrics.group_outcomes(r)]
    return w, shares(curve[:w]), shares(curve[-w:])


def rollout_trend(curve: list[tuple[int, dict]], group_size: int, window: int = 30) -> str:
    """Markdown: mean@G of the training rollouts (each sampled group's valid share) over the
    first and the last `window` updates (a quarter of the run when it is shorter than
    4 x window), their difference with a 95 % interval over groups (`stats.mean_difference`),
    and the stop criterion: a rise under STALL_POINTS points over STALL_UPDATES updates means
    this learning rate has stalled."""
    if not curve:
        return "No training updates logged."
    w, first, last = window_shares(curve, group_size, window)
    if not first or not last:
        return "The metrics carry no per-group outcomes (written before they were logged)."
    a, b = stats.bounded_mean(first), stats.bounded_mean(last)
    d = stats.mean_difference(last, first)
    table = stats.markdown_table(
        ["updates", "groups", f"mean@{group_size} %"],
        [
            [f"first {w} ({curve[0][0]}-{curve[w - 1][0]})", a.n, stats.interval_text(a)],
            [f"last {w} ({curve[-w][0]}-{curve[-1][0]})", b.n, stats.interval_text(b)],
            ["change (points)", "-", stats.interval_text(d, signed=True)],
        ],
    )
    steps = curve[-1][0]
    rise = 100 * d.value
    if steps < STALL_UPDATES:
        verdict = f"not judged: {steps} updates, fewer than {STALL_UPDATES}"
    elif rise < STALL_POINTS:
        verdict = f"met: a rise of {rise:+.1f} points (< {STALL_POINTS:g}) over {steps} updates"
    else:
        verdict = f"not met: a rise of {rise:+.1f} points over {steps} updates; still learning"
    return (
        table
        + f"\n\nStop criterion (training has stalled at this learning rate when mean@{group_size}"
        + f" on the training puzzles rises less than {STALL_POINTS:g} points in "
        + f"{STALL_UPDATES} updates): {verdict}."
    )


def mixed_groups(curve: list[tuple[int, dict]], group_size: int) -> tuple[int, int, int, int]:
    """(sampled groups, those whose rewards differ, of these the ones with every sample valid
    (only the optimal bonus sets them apart), and the ones with none valid (only the format
    penalty)) over a run's logged updates."""
    groups = [o for _, r in curve for o in metrics.group_outcomes(r)]
    mixed = [o for o in groups if o.mixed]
    every = sum(o.valid == group_size for o in mixed)
    return len(groups), len(mixed), every, sum(o.valid == 0 for o in mixed)


def reward_signal(curve: list[tuple[int, dict]], group_size: int) -> str:
    """Markdown: of the sampled groups whose rewards differ (those that carry a gradient), how
    many differ by validity and how many have every sample valid, so that only the optimal
    bonus tells them apart (or none valid: only the format penalty), with the rollouts' valid
    and optimal shares (`valid_rate`, `optimal_rate`, averaged over updates)."""
    groups, mixed, every, none = mixed_groups(curve, group_size)
    if not mixed:
        return "No sampled group had rewards that differ (or none was logged)."
    rate = lambda k: np.mean([r[k] for _, r in curve if k in r])
    share = lambda n: f"{n} ({100 * n / mixed:.0f} %)"
    return stats.markdown_table(
        ["sampled groups", "rewards differ", "by validity", "every sample valid (optimal bonus)",
         "none valid (format penalty)", "rollouts valid %", "rollouts optimal %"],
        [[groups, mixed, share(mixed - every - none), share(every), share(none),
          f"{100 * rate('valid_rate'):.1f}", f"{100 * rate('optimal_rate'):.1f}"]],
    )  # fmt: skip


CURVES = (
    ("reward_mean", "reward"),
    ("valid_rate", "valid rate (samples)"),
    ("mixed_groups", "groups with mixed rewards"),
    ("train_approx_kl_old", "KL to the sampling policy"),
    ("train_entropy", "entropy"),
    ("train_grad_norm", "gradient norm"),
)


def save_png(fig, path: pathlib.Path) -> None:
    """Render the figure to memory and write it atomically (readers never see half a PNG)."""
    import matplotlib.pyplot as plt  # loaded by `_plots` (after choosing Agg) before this runs

    buf = std_io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    files.atomic_write(path, buf.getvalue())


def _plots(records: list[RoundRecord], workdir: pathlib.Path) -> list[str]:
    # Local: matplotlib takes seconds to import, and Agg must be chosen before pyplot loads.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = _sizes(records)
    xs = [int(s[1:]) for s in sizes]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, field in zip(axes, ("valid", "optimal"), strict=True):
        for r in records:
            ys = [stats.rate(r.validation.get(s, {}), field, 100.0) for s in sizes]
            ax.plot(xs, ys, marker="o", label=f"R{r.round}")
        ax.set_title(f"{field} rate per map size (validation)")
        ax.set_xlabel("map size N (NxN)")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("%")
    axes[1].legend()
    fig.tight_layout()
    names = ["validation.png"]
    save_png(fig, workdir / names[0])

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), sharey=True)
    csizes = sorted({k for r in records for k in r.config["sizes"]}, key=lambda k: int(k[1:]))
    cx = [int(s[1:]) for s in csizes]
    for ax, field in zip(axes, ("data_ratio", "hole_ratio", "wait_ratio"), strict=True):
        for r in records:
            ys = [r.config["sizes"].get(s, {}).get(field, float("nan")) for s in csizes]
            ax.plot(cx, ys, marker="s", label=f"R{r.round}")
        ax.set_title(field)
        ax.set_xlabel("map size N")
        ax.set_xticks(cx)
        ax.grid(alpha=0.3)
    axes[-1].legend()
    fig.tight_layout()
    names.append("configs.png")
    save_png(fig, workdir / names[1])

    curves = training_curves(workdir)
    if curves:
        fig, axes = plt.subplots(2, 3, figsize=(12, 6))
        for ax, (key, title) in zip(axes.flat, CURVES, strict=True):
            pts = [(x, r[key]) for x, r in curves if isinstance(r.get(key), int | float)]
            if pts:
                xs, ys = (np.asarray(v, float) for v in zip(*pts, strict=True))
                ax.plot(xs, ys, lw=0.8, alpha=0.45, label="per update")
                w = max(1, min(len(ys) // 5, 20))  # a trend through the per-update noise
                if w > 1:
                    trend = np.convolve(ys, np.ones(w) / w, mode="valid")
                    ax.plot(xs[w - 1 :], trend, lw=2, label=f"mean of {w}")
                    ax.legend(fontsize=7)
            ax.set_title(title)
            ax.set_xlabel("update")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        names.append("training.png")
        save_png(fig, workdir / names[-1])
    return names


def compare_runs(workdirs: list[pathlib.Path], labels: list[str] | None = None) -> str:
    """Markdown: several runs from the same starting model on the same held-out set (e.g.
    GRPO at several learning rates and rejection-sampling fine-tuning). One row for the start
    (the first run's), one per run's last validation: greedy valid and mean@k with 95 %
    intervals, the paired change against the start and against the first run (same puzzles),
    and the training rollouts' change of mean@G (first vs last 30 updates).

    Raises ValueError, naming the runs, when they were validated on different puzzles or one
    has no finished validation."""
    workdirs = [pathlib.Path(w) for w in workdirs]
    labels = labels or [w.name for w in workdirs]
    if len(labels) != len(workdirs):
        raise ValueError(f"{len(labels)} labels for {len(workdirs)} runs")
    found = []
    for w in workdirs:
        if not w.is_dir():
            raise ValueError(f"{w}: no such run directory")
        found.append(validation_rows(w))
        start_rows(found[-1], w)  # a run without its start is not read from round 0
        if len(found[-1]) < 2:
            raise ValueError(f"{w}: no finished round with a validation.json to compare")
    start, finals = found[0][0][1], [rows[-1][1] for rows in found]
    ids = sorted(r["id"] for r in start)
    for w, rows in zip(workdirs, finals, strict=True):
        if sorted(r["id"] for r in rows) != ids:
            raise ValueError(
                f"{w} was validated on other puzzles than {workdirs[0]}; compare runs that "
                "share validation_set.jsonl"
            )
    refs = (valid_by_id(start), valid_by_id(finals[0]))  # the start, the first run
    k = start[0].get("samples")
    ks = {r.get("samples") for rows in (start, *finals) for r in rows}
    mixed = len(ks) > 1  # runs validated with different sample counts: each cell names its k
    header = ["model", "updates", "greedy valid %"]
    header += [("mean@k %" if mixed else f"mean@{k} %")] if k else []
    header += ["vs start (points)", f"vs {labels[0]} (points)", "training mean@G change"]
    table = []
    entries = [("start", None, start), *zip(labels, workdirs, finals, strict=True)]
    for i, (label, w, rows) in enumerate(entries):
        curve = training_curves(w) if w is not None else []
        line = [label, str(curve[-1][0]) if curve else "0"]
        line.append(stats.interval_text(stats.proportion([r["valid"] for r in rows])))
        if k:
            shares = [stats.sample_share(r) for r in rows if r.get("samples")]
            text = stats.interval_text(stats.bounded_mean(shares)) if shares else "-"
            row_ks = sorted({r["samples"] for r in rows if r.get("samples")})
            line.append(f"{text} (k={'/'.join(map(str, row_ks))})" if mixed and shares else text)
        mine = valid_by_id(rows)
        for r, ref in enumerate(refs):
            if i == 0 or (r == 1 and i == 1):  # no change against itself
                line.append("-")
                continue
            line.append(stats.interval_text(paired_change(mine, ref), signed=True))
        g = _group_size(w) if w is not None else None
        if curve and g:
            _, early, late = window_shares(curve, g)
            line.append(stats.interval_text(stats.mean_difference(late, early), signed=True))
        else:
            line.append("-")
        table.append(line)
    return stats.markdown_table(header, table)


# What `export_run` keeps of a run directory: no checkpoints, models or training sets.
EXPORTED = (
    "run_config.json", "report.md", "*.png", "start/validation.*", "round_*/validation.*",
    "round_*/record.json", "round_*/config.json", "round_*/decision.json", "round_*/DONE",
    "round_*/time_budget.json",  # driver.STOP_FILE: where a stop hook ended a round
    "phases.jsonl", "benchmark/comparison.*", "benchmark/*/results.*",
)  # fmt: skip


def export_run(workdir, dest) -> pathlib.Path:
    """Copies the small files of a finished run (`EXPORTED`, metrics.jsonl gzip-compressed)
    to `dest`, a directory that `compare_runs` and `write_report` read like the run itself;
    each file is written atomically. Returns `dest`."""
    workdir, dest = pathlib.Path(workdir), pathlib.Path(dest)
    if not (workdir / "start").is_dir():
        raise ValueError(f"{workdir}: not a run directory of launch/train.py (no start/)")
    for pattern in EXPORTED:
        for src in sorted(workdir.glob(pattern)):
            out = dest / src.relative_to(workdir)
            out.parent.mkdir(parents=True, exist_ok=True)
            files.atomic_write(out, src.read_bytes())
    for src in sorted(workdir.glob("round_*/metrics.jsonl")):
        out = dest / src.relative_to(workdir).with_suffix(".jsonl.gz")
        out.parent.mkdir(parents=True, exist_ok=True)
        files.atomic_write(out, gzip.compress(src.read_bytes(), mtime=0))
    return dest


def _group_size(workdir: pathlib.Path) -> int | None:
    path = workdir / "run_config.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("train", {}).get("group_size")


def final_benchmark(workdir: pathlib.Path) -> list[str]:
    """The report's lines for the run's final benchmark (benchmark/comparison.md, written by
    the loop once the starting and the final model have answered it), or none."""
    path = workdir / "benchmark" / "comparison.md"
    if not path.exists():
        return []
    return [path.read_text().rstrip(), ""]


def engineer_failures(workdir: pathlib.Path, found) -> list[str]:
    """'R<n>: why' for each finished round whose engineer could not run (`extra.failure` in
    its decision.json, written by `engineers.engineer_failed`)."""
    out = []
    for n, d in found:
        path = d / "decision.json"
        if path.exists():
            why = json.loads(path.read_text()).get("extra", {}).get("failure")
            if why:
                out.append(f"R{n}: {str(why).splitlines()[0][:160]}")
    return out


def write_report(workdir, title: str | None = None) -> pathlib.Path:
    """Write `workdir/report.md` (+ validation.png, configs.png); returns the markdown path.
    title: what the heading names the run by (default: the work directory; a remote run's
    URL when `workdir` is its local copy)."""
    workdir = pathlib.Path(workdir)
    found = _rounds(workdir)
    records = [RoundRecord.from_dict(json.loads((d / "record.json").read_text())) for _, d in found]
    parts = [f"# Run report: {title or workdir}", ""]
    failed = engineer_failures(workdir, found)
    if failed:
        steps = sum((d / "decision.json").exists() for _, d in found)
        parts += [
            f"**The engineer failed to run in {len(failed)} of {steps} steps** "
            f"({'; '.join(failed)}); those rounds kept the config, as the fixed baseline would.",
            "",
        ]
    if not records:
        parts.append("No finished round yet.")
    else:
        plots = _plots(records, workdir)
        held = validation_rows(workdir)
        sampled = any("samples" in r for _, rows in held for r in rows)
        parts += [
            f"## Held-out validation ({'greedy and sampled' if sampled else 'greedy'}, 95 % "
            "intervals)",
            "",
            held_out_table(held),
            "",
            "`start` is the model before any training. The change against it is paired over the "
            "same puzzles (greedy: solved or not; mean@k: each puzzle's share of valid samples, "
            "what GRPO optimises); an interval that contains 0 is no measurable change.",
            "",
        ]
        held_set = workdir / "validation_set.jsonl"
        labels = needs_wait_labels(held_set.read_bytes()) if held_set.exists() else None
        split = wait_split_table(held, labels) if labels else ""
        if split:
            parts += [
                "Split by whether a held-out puzzle needs a wait (greedy):",
                "",
                split,
                "",
            ]
        parts += final_benchmark(workdir)
        if "training.png" in plots:
            parts += ["## Training curves", "", "![training](training.png)", ""]
        group_size = _group_size(workdir)
        if group_size:
            curve = training_curves(workdir)
            parts += [
                "## Training rollouts: first vs last updates",
                "",
                rollout_trend(curve, group_size),
                "",
                "Which reward differences the gradient came from (groups whose samples' rewards "
                "all equal carry none):",
                "",
                reward_signal(curve, group_size),
                "",
            ]
        parts += [
            "## Validation per size (valid % / optimal %, greedy)",
            "",
            validation_table(records),
            "",
        ]
        parts += [f"![validation]({plots[0]})", ""]
        parts += [
            "## Generator config per round (data / hole / wait ratio)",
            "",
            config_table(records),
            "",
            f"![configs]({plots[1]})",
            "",
        ]
        parts += ["## What the engineer said", ""]
        for n, d in found:
            path = d / "decision.json"
            if not path.exists():
                continue
            dec = json.loads(path.read_text())
            parts.append(f"### After R{n} ({dec['engineer']})")
            if dec.get("kept_current"):
                parts.append(f"- kept the config: {dec.get('reason', '')}")
            else:
                diff = ", ".join(f"`{k}: {v:g}`" for k, v in dec["diff"].items())
                parts.append(f"- diff: {diff}")
            extra = dec.get("extra", {})
            if extra.get("mode"):
                parts.append(
                    f"- decided by: {extra['mode']}"
                    + (f" (candidate {extra['chosen']})" if extra.get("chosen") is not None else "")
                )
            for change in dec.get("changes", []):
                parts.append(f"- projection: {change}")
            for key, why in dec.get("rejected", []):
                parts.append(f"- rejected `{key}`: {why}")
            if dec.get("summary"):
                parts.append(f"- summary: {dec['summary']}")
            raw = (dec.get("raw") or "").strip()
            if raw:
                parts.append("\n~~~text\n" + raw[:1500] + "\n~~~")
            parts.append("")
    out = workdir / "report.md"
    files.atomic_write(out, "\n".join(parts).encode())
    return out
