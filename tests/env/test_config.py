"""Generator config: validation messages and projection onto the legal space."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mapfjax.env import config as C


def test_default_is_valid_and_uniform():
    cfg = C.default_config()
    C.validate(cfg)
    assert sorted(cfg.sizes.keys(), key=C.key_size) == [f"s{n}" for n in range(3, 11)]
    assert math.isclose(sum(e.data_ratio for e in cfg.sizes.values()), 1.0)


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda c: c.sizes.s5.__setattr__("hole_ratio", 0.7),
            ["sizes.s5.hole_ratio", "0.7", "0.5"],
        ),
        (lambda c: c.sizes.s5.__setattr__("wait_ratio", -0.1), ["sizes.s5.wait_ratio", "-0.1"]),
        (lambda c: c.sizes.s5.__setattr__("data_ratio", 0.9), ["data_ratio", "sum"]),
        (lambda c: c.__setattr__("num_agents", 9), ["num_agents", "9"]),
        (lambda c: c.sizes.s5.__setitem__("colour", 1), ["sizes.s5", "colour"]),
        (lambda c: c.__setitem__("bogus", 1), ["bogus", "allowed"]),
        (lambda c: c.sizes.__setitem__("s12", dict(c.sizes.s3)), ["s12", "max_size"]),
        (lambda c: c.__setattr__("num_agents", True), ["num_agents", "True", "integer"]),
        (lambda c: c.__setattr__("seed", -1), ["seed", "-1", ">= 0"]),
        (lambda c: c.__setattr__("max_size", True), ["max_size", "True"]),
    ],
)
def test_validate_names_key_value_and_allowed(mutate, words):
    cfg = C.default_config()
    with cfg.unlocked():
        mutate(cfg)
    with pytest.raises(C.ConfigError) as e:
        C.validate(cfg)
    for w in words:
        assert w in str(e.value)


def test_project_clips_renormalises_and_reports():
    cur = C.default_config(sizes=(3, 4, 5))
    new, changes = C.project(
        {"sizes.s3.hole_ratio": 0.9, "sizes.s4.wait_ratio": 1.4, "sizes.s5.data_ratio": 2.0}, cur
    )
    assert new.sizes.s3.hole_ratio == 0.5 and new.sizes.s4.wait_ratio == 1.0
    assert math.isclose(sum(e.data_ratio for e in new.sizes.values()), 1.0)
    assert new.sizes.s5.data_ratio > new.sizes.s3.data_ratio
    text = "\n".join(changes)
    assert "sizes.s3.hole_ratio" in text and "renormalised" in text
    assert cur.sizes.s3.hole_ratio == 0.2  # the current config is not mutated


def test_project_accepts_aliases_and_nested():
    cur = C.default_config(sizes=(3, 4))
    new, _ = C.project({"sizes": {"4x4": {"hole_ratio": 0.1}, "3": {"wait_ratio": 0.9}}}, cur)
    assert new.sizes.s4.hole_ratio == 0.1 and new.sizes.s3.wait_ratio == 0.9


@pytest.mark.parametrize(
    "proposal, words",
    [
        ({"seed": 3}, ["seed", "cannot be changed"]),
        ({"reward.valid": 2.0}, ["reward.valid"]),
        ({"sizes.s7.colour": 1}, ["sizes.s7.colour"]),
        ({"sizes.s30.hole_ratio": 0.1}, ["s30"]),
        ({"sizes.s4.hole_ratio": "lots"}, ["lots", "not a number"]),
        ({"sizes.s4.hole_ratio": float("nan")}, ["finite"]),
    ],
)
def test_project_rejects_illegal_keys(proposal, words):
    with pytest.raises(C.ConfigError) as e:
        C.project(proposal, C.default_config())
    for w in words:
        assert w in str(e.value)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([f"sizes.s{n}.{f}" for n in range(3, 11) for f in C.RATIO_FIELDS]),
        st.floats(-5, 5, allow_nan=False),
        max_size=12,
    )
)
def test_projection_always_lands_in_legal_space(proposal):
    new, _ = C.project(proposal, C.default_config())
    C.validate(new)
    for e in new.sizes.values():
        assert 0 <= e.hole_ratio <= 0.5 and 0 <= e.wait_ratio <= 1 and e.data_ratio >= 0


def test_requested_counts_sum_to_n():
    cfg, _ = C.project(
        {"sizes.s3.data_ratio": 0.37, "sizes.s9.wait_ratio": 0.8}, C.default_config()
    )
    counts = C.requested_counts(cfg, 4000)
    assert sum(c for c, _ in counts.values()) == 4000
    assert all(0 <= w <= c for c, w in counts.values())


def test_project_and_validate_agree_on_the_smallest_size():
    # `generate --sizes 2` (validate) works, so the projection must accept s2 too.
    cur = C.default_config(num_agents=2, sizes=(2, 3))
    C.validate(cur)
    new, _ = C.project({"sizes.s2.hole_ratio": 0.1, "sizes.2x2.wait_ratio": 0.0}, cur)
    assert new.sizes.s2.hole_ratio == 0.1
    added, changes = C.project({"sizes.s2.data_ratio": 0.5}, C.default_config(sizes=(3, 4)))
    C.validate(added)
    assert math.isclose(added.sizes.s2.data_ratio, 1 / 3) and "renormalised" in changes[-1]
    for key in ("sizes.s1.data_ratio", "sizes.s0.hole_ratio"):
        with pytest.raises(C.ConfigError, match=rf"map size \d outside \[{C.MIN_SIZE}, max_size"):
            C.project({key: 0.1}, cur)
    with pytest.raises(C.ConfigError, match="too small for 3 agents"):
        C.project({"sizes.s2.data_ratio": 0.1}, C.default_config(num_agents=3, sizes=(3,)))


def test_project_never_overflows():
    cur = C.default_config()
    new, changes = C.project({"sizes.s7.data_ratio": 1e308, "sizes.s8.data_ratio": 1e308}, cur)
    assert new.sizes.s7.data_ratio == new.sizes.s8.data_ratio == 0.5
    assert new.sizes.s3.data_ratio < 1e-300 and "sum of 2.000e+308" in changes[-1]
    tiny, _ = C.project({f"sizes.s{n}.data_ratio": 5e-324 for n in range(3, 11)}, cur)
    assert all(e.data_ratio == 1 / 8 for e in tiny.sizes.values())
    for value in (10**400, -(10**400), "1e400", float("inf")):
        with pytest.raises(C.ConfigError, match="sizes.s7.data_ratio"):
            C.project({"sizes.s7.data_ratio": value}, cur)
    for key in ("sizes.s" + "9" * 5000 + ".data_ratio", "sizes.s\u00b2.data_ratio"):
        with pytest.raises(C.ConfigError, match="not a map size"):
            C.project({key: 0.1}, cur)
