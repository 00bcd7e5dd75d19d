"""Tests for the shared type checks of user values."""

import math

import numpy as np
import pytest

from mapfjax import checks


@pytest.mark.parametrize("value", [0, -3, 10**30])
def test_ints_pass_both_checks(value):
    assert checks.is_int(value) and checks.is_real(value)


@pytest.mark.parametrize("value", [1.0, 0.5, math.inf])
def test_floats_are_real_but_not_int(value):
    assert checks.is_real(value) and not checks.is_int(value)


@pytest.mark.parametrize("value", [True, False, None, "1", [1], np.int32(1)])
def test_bools_strings_and_numpy_ints_are_neither(value):
    assert not checks.is_int(value) and not checks.is_real(value)


@pytest.mark.parametrize("value", [0, -2.5, 10**300, 1e308])
def test_finite_reals(value):
    assert checks.is_finite_real(value)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400, True, "1", None])
def test_infinite_huge_or_non_numbers_are_not_finite_reals(value):
    assert not checks.is_finite_real(value)


def test_did_you_mean_names_the_closest_allowed_key_or_nothing():
    assert checks.did_you_mean(["hole_ration"], ["data_ratio", "hole_ratio"]) == (
        "; did you mean 'hole_ratio'?"
    )
    assert checks.did_you_mean(["zzz", "wiat_ratio"], ["hole_ratio", "wait_ratio"]) == (
        "; did you mean 'wait_ratio'?"  # the first unknown key with a close match
    )
    assert checks.did_you_mean(["zzz"], ["hole_ratio"]) == ""


def test_env_config_typo_gets_a_suggestion():
    from mapfjax.env.config import ConfigError, default_config, validate

    c = default_config(2, sizes=(3,))
    c.sizes.s3.hole_ration = 0.2
    with pytest.raises(
        ConfigError,
        match=r"sizes.s3: unknown key\(s\) \['hole_ration'\].*did you mean 'hole_ratio'\?",
    ):
        validate(c)
