"""Subcommands of `python -m mapfjax.env`: a registry of (add_arguments, run) pairs."""

from __future__ import annotations

import json
import sys

import jax


def _emit(row: dict) -> None:
    sys.stdout.write(json.dumps(row) + "\n")


def _verify_args(p):
    """Score raw model answers ({"id", "text"} JSONL) against instances."""
    p.add_argument("--instances", required=True, help="instance JSONL")
    p.add_argument("--answers", required=True, help='answer JSONL: {"id", "text"} per line')


def _verify(args):
    from mapfjax.env import dynamics, io, text, types

    problems = {p.id: p for p in io.load_instances(args.instances)}
    answers = io.load_answers(args.answers)
    for line, (aid, _) in enumerate(answers, 1):
        if aid not in problems:
            raise ValueError(
                f"{args.answers}:{line}: field 'id': {aid!r} is not in {args.instances}"
            )
    probs = [problems[aid] for aid, _ in answers]
    for start in range(0, len(answers), 4096):
        chunk = answers[start : start + 4096]
        pchunk = probs[start : start + 4096]
        parsed = text.parse_answers([t for _, t in chunk], [p.num_agents for p in pchunk])
        verdict = dynamics.verify(types.to_instances(pchunk), parsed)
        for (aid, _), row in zip(chunk, dynamics.verdict_rows(verdict), strict=True):
            keys = ("valid", "optimal", "failure", "soc", "makespan")
            _emit({"id": aid, **{k: row[k] for k in keys}})


def _solve_args(p):
    """Solve instances exactly with the CBS oracle; print the canonical answers."""
    p.add_argument("--instances", required=True)
    p.add_argument("--max_nodes", type=int, default=50_000)
    p.add_argument("--time_limit", type=float, default=30.0)
    p.add_argument("--processes", type=int, default=None)


def _solve(args):
    from mapfjax.env import io, oracle, text

    problems = io.load_instances(args.instances)
    sols = oracle.solve_many(
        problems, args.max_nodes, args.time_limit, args.processes, progress=sys.stderr.isatty()
    )
    for p, s in zip(problems, sols, strict=True):
        answer = text.render_answer(oracle.answer_actions(s)) if s.optimal else None
        _emit(
            {"id": p.id, "status": s.status, "soc": s.soc, "makespan": s.makespan, "answer": answer}
        )


def _generate_args(p):
    """Generate labelled instances from a generator config."""
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--sizes", default="3-10", help="e.g. 3-10 or 3,5,7")
    p.add_argument("--hole_ratio", type=float, default=0.2)
    p.add_argument("--wait_ratio", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="per-size override, e.g. sizes.s7.hole_ratio=0.4 (repeatable)",
    )
    p.add_argument("--report", default=None, help="write the generation report (JSON) here")


def parse_sizes(spec: str) -> tuple[int, ...]:
    try:
        if "-" in spec:
            lo, hi = spec.split("-")
            return tuple(range(int(lo), int(hi) + 1))
        return tuple(int(s) for s in spec.split(","))
    except ValueError:
        raise ValueError(
            f"--sizes {spec!r}: expected a range like 3-10 or a list like 3,5,7"
        ) from None


def _generate(args):
    from mapfjax.env import config, generator, io

    cfg = config.default_config(
        args.agents, parse_sizes(args.sizes), args.hole_ratio, args.wait_ratio, args.seed
    )
    if args.set:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: expected KEY=VALUE")
            overrides[key.strip()] = value.strip()
        cfg, changes = config.project(overrides, cfg)
        for c in changes:
            print(f"projected: {c}", file=sys.stderr)
    out = generator.generate(jax.random.key(args.seed), cfg, args.n, progress=sys.stderr.isatty())
    io.save_instances(args.out, out.problems)
    print(out.report.table(), file=sys.stderr)
    if args.report:
        io.save_jsonl(args.report, [out.report.to_dict()])


def _benchmark_args(p):
    """Build the paper's evaluation set (3/4/5 agents x sizes x wait ratios) as JSONL."""
    p.add_argument("--out", required=True)
    p.add_argument("--per_cell", type=int, default=50)
    p.add_argument("--agents", default="3,4,5")
    p.add_argument("--sizes", default="3-10")
    p.add_argument("--wait_ratios", default="0.25,0.5,0.75")
    p.add_argument("--hole_ratio", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="write per-cell generation reports here")


def _spec(args):
    from mapfjax.env.benchmark import BenchmarkSpec

    return BenchmarkSpec(
        agents=tuple(int(a) for a in args.agents.split(",")),
        sizes=parse_sizes(args.sizes),
        wait_ratios=tuple(float(w) for w in args.wait_ratios.split(",")),
        per_cell=args.per_cell,
        hole_ratio=args.hole_ratio,
        seed=args.seed,
    )


def _benchmark(args):
    from mapfjax.env import benchmark, io

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


def _demo(args):
    from mapfjax.env import benchmark, dynamics, io, text, types

    problems, _ = benchmark.build(_spec(args), progress=True)
    if args.out:
        io.save_instances(args.out, problems)
    # Baseline: every agent follows its own shortest path and ignores the others.
    answers = [text.render_answer(independent_plan(p)) for p in problems]
    parsed = text.parse_answers(answers, [p.num_agents for p in problems])
    verdict = dynamics.verify(types.to_instances(problems), parsed)
    rows = dynamics.verdict_rows(verdict)
    print("Independent shortest paths (no coordination), valid % / optimal %:")
    print(benchmark.table(benchmark.summarize(problems, rows), _spec(args).sizes))
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


def _render_args(p):
    """Draw an instance (PNG), or a plan from an answer file (GIF)."""
    p.add_argument("--instances", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--out", required=True, help=".png, or .gif with --answers")
    p.add_argument("--answers", default=None)


def _render(args):
    from mapfjax.env import io, render, text

    problems = {p.id: p for p in io.load_instances(args.instances)}
    if args.id not in problems:
        raise ValueError(f"--id {args.id!r} is not in {args.instances}")
    p = problems[args.id]
    if args.answers:
        texts = dict(io.load_answers(args.answers))
        if args.id not in texts:
            raise ValueError(f"--id {args.id!r} is not in {args.answers}")
        plan, why = text.parse_answer(texts[args.id], p.num_agents)
        if plan is None:
            raise ValueError(f"answer for {args.id!r} does not parse: {why}")
        render.save_gif(p, plan, args.out)
    else:
        render.save_png(p, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


COMMANDS = {
    "verify": (_verify_args, _verify),
    "solve": (_solve_args, _solve),
    "generate": (_generate_args, _generate),
    "benchmark": (_benchmark_args, _benchmark),
    "demo": (_demo_args, _demo),
    "render": (_render_args, _render),
}
