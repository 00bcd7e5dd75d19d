"""Subcommands of `python -m mapfjax.env`: a registry of (add_arguments, run) pairs.

Arguments are checked before any work starts: a bad value is one line naming the flag, the value
and what is allowed (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import jax

from mapfjax.env.config import ConfigError
from mapfjax.env.config import parse_sizes as config_parse_sizes


def _emit(row: dict) -> None:
    sys.stdout.write(json.dumps(row) + "\n")


# --- argument types: each names the value and what is allowed (argparse adds the flag) -------


def int_at_least(lo: int):
    """An argparse type: an integer >= lo."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}; allowed: an integer >= {lo}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v}; allowed: an integer >= {lo}")
        return v

    return parse


def float_in(lo: float, hi: float, open_lo: bool = False):
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with open_lo)."""
    if math.isinf(hi):
        allowed = f"a finite number {'>' if open_lo else '>='} {lo:g}"
    else:
        allowed = f"a number in {'(' if open_lo else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}; allowed: {allowed}") from None
        if not math.isfinite(v) or v < lo or v > hi or (open_lo and v == lo):
            raise argparse.ArgumentTypeError(f"{text}; allowed: {allowed}")
        return v

    return parse


def list_of(item, what: str):
    """An argparse type: a comma-separated list of `item` values (at least one)."""

    def parse(text: str) -> tuple:
        parts = [s.strip() for s in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r}; allowed: a comma-separated list of {what}")
        try:
            return tuple(item(s) for s in parts)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"item {e} (in {text!r})") from None

    return parse


def parse_sizes(spec: str) -> tuple[int, ...]:
    """argparse type: `config.parse_sizes` ('3-10', '3,5,7', '3-5,8'), map sizes in [2, 40]."""
    allowed = "a range like 3-10 or a list like 3,5,7 of map sizes in [2, 40]"
    try:
        sizes = config_parse_sizes(spec)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{spec!r}; allowed: {allowed}") from None
    if not sizes or not all(2 <= n <= 40 for n in sizes):
        raise argparse.ArgumentTypeError(f"{spec!r}; allowed: {allowed}")
    return sizes


def _agents(text: str) -> int:
    from mapfjax.env.types import MAX_AGENTS  # the padding of every Instance

    v = int_at_least(1)(text)
    if v > MAX_AGENTS:
        raise argparse.ArgumentTypeError(f"{v}; allowed: an integer in [1, {MAX_AGENTS}]")
    return v


def _check_out(path, flag: str) -> None:
    """Refuse an output path that cannot be written, before any work is done."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; expected a file name")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {path}: {parent} is a file, not a directory")


def _add_budget_args(p, max_nodes: int, time_limit: float) -> None:
    p.add_argument(
        "--max_nodes", type=int_at_least(1), default=max_nodes, help="CBS nodes per instance"
    )
    p.add_argument(
        "--time_limit",
        type=float_in(0, math.inf, open_lo=True),
        default=time_limit,
        help="seconds per instance",
    )
    p.add_argument("--processes", type=int_at_least(1), default=None, help="default: all CPUs")


# --- verify ----------------------------------------------------------------------------------


def _verify_args(p):
    """Score raw model answers ({"id", "text"} JSONL) against instances."""
    p.add_argument("--instances", required=True, help="instance JSONL")
    p.add_argument(
        "--answers",
        required=True,
        help='answer JSONL: {"id", "text"[, "puzzle_hash"]} per line (what `solve` prints is one)',
    )
    p.add_argument(
        "--allow_missing",
        action="store_true",
        help="exit 0 even when some instances have no answer (still reported as 'missing')",
    )
    p.add_argument(
        "--duplicates",
        choices=("error", "first", "last", "all"),
        default="error",
        help="an id answered on several lines: refuse (default), score its first or last "
        "answer, or all of them (several samples per instance)",
    )


