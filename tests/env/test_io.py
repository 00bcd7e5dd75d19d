"""Tests for instance/answer JSONL, paper-row import and MovingAI files."""

import json

import pytest
from hypothesis import HealthCheck, given, settings

from mapfjax.env import io, text
from mapfjax.env.types import Problem, ProblemError
from tests.env.test_text import HAND, problems

LABELLED = Problem(
    id="lab",
    grid=("FFH", "FFF"),
    starts=((0, 0), (1, 0)),
    goals=((1, 2), (0, 1)),
    optimal_soc=5,
    optimal_makespan=3,
    needs_wait=True,
)


def _row(**over):
    row = {"id": "a", "grid": ["FFH", "FFF"], "starts": [[0, 0]], "goals": [[1, 2]]}
    row.update(over)
    return {k: v for k, v in row.items() if v is not _DROP}


_DROP = object()


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- instance JSONL --------------------------------------------------------------------------


def test_instances_round_trip_with_and_without_labels(tmp_path):
    path = tmp_path / "inst.jsonl"
    io.save_instances(path, [HAND, LABELLED])
    assert io.load_instances(path) == [HAND, LABELLED]
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {
        "id": "hand",
        "grid": ["FFFF", "FHFF", "FFHF"],
        "starts": [[0, 0], [2, 0], [1, 2]],
        "goals": [[0, 3], [1, 2], [2, 1]],
    }
    assert json.loads(lines[1])["needs_wait"] is True


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problems())
def test_instances_round_trip_random(tmp_path, p):
    path = tmp_path / "r.jsonl"
    io.save_instances(path, [p])
    assert io.load_instances(path) == [p]


def test_blank_lines_skipped_and_null_labels_accepted(tmp_path):
    path = _write_lines(
        tmp_path / "b.jsonl", ["", json.dumps(_row(optimal_soc=None, needs_wait=False)), "   "]
    )
    (p,) = io.load_instances(path)
    assert p.optimal_soc is None and p.needs_wait is False


BAD_INSTANCE_LINES = [
    ('{"id": "a", "grid": [', None, "malformed JSON"),
    ("[1, 2]", None, "expected a JSON object"),
    (json.dumps(_row(id=_DROP)), "id", "missing"),
    (json.dumps(_row(grid=_DROP)), "grid", "missing"),
    (json.dumps(_row(colour="red")), "colour", "unknown field"),
    (json.dumps(_row(id=7)), "id", "not a non-empty string"),
    (json.dumps(_row(grid="FFH")), "grid", "not a non-empty list"),
    (json.dumps(_row(starts=[[0, "0"]])), "starts", "integer pairs"),
    (json.dumps(_row(starts=[[0, 0, 1]])), "starts", "integer pairs"),
    (json.dumps(_row(goals=[[True, 0]])), "goals", "integer pairs"),
    (json.dumps(_row(optimal_soc=-1)), "optimal_soc", "non-negative"),
    (json.dumps(_row(needs_wait=1)), "needs_wait", "true, false or null"),
    (json.dumps(_row(grid=["FXH", "FFF"])), "grid", "unknown symbol"),
    (json.dumps(_row(grid=["FFH", "FF"])), "grid", "length"),
    (json.dumps(_row(starts=[[5, 0]])), "starts", "outside"),
    (json.dumps(_row(goals=[[0, 2]])), "goals", "on a hole"),
    (json.dumps(_row(starts=[[0, 0], [0, 0]], goals=[[1, 2], [1, 1]])), "starts", "duplicate"),
    (json.dumps(_row(starts=[[0, 0], [1, 0]], goals=[[1, 1], [1, 1]])), "goals", "duplicate"),
    (json.dumps(_row(goals=[])), "starts", "agents"),
]


@pytest.mark.parametrize("bad, field, message", BAD_INSTANCE_LINES)
def test_bad_instance_lines_name_file_line_and_field(tmp_path, bad, field, message):
    path = _write_lines(tmp_path / "bad.jsonl", [json.dumps(_row(id="ok")), "", bad])
    with pytest.raises(io.JsonlError) as info:
        io.load_instances(path)
    err = info.value
    assert str(path) in str(err) and "bad.jsonl:3:" in str(err)
    assert err.line == 3 and err.field == field
    if field:
        assert f"field '{field}'" in str(err)
    assert message in str(err)
    assert isinstance(err, ValueError)


