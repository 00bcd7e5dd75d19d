"""launch/train_tiny.py end to end on its "quick" config: tokenizer -> SFT (two stages, with
the coordinate targets) -> GRPO -> export -> validation, as the user runs it; a rerun resumes."""

import json
import math
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from mapfjax.configfile import ROOT
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib


@pytest.mark.slow
def test_quick_run_exports_a_loadable_validated_model(tmp_path, one_device_env):
    work, out = tmp_path / "work", tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train_tiny.py"),
        f"--config={ROOT / 'configs' / 'tiny_model.py'}:quick",
        f"--config.workdir={work}",
        f"--config.out_dir={out}",
        "--config.processes=1",
    ]
    env = {**one_device_env, "PYTHONPATH": str(ROOT)}

    errs = []

    def run():
        p = subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=900, cwd=ROOT)
        errs.append(p.stderr.decode())
        sft = (work / "log.jsonl").read_text().splitlines()
        grpo = (work / "grpo" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in sft], [json.loads(line) for line in grpo]

    log, grpo = run()
    assert "sft: 100%" in errs[0] and "16/16" in errs[0]  # the SFT stages' progress bar
    assert [r["phase"] for r in log] == ["sft"] * 16
    assert [r["step"] for r in log] == [*range(1, 17)]
    # GRPO runs through the shared driver: its steps, the phase position and dynamic-sampling
    # bookkeeping are in grpo/metrics.jsonl.
    assert [r["step"] for r in grpo] == [1, 2, 3, 4] and {r["phase"] for r in grpo} == {"grpo"}
    assert all("kept_mixed" in r and len(r["groups"]) == 2 for r in grpo)
    # Each step's wall time, split into sampling (with the rewards) and the update.
    for r in grpo:
        assert 0 < r["rollout_seconds"] and 0 < r["update_seconds"]
        assert r["rollout_seconds"] + r["update_seconds"] == pytest.approx(r["seconds"])
    assert all(math.isfinite(r["loss"]) for r in log)
    assert all(math.isfinite(r["train_loss"]) for r in grpo)
    # Every SFT batch has the answer tokens and the 8 coordinate tokens (2 agents x 4) per row.
    assert all(r["num_tokens"] > 16 * 8 for r in log if r["phase"] == "sft")

    model = hf.from_pretrained(out, dtype=jnp.float32)
    assert model.config.vocab_size == len(tok_lib.load_tokenizer(out))
    report = (out / "VALIDATION.md").read_text()
    assert "| 2 | 3x3 | 4 |" in report and "| 2 | 10x10 | 4 |" in report

    # A rerun finds every stage done: no new training steps, the same exported weights.
    weights = (out / "model.safetensors").read_bytes()
    assert run() == (log, grpo)
    assert (out / "model.safetensors").read_bytes() == weights


BAD_RECIPES = [
    # Each used to fail only after data generation, after SFT (rl.*: hours at full scale) or
    # never (an empty validation table), most of them with a traceback.
    ("sft.batch_size", 0, r"sft\.batch_size = 0; allowed: an integer in \[1, sft\.instances"),
    ("sft.stages", (16, 8), r"sft\.stages = \(16, 8\); allowed: update counts >= 1, increasing"),
    ("sft.stages", (), r"sft\.stages = \(\)"),
    ("sft.optim.lr", 0.0, r"OptimConfig\.lr=0\.0 is invalid"),
    ("model.hidden_size", -4, r"model\.hidden_size = -4; allowed: an integer >= 1"),
    ("model.num_kv_heads", 3, r"num_heads=4 must be a multiple of num_kv_heads=3"),
    ("tokenizer.vocab_size", 10, r"tokenizer\.vocab_size = 10; allowed: an integer >= 262"),
    ("validation.per_size", 0, r"validation\.per_size = 0; allowed: an integer >= 1"),
    ("validation.env.sizes.s3.hole_ratio", 0.7, r"validation\.env\.sizes\.s3\.hole_ratio = 0\.7"),
    ("sft.env.num_agents", 9, r"sft\.env\.num_agents = 9"),
    ("rl.optim.lr", -1.0, r"OptimConfig\.lr=-1\.0 is invalid"),
    ("rl.train.group_size", 1, r"GRPOConfig\.group_size=1 is invalid"),
    ("rl.train.steps", -1, r"rl\.train\.steps = -1; allowed: an integer >= 0"),
    ("sft.answer_weight", 0.0, r"sft\.answer_weight = 0\.0; allowed: a number > 0"),
    ("sft.answer_weight", 5.0, r"other than 1 only with thinking=True"),
    ("dtype", "float7", r"dtype = 'float7'"),
    ("trace_form", "grid_relay", r"trace_form = 'grid_relay'; allowed: '' without thinking"),
    ("init", "/nonexistent", r"init = '/nonexistent'; allowed: a model directory or ''"),
    ("sft.exclude", ("/nonexistent.jsonl",), r"sft\.exclude = '/nonexistent\.jsonl'; allowed: "),
    ("sft.completion_multiple", 0, r"sft\.completion_multiple = 0; allowed: an integer >= 1"),
    ("sft.extra_examples", "x", r"sft\.extra_examples = 'x'; allowed: 'package.module:attr"),
    ("sft.extra_examples", "mapfjax.rl.data:Example.x", r"has no 'Example\.x'"),
    ("sft.extra_examples", "mapfjax.rl.data:Example", None),  # a class is callable: accepted
    (
        "sft.extra_examples",
        "mapfjax.env.trace:NO_ORDER",
        r"'mapfjax\.env\.trace:NO_ORDER'; "
        r"allowed: '' or 'module:attribute' naming a function",
    ),  # fmt: skip
    ("sft.answer_only", 0.5, r"sft\.answer_only = 0\.5; allowed: a share in \[0, 1\]; above 0"),
    ("sft.answer_only", 1.5, r"sft\.answer_only = 1\.5; allowed: a share in \[0, 1\]"),
]


