"""The slice split per agent count: every instance in exactly one file, unchanged."""

import shutil

from mapfjax.env import io
from projects.zero_shot import split_by_agents

SLICE = "projects/zero_shot/results/slice_345.jsonl"


def test_each_agent_count_gets_its_instances_whole(tmp_path):
    src = tmp_path / "slice.jsonl"
    shutil.copy(SLICE, src)
    out = split_by_agents.split(src)
    assert sorted(out) == [3, 4, 5]
    whole = io.require_instances(src)
    parts = {k: io.require_instances(path) for k, path in out.items()}
    assert sum(map(len, parts.values())) == len(whole) == 270
    by_id = {p.id: p for p in whole}
    for k, problems in parts.items():
        assert problems and all(p.num_agents == k for p in problems)
        assert all(io.puzzle_hash(p) == io.puzzle_hash(by_id[p.id]) for p in problems)


def test_the_committed_parts_are_what_the_split_writes(tmp_path):
    src = tmp_path / "slice_345.jsonl"
    shutil.copy(SLICE, src)
    for k, path in split_by_agents.split(src).items():
        committed = f"projects/zero_shot/results/slice_345_{k}ag.jsonl"
        assert path.read_text() == open(committed).read(), committed
