r"""How much of the oracle's plan do the reasoning trace's own lines decide? Per half of the
puzzles (needs a wait or not): plans whose every action a move line's cells, their contents
and their distances to the goal decide (`env.locality`), the most that any optimal plan
reaches, the local rule run as a planner, and with --evals each policy's valid rate on the
puzzles whose plan is decided and on the rest.

    python -m projects.go_no_go.trace_locality \
        --instances projects/go_no_go/results/held_out_400.jsonl \
        [--evals runs/trace_long_eval/long --labels trace_long] [--out table.md]
"""

from absl import app, flags

_INSTANCES = flags.DEFINE_string("instances", None, "instance JSONL (2-3 agents)")
_EVALS = flags.DEFINE_list(
    "evals", [], "launch/evaluate.py --out_dir(s) or runs' validation.json on these instances"
)
_LABELS = flags.DEFINE_list("labels", [], "a name per --evals directory")
_OUT = flags.DEFINE_string("out", None, "also write the table here")
flags.mark_flags_as_required(["instances"])


def main(argv):
    del argv
    from mapfjax import files
    from mapfjax.env import io, oracle
    from mapfjax.eval import evaluate as ev
    from projects.go_no_go import locality

    def build():
        if len(_LABELS.value) != len(_EVALS.value):
            raise ValueError(
                f"--labels names {len(_LABELS.value)} evaluations, --evals {len(_EVALS.value)}"
            )
        problems = io.require_instances(_INSTANCES.value)
        valid = {}
        for label, path in zip(_LABELS.value, _EVALS.value, strict=True):
            verdicts = ev.read_outcomes(path)
            if missing := [p.id for p in problems if p.id not in verdicts]:
                raise ValueError(
                    f"{path}: no verdict for {len(missing)} puzzle(s), e.g. {missing[0]!r}"
                )
            valid[label] = {i: bool(v["valid"]) for i, v in verdicts.items()}
        sols = oracle.solve_many(problems)
        if bad := [p.id for p, s in zip(problems, sols, strict=True) if not s.optimal]:
            raise ValueError(f"{_INSTANCES.value}: the oracle did not solve {bad[0]!r}")
        plans = [oracle.answer_actions(s) for s in sols]
        return locality.locality_table(problems, plans, valid, [s.nodes for s in sols])

    return files.report_command(build, _OUT.value)


if __name__ == "__main__":
    app.run(main)
