"""projects/go_no_go/trace_lengths.py: the oracle response's tokens per size against a budget,
and an
evaluation's parse errors that the budget would cut even on the oracle's trace."""

import json
import pathlib
import subprocess
import sys

import pytest

from mapfjax.env import io, oracle, text
from mapfjax.env.types import Problem
from projects.go_no_go import layouts
from projects.go_no_go.lengths import response_length_table

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _problems():
    grids = [("FFF", "FHF", "FFF"), ("FFFF", "FFHF", "FFFF", "HFFF"), ("FFF", "FFF", "FFF")]
    out = []
    for i, g in enumerate(grids):
        n = len(g)
        p = Problem(f"p{i}", g, ((0, 0), (n - 1, n - 1)), ((n - 1, n - 2), (0, 1)))
        out.append(p.with_labels(None, None, needs_wait=i == 2))
    return out


def test_the_table_counts_lengths_over_the_budget_and_parse_errors_among_them():
    probs = _problems()  # 3x3 no wait, 4x4 no wait, 3x3 wait
    table = response_length_table(
        probs, [100, 300, 500], budget=250, failures={"p0": None, "p1": "parse_error",
                                                      "p2": "parse_error"}
    )  # fmt: skip
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table.splitlines()}
    cells = lambda key: [c.strip() for c in rows[key].split("|")[3:-1]]  # noqa: E731
    # puzzles, median, p90, max, > budget, parse errors, of them > budget
    assert cells(("3x3", "no")) == ["1", "100", "100", "100", "0", "0", "0"]
    assert cells(("3x3", "yes")) == ["1", "500", "500", "500", "1", "1", "1"]
    assert cells(("4x4", "no")) == ["1", "300", "300", "300", "1", "1", "1"]
    assert cells(("all", "")) == ["3", "300", "500", "500", "2", "2", "2"]
    assert "parse errors" not in response_length_table(probs, [1, 2, 3], budget=2)
    with pytest.raises(ValueError, match="2 lengths for 3 puzzles"):
        response_length_table(probs, [1, 2], budget=2)


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.trace_lengths", *args], cwd=ROOT,
        capture_output=True,
        text=True,
    )  # fmt: skip


def _saved(tmp_path):
    probs = _problems()
    inst = tmp_path / "inst.jsonl"
    io.save_instances(inst, probs)
    return probs, inst


def _tokens(model_dir, think: str, plans) -> int:
    """Tokens of a think block + the answer block of `plans`, with the end of turn."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    turn = think + text.render_answer(plans)
    return len(tok(turn, add_special_tokens=False)["input_ids"]) + 1


def test_the_script_counts_the_oracle_trace_and_answer_with_the_end_of_turn(
    tiny_model_dir, tmp_path
):
    probs, inst = _saved(tmp_path)
    want = []
    for p in probs:
        a = oracle.answer_actions(oracle.solve(p))
        want.append(_tokens(tiny_model_dir, layouts.render_thinking(p, a, "grid"), a))
    out = _run(f"--instances={inst}", f"--tokenizer={tiny_model_dir}", "--budget=100000")
    assert out.returncode == 0, out.stderr
    last = [c.strip() for c in out.stdout.strip().splitlines()[-1].split("|")[1:-1]]
    assert last[:3] == ["all", "", "3"] and int(last[5]) == max(want) and last[6] == "0"

    verdicts = tmp_path / "validation.json"
    row = {"id": "p0", "valid": False, "failure": "parse_error"}
    verdicts.write_text(json.dumps({"rows": [row]}))
    out = _run(f"--instances={inst}", f"--tokenizer={tiny_model_dir}", f"--verdicts={verdicts}")
    assert out.returncode == 2
    assert f"{verdicts}: no verdict for 2 puzzle(s), e.g. 'p1'" in out.stderr
    verdicts.write_text("[1, 2]")
    out = _run(f"--instances={inst}", f"--tokenizer={tiny_model_dir}", f"--verdicts={verdicts}")
    assert out.returncode == 2 and f"{verdicts}: not a validation.json" in out.stderr


def test_with_lookahead_the_trace_writes_the_search_and_the_script_counts_it(
    tiny_model_dir, tmp_path
):
    from projects.go_no_go import lookahead

    probs, inst = _saved(tmp_path)
    want = []
    for p in probs:
        found = lookahead.search(p)  # --lookahead=search
        think = layouts.render_thinking(p, found.plans, "grid", found.lines)
        want.append(_tokens(tiny_model_dir, think, found.plans))
    out = _run(
        f"--instances={inst}",
        f"--tokenizer={tiny_model_dir}",
        "--budget=100000",
        "--lookahead=search",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == (
        "The search look-ahead found no plan for 0 of 3 puzzles (the search gives up after 16 "
        "opened nodes); they are left out above."
    )
    last = [c.strip() for c in lines[-3].split("|")[1:-1]]
    assert last[:3] == ["all", "", "3"] and int(last[5]) == max(want)