def test_duplicate_ids_and_bad_utf8(tmp_path):
    row = json.dumps(_row())
    path = _write_lines(tmp_path / "d.jsonl", [row, row])
    with pytest.raises(io.JsonlError, match=r"d\.jsonl:2: field 'id': duplicate id 'a' .*line 1"):
        io.load_instances(path)
    raw = tmp_path / "u.jsonl"
    raw.write_bytes(json.dumps(_row()).encode() + b"\n\xff\xfe\n")
    with pytest.raises(io.JsonlError, match=r"u\.jsonl:2: not valid UTF-8"):
        io.load_instances(raw)


def test_save_instances_validates(tmp_path):
    with pytest.raises(ProblemError, match="duplicate problem id"):
        io.save_instances(tmp_path / "x.jsonl", [HAND, HAND])
    assert not (tmp_path / "x.jsonl").exists()


def test_atomic_write_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    io.save_jsonl(path, [{"a": 1}, {"b": "é"}])
    io.save_jsonl(path, [{"a": 2}])  # overwrite in place
    assert path.read_text(encoding="utf-8") == '{"a": 2}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]

    class Boom:
        pass

    with pytest.raises(TypeError):
        io.save_jsonl(path, [{"a": Boom()}])
    assert path.read_text(encoding="utf-8") == '{"a": 2}\n'  # old content survives
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]


def test_meta_round_trips_and_is_checked(tmp_path):
    # Benchmark cells travel in `meta`, never in the id (item 6 of the robustness list).
    p = Problem("wrong_1", ("FF",), ((0, 0),), ((0, 1),), meta={"wait_ratio": 0.5, "size": 2})
    path = tmp_path / "m.jsonl"
    io.save_instances(path, [p])
    (back,) = io.load_instances(path)
    assert back.meta == {"wait_ratio": 0.5, "size": 2} and json.loads(path.read_text())["meta"]
    bad = _write_lines(tmp_path / "bad.jsonl", [json.dumps(_row(meta=[1]))])
    with pytest.raises(io.JsonlError, match=r"bad\.jsonl:1: field 'meta': \[1\] is not a JSON obj"):
        io.load_instances(bad)


