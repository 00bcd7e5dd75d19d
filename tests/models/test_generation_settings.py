"""A checkpoint's generation settings (thinking, response budget, sampling) in its
generation_config.json: written by `hf.save_pretrained`, read by `hf.generation_settings`, and
chosen by `launch/evaluate.py` unless its flags say otherwise."""

import importlib.util
import json
import sys

import jax.numpy as jnp
import pytest

from mapfjax import configfile
from mapfjax.files import CheckpointError
from mapfjax.models import hf, qwen3

ASSETS = configfile.ROOT / "mapfjax" / "assets"


@pytest.fixture(scope="module")
def tiny_model():
    return qwen3.Qwen3(qwen3.PRESETS["tiny"], dtype=jnp.float32, param_dtype=jnp.float32)


def _write(path, gen: dict):
    path.mkdir(parents=True, exist_ok=True)
    (path / hf.GENERATION_CONFIG).write_text(json.dumps(gen))
    return path


def test_settings_round_trip_through_save_pretrained(tmp_path, tiny_model):
    sampled = hf.GenerationSettings(True, 100, do_sample=True, temperature=0.7, top_p=0.9)
    out = hf.save_pretrained(tiny_model, tmp_path / "sampled", generation=sampled)
    back = hf.generation_settings(out)
    assert back == sampled and back.given == set(hf.GENERATION_KEYS)
    greedy = hf.GenerationSettings(enable_thinking=True, max_new_tokens=640)
    out = hf.save_pretrained(tiny_model, tmp_path / "greedy", generation=greedy)
    written = json.loads((out / hf.GENERATION_CONFIG).read_text())
    assert written == {"enable_thinking": True, "max_new_tokens": 640, "do_sample": False}
    assert hf.generation_settings(out) == greedy
    # Without the keyword the file is what it was (no settings): every default, none given.
    out = hf.save_pretrained(tiny_model, tmp_path / "plain")
    assert json.loads((out / hf.GENERATION_CONFIG).read_text()) == {}
    plain = hf.generation_settings(out)
    assert plain == hf.GenerationSettings() and plain.given == frozenset()
    assert (plain.enable_thinking, plain.max_new_tokens, plain.do_sample) == (False, 512, False)


def test_settings_replace_a_copied_files_decoding_keys_and_keep_the_rest(tmp_path, tiny_model):
    """copy_from carries the source's generation_config.json; the settings replace its
    decoding keys (a base model's sampling, top_k included) and keep its token ids."""
    src = tmp_path / "src"
    hf.save_pretrained(tiny_model, src)
    base = {"eos_token_id": [5, 6], "do_sample": True, "temperature": 0.6, "top_k": 20}
    _write(src, base)
    answer_only = hf.GenerationSettings(max_new_tokens=64)
    out = hf.save_pretrained(tiny_model, tmp_path / "out", copy_from=src, generation=answer_only)
    written = json.loads((out / hf.GENERATION_CONFIG).read_text())
    assert written == {"eos_token_id": [5, 6], **answer_only.to_json()}
    # Callers without the keyword: the source's file, verbatim, as before.
    out = hf.save_pretrained(tiny_model, tmp_path / "copied", copy_from=src)
    assert json.loads((out / hf.GENERATION_CONFIG).read_text()) == base
    assert hf.generation_settings(out).do_sample is True
    with pytest.raises(TypeError, match=r"generation = \{'max_new_tokens': 5\}; allowed: a hf"):
        hf.save_pretrained(tiny_model, tmp_path / "bad", generation={"max_new_tokens": 5})
    assert not (tmp_path / "bad").exists()


def _main_jobs():
    """(variant, config) of configs/tiny_cpu.py's main jobs: the one that thinks and the
    answer-only model's, under whichever variant names the file gives them."""
    module = configfile.load_module("configs/tiny_cpu.py")
    return [(v, module.get_config(v)) for v in ("", "answer_only", "think") if v in module.VARIANTS]


