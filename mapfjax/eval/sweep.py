"""Sweeps: an ml-collections sweep definition (configs/sweep_ablation.py) -> `launch/train.py`
runs with `--config.*` overrides, run locally one after another (finished runs skipped) or
printed for a cluster, and a summary table across the runs' records and evaluations."""

from __future__ import annotations

import ast
import csv
import dataclasses
import io as std_io
import json
import math
import pathlib
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections

from mapfjax import configfile, files, stats
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer import loop
from mapfjax.env.config import flatten
from mapfjax.eval import compare
from mapfjax.presets import variants

GROUP_KEYS = ("engineers", "variants", "t_details")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the sweep.

    train_arg: the sweep config file's argument that builds the training config.
    overrides: dotted config key -> value, passed as `--config.<key>=<value>`.
    rounds: the run's round count (finished = `workdir/round_<rounds-1>/DONE`).
    """

    name: str
    engineer: str
    variant: str
    t_detail: str
    seed: int
    train_arg: str
    overrides: tuple[tuple[str, Any], ...]
    workdir: pathlib.Path
    rounds: int

    @property
    def finished(self) -> bool:
        return (self.workdir / f"round_{self.rounds - 1}" / "DONE").exists()

    @property
    def eval_dir(self) -> pathlib.Path:
        return self.workdir / "eval"


def _flag_value(v: Any) -> str:
    return str(v) if not isinstance(v, tuple | list) else "(" + ",".join(map(str, v)) + ",)"


def train_command(run: Run, sweep_file, python: str = "python") -> list[str]:
    """argv of `launch/train.py` for one run."""
    return [
        python,
        "launch/train.py",
        f"--config={sweep_file}:{run.train_arg}",
        f"--workdir={run.workdir}",
        *(f"--config.{k}={_flag_value(v)}" for k, v in run.overrides),
    ]


def eval_command(run: Run, ev: ml_collections.ConfigDict, python: str = "python") -> list[str]:
    """argv of `launch/evaluate.py` on the run's final model."""
    return [
        python,
        "launch/evaluate.py",
        f"--checkpoint={run.workdir / f'round_{run.rounds - 1}' / 'model'}",
        f"--instances={ev.instances}",
        f"--answers_out={run.eval_dir / 'answers.jsonl'}",
        f"--out_dir={run.eval_dir}",
        f"--max_new_tokens={ev.max_new_tokens}",
        f"--batch_size={ev.batch_size}",
        "--enable_thinking" if ev.enable_thinking else "--noenable_thinking",
    ]


