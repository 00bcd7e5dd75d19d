r"""How long is the response a policy is trained to write for the oracle's plan, against the
generation budget? Per map size and whether the puzzle needs a wait: tokens of the oracle's
reasoning trace + answer (`rl.data.sft_examples`, end of turn included; median, 90th
percentile, max) and how many exceed the budget; with --lookahead=search|priority|relay the
trace also writes how its plan is found (`lookahead`; relay: the plan of `mapfjax.env.relay`,
each agent's in turn; the trace form `traces.form`). With --verdicts (a launch/evaluate.py
--out_dir, or a run's validation.json) also the evaluation's parse errors, and how many of
them the budget would have cut even on the oracle's trace.

    python -m projects.go_no_go.trace_lengths \
        --instances projects/go_no_go/results/held_out_400.jsonl \
        --tokenizer runs/tiny_trace_grid/export_aw10_6000 --style grid --budget 640 \
        [--verdicts runs/go_no_go_6000_kl/matched/start/validation.json] [--out table.md]
"""

from absl import app, flags
from absl import logging as absl_logging

from projects.go_no_go.lookahead import LOOKAHEADS
from projects.go_no_go.styles import STYLES

_INSTANCES = flags.DEFINE_string("instances", None, "instance JSONL")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "model directory whose tokenizer counts")
_STYLE = flags.DEFINE_enum("style", "grid", list(STYLES), "the trace's map transcription")
_NO_TRACE = flags.DEFINE_bool("answer_only", False, "the answer block alone (no trace)")
_LOOKAHEAD = flags.DEFINE_enum(
    "lookahead",
    None,
    list(LOOKAHEADS),
    "the trace first writes how its plan is found (lookahead.py; that plan, not the oracle's)",
)
_BUDGET = flags.DEFINE_integer("budget", 640, "max_new_tokens to compare with", lower_bound=1)
_VERDICTS = flags.DEFINE_string(
    "verdicts", None, "an evaluation --out_dir (verdicts.jsonl) or a run's validation.json"
)
_OUT = flags.DEFINE_string("out", None, "also write the table here")
flags.mark_flags_as_required(["instances", "tokenizer"])


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    from mapfjax import files
    from mapfjax.env import io
    from mapfjax.eval import evaluate as ev
    from mapfjax.models import tokenizer as tok_lib
    from mapfjax.rl import data
    from projects.go_no_go import lengths, lookahead, traces

    def build():
        problems = io.load_instances(_INSTANCES.value)
        tok = tok_lib.load_tokenizer(_TOKENIZER.value)
        fails = None
        if _VERDICTS.value:
            fails = {i: r.get("failure") for i, r in ev.read_outcomes(_VERDICTS.value).items()}
        if fails is not None and (missing := [p.id for p in problems if p.id not in fails]):
            raise ValueError(
                f"{_VERDICTS.value}: no verdict for {len(missing)} puzzle(s), e.g. "
                f"{missing[0]!r}, of {_INSTANCES.value}"
            )
        form = None if _NO_TRACE.value else traces.form(_LOOKAHEAD.value or "", _STYLE.value)
        examples = data.sft_examples(tok, problems, form=form)
        note = ""
        if _LOOKAHEAD.value:
            note = (
                f"\n\nThe {_LOOKAHEAD.value} look-ahead found no plan for "
                f"{len(problems) - len(examples)} of {len(problems)} puzzles"
                + (
                    f" (the search gives up after {lookahead.MAX_OPEN} opened nodes)"
                    if _LOOKAHEAD.value == "search"
                    else ""
                )
                + "; they are left out above."
            )
            kept = {e.problem_id for e in examples}
            problems = [p for p in problems if p.id in kept]
        counts = [len(e.completion) for e in examples]
        return lengths.response_length_table(problems, counts, _BUDGET.value, fails) + note

    return files.report_command(build, _OUT.value)


if __name__ == "__main__":
    app.run(main)