@pytest.mark.parametrize("key,value,message", BAD_RECIPES, ids=lambda x: str(x)[:30])
def test_a_bad_recipe_is_refused_before_any_work(key, value, message):
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "quick")
    recipe.check_recipe(c)
    node, last = configfile.key_path(c, key)
    node[last] = value
    if message is None:
        return recipe.check_recipe(c)
    with pytest.raises(ValueError, match=message):
        recipe.check_recipe(c)


@pytest.mark.parametrize(
    "value, message",
    [
        ("cbs", r"trace_form = 'cbs'; allowed: one of \['grid_relay'\], or 'module:attribute'"),
        ("", r"trace_form = ''; allowed: one of \['grid_relay'\]"),
        ("mapfjax.env.trace:cell", r"trace_form = 'mapfjax\.env\.trace:cell': a function, not a"),
        ("no_such_module_x:F", r"No module named 'no_such_module_x'"),
    ],
)
def test_a_thinking_recipe_names_a_trace_form_that_resolves(value, message):
    """With thinking, `trace_form` is a registered form or "module:attribute" naming one (an
    experiment's, e.g. projects/go_no_go/traces.py); the check names the key and value."""
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "think_quick").stage.trace
    recipe.check_recipe(c)
    assert recipe.trace_form(c).name == "grid_relay"
    c.trace_form = value
    with pytest.raises(ValueError, match=message):
        recipe.check_recipe(c)


def test_a_recipe_without_grpo_is_accepted():
    """rl.train.steps = 0 exports the SFT model; the rest of rl.* is still checked."""
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "think_quick").stage.trace
    c.rl.train.steps, c.sft.answer_weight = 0, 10.0
    recipe.check_recipe(c)
    assert c.rl.train.steps == 0  # the check works on a copy
    c.rl.train.group_size = 1
    with pytest.raises(ValueError, match=r"group_size=1"):
        recipe.check_recipe(c)


def test_the_launch_script_refuses_a_bad_recipe_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "launch/train_tiny.py", "--config=configs/tiny_model.py:quick",
         f"--config.workdir={tmp_path / 'w'}", "--config.rl.optim.lr=-1.0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: OptimConfig.lr=-1.0 is invalid: allowed a number > 0"
    )
    assert not (tmp_path / "w").exists()


def test_only_the_full_recipes_write_into_the_package():
    """A smoke run ("quick") once exported its 16-update model over the shipped one."""
    from mapfjax import configfile

    assets = (ROOT / "mapfjax" / "assets").resolve()
    for arg, ships in (("", True), ("quick", False), ("think", True), ("think_quick", False)):
        out = configfile.resolve(configfile.get_config("configs/tiny_model.py", arg).out_dir)
        assert out.resolve().is_relative_to(assets) == ships, (arg, out)