def _verify(args) -> int:
    from mapfjax.env import dynamics, io, text, types

    problems = {p.id: p for p in io.require_instances(args.instances)}
    answers = io.read_answer_lines(args.answers)
    for a in answers:
        if a.id not in problems:
            raise ValueError(
                f"{args.answers}:{a.line}: field 'id': {a.id!r} is not in {args.instances}"
            )
    io.check_answers_match(args.answers, answers, problems)
    answers = io.one_answer_per_id(args.answers, answers, args.duplicates)
    keys = ("valid", "optimal", "failure", "soc", "makespan")
    below = []  # (id, soc, label): a valid plan cheaper than the "optimal" label
    for start in range(0, len(answers), 4096):
        chunk = answers[start : start + 4096]
        pchunk = [problems[a.id] for a in chunk]
        parsed = text.parse_answers([a.text for a in chunk], [p.num_agents for p in pchunk])
        verdict = dynamics.verify(types.to_instances(pchunk), parsed)
        for a, p, row in zip(chunk, pchunk, dynamics.verdict_rows(verdict), strict=True):
            _emit({"id": a.id, **{k: row[k] for k in keys}})
            if row["valid"] and p.optimal_soc is not None and row["soc"] < p.optimal_soc:
                below.append((a.id, row["soc"], p.optimal_soc))
    answered = {a.id for a in answers}
    missing = [pid for pid in problems if pid not in answered]
    for pid in missing:
        optimal = None if problems[pid].optimal_soc is None else False
        row = {"valid": False, "optimal": optimal, "failure": "missing", "soc": None}
        _emit({"id": pid, **row, "makespan": None})
    status = 0
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        print(
            f"{'warning' if args.allow_missing else 'error'}: {args.answers}: no answer for "
            f"{len(missing)} of {len(problems)} instance(s) of {args.instances} ({shown}); "
            "reported with failure 'missing'",
            file=sys.stderr,
        )
        status = 0 if args.allow_missing else 1
    if below:
        shown = "; ".join(f"{i!r}: soc {s} < optimal_soc {lab}" for i, s, lab in below[:5])
        print(
            f"error: {args.instances}: field 'optimal_soc' is wrong for {len(below)} "
            f"instance(s): a valid answer costs less ({shown}); relabel the file with "
            "`python -m mapfjax.env label`",
            file=sys.stderr,
        )
        status = 1
    return status


# --- solve and label -------------------------------------------------------------------------


def _solve_args(p):
    """Solve instances exactly with the CBS oracle; print one answer line per instance, which
    `verify --answers` and `render --answers` read as they are."""
    p.add_argument("--instances", required=True, help="instance JSONL (labels optional)")
    _add_budget_args(p, 50_000, 30.0)


def _solve(args):
    from mapfjax.env import io, oracle, text

    problems = io.require_instances(args.instances)
    sols = oracle.solve_many(
        problems, args.max_nodes, args.time_limit, args.processes, progress=sys.stderr.isatty()
    )
    for p, s in zip(problems, sols, strict=True):
        # An answer line (id, puzzle_hash, text) with the oracle's outcome beside it; text is
        # null when there is no optimal plan (timeout, unsolvable): no answer for that id.
        plan = text.render_answer(oracle.answer_actions(s)) if s.optimal else None
        row = {"id": p.id, "puzzle_hash": io.puzzle_hash(p), "status": s.status}
        _emit(row | {"soc": s.soc, "makespan": s.makespan, "text": plan})


def _label_args(p):
    """Label your own instances with the exact oracle (optimal_soc, optimal_makespan,
    needs_wait) and write them to --out."""
    p.add_argument("--instances", required=True, help="instance JSONL (labels optional)")
    p.add_argument("--out", required=True, help="labelled instance JSONL (may be --instances)")
    _add_budget_args(p, 50_000, 30.0)