def _split_top_level(spec: str) -> list[str]:
    """Split at commas outside brackets and quotes: "a=(3,4),b='x,y'" -> ["a=(3,4)", "b='x,y'"]."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(spec):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    return [*parts, spec[start:]]


def parse_overrides(spec: str) -> dict[str, Any]:
    """ "rounds=2,validation.sizes=(3,4)" -> {"rounds": 2, "validation.sizes": (3, 4)}
    (values as Python literals where they parse, else strings; commas inside brackets or
    quotes belong to the value)."""
    out: dict[str, Any] = {}
    for part in filter(None, (s.strip() for s in _split_top_level(spec))):
        key, sep, raw = part.partition("=")
        if not sep or not key:
            raise ValueError(f"sweep overrides: {part!r} in {spec!r}; expected key=value")
        try:
            out[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = raw.strip()
    return out


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: Mapping[str, Any]):
    """A copy of `cfg` with dotted keys set; an unknown key raises naming it and the allowed
    keys at that level (the same check `--config.*` flags make)."""
    cfg = cfg.copy_and_resolve_references()
    for key, value in overrides.items():
        try:
            node, last = configfile.key_path(cfg, key)
        except ValueError as e:
            raise ValueError(f"override {key!r}: {e}") from None
        node[last] = type(node[last])(value) if isinstance(node[last], tuple) else value
    return cfg


def expand(
    sweep: ml_collections.ConfigDict, workdir, load_config: Callable[[str], Any]
) -> list[Run]:
    """The sweep's runs, in group order, each once. `load_config(arg)` returns the sweep file's
    `get_config(arg)` (the training config of "train,engineer=NAME,...")."""
    workdir = pathlib.Path(workdir)
    common = parse_overrides(sweep.overrides)
    runs: dict[str, Run] = {}
    for gname, group in sweep.groups.items():
        missing = [k for k in GROUP_KEYS if k not in group]
        if missing:
            raise ValueError(f"sweep group {gname!r}: missing {missing}; required: {GROUP_KEYS}")
        for engineer in group.engineers:
            arg = f"train,engineer={engineer},base={sweep.train_config}"
            arg += f",base_arg={sweep.train_arg}" if sweep.train_arg else ""
            base = load_config(arg)
            for variant in group.variants:
                if variant not in variants.VARIANTS:
                    raise ValueError(
                        f"sweep group {gname!r}: variant {variant!r}; allowed: "
                        f"{sorted(variants.VARIANTS)}"
                    )
                for detail in group.t_details:
                    if detail not in ctx_lib.T_DETAILS:
                        raise ValueError(
                            f"sweep group {gname!r}: t_detail {detail!r}; "
                            f"allowed: {list(ctx_lib.T_DETAILS)}"
                        )
                    for seed in sweep.seeds:
                        run = _make_run(
                            base, arg, engineer, variant, detail, int(seed), common, workdir
                        )
                        runs.setdefault(run.name, run)
    return list(runs.values())


def _make_run(base, arg, engineer, variant, detail, seed, common, workdir) -> Run:
    fixed = engineer == "fixed"  # the baseline never reads its context: one run per seed
    want: dict[str, Any] = {}
    if not fixed:
        modules = variants.get_config(variant).modules.to_dict()
        modules["T"]["detail"] = detail
        want["engineer.variant"] = variant
        have = flatten(base.engineer.modules.to_dict(), "engineer.modules.")
        for k, v in flatten(modules, "engineer.modules.").items():
            if have.get(k) != v:
                want[k] = v
    want["seed"] = seed
    want.update(common)
    cfg = apply_overrides(base, want)
    name = f"fixed_s{seed}" if fixed else f"{engineer}_{variant}_T{detail}_s{seed}"
    try:
        loop.check_config(cfg)  # every run's config, before the first run starts
    except ValueError as e:
        raise ValueError(f"sweep run {name}: {e}") from None
    return Run(
        name=name,
        engineer=engineer,
        variant="-" if fixed else variant,
        t_detail="-" if fixed else detail,
        seed=seed,
        train_arg=arg,
        overrides=tuple(want.items()),
        workdir=workdir / name,
        rounds=int(cfg.rounds),
    )


def plan(runs: Sequence[Run], sweep, sweep_file, python: str = "python") -> list[list[str]]:
    """The commands still to run, in order (training, then evaluation when configured); a
    finished run's training and a finished evaluation are left out. Run them from the
    repository root."""
    out = []
    for run in runs:
        if not run.finished:
            out.append(train_command(run, sweep_file, python))
        if sweep.evaluate.instances and not (run.eval_dir / "results.json").exists():
            out.append(eval_command(run, sweep.evaluate, python))
    return out


def checkout() -> pathlib.Path:
    """The directory the sweep's commands run from: the one holding launch/train.py (the
    repository root; with a wheel install, the checkout the sweep is started from)."""
    script = configfile.resolve("launch/train.py")
    if not script.is_file():
        raise FileNotFoundError(
            f"{script}: not found; run the sweep from the repository root (it runs launch/train.py)"
        )
    return script.parents[1]


class Exit(NamedTuple):
    """How a command of the sweep ended: its exit status and, when it failed, the first line
    of its error (its last `error: ...` line on stderr, else its last line there)."""

    code: int
    error: str = ""


def run_command(argv: list[str]) -> Exit:
    """Run `argv` from the checkout, its stderr passed through as it comes (progress bars
    included) and its tail kept for the error line."""
    proc = subprocess.Popen(argv, cwd=checkout(), stderr=subprocess.PIPE)
    tail = b""
    while chunk := proc.stderr.read1(1 << 16):
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()
        tail = (tail + chunk)[-(1 << 14) :]
    code = proc.wait()
    lines = [x.strip() for x in tail.decode("utf-8", "replace").splitlines() if x.strip()]
    errors = [x.removeprefix("error: ") for x in lines if x.startswith("error: ")]
    return Exit(code, "" if code == 0 else (errors or lines or [""])[-1])


def run_local(
    runs: Sequence[Run],
    sweep,
    sweep_file,
    python: str,
    execute: Callable[[list[str]], Exit] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, str]:
    """Run the sweep here, one command after another, skipping finished training runs and
    finished evaluations; returns {run name: why} for the runs whose commands failed (the
    others go on), for `write_summary`."""
    execute = execute or run_command
    failed: dict[str, str] = {}
    for i, run in enumerate(runs, 1):
        head = f"[{i}/{len(runs)}] {run.name}"
        if run.finished:
            log(f"{head}: finished, skipped")
        else:
            argv = train_command(run, sweep_file, python)
            log(f"{head}: {shlex.join(argv)}")
            done = execute(argv)
            if done.code != 0 or not run.finished:
                why = done.error or "stopped before its last round"
                log(f"{head}: training failed: {why}")
                failed[run.name] = f"training: {why}"
                continue
        if sweep.evaluate.instances and not (run.eval_dir / "results.json").exists():
            argv = eval_command(run, sweep.evaluate, python)
            log(f"{head}: {shlex.join(argv)}")
            done = execute(argv)
            if done.code != 0:
                log(f"{head}: evaluation failed: {done.error}")
                failed[run.name] = f"evaluation: {done.error}"
    return failed


def run_summary(run: Run, failure: str = "") -> dict[str, Any]:
    """One row: the run's status ("finished", "unfinished" or "failed (<failure>)"), its last
    finished round's mean valid/optimal over sizes (validation set) and, when present, its
    benchmark means per agent count (eval/results.json)."""
    status = "finished" if run.finished else "unfinished"
    row: dict[str, Any] = {
        "run": run.name,
        "engineer": run.engineer,
        "variant": run.variant,
        "t_detail": run.t_detail,
        "seed": run.seed,
        "status": f"failed ({failure})" if failure else status,
        "rounds_done": 0,
        "valid": math.nan,
        "optimal": math.nan,
    }
    done = sorted(
        int(d.name.split("_")[1])
        for d in run.workdir.glob("round_*")
        if d.name.split("_")[1].isdigit() and (d / "record.json").exists()
    )
    if done:
        path = run.workdir / f"round_{done[-1]}" / "record.json"
        try:
            record = ctx_lib.RoundRecord.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a round record ({e})") from e
        row.update(
            rounds_done=done[-1] + 1,
            valid=100 * stats.mean_rate(record.validation.values(), "valid"),
            optimal=100 * stats.mean_rate(record.validation.values(), "optimal"),
        )
    results = run.eval_dir / "results.json"
    if results.exists():
        try:
            means = json.loads(results.read_text())["means"]["all"]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{results}: field 'means.all' unreadable ({e!r})") from e
        for k, (v, o) in means.items():
            row[f"bench_{k}ag_valid"], row[f"bench_{k}ag_optimal"] = v, o
    return row


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.1f}"
    return str(v)


def summary_tables(rows: Sequence[dict]) -> tuple[str, str]:
    """(markdown, CSV) of the run rows; columns are the union of the rows' keys."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    md = stats.markdown_table(cols, [[_cell(r.get(c, "")) for c in cols] for r in rows])
    buf = std_io.StringIO()
    w = csv.DictWriter(buf, cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return md + "\n", buf.getvalue()


def write_summary(runs: Sequence[Run], workdir, failed: Mapping[str, str] | None = None):
    """`workdir/summary.md` and `summary.csv` across the runs (`failed`: {run name: why}, as
    `run_local` returns it); returns the markdown path."""
    workdir, failed = pathlib.Path(workdir), failed or {}
    md, table_csv = summary_tables([run_summary(r, failed.get(r.name, "")) for r in runs])
    head = (
        "# Sweep summary\n\nvalid / optimal: mean % over map sizes on the run's validation set "
        "after its last finished round; bench_*: benchmark means per agent count.\n\n"
    )
    files.atomic_write(workdir / "summary.md", head + md)
    files.atomic_write(workdir / "summary.csv", table_csv)
    return workdir / "summary.md"


def write_results(runs: Sequence[Run], sweep, command: str = "") -> pathlib.Path:
    """The comparison files under `sweep.results` (`eval.compare`): one JSON record per run,
    summary.md, summary.csv, plots. A run finished here gives its record from its directory;
    one that is not (run on another machine, or its directory gone) keeps the record already
    under results/runs/, so a sweep split across machines adds up and the committed records
    alone give the same files. Raises `compare.MismatchError` when runs used
    different held-out sets or training budgets."""
    out = configfile.resolve(sweep.results)  # an absolute path as it is
    committed = {}
    for path in sorted((out / "runs").glob("*.json")):
        try:
            committed[path.stem] = compare.check_record(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, RecursionError) as e:
            raise ValueError(f"{path}: not a run record ({e}); delete it or restore it") from None
    records = []
    for r in runs:
        if r.finished:
            records.append(compare.run_record(r.workdir, r.name, r.engineer, r.seed))
        elif r.name in committed:
            records.append(committed[r.name])
    command = command or "python launch/sweep.py --config SWEEP_FILE --workdir WORKDIR"
    note = (
        f"{len(records)} of {len(runs)} runs finished. Regenerate with `{command}` (it trains "
        f"what is missing; finished runs are skipped), or without training, from the records "
        f"under runs/, with `{command} --results_only`. Rates: % of held-out puzzles; [95 % "
        "interval]."
    )
    others = sorted(set(committed) - {r.name for r in runs})
    if others:  # e.g. a sweep narrowed to one seed by --config.seeds: say what it leaves out
        note += (
            f" Not summarised here: {len(others)} more records under runs/ from runs outside "
            f"this sweep ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); they are "
            "kept, and a sweep whose seeds and engineers include them summarises them too."
        )
    return compare.write_results(records, out, sweep.get("reference", "fixed"), note)
