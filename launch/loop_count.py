r"""How often a retrying relay policy's traces never close, and why: per evaluation (a
`launch/evaluate.py --answers_out` file), the answers, those whose trace never closes within
the token budget, those of them with an agent on one cell on 3 or more lines of one attempt
(going back and forth), and the answers that write a loop line or a retry
(`env.relay.loop_counts`).

    python launch/loop_count.py --answers runs/a/answers.jsonl,runs/b/answers.jsonl \
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
    from mapfjax.env import io, relay

    labels = _LABELS.value or _ANSWERS.value
    if len(labels) != len(_ANSWERS.value):
        raise app.UsageError(f"{len(labels)} labels for {len(_ANSWERS.value)} answer files")
    rows = []
    for label, path in zip(labels, _ANSWERS.value, strict=True):
        responses = [text for _, text in io.load_answers(path)]
        rows.append([label, *relay.loop_counts(responses)])
    table = stats.markdown_table(["policy", *relay.LOOP_COLUMNS], rows)
    print(table)
    if _OUT.value:
        files.atomic_write(_OUT.value, (table + "\n").encode())


if __name__ == "__main__":
    app.run(main)