def label_problems(problems, max_nodes: int, time_limit: float, processes=None, progress=False):
    """Label every problem with the exact oracle; returns (problems, summary).

    A problem the oracle cannot solve within the budget (or proves unsolvable) comes back
    without labels rather than with a wrong one; summary lists those ids ("timeout",
    "unsolvable"), the ids whose earlier optimal_soc differed ("relabelled") and the budget.
    """
    from mapfjax.env import oracle, types

    problems = list(problems)
    sols = oracle.solve_many(problems, max_nodes, time_limit, processes, progress=progress)
    out, relabelled = [], []
    unlabelled: dict[str, list[str]] = {"timeout": [], "unsolvable": []}
    for p, s in zip(problems, sols, strict=True):
        if s.optimal:
            nw = types.needs_wait(s.soc, oracle.shortest_path_lengths(p))
            if p.optimal_soc not in (None, s.soc):
                relabelled.append(p.id)
            out.append(p.with_labels(s.soc, s.makespan, nw))
        else:
            unlabelled[s.status].append(p.id)
            out.append(p.with_labels(None, None, None))
    summary = {
        "instances": len(problems),
        "labelled": len(problems) - sum(map(len, unlabelled.values())),
        "max_nodes": max_nodes,
        "time_limit": time_limit,
        **unlabelled,
        "relabelled": relabelled,
    }
    return out, summary


def label_summary_line(summary: dict) -> str:
    """One human line for `label_problems`' summary."""
    return (
        f"labelled {summary['labelled']} of {summary['instances']} instances (exact CBS, budget "
        f"per instance: max_nodes={summary['max_nodes']}, time_limit={summary['time_limit']:g} s)"
        f"; {len(summary['timeout'])} timed out and {len(summary['unsolvable'])} are unsolvable "
        "(left without labels; a larger budget may label the timeouts); "
        f"{len(summary['relabelled'])} had a different optimal_soc before"
    )


def _label(args):
    from mapfjax.env import io

    _check_out(args.out, "--out")
    problems = io.require_instances(args.instances)
    progress = sys.stderr.isatty()
    out, summary = label_problems(
        problems, args.max_nodes, args.time_limit, args.processes, progress
    )
    io.save_instances(args.out, out)
    _emit({"out": str(args.out), **summary})
    print(f"{args.out}: {label_summary_line(summary)}", file=sys.stderr)


# --- generate and benchmark ------------------------------------------------------------------


def _generate_args(p):
    """Generate labelled instances from a generator config."""
    p.add_argument("--out", required=True, help="output instance JSONL")
    p.add_argument(
        "--n", type=int_at_least(1), default=1000, help="instances to write (default: %(default)s)"
    )
    p.add_argument(
        "--agents", type=_agents, default=2, help="agents per puzzle, 1-5 (default: %(default)s)"
    )
    p.add_argument(
        "--sizes", type=parse_sizes, default="3-10", help="NxN map sizes, e.g. 3-10 or 3,5,7"
    )
    p.add_argument(
        "--hole_ratio",
        type=float_in(0, 0.5),
        default=0.2,
        help="share of a map's cells that are holes, in [0, 0.5] (default: %(default)s)",
    )
    p.add_argument(
        "--wait_ratio",
        type=float_in(0, 1),
        default=0.3,
        help="share of needs-wait puzzles (optimal cost above the sum of the agents' shortest "
        "paths), in [0, 1] (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="generator seed (default: %(default)s)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="per-size override, e.g. sizes.s7.hole_ratio=0.4 (repeatable)",
    )
    p.add_argument("--report", default=None, help="write the generation report (JSON) here")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="JSONL",
        help="instance file whose puzzles (grid, starts, goals) are left out, e.g. a run's "
        "train_set.jsonl; --n then counts the puzzles kept (repeatable)",
    )


# Draws of the config (the first with the seed's key, then keys folded from it) that --exclude
# may take to keep --n puzzles before it gives up.
EXCLUDE_DRAWS = 50


