"""Outcome rows are checked where they enter (`mapfjax.eval.outcomes`): an id given twice, a
"valid" that is not a boolean, a row without an id, a line that is not an object, outcomes of
other puzzles under the same ids and a run without its start are refused in one line naming
the file, the line or row and the field, before any table is written."""

import json
import subprocess
import sys

import pytest

from mapfjax.configfile import ROOT
from mapfjax.env import io
from mapfjax.eval import evaluate as ev
from mapfjax.eval import outcomes, report
from tests.eval.test_compare_evals import _problem


def _verdicts(path, rows: list) -> None:
    path.mkdir(exist_ok=True)
    (path / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


ROWS = [{"id": f"p{i}", "valid": i % 2 == 0, "optimal": False} for i in range(4)]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"id": "p0", "valid": True}, r"verdicts.jsonl:5: id 'p0' again \(first at .*:1\)"),
        ({"id": "p9", "valid": "false"}, r":5 \(id 'p9'\): field 'valid' = 'false'; allowed: true"),
        ({"id": "p9", "valid": 1}, r"field 'valid' = 1; allowed: true or false"),
        ({"id": "p9", "valid": True, "optimal": "yes"}, r"field 'optimal' = 'yes'"),
        ({"valid": True}, r"verdicts.jsonl:5: field 'id' = None; allowed: a non-empty string"),
        ({"id": ["p9"], "valid": True}, r"field 'id' = \['p9'\]; allowed: a non-empty string"),
        ({"id": "p9"}, r"\(id 'p9'\): field 'valid' is missing"),
        (["p9", True], r"verdicts.jsonl:5: a list; allowed: a JSON object per puzzle"),
    ],
)
def test_a_bad_verdict_line_is_one_error_naming_the_line_and_field(tmp_path, bad, message):
    _verdicts(tmp_path / "e", [*ROWS, bad])
    with pytest.raises(ValueError, match=message):
        outcomes.read_verdicts(tmp_path / "e")


def test_duplicated_validation_rows_are_refused(tmp_path):
    path = tmp_path / "validation.json"
    path.write_text(json.dumps({"rows": [*ROWS, {**ROWS[1], "valid": True}]}))
    with pytest.raises(ValueError, match=r"validation.json row 4: id 'p1' again"):
        report.read_validation(path)
    path.write_text(json.dumps({"rows": [{**ROWS[0], "valid": "false"}]}))
    with pytest.raises(ValueError, match=r"row 0 \(id 'p0'\): field 'valid' = 'false'"):
        report.read_validation(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match=r"not a validation.json with a 'rows' list"):
        report.read_validation(path)


def test_the_same_ids_on_other_puzzles_are_refused(tmp_path):
    """An instance file with the ids of the evaluated one but other starts and goals (and so
    other needs-wait labels) is not the instance set the evaluation answered."""
    problems = [_problem(i, 3) for i in range(4)]
    rows = [{"id": p.id, "puzzle": io.puzzle_hash(p), "valid": True} for p in problems]
    _verdicts(tmp_path / "a", rows)
    ev.compare_evaluations([tmp_path / "a"], ["A"], problems, [(3,)])  # the same puzzles: fine
    swapped = [p.__class__(p.id, p.grid, p.goals, p.starts) for p in problems]
    with pytest.raises(ValueError, match=r"puzzle 'p0' is not the instance file's"):
        ev.compare_evaluations([tmp_path / "a"], ["A"], swapped, [(3,)])


def test_a_runs_validation_is_held_to_its_validation_set(tmp_path):
    problems = [_problem(i, 3) for i in range(4)]
    run = tmp_path / "run"
    (run / "round_0").mkdir(parents=True)
    io.save_instances(run / outcomes.VALIDATION_SET, problems)
    path = run / "round_0" / "validation.json"
    path.write_text(json.dumps({"rows": ROWS}))
    assert outcomes.check_puzzles(path, problems)
    other = [p.__class__(p.id, p.grid, p.goals, p.starts) for p in problems]
    with pytest.raises(ValueError, match=r"validation.json: puzzle 'p0' is not the instance"):
        outcomes.check_puzzles(path, other)
    _verdicts(tmp_path / "old", ROWS)  # an evaluation written before rows named their puzzle
    assert not outcomes.check_puzzles(tmp_path / "old", other)


def test_evaluations_record_the_puzzle_each_row_answered():
    problems = [_problem(i, 3) for i in range(3)]
    rows = ev.score_answers(problems, {p.id: "<answer></answer>" for p in problems})
    assert [r["puzzle"] for r in rows] == [io.puzzle_hash(p) for p in problems]


def test_a_run_without_its_start_is_not_compared_with_round_0_as_start(tmp_path):
    run = tmp_path / "run"
    for n in (0, 1):
        (run / f"round_{n}").mkdir(parents=True)
        (run / f"round_{n}" / "record.json").write_text("{}")
        (run / f"round_{n}" / "validation.json").write_text(json.dumps({"rows": ROWS}))
    found = report.validation_rows(run)
    assert [label for label, _ in found] == ["R0", "R1"]
    with pytest.raises(ValueError, match=r"run: no start/validation.json"):
        report.start_rows(found, run)
    out = subprocess.run(
        [sys.executable, "launch/compare_runs.py", f"--runs={run}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2 and "no start/validation.json" in out.stderr
    assert "Traceback" not in out.stderr


def test_compare_evals_refuses_a_duplicated_verdict_in_one_line(tmp_path):
    problems = [_problem(i, 3) for i in range(4)]
    io.save_instances(tmp_path / "inst.jsonl", problems)
    rows = [{"id": p.id, "valid": False} for p in problems]
    _verdicts(tmp_path / "a", rows)
    _verdicts(tmp_path / "b", [*rows, {"id": "p0", "valid": True}])
    out = subprocess.run(
        [sys.executable, "launch/compare_evals.py", f"--instances={tmp_path / 'inst.jsonl'}",
         f"--evals={tmp_path / 'a'},{tmp_path / 'b'}", f"--out={tmp_path / 'table.md'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "id 'p0' again" in lines[0]
    assert not (tmp_path / "table.md").exists()