def test_unreadable_json_lines_are_one_error(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps(_row()) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(io.JsonlError, match=r"deep\.jsonl:2: malformed JSON \(nested too deeply"):
        io.load_instances(deep)
    long = _write_lines(tmp_path / "long.jsonl", ['{"id": "a", "text": ' + "7" * 5000 + "}"])
    with pytest.raises(io.JsonlError, match=r"long\.jsonl:1: malformed JSON"):
        io.load_answers(long)
    rows = tmp_path / "rows.json"
    rows.write_text("[" + "[" * 100_000)
    with pytest.raises(io.JsonlError, match=r"rows\.json:1: malformed JSON \(nested too deeply"):
        io.import_paper_rows(rows)


def test_directories_and_files_in_the_way_name_the_path(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(IsADirectoryError, match=r"dir: is a directory; expected a file$"):
        io.load_instances(tmp_path / "dir")
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: no such file$"):
        io.load_answers(tmp_path / "nope.jsonl")
    with pytest.raises(IsADirectoryError, match=r"dir: is a directory; expected a file name"):
        io.save_instances(tmp_path / "dir", [HAND])
    with pytest.raises(NotADirectoryError, match=r"file/x\.jsonl: cannot write there, .*file is"):
        io.save_instances(tmp_path / "file" / "x.jsonl", [HAND])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]


# --- answers ---------------------------------------------------------------------------------


def test_answers_round_trip_and_errors(tmp_path):
    path = tmp_path / "ans.jsonl"
    rows = [
        {"id": "a", "text": "<answer>Agent 0: UP</answer>", "model": "m"},
        {"id": "a", "text": ""},
    ]
    io.save_jsonl(path, rows)
    assert io.load_answers(path) == [("a", rows[0]["text"]), ("a", "")]
    bad = _write_lines(tmp_path / "bad_ans.jsonl", [json.dumps(rows[0]), json.dumps({"id": "b"})])
    with pytest.raises(io.JsonlError, match=r"bad_ans\.jsonl:2: field 'text': missing"):
        io.load_answers(bad)
    bad = _write_lines(tmp_path / "bad_ans2.jsonl", [json.dumps({"id": "b", "text": 3})])
    with pytest.raises(io.JsonlError, match=r"bad_ans2\.jsonl:1: field 'text': 3 is not a string"):
        io.load_answers(bad)


# --- paper rows ------------------------------------------------------------------------------

PAPER_ROW_TEXT = """Question: You are a multi-agent path planning expert. Plan for every agent.
There is a 3x3 frozen lake map with 3 agents:
S F G
s H g
A F a
Legend:
S: start of agent 1, G: goal of agent 1 (similar for s/g, A/a)
Agent 1 needs to go from (0, 0) to (0, 2)
Agent 2 needs to go from (1, 0) to (1, 2)
Agent 3 needs to go from (2, 0) to (2, 2)
Output your plan in the format required."""


def _paper_rows():
    rendered = [
        {
            "sample_id": f"{p.num_agents}ag_{p.height}x{p.width}_hr0.1_{i:03d}",
            "num_agents": p.num_agents,
            "text": text.render_prompt(p),
            "wait_ratio": 0.25,
        }
        for i, p in enumerate([HAND, LABELLED])
    ]
    hand = {"sample_id": "3ag_3x3_hr0.1_000", "num_agents": 3, "text": PAPER_ROW_TEXT}
    return rendered + [hand]


@pytest.mark.parametrize("as_list", [True, False])
def test_import_paper_rows(tmp_path, as_list):
    rows = _paper_rows()
    path = tmp_path / ("rows.json" if as_list else "rows.jsonl")
    if as_list:
        path.write_text(json.dumps(rows, indent=2))
    else:
        io.save_jsonl(path, rows)
    got = io.import_paper_rows(path)
    assert [p.id for p in got] == [r["sample_id"] for r in rows]
    for p, ref in zip(got[:2], [HAND, LABELLED]):
        assert (p.grid, p.starts, p.goals) == (ref.grid, ref.starts, ref.goals)
    assert got[2].grid == ("FFF", "FHF", "FFF")
    assert got[2].starts == ((0, 0), (1, 0), (2, 0))
    assert got[2].goals == ((0, 2), (1, 2), (2, 2))


def test_import_paper_rows_errors_have_line_numbers(tmp_path):
    rows = _paper_rows()
    rows[1]["num_agents"] = 4
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2))
    # With indent=2 each row object starts on its own line: row 1 starts after row 0's lines.
    start_line = json.dumps(rows, indent=2).splitlines().index("  {", 2) + 1
    with pytest.raises(io.JsonlError) as info:
        io.import_paper_rows(path)
    assert info.value.line == start_line and info.value.field == "num_agents"
    assert "the prompt has 2 agents" in str(info.value)

    rows = _paper_rows()
    rows[0]["text"] = "There is no map here"
    path = tmp_path / "rows.jsonl"
    io.save_jsonl(path, rows)
    with pytest.raises(io.JsonlError, match=r"rows\.jsonl:1: field 'text': cannot read the prompt"):
        io.import_paper_rows(path)

    path.write_text("[" + json.dumps(_paper_rows()[0]) + ' {"a": 1}]')
    with pytest.raises(io.JsonlError, match="expected ',' or ']'"):
        io.import_paper_rows(path)
    path.write_text(json.dumps([_paper_rows()[0], _paper_rows()[0]]))
    with pytest.raises(io.JsonlError, match="field 'sample_id': duplicate"):
        io.import_paper_rows(path)


# --- MovingAI --------------------------------------------------------------------------------


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problems())
def test_movingai_round_trip(tmp_path, p):
    io.write_movingai(p, tmp_path / "m.map", tmp_path / "m.scen")
    q = io.read_movingai(tmp_path / "m.map", tmp_path / "m.scen", id=p.id)
    assert q == p