def _fresh(key, cfg, n: int, seen: set[str], progress: bool):
    """`n` instances of `cfg` whose puzzles are not in `seen`, and the first draw's report:
    the first draw uses `key` (so with nothing excluded the output is `generator.generate`'s),
    later ones fold the draw number into it and prefix their ids with it."""
    from mapfjax.env import generator, io

    kept, report = [], None
    for r in range(EXCLUDE_DRAWS):
        k = key if r == 0 else jax.random.fold_in(key, r)
        out = generator.generate(
            k, cfg, n - len(kept), id_prefix=f"d{r}_" if r else "", progress=progress
        )
        report = report or out.report
        kept += io.held_out(out.problems, seen)[0]
        if len(kept) == n:
            return kept, report
    raise ValueError(
        f"--exclude: only {len(kept)} of --n {n} puzzles are outside the excluded files after "
        f"{EXCLUDE_DRAWS} draws; the config has too few distinct puzzles (lower --n, or widen "
        "--sizes)"
    )


def _generate(args):
    from mapfjax.env import config, io

    _check_out(args.out, "--out")
    if args.report:
        _check_out(args.report, "--report")
    cfg = config.default_config(
        args.agents, args.sizes, args.hole_ratio, args.wait_ratio, args.seed
    )
    config.validate(cfg)
    if args.set:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: expected KEY=VALUE")
            overrides[key.strip()] = value.strip()
        try:
            cfg, changes = config.project(overrides, cfg)
        except config.ConfigError as e:
            raise ValueError(f"--set: {e}") from None
        for c in changes:
            print(f"projected: {c}", file=sys.stderr)
    seen = io.puzzle_hashes(args.exclude)
    problems, report = _fresh(jax.random.key(args.seed), cfg, args.n, seen, sys.stderr.isatty())
    io.save_instances(args.out, problems)
    print(report.table(), file=sys.stderr)
    if args.exclude:
        print(f"kept {len(problems)} puzzles outside {len(seen)} excluded", file=sys.stderr)
    if args.report:
        io.save_jsonl(args.report, [report.to_dict()])


def _benchmark_args(p):
    """Build the paper's evaluation set (3/4/5 agents x sizes x wait ratios) as JSONL."""
    p.add_argument("--out", required=True, help="output instance JSONL")
    p.add_argument(
        "--per_cell",
        type=int_at_least(1),
        default=50,
        help="instances per (agents, size, wait ratio) cell (default: %(default)s)",
    )
    p.add_argument(
        "--agents",
        type=list_of(_agents, "agent counts in [1, 5]"),
        default="3,4,5",
        help="agent counts, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--sizes", type=parse_sizes, default="3-10", help="NxN map sizes (default: %(default)s)"
    )
    p.add_argument(
        "--wait_ratios",
        type=list_of(float_in(0, 1), "numbers in [0, 1]"),
        default="0.25,0.5,0.75",
        help="shares of needs-wait puzzles, one subset each (default: %(default)s)",
    )
    p.add_argument(
        "--hole_ratio",
        type=float_in(0, 0.5),
        default=0.1,
        help="share of a map's cells that are holes, in [0, 0.5] (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="generator seed (default: %(default)s)"
    )
    p.add_argument("--report", default=None, help="write per-cell generation reports here")


def _spec(args):
    from mapfjax.env.benchmark import BenchmarkSpec

    for k in args.agents:
        if not any(n >= k for n in args.sizes):  # BenchmarkSpec.cells: sizes below k are skipped
            raise ValueError(
                f"--agents {k}: larger than every map size in --sizes {list(args.sizes)}; a cell "
                f"needs an NxN map with N >= {k}"
            )
    return BenchmarkSpec(
        agents=tuple(args.agents),
        sizes=tuple(args.sizes),
        wait_ratios=tuple(args.wait_ratios),
        per_cell=args.per_cell,
        hole_ratio=args.hole_ratio,
        seed=args.seed,
    )


def _benchmark(args):
    from mapfjax.env import benchmark, io

    _check_out(args.out, "--out")
    if args.report:
        _check_out(args.report, "--report")
    problems, reports = benchmark.build(_spec(args), progress=True)
    io.save_instances(args.out, problems)
    if args.report:
        io.save_jsonl(args.report, reports)
    print(f"wrote {len(problems)} instances to {args.out}", file=sys.stderr)


def _demo_args(p):
    """Build a small benchmark, answer it with a naive baseline, verify and print the table."""
    _benchmark_args(p)
    p.set_defaults(per_cell=4, out=None)
    for a in p._actions:
        if a.dest == "out":
            a.required = False
            a.help = "also write the benchmark's instances here (instance JSONL; optional)"