@pytest.mark.slow
def test_sft_exclude_keeps_a_held_out_file_out_of_the_sft_data(tmp_path):
    """The puzzles of sft.exclude files are dropped from the SFT data, and the cache is keyed
    by the files' content (another file: other data)."""
    from mapfjax import configfile
    from mapfjax.env import io
    from mapfjax.rl import data, recipe

    c = configfile.get_config("configs/tiny_model.py", "think_quick").stage.trace
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 48, 48, 2
    drawn = data.generate_problems(c.sft.env, 48, c.seed + 1, 1, tuple(c.sft.hole_ratios))
    held = tmp_path / "held.jsonl"
    io.save_instances(held, drawn[:10])
    c.sft.exclude = (str(held),)
    recipe.check_recipe(c)
    got = recipe.prepare(c, tmp_path / "w").sft
    gone = {io.puzzle_hash(p) for p in drawn[:10]}
    assert {e.puzzle for e in got}.isdisjoint(gone)
    assert len(got) == sum(io.puzzle_hash(p) not in gone for p in drawn)
    io.save_instances(held, drawn[:1])
    assert len(recipe.prepare(c, tmp_path / "w").sft) > len(got)


def test_a_staged_recipe_runs_in_order_each_from_the_export_before():
    """configs/tiny_model.py:think: stage `trace` works and exports in <workdir>/trace, `mix`
    starts from that export and writes the recipe's out_dir; every stage passes its check."""
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "think")
    c.workdir = "/w"
    c.lock()  # as the launch script's flags give it
    stages = recipe.stage_configs(c)
    assert [s.name for s in stages] == ["trace", "mix"] and stages[1].after == "trace"
    assert stages[0].config.workdir == "/w/trace" and not stages[0].config.get("init")
    assert stages[0].config.out_dir == stages[1].config.init == "/w/trace/export"
    assert stages[1].config.out_dir == c.out_dir and stages[1].config.workdir == "/w/mix"
    for s in stages:
        recipe.check_recipe(s.config, made_before=bool(s.after))
    assert stages[1].config.sft.answer_only == 0.6 and stages[0].config.sft.answer_only == 0
    one = configfile.get_config("configs/tiny_model.py", "quick")
    assert [(s.name, s.config) for s in recipe.stage_configs(one)] == [("", one)]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: setattr(c, "stages", ("mix", "trace")), r"stage\.mix\.init = 'stage:trace'"),
        (lambda c: setattr(c, "stages", ("trace",)), r"stages = \('trace',\); allowed: each"),
        (lambda c: setattr(c, "stages", ("trace", "trace")), r"stages = .*allowed: each"),
    ],
)
def test_a_staged_recipe_that_cannot_run_in_its_order_is_refused(edit, message):
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "think")
    edit(c)
    with pytest.raises(ValueError, match=message):
        recipe.stage_configs(c)


@pytest.mark.slow
def test_a_training_config_in_sft_exclude_is_its_held_out_set(tmp_path):
    """`sft.exclude` may name a training config: its held-out puzzles, drawn as the loop draws
    them (the main job's 400 here), become the instance file the recipe keeps out."""
    from mapfjax import configfile
    from mapfjax.engineer import settings, validation
    from mapfjax.env import io

    path = validation.held_out_file("configs/tiny_cpu.py", tmp_path)
    v = settings.ValidationSettings.from_config(configfile.get_config("configs/tiny_cpu.py"))
    want = validation.held_out_set(tmp_path / "direct", v)
    got = io.load_instances(path)
    assert len(got) == 400 and [io.puzzle_hash(p) for p in got] == [io.puzzle_hash(p) for p in want]
    assert validation.held_out_file("configs/tiny_cpu.py", tmp_path) == path  # read back
    other = validation.held_out_file("configs/tiny_cpu.py:answer_only", tmp_path)
    assert other != path and len(io.load_instances(other)) == 1200


def test_a_workdir_refuses_another_recipe_before_any_work(tmp_path):
    """A resume restores the workdir's checkpoints: under another seed (another tokenizer) or
    architecture they would not fit; the run says so in one line and leaves the workdir as it
    was. Longer stages, other checkpoint intervals and the validation may change."""
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "quick")
    work = tmp_path / "w"
    recipe.check_resume(c, work)
    record = (work / recipe.RECORD).read_text()
    longer = c.copy_and_resolve_references()
    longer.sft.stages, longer.sft.checkpoint_every, longer.validation.per_size = (8, 32), 4, 9
    recipe.check_resume(longer, work)
    for key, value in (("seed", 1), ("model.num_layers", 2), ("sft.instances", 512)):
        other = c.copy_and_resolve_references()
        node, last = configfile.key_path(other, key)
        node[last] = value
        with pytest.raises(ValueError, match=rf"holds a run of another recipe \(1 key\(s\) differ: "
                                             rf"{re.escape(key)}: "):  # fmt: skip
            recipe.check_resume(other, work)
    assert (work / recipe.RECORD).read_text() == record


