"""Loop lessons: SFT examples that teach the retrying relay trace to end a run that comes back
to a cell, the trace up to a wrong move back as context outside the loss (`Example.loss_from`)
and the loop line that catches it, the retry and the plan from the next order as the target.
A recipe adds them beside its puzzles' own examples with `sft.extra_examples`:

    c.sft.extra_examples = "projects.go_no_go.lessons:quarter"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mapfjax.env import io, relay, text, trace
from mapfjax.env.trace import LOOP, Attempt, cells_by_time, relay_taken, step
from mapfjax.env.types import Problem
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import data
from projects.go_no_go import layouts


class Lesson(NamedTuple):
    """A trace that goes wrong once and catches it (`loop_lesson`): `tries` as
    `trace.render_relay` takes them, the first the index order's attempt with one wrong line,
    then the plans of `order`, the order the relay that retries reaches from the next one."""

    tries: tuple[Attempt, ...]
    order: tuple[int, ...]
    plans: list[list[int]]


def loop_lesson(problem: Problem, pick: int) -> Lesson | None:
    """The index order's rule run with one wrong line: at a step K once the earlier agents
    rest (K - 1 >= the run's rest step), an agent that has just moved moves back where it came
    from (a free cell not `taken`, not the rule's move), so that its next line stands on the
    cell of its line K - 1 and ends the attempt `= loop t<K-1>`; the trace then retries from
    the next order as `relay.retry` does. The policy's own loops go back and forth between two
    cells, and this is the check that ends them (the rule alone loops only where an agent
    cannot reach its goal, a different picture). `pick` chooses among the wrong lines the
    rule's runs allow (modulo their number; any int). None when there is none, or the retry
    from the next order reaches no plan (or fails on no line)."""
    orders = list(relay.orders(problem.num_agents))
    order, plans, tail, _ = relay.retry(problem, orders[1:])
    if plans is None:
        return None
    first, failed0, _ = relay.attempt(problem, orders[0])
    if first is not None:
        runs = [(i, tuple(first[i])) for i in orders[0]]
    elif failed0 is not None:
        runs = list(failed0.runs)
    else:
        return None
    wrong = []  # (run, K, the move back, the run's rest step)
    for r, (i, actions) in enumerate(runs):
        rest = relay.rule(problem, i, runs[:r])[1]
        cells = cells_by_time(problem.starts[i], actions)
        earlier = [cells_by_time(problem.starts[j], p) for j, p in runs[:r]]
        for k in range(max(2, rest + 1), len(actions) + 1):
            here, back = cells[k - 1], cells[k - 2]
            if here == back or back in relay_taken(earlier, k, here):
                continue
            a = next(a for a in relay.MOVE_CODES if step(here, a) == back)
            if a != actions[k - 1]:
                wrong.append((r, k, a, rest))
    if not wrong:
        return None
    r, k, a, rest = wrong[pick % len(wrong)]
    i, actions = runs[r]
    run = (*actions[: k - 1], a)
    again = relay.loop_step(cells_by_time(problem.starts[i], run), rest)
    lesson = Attempt(tuple(orders[0]), (*runs[:r], (i, run)), LOOP, again)
    return Lesson((lesson, *tail), tuple(order), plans)


def lesson_turn(problem: Problem, share: float, style: str = "grid") -> tuple[str, int] | None:
    """(the whole turn of `problem`'s loop lesson, the offset of its loop line) when the
    puzzle's hash draws it at `share` (its first 12 hex digits, which also pick the wrong line:
    the same puzzles give the same lessons), the map in `style`; None when it is not drawn or
    has no lesson (`loop_lesson`)."""
    h = int(io.puzzle_hash(problem)[:12], 16)
    if h % 10_000 >= share * 10_000 or (lesson := loop_lesson(problem, h // 10_000)) is None:
        return None
    body = layouts.render_thinking(
        problem, lesson.plans, style, order=lesson.order, tries=lesson.tries
    )
    turn = body + text.render_answer(lesson.plans)
    return turn, trace.FAILED_LINE.search(turn).start()  # the first failure: the lesson's loop


def loop_lesson_examples(tokenizer, problems: Sequence[Problem], share: float, style: str = "grid"):
    """SFT examples that teach the retrying relay trace (`traces.relay_retry`) to end a run
    that comes back to a cell (`lesson_turn`), for about `share` of `problems`. The completion
    is the whole turn, but the loss starts at the line that names the loop
    (`Example.loss_from`): the trace up to and including its wrong line is context, and no
    loss teaches the wrong move. The rows keep the shapes of the puzzles' own examples (the
    same prompt, a turn as long): on 2 CPU cores, lessons whose context was prompt made each
    batch a new compiled shape. Puzzles without a lesson are skipped."""
    if not 0 <= share <= 1:
        raise ValueError(f"loop lessons: share {share!r}, allowed a number in [0, 1]")
    im_end = tok_lib.special_ids(tokenizer).im_end
    out = []
    for p in problems:
        if (found := lesson_turn(p, share, style)) is None:
            continue
        turn, split = found
        enc = tokenizer(turn, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        cut = next(j for j, (_, end) in enumerate(offsets) if end > split)
        prompt = data.encode_prompts(tokenizer, [p], enable_thinking=True)[0]
        out.append(data.Example(p.id, tuple(prompt), (*ids, im_end), io.puzzle_hash(p), cut))
    return out


def quarter(tokenizer, problems: Sequence[Problem]) -> list[data.Example]:
    """Loop lessons for about a quarter of `problems` (`sft.extra_examples`, the recipe
    trace_retry_lessons), the map in the grid style."""
    return loop_lesson_examples(tokenizer, problems, 0.25)