def test_movingai_file_contents_use_x_col_y_row(tmp_path):
    p = Problem("m", ("FFH", "FFF"), ((1, 0),), ((0, 1),))
    io.write_movingai(p, tmp_path / "a.map", tmp_path / "a.scen")
    assert (tmp_path / "a.map").read_text() == "type octile\nheight 2\nwidth 3\nmap\n..@\n...\n"
    scen = (tmp_path / "a.scen").read_text().splitlines()
    # start (row 1, col 0) -> x=0, y=1; goal (row 0, col 1) -> x=1, y=0; shortest path 2.
    assert scen == ["version 1", "0\ta.map\t3\t2\t0\t1\t1\t0\t2.00000000"]
    q = io.read_movingai(tmp_path / "a.map", tmp_path / "a.scen")
    assert q.id == "a" and q.starts == ((1, 0),) and q.goals == ((0, 1),)


def test_movingai_reads_first_agents_and_other_symbols(tmp_path):
    (tmp_path / "x.map").write_text("type octile\nheight 2\nwidth 4\nmap\n.GST\n@OW.\n")
    scen = ["version 1", "0\tx.map\t4\t2\t0\t0\t3\t1\t4", "0\tx.map\t4\t2\t1\t0\t2\t0\t1"]
    _write_lines(tmp_path / "x.scen", scen)
    p = io.read_movingai(tmp_path / "x.map", tmp_path / "x.scen", num_agents=1, id="x1")
    assert p.grid == ("FFFH", "HHHF") and p.starts == ((0, 0),) and p.goals == ((1, 3),)
    assert io.read_movingai(tmp_path / "x.map", tmp_path / "x.scen").num_agents == 2
    with pytest.raises(io.MovingAIError, match="asked for 3 agents, file has 2"):
        io.read_movingai(tmp_path / "x.map", tmp_path / "x.scen", num_agents=3)


@pytest.mark.parametrize(
    "map_text, scen_line, match",
    [
        ("type octile\nheight 2\nwidth 2\nmap\n.?\n..\n", None, r"m\.map:5: unknown map symbol"),
        ("type octile\nheight 3\nwidth 2\nmap\n..\n..\n", None, "height 3 but 2 map rows"),
        ("type octile\nwidth 2\nmap\n..\n..\n", None, "'height ...' missing"),
        ("type octile\nheight 2\nwidth 2\nmap\n...\n..\n", None, r"m\.map:5: map row has 3"),
        (None, "0\tm.map\t2\t2\t2\t0\t1\t1\t1", r"m\.scen:2: start \(x=2, y=0\) lies outside"),
        (None, "0\tm.map\t3\t2\t0\t0\t1\t1\t1", r"m\.scen:2: scen says 3x2"),
        (None, "0\tm.map\t2\t2\t0\t0\t1\t0\t1", r"m\.scen:2: goal \(x=1, y=0\) is a blocked"),
        (None, "0\tm.map\t2\t2\t0\t0", r"m\.scen:2: expected 9"),
        (None, "0\tm.map\t2\t2\ta\t0\t1\t1\t1", r"m\.scen:2: width\.\.goal_y must be integers"),
    ],
)
def test_movingai_errors_name_file_and_line(tmp_path, map_text, scen_line, match):
    (tmp_path / "m.map").write_text(map_text or "type octile\nheight 2\nwidth 2\nmap\n.@\n..\n")
    _write_lines(tmp_path / "m.scen", ["version 1", scen_line or "0\tm.map\t2\t2\t0\t0\t1\t1\t1"])
    with pytest.raises(io.MovingAIError, match=match):
        io.read_movingai(tmp_path / "m.map", tmp_path / "m.scen")