def test_the_launch_script_refuses_a_changed_seed_on_resume(tmp_path):
    work = tmp_path / "w"
    base = [sys.executable, "launch/train_tiny.py", "--config=configs/tiny_model.py:quick",
            f"--config.workdir={work}", "--config.sft.stages=0"]  # fmt: skip
    first = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 2  # the bad stages: refused before the workdir is made
    assert not work.exists()
    from mapfjax import configfile
    from mapfjax.rl import recipe

    recipe.check_resume(configfile.get_config("configs/tiny_model.py", "quick"), work)
    again = [*base[:-1], "--config.seed=1"]
    out = subprocess.run(again, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {work} holds a run of another")
    assert sorted(p.name for p in work.iterdir()) == [recipe.RECORD]


def test_sft_mix_adds_puzzles_of_other_generator_configs(tmp_path):
    """`sft.mix`: each named part draws its own puzzles (here 3 agents, none needing a wait)
    into the SFT data beside the recipe's own, in its own cache entry; a bad part names it."""
    import ml_collections

    from mapfjax import configfile
    from mapfjax.env.config import default_config
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 24, 24, 2
    plain = recipe.prepare(c, tmp_path / "w").sft
    three = default_config(3, sizes=(4, 5), wait_ratio=0.0)
    c.sft.mix = ml_collections.ConfigDict({"three": {"env": three, "instances": 8}})
    recipe.check_recipe(c)
    got = recipe.prepare(c, tmp_path / "w")
    assert len(got.sft) == len(plain) + 8
    prompts = [got.tokenizer.decode(e.prompt) for e in got.sft]
    assert sum("with 3 agents" in p for p in prompts) == 8
    assert sum("with 2 agents" in p for p in prompts) == len(plain)
    c.sft.mix.three.instances = 0
    with pytest.raises(ValueError, match=r"sft\.mix\.three\.instances = 0; allowed: an integer"):
        recipe.check_recipe(c)
    c.sft.mix.three.instances, c.sft.mix.three.seeds = 8, 3
    with pytest.raises(ValueError, match=r"sft\.mix\.three: unknown key\(s\) = \['seeds'\]"):
        recipe.check_recipe(c)


# What `sft.extra_examples` was last called with (`_count_puzzles`).
_SEEN: list[int] = []


def _count_puzzles(tokenizer, problems):
    """An `sft.extra_examples` that adds nothing and records how many puzzles it was given."""
    _SEEN.append(len(problems))
    return []


def test_sft_extra_examples_see_every_part_answered_in_its_own_mode(tmp_path):
    """A mix part with its own answer-only share is made into examples apart from the main
    draw, yet `sft.extra_examples` is given every SFT puzzle, the main draw's and the part's."""
    import ml_collections

    from mapfjax import configfile
    from mapfjax.env.config import default_config
    from mapfjax.rl import recipe

    tiny = configfile.load_module("configs/tiny_model.py")
    c = tiny.trace_stage()
    tiny.quick(c)
    c.workdir, c.out_dir = str(tmp_path / "w"), str(tmp_path / "w" / "export")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 16, 16, 2
    c.sft.exclude = ()  # (the exclusion has its own tests)
    c.sft.answer_only = 0.5
    three = default_config(3, sizes=(4, 5), wait_ratio=0.0)
    c.sft.mix = ml_collections.ConfigDict(
        {"three": {"env": three, "instances": 8, "answer_only": 0.0}}
    )
    c.sft.extra_examples = f"{__name__}:_count_puzzles"
    recipe.check_recipe(c)
    _SEEN.clear()
    data = recipe.prepare(c, tmp_path / "w")
    assert _SEEN == [16 + 8]
    prompts = [data.tokenizer.decode(e.prompt) for e in data.sft]
    assert sum("with 3 agents" in p for p in prompts) == 8


def test_sft_max_completion_tokens_leaves_out_longer_examples(tmp_path):
    from mapfjax import configfile
    from mapfjax.rl import recipe

    c = configfile.get_config("configs/tiny_model.py", "quick")
    c.sft.instances, c.tokenizer.instances, c.validation.per_size = 24, 24, 2
    every = recipe.prepare(c, tmp_path / "w").sft
    cap = sorted(len(e.completion) for e in every)[len(every) // 2]
    c.sft.max_completion_tokens = cap
    recipe.check_recipe(c)
    kept = recipe.prepare(c, tmp_path / "w").sft
    assert kept == [e for e in every if len(e.completion) <= cap] and len(kept) < len(every)
    c.sft.max_completion_tokens = -1
    with pytest.raises(ValueError, match=r"sft\.max_completion_tokens = -1; allowed: 0"):
        recipe.check_recipe(c)
