"""projects/go_no_go/lessons.py: a loop lesson is the rule's index-order trace with one wrong
move back, the loop line that catches it, the retry and the plan from the next order (read
from the rendered text); its SFT example trains from the loop line on; a recipe adds the
lessons beside its own examples by `sft.extra_examples`, in a cache entry of its own."""

import re

import numpy as np
import pytest

from mapfjax.env import io, simulate, text, trace
from mapfjax.env.types import Problem
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import data
from projects.go_no_go import layouts, lessons, relay_checks
from tests.models.test_bpe import random_problems
from tests.rl.test_data import make_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def _run_lines(body: str) -> list[tuple[int, int, tuple[int, int], str]]:
    """(step, agent, cell, the rest) of each relay or failure line, read with a regex."""
    out = []
    for line in body.splitlines():
        if m := re.match(r"^t(\d+) A(\d+) \((\d+), (\d+)\)(.*)$", line):
            out.append((int(m[1]), int(m[2]), (int(m[3]), int(m[4])), m[5]))
    return out


def test_a_loop_lesson_goes_back_once_then_retries_into_a_valid_plan():
    """Over generated puzzles, read from the rendered text: the lesson's first attempt keeps
    the rule's index-order lines but one, whose move goes back to the cell of the line before
    it; the next line names that line's step as a loop; the trace then retries in the next
    order and reads back into a valid plan, the one `retry` finds from that order on."""
    made = 0
    for p in random_problems(80, seed=21, sizes=(3, 4, 5, 6)):
        for pick in (0, 5):
            lesson = lessons.loop_lesson(p, pick)
            if lesson is None:
                continue
            made += 1
            body = layouts.render_trace(p, lesson.plans, "grid", order=lesson.order,
                                      tries=lesson.tries)  # fmt: skip
            assert layouts.parse_trace(body, 2) == (lesson.plans, None)
            assert simulate.simulate(p, lesson.plans)["valid"]
            head, rest = body.split("\nretry ", 1)
            lines = _run_lines(head)
            k, agent, back, loop = lines[-1]
            j = int(re.fullmatch(r" = loop t(\d+)", loop)[1])
            run = [x for x in lines[:-1] if x[1] == agent]
            assert [x[0] for x in run] == list(range(1, k))  # the run's steps, in order
            assert run[j - 1][2] == back and j == k - 2  # back on the cell of line K - 2
            wrong = run[-1][3]  # the line before the loop: its move goes back there
            assert wrong.endswith(f"({back[0]}, {back[1]})") and " = WAIT" not in wrong
            # the rule's own lines in index order agree up to the wrong one
            if (first := relay_checks.plan_in_order(p, (0, 1))) is not None:
                rule = layouts.render_trace(p, first, "grid", order=(0, 1)).splitlines()
                kept = head.splitlines()[:-2]  # all but the wrong line and the loop line
                assert rule[: len(kept)] == kept and rule[len(kept)] != head.splitlines()[-2]
            # then the other order, as the rule writes it
            assert lesson.order == (1, 0) and rest.startswith("A1 A0\n")
            assert lesson.plans == relay_checks.plan_in_order(p, (1, 0))
    assert made >= 30


def test_no_loop_lesson_where_the_next_order_has_no_plan_or_nothing_goes_back():
    # one agent waits for ever: a 1x3 corridor with both goals beyond each other
    stuck = Problem(id="stuck", grid=("FFF",), starts=((0, 0), (0, 2)), goals=((0, 1), (0, 0)))
    assert lessons.loop_lesson(stuck, 0) is None
    # every run one step long: no agent has a line to go back from
    short = Problem(id="short", grid=("FF", "FF"), starts=((0, 0), (1, 1)), goals=((0, 1), (1, 0)))
    assert lessons.loop_lesson(short, 0) is None


def test_loop_lessons_train_from_the_loop_line_after_the_wrong_move(tok, tmp_path):
    """A loop lesson's prompt is the puzzle's chat prompt and its completion the whole
    retrying trace with one wrong line, the retry and the answer; the loss starts on the loop
    line (`loss_from`), so the wrong move is context only, and the batch masks it so. The
    share chooses puzzles by hash, so a subset of puzzles keeps its lessons."""
    problems = random_problems(40, seed=21, sizes=(4, 5, 6))
    made = lessons.loop_lesson_examples(tok, problems, 1.0)
    by_id = {p.id: p for p in problems}
    assert len(made) == sum(lessons.loop_lesson(p, 0) is not None for p in problems) >= 15
    ids = tok_lib.special_ids(tok)
    for e in made:
        p = by_id[e.problem_id]
        chat = tok_lib.builtin_chat_text([{"role": "user", "content": text.render_prompt(p)}])
        assert tok.decode(list(e.prompt)) == chat and e.completion[-1] == ids.im_end
        head = tok.decode(list(e.completion[: e.loss_from]))
        turn = tok.decode(list(e.completion[e.loss_from : -1]))
        assert re.match(r"t\d+ A\d \(\d, \d\) = loop t\d+\nretry A1 A0\nt1 A1 ", turn), turn[:60]
        assert head.startswith("<think>\n") and head.endswith("\n") and "loop" not in head
        plans, reason = text.parse_answer(turn, 2)
        assert (
            reason is None and layouts.parse_trace(trace.thinking_text(head + turn), 2)[0] == plans
        )
        assert e.puzzle == io.puzzle_hash(p)
    batch = data.to_batch(made[:4] + data.sft_examples(tok, problems[:2]), ids.pad)
    for row, e in enumerate(made[:4] + data.sft_examples(tok, problems[:2])):
        mask = np.asarray(batch.loss_mask[row])
        want = [j >= e.loss_from for j in range(len(e.completion))]
        assert mask[: len(want)].tolist() == want and not mask[len(want) :].any()
    data.save_examples(tmp_path / "lessons.jsonl", made)
    assert data.load_examples(tmp_path / "lessons.jsonl") == made  # loss_from kept
    half = lessons.loop_lesson_examples(tok, problems, 0.5)
    assert set(half) <= set(made) and 0 < len(half) < len(made)
    assert lessons.loop_lesson_examples(tok, problems, 0.0) == []
    with pytest.raises(ValueError, match=r"share 1\.5, allowed a number in \[0, 1\]"):
        lessons.loop_lesson_examples(tok, problems, 1.5)
