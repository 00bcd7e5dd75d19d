"""The go / no-go gate's trace recipes (projects/go_no_go/configs/tiny_model.py): a look-ahead
form writes its block into every SFT completion, and loop lessons join the retrying relay's
examples, each in its own cache entry."""

from mapfjax import configfile

RECIPES = "projects/go_no_go/configs/tiny_model.py"


def test_a_lookahead_recipe_writes_the_block_and_drops_puzzles_it_cannot_plan(tmp_path):
    """trace_lookahead: every SFT completion holds the block, its plan is the look-ahead's, and
    the cache key changes with it."""
    from mapfjax.env import lookahead, trace
    from mapfjax.rl import data, recipe

    c = configfile.get_config(RECIPES, "trace_quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 32, 32, 2
    c.trace_lookahead = "priority"
    recipe.check_recipe(c)
    run = recipe.prepare(c, tmp_path / "w")
    drawn = data.generate_problems(c.sft.env, 32, c.seed + 1, 1, tuple(c.sft.hole_ratios))
    plannable = [p for p in drawn if lookahead.priority(p).plans is not None]
    assert len(run.sft) == len(plannable)
    tok = run.tokenizer
    for e, p in zip(run.sft, plannable, strict=True):
        turn = tok.decode(e.completion)
        assert "\nP0 (" in turn and "\nP1 (" in turn
        plans = trace.parse_trace(trace.thinking_text(turn), 2)[0]
        assert plans == lookahead.priority(p).plans
    c.trace_lookahead = ""
    assert len(recipe.prepare(c, tmp_path / "w").sft) == len(drawn)  # its own cache entry


def test_a_retry_recipe_with_loop_lessons_adds_them_to_its_own_cache_entry(tmp_path):
    """sft.loop_lessons: the retrying relay's examples, then the lessons
    (`data.loop_lesson_examples`) of the same drawn puzzles; the cache key changes with it."""
    from mapfjax.rl import data, recipe

    c = configfile.get_config(RECIPES, "trace_quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 48, 32, 2
    c.trace_lookahead = "relay_retry"
    plain = recipe.prepare(c, tmp_path / "w").sft
    c.sft.loop_lessons = 1.0
    recipe.check_recipe(c)
    run = recipe.prepare(c, tmp_path / "w")
    drawn = data.generate_problems(c.sft.env, 48, c.seed + 1, 1, tuple(c.sft.hole_ratios))
    want = data.loop_lesson_examples(run.tokenizer, drawn, 1.0, c.trace_style)
    assert want and run.sft == [*plain, *want]
