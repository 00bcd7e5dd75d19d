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
