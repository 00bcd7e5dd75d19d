r"""How much of the look-ahead block a policy writes right: per half of the puzzles (needs a
wait or not), of those the form finds a plan for, how many responses write the whole block
right, and where the others first go wrong (`lookahead.first_wrong`: each agent's path
alone, the first conflict, the re-planning), beside the valid rate. With --form relay (no
block; `relay_checks.check`): whether each line and each action is right, and where not (the map
and agents' lines, the first agent's run, a later run, an action not the rule's), and how
often the policy runs first the agent the rule's first valid order does, and how often it
runs first an agent no order starting with which has a valid plan; then, over all the
puzzles, which field of the first wrong line in a run is wrong (`relay_checks.line_error`); and
on the puzzles where every order fails on a line, how many traces end on `no order left`, how
many are right (`relay_retry_end`'s ending) and how many answers are valid.

    python -m projects.go_no_go.lookahead_check \
        --instances projects/go_no_go/results/held_out_400.jsonl \
        --eval runs/trace_ahead_eval --form priority [--out table.md]
"""

from absl import app, flags

from projects.go_no_go.lookahead import LOOKAHEADS

_INSTANCES = flags.DEFINE_string("instances", None, "instance JSONL")
_EVAL = flags.DEFINE_string("eval", None, "a launch/evaluate.py --out_dir with answers.jsonl")
_FORM = flags.DEFINE_enum("form", "priority", list(LOOKAHEADS), "the form")
_OUT = flags.DEFINE_string("out", None, "also write the table here")
flags.mark_flags_as_required(["instances", "eval"])


def main(argv):
    del argv
    import pathlib

    from mapfjax import files, stats
    from mapfjax.env import io, relay, trace
    from mapfjax.eval import evaluate as ev
    from projects.go_no_go import layouts, lookahead, relay_checks

    def build():
        problems = {p.id: p for p in io.require_instances(_INSTANCES.value)}
        verdicts = ev.read_outcomes(_EVAL.value)
        answers = dict(io.load_answers(pathlib.Path(_EVAL.value) / "answers.jsonl"))
        if missing := sorted(set(problems) - set(answers)):
            raise ValueError(
                f"{_EVAL.value}: no answer for {len(missing)} puzzles, e.g. {missing[0]!r}"
            )
        if _FORM.value.startswith("relay"):
            return relay_table(problems, answers, verdicts)
        kinds = ("right", *lookahead.BLOCK_PARTS, "missing")
        rows = []
        for name, wait in (("no", False), ("yes", True)):
            found = [p for p in problems.values() if p.needs_wait is wait
                     and lookahead.LOOKAHEADS[_FORM.value](p).plans is not None]  # fmt: skip
            where = [lookahead.first_wrong(p, answers[p.id], _FORM.value) or "right" for p in found]
            valid = stats.proportion([bool(verdicts[p.id]["valid"]) for p in found])
            rows.append(
                [name, len(found), *(where.count(k) for k in kinds), stats.interval_text(valid)]
            )
        header = ["needs a wait", "puzzles with a plan", "block right",
                  *(f"first wrong: {k}" for k in kinds[1:]), "valid %"]  # fmt: skip
        return stats.markdown_table(header, rows)

    def relay_table(problems, answers, verdicts):
        rows = []
        orders = {i: relay_checks.relay(p)[0] for i, p in problems.items()}
        for name, wait in (("no", False), ("yes", True)):
            found = [(p, orders[i]) for i, p in problems.items()
                     if p.needs_wait is wait and orders[i] is not None]  # fmt: skip
            where = [relay_checks.check(p, answers[p.id]) for p, _ in found]
            firsts = [relay_checks.first_agent(answers[p.id]) for p, _ in found]
            same = sum(f == o[0] for f, (_, o) in zip(firsts, found, strict=True))
            # a first agent that no order starting with it gives a valid plan: a lost puzzle
            # (the rule's own first agent has one: its order is the plan found above)
            dead = sum(f not in (None, o[0]) and relay_checks.plan_from(p, f) is None
                       for f, (p, o) in zip(firsts, found, strict=True))  # fmt: skip
            valid = stats.proportion([bool(verdicts[p.id]["valid"]) for p, _ in found])
            line = [name, len(found), same, dead, *(where.count(k) for k in relay_checks.CHECKS)]
            rows.append(line + [stats.interval_text(valid)])
        header = ["needs a wait", "puzzles with a plan", "first agent as the rule's order",
                  "first agent with no plan",
                  *(f"trace {k}" if k == "right" else f"first wrong: {k}"
                    for k in relay_checks.CHECKS),
                  "valid %"]  # fmt: skip
        # the field of the first wrong line, over every puzzle whose trace has one in a run
        fields = [relay_checks.line_error(p, answers[p.id]) for p in problems.values()]
        by_run = [[run, *(fields.count((run, f)) for f in relay_checks.LINE_FIELDS)]
                  for run in ("first run", "later run")]  # fmt: skip
        wrong = ["first wrong line in", *relay_checks.LINE_FIELDS]
        tables = [stats.markdown_table(header, rows), stats.markdown_table(wrong, by_run)]
        # the puzzles where every order fails on a line: a trace that ends there is right
        # when it writes the rule's attempts and then `no order left`
        ends = [p for i, p in problems.items()
                if orders[i] is None and relay.every_order_fails(p) is not None]  # fmt: skip
        if ends:
            bodies = [trace.thinking_text(answers[p.id]) for p in ends]
            said = sum(b is not None and layouts.parse_trace(b, p.num_agents)[1] == trace.NO_ORDER
                       for b, p in zip(bodies, ends, strict=True))  # fmt: skip
            right = sum(relay_checks.check(p, answers[p.id]) == "right" for p in ends)
            valid = stats.proportion([bool(verdicts[p.id]["valid"]) for p in ends])
            head = ["puzzles where every order fails", "trace ends on `no order left`",
                    "trace right", "valid %"]  # fmt: skip
            row = [len(ends), said, right, stats.interval_text(valid)]
            tables.append(stats.markdown_table(head, [row]))
        return "\n\n".join(tables)

    return files.report_command(build, _OUT.value)


if __name__ == "__main__":
    app.run(main)
