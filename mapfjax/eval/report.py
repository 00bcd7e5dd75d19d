"""Run reports: per-round validation tables, the configs chosen and what the engineer said,
as markdown plus PNG plots, read back from a run directory written by `engineer.loop`."""

from __future__ import annotations

import io as std_io
import json
import pathlib

from mapfjax.engineer.context import RoundRecord
from mapfjax.env import io


def _rounds(workdir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    out = []
    for d in workdir.glob("round_*"):
        if d.is_dir() and d.name.split("_")[-1].isdigit() and (d / "record.json").exists():
            out.append((int(d.name.split("_")[-1]), d))
    return sorted(out)


def _sizes(records: list[RoundRecord]) -> list[str]:
    keys = {k for r in records for k in r.validation}
    return sorted(keys, key=lambda k: int(k.lstrip("s")))


def _rate(entry: dict, field: str) -> float:
    return 100.0 * entry[field] / entry["n"] if entry.get("n") else float("nan")


def validation_table(records: list[RoundRecord]) -> str:
    """Rows: rounds; columns: map sizes; cells: valid % / optimal %; last column: the mean."""
    sizes = _sizes(records)
    head = "| round | " + " | ".join(f"{s[1:]}x{s[1:]}" for s in sizes) + " | mean |"
    lines = [head, "|---" * (len(sizes) + 2) + "|"]
    for r in records:
        cells, vs, os_ = [], [], []
        for s in sizes:
            e = r.validation.get(s)
            if not e:
                cells.append("-")
                continue
            v, o = _rate(e, "valid"), _rate(e, "optimal")
            vs.append(v)
            os_.append(o)
            cells.append(f"{v:.1f} / {o:.1f}")
        mean = f"{sum(vs) / len(vs):.1f} / {sum(os_) / len(os_):.1f}" if vs else "-"
        lines.append(f"| R{r.round} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines)


def config_table(records: list[RoundRecord]) -> str:
    """The generator config of each round: data / hole / wait ratio per size."""
    sizes = sorted({k for r in records for k in r.config["sizes"]}, key=lambda k: int(k[1:]))
    head = "| round | " + " | ".join(f"{s[1:]}x{s[1:]}" for s in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    for r in records:
        cells = []
        for s in sizes:
            e = r.config["sizes"].get(s)
            cells.append(
                "-"
                if e is None
                else f"{e['data_ratio']:.2f} / {e['hole_ratio']:.2f} / {e['wait_ratio']:.2f}"
            )
        lines.append(f"| R{r.round} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _save_png(fig, path: pathlib.Path) -> None:
    """Render the figure to memory and write it atomically (readers never see half a PNG)."""
    import matplotlib.pyplot as plt

    buf = std_io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    io.atomic_write(path, buf.getvalue())


def _plots(records: list[RoundRecord], workdir: pathlib.Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = _sizes(records)
    xs = [int(s[1:]) for s in sizes]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, field in zip(axes, ("valid", "optimal"), strict=True):
        for r in records:
            ys = [
                _rate(r.validation[s], field) if s in r.validation else float("nan") for s in sizes
            ]
            ax.plot(xs, ys, marker="o", label=f"R{r.round}")
        ax.set_title(f"{field} rate per map size (validation)")
        ax.set_xlabel("map size N (NxN)")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("%")
    axes[1].legend()
    fig.tight_layout()
    names = ["validation.png"]
    _save_png(fig, workdir / names[0])

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
    _save_png(fig, workdir / names[1])
    return names


def write_report(workdir) -> pathlib.Path:
    """Write `workdir/report.md` (+ validation.png, configs.png); returns the markdown path."""
    workdir = pathlib.Path(workdir)
    found = _rounds(workdir)
    records = [RoundRecord.from_dict(json.loads((d / "record.json").read_text())) for _, d in found]
    parts = [f"# Run report: {workdir}", ""]
    if not records:
        parts.append("No finished round yet.")
    else:
        plots = _plots(records, workdir)
        parts += ["## Validation (valid % / optimal %, greedy)", "", validation_table(records), ""]
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
    io.atomic_write(out, "\n".join(parts).encode())
    return out