def test_the_shipped_models_carry_the_settings_their_main_jobs_validate_with():
    think = hf.generation_settings(ASSETS / "tiny_think")
    assert (think.enable_thinking, think.max_new_tokens, think.do_sample) == (True, 640, False)
    answer_only = hf.generation_settings(ASSETS / "tiny")
    assert (answer_only.enable_thinking, answer_only.max_new_tokens) == (False, 64)
    assert answer_only.do_sample is False
    seen = set()
    for variant, c in _main_jobs():
        stored = hf.generation_settings(c.model.path)
        want = (c.train.enable_thinking, c.validation.max_new_tokens)
        assert (stored.enable_thinking, stored.max_new_tokens) == want, variant
        seen.add(stored.enable_thinking)
    assert seen == {True, False}  # both shipped models were checked against a job


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("enable_thinking", 1, "true or false"),
        ("enable_thinking", "yes", "true or false"),
        ("max_new_tokens", 0, "an integer >= 1"),
        ("max_new_tokens", 64.5, "an integer >= 1"),
        ("max_new_tokens", True, "an integer >= 1"),
        ("do_sample", "false", "true or false"),
        ("temperature", -0.5, "a finite number >= 0"),
        ("top_p", 0, "a number in (0, 1]"),
        ("top_p", 1.5, "a number in (0, 1]"),
    ],
)
def test_a_bad_value_names_the_file_key_value_and_what_is_allowed(tmp_path, key, value, allowed):
    ckpt = _write(tmp_path / "m", {"bos_token_id": 1, key: value})
    with pytest.raises(CheckpointError) as e:
        hf.generation_settings(ckpt)
    file = ckpt / hf.GENERATION_CONFIG
    assert str(e.value) == f"{file}: key {key!r}: {value!r}; allowed: {allowed}"
    with pytest.raises(ValueError, match=rf"GenerationSettings\.{key} = .*; allowed: "):
        hf.GenerationSettings(**{key: value})


def test_a_malformed_file_and_null_values(tmp_path):
    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / hf.GENERATION_CONFIG).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"m/generation_config\.json: invalid JSON"):
        hf.generation_settings(ckpt)
    (ckpt / hf.GENERATION_CONFIG).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"json: expected a JSON object, got list"):
        hf.generation_settings(ckpt)
    _write(ckpt, {"max_new_tokens": None, "enable_thinking": True})  # null: transformers' unset
    got = hf.generation_settings(ckpt)
    assert (got.max_new_tokens, got.enable_thinking, got.given) == (512, True, {"enable_thinking"})
    with pytest.raises(CheckpointError, match=r"nope: no such checkpoint directory"):
        hf.generation_settings(tmp_path / "nope")


# --- launch/evaluate.py: the checkpoint's settings unless a flag is given --------------------


@pytest.fixture(scope="module")
def evaluate_script():
    """launch/evaluate.py as a module (its flags are defined once per process)."""
    name = "launch_evaluate_script"
    if name not in sys.modules:
        path = configfile.ROOT / "launch" / "evaluate.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def test_evaluate_uses_the_checkpoints_settings_unless_a_flag_is_given(evaluate_script):
    choose = evaluate_script.generation_choice
    think = ASSETS / "tiny_think"
    file = think / hf.GENERATION_CONFIG
    settings, line = choose(str(think))
    assert (settings.enable_thinking, settings.max_new_tokens) == (True, 640)
    assert line == (
        f"generation settings: enable_thinking=True ({file}), max_new_tokens=640 ({file})"
    )
    settings, line = choose(str(think), enable_thinking=False, max_new_tokens=100)
    assert (settings.enable_thinking, settings.max_new_tokens) == (False, 100)
    assert "enable_thinking=False (--noenable_thinking)" in line
    assert "max_new_tokens=100 (--max_new_tokens)" in line
    settings, line = choose(str(ASSETS / "tiny"), max_new_tokens=80)
    assert (settings.enable_thinking, settings.max_new_tokens) == (False, 80)
    assert f"enable_thinking=False ({ASSETS / 'tiny' / hf.GENERATION_CONFIG})" in line


def test_evaluate_names_the_defaults_a_checkpoint_does_not_set(evaluate_script, tmp_path):
    ckpt = _write(tmp_path / "m", {"eos_token_id": 2, "max_new_tokens": 96})
    file = ckpt / hf.GENERATION_CONFIG
    settings, line = evaluate_script.generation_choice(str(ckpt))
    assert (settings.enable_thinking, settings.max_new_tokens) == (False, 96)
    assert line == (
        f"generation settings: enable_thinking=False (default: {file} does not set it), "
        f"max_new_tokens=96 ({file})"
    )
    settings, line = evaluate_script.generation_choice(str(ckpt), enable_thinking=True)
    assert settings.enable_thinking is True and "enable_thinking=True (--enable_thinking)" in line
    _write(ckpt, {"max_new_tokens": -3})
    with pytest.raises(CheckpointError, match=r"key 'max_new_tokens': -3; allowed: an integer"):
        evaluate_script.generation_choice(str(ckpt), max_new_tokens=10)
