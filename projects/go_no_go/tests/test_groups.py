"""projects.go_no_go.groups: copies of puzzles for sampled groups, and the groups sorted by the
greedy verdict on their puzzle (checked against a hand count)."""

import json
import subprocess
import sys

import pytest

from projects.go_no_go import groups

from .test_go_no_go import ROOT


def test_repeat_keeps_every_nth_puzzle_k_times_under_copy_ids():
    rows = [{"id": f"p{i}", "grid": ["F"]} for i in range(5)]
    out = groups.repeat_instances(rows, 3, every=2)
    assert [r["id"] for r in out] == [f"p{i}#{j}" for i in (0, 2, 4) for j in range(3)]
    assert all(r["grid"] == ["F"] for r in out) and rows[0]["id"] == "p0"  # input untouched
    assert groups.repeat_instances(rows, 1, every=2) == rows[::2]  # k=1: the puzzles as such
    with pytest.raises(ValueError, match="marks a copy"):
        groups.repeat_instances([{"id": "a#1"}], 2)
    with pytest.raises(ValueError, match="k=0"):
        groups.repeat_instances(rows, 0)


def test_group_counts_sort_mixed_groups_by_the_greedy_verdict():
    greedy = {"a": True, "b": False, "c": True, "d": False, "e#x": True}
    valid = {"a": [1, 0, 1], "b": [0, 1, 0], "c": [1, 1, 1], "d": [0, 0, 0], "e#x": [0, 1, 1]}
    sampled = {f"{p}#{j}": bool(v) for p, vs in valid.items() for j, v in enumerate(vs)}
    c = groups.group_counts(greedy, sampled)
    assert (c.k, c.puzzles, c.all_valid, c.none_valid) == (3, 5, 1, 1)
    assert (c.mixed_greedy_valid, c.mixed_greedy_fails, c.mixed) == (2, 1, 3)
    assert c.fails_share == pytest.approx(1 / 3)
    table = groups.table([("top_p 1", c, 12.4), ("again", c, None)])
    assert "| top_p 1 | 5 | 3 | 1 | 33.3 % | 2 | 1 | 1 | 12 |" in table
    assert table.splitlines()[-1].endswith("| 1 | 1 | - |")


@pytest.mark.parametrize(
    "sampled, match",
    [
        ({"a#0": True, "a#1": False, "b#0": True}, "different sizes"),
        ({"z#0": True}, "without a greedy verdict"),
        ({"a": True}, "not a copy id"),
    ],
)
def test_group_counts_refuses_what_is_not_a_set_of_groups(sampled, match):
    with pytest.raises(ValueError, match=match):
        groups.group_counts({"a": True, "b": False}, sampled)


def test_the_cli_repeats_then_counts(tmp_path):
    src = tmp_path / "i.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in range(4)))
    run = [sys.executable, "-m", "projects.go_no_go.mixed_groups"]
    out = subprocess.run(run + ["repeat", f"--instances={src}", "--k=2", "--every=2",
                                f"--out={tmp_path / 'c.jsonl'}"],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ids = [json.loads(x)["id"] for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert ids == ["p0#0", "p0#1", "p2#0", "p2#1"]
    greedy = {"rows": [{"id": "p0", "valid": True}, {"id": "p2", "valid": False}]}
    (tmp_path / "g.json").write_text(json.dumps(greedy))
    (tmp_path / "e").mkdir()
    verdicts = [("p0#0", True), ("p0#1", False), ("p2#0", True), ("p2#1", False)]
    (tmp_path / "e" / "verdicts.jsonl").write_text(
        "".join(json.dumps({"id": i, "valid": v}) + "\n" for i, v in verdicts)
    )
    args = ["count", f"--greedy={tmp_path / 'g.json'}", f"--evals={tmp_path / 'e'}",
            "--labels=T1", "--seconds=7", f"--out={tmp_path / 'g.md'}"]  # fmt: skip
    out = subprocess.run(run + args, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| T1 | 2 | 2 | 1 | 50.0 % | 1 | 0 | 0 | 7 |" in (tmp_path / "g.md").read_text()
    bad = subprocess.run(run + args[:3] + ["--labels=a,b"], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 2 and "one entry each" in bad.stderr
