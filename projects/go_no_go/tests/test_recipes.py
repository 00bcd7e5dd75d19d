"""The go / no-go gate's trace recipes (projects/go_no_go/configs/tiny_model.py): every variant
still builds the SFT turns (and loop lessons) it built before its trace became a named form,
under the same data cache words; a look-ahead form writes its block into every SFT completion,
and loop lessons join the retrying relay's examples, each in its own cache entry."""

import hashlib
import json
import pathlib

import pytest

from mapfjax import configfile
from mapfjax.env import io

RECIPES = "projects/go_no_go/configs/tiny_model.py"
GOLDEN = pathlib.Path(__file__).parent / "data" / "variant_turns.json"


def _digest(turn: str | None) -> str | None:
    return None if turn is None else hashlib.sha256(turn.encode()).hexdigest()[:16]


@pytest.mark.parametrize("variant", configfile.load_module(RECIPES).VARIANTS)
def test_each_variant_builds_the_turns_it_built_before(variant):
    """The recorded digests cover 13 puzzles (3x3-6x6, with waits, retries and endings): the
    variant's form, answer-only share and extra examples give the same texts, its data cache
    names the same words, and its recipe passes the check."""
    from mapfjax.rl import data, recipe
    from projects.go_no_go import lessons

    golden = json.loads(GOLDEN.read_text())
    sample = [io.problem_from_row(r) for r in golden["problems"]]
    want = golden["variants"][variant]
    c = configfile.get_config(RECIPES, variant)
    recipe.check_recipe(c, made_before=bool(c.get("init")))  # an init is a run's export
    form = recipe.trace_form(c)
    share = c.sft.answer_only if form else 0.0
    turns = data.sft_turns(sample, form=form, answer_only=share)
    assert [_digest(t) for t in turns] == want["turns"]
    assert list(("thinking", *form.cache_key) if form else ()) == want["cache_key"]
    if "lessons" in want:
        assert c.sft.extra_examples == "projects.go_no_go.lessons:quarter"
        made = [lessons.lesson_turn(p, 0.25) for p in sample]
        got = [None if m is None else _digest(f"{m[1]}|{m[0]}") for m in made]
        assert got == want["lessons"] and any(got)
    else:
        assert not c.sft.get("extra_examples")


def test_a_lookahead_recipe_writes_the_block_and_drops_puzzles_it_cannot_plan(tmp_path):
    """trace_form priority: every SFT completion holds the block, its plan is the look-ahead's,
    and the cache key changes with the form."""
    from mapfjax.env import trace
    from mapfjax.rl import data, recipe
    from projects.go_no_go import layouts, lookahead

    c = configfile.get_config(RECIPES, "trace_quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 32, 32, 2
    c.trace_form = "projects.go_no_go.traces:priority"
    recipe.check_recipe(c)
    run = recipe.prepare(c, tmp_path / "w")
    drawn = data.generate_problems(c.sft.env, 32, c.seed + 1, 1, tuple(c.sft.hole_ratios))
    plannable = [p for p in drawn if lookahead.priority(p).plans is not None]
    assert len(run.sft) == len(plannable)
    tok = run.tokenizer
    for e, p in zip(run.sft, plannable, strict=True):
        turn = tok.decode(e.completion)
        assert "\nP0 (" in turn and "\nP1 (" in turn
        plans = layouts.parse_trace(trace.thinking_text(turn), 2)[0]
        assert plans == lookahead.priority(p).plans
    c.trace_form = "projects.go_no_go.traces:steps"
    assert len(recipe.prepare(c, tmp_path / "w").sft) == len(drawn)  # its own cache entry


def test_a_retry_recipe_with_loop_lessons_adds_them_to_its_own_cache_entry(tmp_path):
    """sft.extra_examples: the retrying relay's examples, then the lessons
    (`lessons.quarter`) of the same drawn puzzles; the cache key changes with it."""
    from mapfjax.rl import data, recipe
    from projects.go_no_go import lessons

    c = configfile.get_config(RECIPES, "trace_quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 48, 32, 2
    c.trace_form = "projects.go_no_go.traces:relay_retry"
    plain = recipe.prepare(c, tmp_path / "w").sft
    c.sft.extra_examples = "projects.go_no_go.lessons:quarter"
    recipe.check_recipe(c)
    run = recipe.prepare(c, tmp_path / "w")
    drawn = data.generate_problems(c.sft.env, 48, c.seed + 1, 1, tuple(c.sft.hole_ratios))
    want = lessons.quarter(run.tokenizer, drawn)
    assert want and run.sft == [*plain, *want]
    assert want == lessons.loop_lesson_examples(run.tokenizer, drawn, 0.25)
    assert all(0 < e.loss_from < len(e.completion) for e in want)