def _demo(args):
    from mapfjax.env import benchmark, dynamics, io, text, types

    if args.out:
        _check_out(args.out, "--out")
    spec = _spec(args)
    problems, _ = benchmark.build(spec, progress=True)
    if args.out:
        io.save_instances(args.out, problems)
    # Baseline: every agent follows its own shortest path and ignores the others.
    answers = [text.render_answer(independent_plan(p)) for p in problems]
    parsed = text.parse_answers(answers, [p.num_agents for p in problems])
    verdict = dynamics.verify(types.to_instances(problems), parsed)
    rows = dynamics.verdict_rows(verdict)
    print("Independent shortest paths (no coordination), valid % / optimal %:")
    print(benchmark.table(benchmark.summarize(problems, rows), spec.sizes))
    fails: dict = {}
    for r in rows:
        fails[r["failure"] or "valid"] = fails.get(r["failure"] or "valid", 0) + 1
    print("outcomes:", json.dumps(dict(sorted(fails.items()))))


def independent_plan(problem):
    """Each agent's own shortest action list (other agents ignored), via the oracle on one agent."""
    from mapfjax.env import oracle, types

    plan = []
    for i in range(problem.num_agents):
        alone = types.Problem(problem.id, problem.grid, (problem.starts[i],), (problem.goals[i],))
        sol = oracle.solve(alone)
        plan.append(list(sol.actions[0]) if sol.optimal else [])
    return plan


# --- render ----------------------------------------------------------------------------------

PICTURE_FORMATS = (".png", ".gif")


def _render_args(p):
    """Draw an instance (.png; with --answers, the plan's trails), or animate a plan (.gif)."""
    p.add_argument("--instances", required=True, help="instance JSONL")
    p.add_argument("--id", required=True, help="the id of the instance to draw")
    p.add_argument("--out", required=True, help=".png (a picture) or .gif (needs --answers)")
    p.add_argument(
        "--answers",
        default=None,
        help="answer JSONL holding a plan for --id (e.g. what `solve` prints); its last line "
        "for the id is drawn",
    )


def _render(args):
    from mapfjax.env import io, render, text

    ext = pathlib.Path(args.out).suffix.lower()
    if ext not in PICTURE_FORMATS:
        raise ValueError(
            f"--out {args.out}: unknown picture format {ext or '(no extension)'!r}; allowed: "
            ".png (the puzzle, with the plan's trails when --answers is given) or .gif "
            "(an animation of the plan, needs --answers)"
        )
    if ext == ".gif" and not args.answers:
        raise ValueError(f"--out {args.out}: a .gif animates a plan; give --answers or use .png")
    _check_out(args.out, "--out")
    problems = {p.id: p for p in io.require_instances(args.instances)}
    if args.id not in problems:
        raise ValueError(f"--id {args.id!r} is not in {args.instances}")
    p = problems[args.id]
    plan = None
    if args.answers:
        answers = [a for a in io.read_answer_lines(args.answers) if a.id == args.id]
        io.check_answers_match(args.answers, answers, problems)
        if not answers:
            raise ValueError(f"--id {args.id!r} has no answer in {args.answers}")
        plan, why = text.parse_answer(answers[-1].text, p.num_agents)
        if plan is None:
            raise ValueError(
                f"{args.answers}:{answers[-1].line}: answer for {args.id!r} does not parse: {why}"
            )
    if ext == ".gif":
        render.save_gif(p, plan, args.out)
    else:
        render.save_png(p, args.out, plan=plan)
    print(f"wrote {args.out}", file=sys.stderr)


COMMANDS = {
    "verify": (_verify_args, _verify),
    "solve": (_solve_args, _solve),
    "label": (_label_args, _label),
    "generate": (_generate_args, _generate),
    "benchmark": (_benchmark_args, _benchmark),
    "demo": (_demo_args, _demo),
    "render": (_render_args, _render),
}
