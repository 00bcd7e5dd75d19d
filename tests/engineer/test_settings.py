"""The loop's per-section settings objects: defaults filled in, a bad value or an unknown key
refused naming the key, the value and what is allowed."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "configs"))
import tiny_cpu  # noqa: E402

from mapfjax.engineer.settings import EngineerSettings, ValidationSettings  # noqa: E402


def test_validation_settings_hold_the_section_and_its_defaults():
    c = tiny_cpu.get_config("smoke")
    v = ValidationSettings.from_config(c)
    assert (v.sizes, v.per_size, v.samples, v.max_size) == ((3, 4, 5), 2, 2, c.env.max_size)
    del c.validation.samples, c.validation.hole_ratios
    v = ValidationSettings.from_config(c)
    assert v.samples == 0 and v.hole_ratios == ()
    gen = v.generator_config()
    assert sorted(gen.sizes) == ["s3", "s4", "s5"] and gen.sizes.s4.wait_ratio == 0.5


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("batch_size", 0, r"validation\.batch_size = 0; allowed: an integer >= 1"),
        ("num_agents", 9, r"validation\.num_agents = 9; allowed: 1 to 5"),
        ("wait_ratio", 2.0, r"validation\.wait_ratio = 2\.0; allowed: \[0, 1\]"),
        ("sizes", (3, 99), r"validation\.sizes = \(3, 99\); allowed: map sizes in"),
        ("extra_seeds", (5, 5), r"validation\.extra_seeds = \(5, 5\); allowed: distinct"),
        ("extra_seeds", (-1,), r"validation\.extra_seeds = \(-1,\); allowed: distinct"),
        ("bucket", "x9", r"validation\.bucket = 'x9'; allowed: one of 'pow2', 'pow2_mid'"),
        ("seeed", 1, r"validation: unknown key\(s\) = \['seeed'\]; allowed: \['num_agents'"),
    ],
)
def test_validation_settings_refuse_a_bad_value_naming_it(key, value, message):
    c = tiny_cpu.get_config("smoke")
    c.validation[key] = value
    with pytest.raises(ValueError, match=message):
        ValidationSettings.from_config(c)


def test_a_missing_validation_key_is_named():
    c = tiny_cpu.get_config("smoke")
    del c.validation.max_new_tokens
    with pytest.raises(ValueError, match=r"validation\.max_new_tokens = None; allowed"):
        ValidationSettings.from_config(c)


def test_engineer_settings_defaults_and_refusals():
    e = tiny_cpu.engineer_settings("fixed", "V6")
    s = EngineerSettings.from_config(e)
    assert (s.name, s.variant, s.max_new_tokens, s.temperature) == ("fixed", "V6", 128, 0.7)
    del e.max_new_tokens, e.temperature, e.variant
    s = EngineerSettings.from_config(e)
    assert (s.variant, s.max_new_tokens, s.temperature) == (None, 1, 0.0)
    e.temperature = float("nan")
    with pytest.raises(ValueError, match=r"engineer\.temperature = nan; allowed: a number >= 0"):
        EngineerSettings.from_config(e)
    e.temperature, e.modelz = 0.0, "x"
    with pytest.raises(ValueError, match=r"engineer: unknown key\(s\) = \['modelz'\]"):
        EngineerSettings.from_config(e)


def test_check_config_refuses_an_unknown_attention_impl():
    from mapfjax.engineer.settings import check_config

    c = tiny_cpu.get_config("smoke")
    c.model.attention_impl = "fused"
    check_config(c)
    c.model.attention_impl = "flash"
    with pytest.raises(ValueError, match=r"model\.attention_impl = 'flash'; allowed: 'einsum'"):
        check_config(c)


def test_a_resumed_run_may_change_attention_impl_only(tmp_path):
    from mapfjax.engineer import rundir

    c = tiny_cpu.get_config("smoke")
    rundir.check_run_dir(tmp_path, c)  # records run_config.json
    c.model.attention_impl = "fused"
    rundir.check_run_dir(tmp_path, c)
    c.train.group_size = 2
    with pytest.raises(rundir.RunDirError, match="train.group_size"):
        rundir.check_run_dir(tmp_path, c)
