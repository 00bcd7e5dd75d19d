r"""Mixed GRPO groups by the greedy verdict on their puzzle (`projects.go_no_go.groups`).

    # each 2nd puzzle of an instance file, 8 copies each (ids "<id>#<j>")
    python -m projects.go_no_go.mixed_groups repeat --instances held_out.jsonl --k 8 --every 2 \
        --out copies.jsonl
    # evaluate copies.jsonl at temperature 1 (launch/evaluate.py), then count the groups
    python -m projects.go_no_go.mixed_groups count --greedy start/validation.json \
        --evals eval_top_p1,eval_top_p095 --labels "top_p 1,top_p 0.95" --seconds 240,250 \
        --out groups.md
"""

import json
import pathlib
import sys

from absl import app, flags

from mapfjax import files
from projects.go_no_go import groups

_INSTANCES = flags.DEFINE_string("instances", None, "repeat: the instance JSONL")
_K = flags.DEFINE_integer("k", 8, "repeat: copies per puzzle (the group size)")
_EVERY = flags.DEFINE_integer("every", 1, "repeat: keep every n-th puzzle")
_GREEDY = flags.DEFINE_string("greedy", None, "count: greedy verdicts (eval dir, validation.json)")
_EVALS = flags.DEFINE_list("evals", None, "count: evaluate.py --out_dir of the copies, sampled")
_LABELS = flags.DEFINE_list("labels", None, "count: one label per evaluation")
_SECONDS = flags.DEFINE_list("seconds", None, "count: each evaluation's wall seconds (optional)")
_OUT = flags.DEFINE_string("out", None, "the copies (repeat) or the table (count)")


def main(argv):
    if len(argv) != 2 or argv[1] not in ("repeat", "count"):
        print("usage: mixed_groups.py repeat|count [flags] (see --help)", file=sys.stderr)
        return 2
    try:
        if argv[1] == "repeat":
            src = pathlib.Path(_INSTANCES.value or "")
            rows = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
            out = groups.repeat_instances(rows, _K.value, _EVERY.value)
            files.atomic_write(_OUT.value, "".join(json.dumps(r) + "\n" for r in out))
            print(f"{_OUT.value}: {len(out) // _K.value} puzzles x {_K.value}")
            return 0
        evals, labels = _EVALS.value or [], _LABELS.value or _EVALS.value or []
        secs = _SECONDS.value or [None] * len(evals)
        if not evals or len(labels) != len(evals) or len(secs) != len(evals):
            print("error: --evals, --labels and --seconds need one entry each", file=sys.stderr)
            return 2
        greedy = groups.read_valid(_GREEDY.value)
        rows = []
        for e, label, s in zip(evals, labels, secs, strict=True):
            counts = groups.group_counts(greedy, groups.read_valid(e))
            rows.append((label, counts, None if s is None else float(s)))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = groups.table(rows)
    if _OUT.value:
        files.atomic_write(_OUT.value, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    app.run(main)