def test_movingai_duplicate_start_and_bad_version(tmp_path):
    (tmp_path / "m.map").write_text("type octile\nheight 2\nwidth 2\nmap\n..\n..\n")
    scen = ["version 1", "0\tm.map\t2\t2\t0\t0\t1\t1\t1", "0\tm.map\t2\t2\t0\t0\t1\t0\t1"]
    _write_lines(tmp_path / "m.scen", scen)
    with pytest.raises(io.MovingAIError, match=r"m\.scen:3: start \(x=0, y=0\) repeats line 2"):
        io.read_movingai(tmp_path / "m.map", tmp_path / "m.scen")
    _write_lines(tmp_path / "m.scen", ["v1", scen[1]])
    with pytest.raises(io.MovingAIError, match=r"m\.scen:1: expected 'version 1'"):
        io.read_movingai(tmp_path / "m.map", tmp_path / "m.scen")


def test_import_paper_rows_rejects_trailing_text_after_list(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(_paper_rows()[:1]) + "\n\n]")
    with pytest.raises(io.JsonlError, match=r"rows\.json:3: unexpected text after the JSON list"):
        io.import_paper_rows(path)
    path.write_text("[]")
    assert io.import_paper_rows(path) == []


def test_answer_lines_keep_file_line_numbers_and_hashes(tmp_path):
    h = io.puzzle_hash(HAND)
    path = tmp_path / "a.jsonl"
    path.write_text(
        "\n"
        + json.dumps({"id": "hand", "text": "x", "puzzle_hash": h})
        + "\n\n  \n"
        + json.dumps({"id": "lab", "text": "y"})
        + "\n"
    )
    lines = io.read_answer_lines(path)
    assert [(a.line, a.id, a.puzzle_hash) for a in lines] == [(2, "hand", h), (5, "lab", None)]
    bad = _write_lines(
        tmp_path / "b.jsonl", ["", json.dumps({"id": "a", "text": "", "puzzle_hash": 7})]
    )
    with pytest.raises(io.JsonlError, match=r"b\.jsonl:2: field 'puzzle_hash': 7 is not 16"):
        io.read_answer_lines(bad)


def test_puzzle_hash_is_the_puzzle_not_its_id_or_labels():
    import dataclasses

    h = io.puzzle_hash(HAND)
    assert len(h) == 16 and int(h, 16) >= 0
    same = dataclasses.replace(HAND, id="other", optimal_soc=9, meta={"x": 1})
    assert io.puzzle_hash(same) == h
    for change in ({"grid": ("FFFF", "FFFF", "FFHF")}, {"goals": HAND.goals[::-1]}):
        assert io.puzzle_hash(dataclasses.replace(HAND, **change)) != h


def test_answers_for_another_puzzle_are_refused(tmp_path):
    import dataclasses

    other = dataclasses.replace(HAND, grid=("FFFF", "FFFF", "FFHF"))
    answers = [
        io.Answer(1, "hand", "x", io.puzzle_hash(HAND)),
        io.Answer(3, "hand", "y", io.puzzle_hash(other)),
        io.Answer(4, "hand", "z", None),
    ]
    io.check_answers_match("a.jsonl", answers[::2], {"hand": HAND})  # matching or unhashed: fine
    with pytest.raises(ValueError, match=r"a\.jsonl: field 'puzzle_hash': 1 answer.*line 3 'hand'"):
        io.check_answers_match("a.jsonl", answers, {"hand": HAND})


def test_one_answer_per_id_and_an_empty_instance_file(tmp_path):
    answers = [io.Answer(1, "a", "x"), io.Answer(2, "b", "y"), io.Answer(4, "a", "z")]
    with pytest.raises(io.JsonlError, match=r"f\.jsonl:4: field 'id': 1 id\(s\) answered more"):
        io.one_answer_per_id("f.jsonl", answers)
    assert [a.text for a in io.one_answer_per_id("f.jsonl", answers, "first")] == ["x", "y"]
    assert [a.text for a in io.one_answer_per_id("f.jsonl", answers, "last")] == ["z", "y"]
    assert io.one_answer_per_id("f.jsonl", answers, "all") == answers
    with pytest.raises(ValueError, match="duplicates = 'keep'; allowed: error, first, last, all"):
        io.one_answer_per_id("f.jsonl", answers, "keep")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert io.load_instances(empty) == []
    with pytest.raises(ValueError, match=r"empty\.jsonl: no instances \(the file is empty\)"):
        io.require_instances(empty)
