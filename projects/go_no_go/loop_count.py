r"""How often a retrying relay policy's traces never close, and why: per evaluation (a
`launch/evaluate.py --answers_out` file), the answers, those whose trace never closes within
the token budget, those of them with an agent on one cell on 3 or more lines of one attempt
(going back and forth), and the answers that write a loop line or a retry
(`relay_checks.loop_counts`); then the share of traces that close against the first file's,
paired on the same puzzles.

    python -m projects.go_no_go.loop_count --answers runs/a/answers.jsonl,runs/b/answers.jsonl \
        --labels "retry start,loop lessons" [--out table.md]
"""

from absl import app, flags

_ANSWERS = flags.DEFINE_list("answers", None, "answers JSONL files, comma-separated")
_LABELS = flags.DEFINE_list("labels", None, "a label per file (default: the file names)")
_OUT = flags.DEFINE_string("out", None, "also write the table here")
flags.mark_flags_as_required(["answers"])


def main(argv):
    del argv
    from mapfjax import files, stats
    from mapfjax.env import io, trace
    from projects.go_no_go import relay_checks

    labels = _LABELS.value or _ANSWERS.value
    if len(labels) != len(_ANSWERS.value):
        raise app.UsageError(f"{len(labels)} labels for {len(_ANSWERS.value)} answer files")
    rows, first = [], None
    for label, path in zip(labels, _ANSWERS.value, strict=True):
        answers = dict(io.load_answers(path))
        closes = {i: trace.THINK_CLOSE in text for i, text in answers.items()}
        if first is None:
            first, paired = closes, "-"
        elif set(closes) != set(first):
            raise app.UsageError(f"{path}: not the puzzles of {_ANSWERS.value[0]}")
        else:
            ids = sorted(first)
            est = stats.paired_proportion_difference(
                [closes[i] for i in ids], [first[i] for i in ids]
            )
            paired = stats.interval_text(est, signed=True)
        rows.append([label, *relay_checks.loop_counts(list(answers.values())), paired])
    paired_head = f"traces that close vs {labels[0]} (paired, points)"
    head = ["policy", *relay_checks.LOOP_COLUMNS, paired_head]
    table = stats.markdown_table(head, rows)
    print(table)
    if _OUT.value:
        files.atomic_write(_OUT.value, (table + "\n").encode())


if __name__ == "__main__":
    app.run(main)
