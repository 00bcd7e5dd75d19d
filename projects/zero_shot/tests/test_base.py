"""The base recipe of the zero-shot test: every agent symbol of the benchmark in its SFT data,
no 3-5-agent puzzle that needs a wait, and no evaluation puzzle (the slice, the main job's
held-out set) among its SFT puzzles."""

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
