r"""A gate arm's start and end at a larger token budget: the held-out puzzles on which either
model's greedy answer ran out of budget (`truncated` in its validation rows) are answered again
by both models with --max_new_tokens; every other answer ended inside the budget, and a greedy
decode with more room writes it again, so its verdict stands. Writes <out>/budget.md (the paired
change at the arm's budget and at the larger one) and each model's evaluation of those puzzles.

    python -m projects.go_no_go.budget_check \
        --arm projects/go_no_go/results/trace_wait_fstep/matched \
        --instances runs/gng_fstep/matched/validation_set.jsonl \
        --start runs/tiny_trace_wait/export --end runs/gng_fstep/matched/round_0/model \
        --max_new_tokens 800 \
        --out projects/go_no_go/results/budget/trace_wait_fstep
"""

import json
import pathlib
import subprocess
import sys

from absl import app, flags

_ARM = flags.DEFINE_string("arm", None, "a gate arm: <results>/<name>/matched", required=True)
_INSTANCES = flags.DEFINE_string(
    "instances", None, "its held-out puzzles (the run's validation_set.jsonl)", required=True
)
_START = flags.DEFINE_string("start", None, "the starting model's directory", required=True)
_END = flags.DEFINE_string("end", None, "the trained model's directory", required=True)
_BUDGET = flags.DEFINE_integer(
    "max_new_tokens", 800, "the larger budget (prompt + budget within the model's positions)"
)
_OUT = flags.DEFINE_string("out", None, "output folder", required=True)
_EVALUATE = pathlib.Path(__file__).resolve().parents[2] / "launch" / "evaluate.py"


def main(argv):
    del argv
    from mapfjax import files, stats
    from mapfjax.eval import evaluate, report
    from projects.go_no_go import gate

    arm, out = pathlib.Path(_ARM.value), pathlib.Path(_OUT.value)
    try:
        start_rows, end_rows = gate.start_and_end(arm)
    except ValueError as e:
        sys.exit(f"error: {e}")
    ids = gate.truncated_ids(start_rows, end_rows)
    lines = {}
    for line in pathlib.Path(_INSTANCES.value).read_text().splitlines():
        if line.strip():
            lines[json.loads(line)["id"]] = line
    missing = [i for i in ids if i not in lines]
    if missing:
        sys.exit(f"error: {_INSTANCES.value} lacks the arm's puzzles {missing[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    subset = out / "puzzles.jsonl"
    files.atomic_write(subset, "".join(lines[i] + "\n" for i in ids).encode())
    redone = {}
    for label, model in (("start", _START.value), ("end", _END.value)):
        where = out / label
        have = evaluate.read_outcomes(where) if (where / "verdicts.jsonl").exists() else {}
        if ids and set(have) != set(ids):  # none yet, or of other puzzles (an older run)
            cmd = [sys.executable, str(_EVALUATE), f"--checkpoint={model}",
                   f"--instances={subset}", f"--out_dir={where}", "--enable_thinking",
                   f"--max_new_tokens={_BUDGET.value}", f"--batch_size={len(ids)}"]  # fmt: skip
            if subprocess.run(cmd).returncode:
                sys.exit(f"error: {_EVALUATE} failed on the {label} model {model} (above)")
            have = evaluate.read_outcomes(where)
        redone[label] = have if ids else {}
    before = report.paired_change(report.valid_by_id(end_rows), report.valid_by_id(start_rows))
    valid = {k: {i: bool(r["valid"]) for i, r in v.items()} for k, v in redone.items()}
    s_new = gate.with_redone(start_rows, valid["start"])
    e_new = gate.with_redone(end_rows, valid["end"])
    after = report.paired_change(e_new, s_new)
    config = json.loads((arm / "run_config.json").read_text())
    budget = config.get("validation", {}).get("max_new_tokens", "?")
    rows = [
        [f"{budget} (the arm's)", str(len(ids)), stats.interval_text(before, True)],
        [str(_BUDGET.value), str(len(ids)), stats.interval_text(after, True)],
    ]
    per_model = []
    for label, old_rows in (("start", start_rows), ("end", end_rows)):
        cut = {r["id"] for r in old_rows if r.get("truncated")}
        again = redone[label]
        per_model.append([
            label, str(len(cut)), str(sum(bool(again[i]["valid"]) for i in cut)),
            str(sum(again[i].get("failure") == gate.PARSE_ERROR for i in cut)),
        ])  # fmt: skip
    header = ["model", f"answers cut at {budget}", f"of them valid at {_BUDGET.value}"]
    header += [f"of them parse errors at {_BUDGET.value} (cut again or unreadable)"]
    text = (
        f"`{arm}`: greedy held-out valid, end against start, paired (n = {before.n}).\n\n"
        + stats.markdown_table(["token budget", "puzzles answered again", "change"], rows)
        + "\n"
        + stats.markdown_table(header, per_model)
        + "\n"
    )
    files.atomic_write(out / "budget.md", text.encode())
    print(text)


if __name__ == "__main__":
    app.run(main)
