"""The base recipe of the zero-shot test: every agent symbol of the benchmark in its SFT data,
no 3-5-agent puzzle that needs a wait, and no evaluation puzzle (the slice, the main job's
held-out set) among its SFT puzzles."""

import pytest

from mapfjax import configfile
from mapfjax.env import io
from mapfjax.rl import recipe

BASE = "projects/zero_shot/configs/base.py"


def test_the_base_recipe_is_checked_and_shows_every_agent_count_without_waits():
    c = configfile.get_config(BASE)
    recipe.check_recipe(c)
    mix = dict(recipe.sft_mix(c))
    assert {part.env.num_agents for part in mix.values()} == {3, 4, 5}
    for part in mix.values():
        assert all(s.wait_ratio == 0.0 for s in part.env.sizes.values())
        assert min(int(k[1:]) for k in part.env.sizes) >= part.env.num_agents
    assert c.sft.env.num_agents == 2 and c.sft.answer_only == 0.6
    assert configfile.resolve(c.sft.exclude[-1]).is_file()


def test_the_quick_base_keeps_the_evaluation_puzzles_out(tmp_path):
    c = configfile.get_config(BASE, "quick")
    slice_ = configfile.resolve(c.sft.exclude[-1])
    c.sft.exclude = (str(slice_),)  # the slice alone: the main job's held-out set is tested
    data = recipe.prepare(c, tmp_path / "w")  # in tests/rl/test_train_tiny.py
    held = io.puzzle_hashes([slice_])
    assert data.sft and not {e.puzzle for e in data.sft} & held
    prompts = [data.tokenizer.decode(e.prompt) for e in data.sft]
    for k in (2, 3, 4, 5):
        assert any(f"with {k} agents" in p for p in prompts), k


def test_v2_answers_every_3_to_5_agent_puzzle_after_a_trace(tmp_path):
    """`:v2` (PLAN.md amendment 1): the 3-5-agent parts doubled, each with its own answer-only
    share of 0 (a trace on every one), the 2-agent mix keeping sft.answer_only's 60 %."""
    full, base = configfile.get_config(BASE, "v2"), configfile.get_config(BASE)
    recipe.check_recipe(full)
    for name, part in recipe.sft_mix(full):
        assert part.answer_only == 0.0
        assert part.instances == 2 * dict(recipe.sft_mix(base))[name].instances
    c = configfile.get_config(BASE, "v2_quick")
    c.sft.exclude = (str(configfile.resolve(c.sft.exclude[-1])),)
    data = recipe.prepare(c, tmp_path / "w")
    traced = {2: [], 3: [], 4: [], 5: []}
    for e in data.sft:
        prompt, completion = data.tokenizer.decode(e.prompt), data.tokenizer.decode(e.completion)
        k = next(k for k in traced if f"with {k} agents" in prompt)
        think = completion.split("</think>")[0]
        traced[k].append(bool(think.replace("<think>", "").strip()))
    for k in (3, 4, 5):
        assert traced[k] and all(traced[k]), k  # every 3-5-agent example thinks
    assert 0 < sum(traced[2]) < len(traced[2])  # the 2-agent mix: some answered bare


def test_a_mix_part_answer_only_is_checked():
    c = configfile.get_config(BASE, "v2")
    c.sft.mix.agents3.answer_only = 1.5
    with pytest.raises(ValueError, match=r"sft\.mix\.agents3\.answer_only = 1\.5; allowed: a sh"):
        recipe.check_recipe(c)
