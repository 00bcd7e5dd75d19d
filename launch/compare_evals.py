r"""Greedy valid rates of several checkpoints evaluated (launch/evaluate.py) on the same instance
file, per group of map sizes, paired against the first on the same puzzles; for evaluations
whose directory holds an answers.jsonl with reasoning traces (--answers_out DIR/answers.jsonl),
also how often the answer copies the plan its trace chose and how valid those plans are; with
--split_wait and an answers.jsonl in every directory, how often the answers write a WAIT on the
puzzles that need one and on the others.
Directories joined by "+" are one evaluation sampled several times (the same checkpoint at
temperature 1 with different --seed): each puzzle then counts its share of valid samples
(mean@k) and the paired change is the mean per-puzzle difference; with --solved_by=any a puzzle
counts as solved when any of its samples is valid (pass@k, paired against a greedy evaluation).

    python launch/compare_evals.py --instances held_out.jsonl --evals eval_a,eval_b \
        [--labels "model A,model B"] [--sizes 3-5 --sizes 3-10] [--out table.md]
    python launch/compare_evals.py --instances held_out.jsonl --solved_by any \
        --evals greedy,s0+s1+s2+s3+s4+s5+s6+s7 --labels "greedy,pass@8"
"""

import pathlib

from absl import app, flags

from mapfjax import configfile

_INSTANCES = flags.DEFINE_string("instances", None, "the instance JSONL every evaluation answered")
_EVALS = flags.DEFINE_list(
    "evals",
    None,
    "launch/evaluate.py --out_dir directories or runs' validation.json (seeds of one model "
    "joined by +)",
)
_LABELS = flags.DEFINE_list("labels", None, "one label per evaluation (default: directory names)")
_SIZES = flags.DEFINE_multi_string("sizes", ["3-10"], "groups of map sizes, e.g. 3-5")
_OUT = flags.DEFINE_string("out", None, "also write the table here")
_SPLIT_WAIT = flags.DEFINE_bool(
    "split_wait", False, "also each size group's puzzles that need a wait and those that do not"
)
_SOLVED_BY = flags.DEFINE_enum(
    "solved_by",
    "mean",
    ["mean", "any"],
    "a puzzle of a joined evaluation: its share of valid samples (mean@k), or solved when any "
    "sample is valid (pass@k: what sharpening towards sampled answers could reach)",
)
_METRIC = flags.DEFINE_enum(
    "metric",
    "valid",
    ["valid", "optimal"],
    "what a puzzle's answer scores: a valid plan, or a valid plan of the oracle's optimal cost",
)
_SUBSET = flags.DEFINE_bool(
    "subset",
    False,
    "the instances are a part of what every evaluation answered: compare on them alone (e.g. "
    "the first 400 of a 1,200-puzzle held-out set)",
)
flags.mark_flags_as_required(["instances", "evals"])


def _has_traces(path: pathlib.Path) -> bool:
    return path.is_file() and "</think>" in path.read_text()


def main(argv):
    del argv
    from mapfjax import files
    from mapfjax.env import io
    from mapfjax.env.config import parse_sizes
    from mapfjax.eval import evaluate as ev

    labels = _LABELS.value or [pathlib.Path(d).name for d in _EVALS.value]

    def build():
        problems = io.load_instances(_INSTANCES.value)
        groups = [parse_sizes(s) for s in _SIZES.value]
        table = ev.compare_evaluations(
            _EVALS.value,
            labels,
            problems,
            groups,
            _SPLIT_WAIT.value,
            _SOLVED_BY.value,
            _METRIC.value,
            _SUBSET.value,
        )
        answers = [pathlib.Path(d) / "answers.jsonl" for d in _EVALS.value]
        traced = [(f, lab) for f, lab in zip(answers, labels, strict=True) if _has_traces(f)]
        if traced:
            table += "\n\nReasoning traces: the answer against the plan its trace chose\n\n"
            table += ev.trace_comparison(*zip(*traced), problems)
        plain = [(f, lab) for f, lab in zip(answers, labels, strict=True) if f.is_file()]
        if _SPLIT_WAIT.value and len(plain) == len(answers):
            table += "\n\nAnswers that write a WAIT, by whether the puzzle needs one\n\n"
            table += ev.wait_usage(*zip(*plain), problems)
        return table

    return files.report_command(build, _OUT.value)


if __name__ == "__main__":
    configfile.quiet_backend_probe()
    app.run(main)
