"""Sampled answers split by how they were written (projects.zero_shot.trace_split)."""

import json

import pytest

from projects.zero_shot import trace_split

EVALS = "projects/zero_shot/results/evals"


def test_each_response_gets_one_mode():
    assert trace_split.mode("<think>\nr0: F F\n</think>\n\n<answer>x</answer>") == "after a trace"
    assert trace_split.mode("<think>\n\n</think>\n\n<answer>x</answer>") == (
        "after an empty think block"
    )
    assert trace_split.mode("\n\n</think>\n<answer>x</answer>") == "after an empty think block"
    assert trace_split.mode("<think>\nr0: F F\nr1:") == "think block not closed"


def test_the_committed_samples_are_split_whole_and_by_their_verdicts():
    dirs = [f"{EVALS}/base_t1_s{s}" for s in range(4)]
    groups = trace_split.split(dirs)
    assert sum(map(len, groups.values())) == 4 * 120
    valid = sum(
        json.loads(line)["valid"] for d in dirs for line in open(f"{d}/verdicts.jsonl") if line
    )
    assert sum(map(sum, groups.values())) == valid
    text = trace_split.table(groups)
    assert all(f"| {m} |" in text for m in trace_split.MODES)


def test_an_evaluation_without_its_answers_is_refused(tmp_path):
    (tmp_path / "verdicts.jsonl").write_text(open(f"{EVALS}/base_t1_s0/verdicts.jsonl").read())
    (tmp_path / "answers.jsonl").write_text("")
    with pytest.raises(ValueError, match="no answer for 120 verdict"):
        trace_split.split([tmp_path])
