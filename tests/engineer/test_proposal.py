"""Proposal parsing against adversarial text, and projection of the parsed diff."""

import json
import math

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mapfjax.engineer import proposal as P
from mapfjax.env import generate
from mapfjax.env.config import MAX_HOLE_RATIO, ConfigError, default_config, project, validate

CUR = default_config(sizes=(3, 4, 5, 6, 7))


@pytest.mark.parametrize(
    "text, diff",
    [
        ("```yaml\nsizes.s7.data_ratio: 0.05\n```", {"sizes.s7.data_ratio": 0.05}),
        ('```json\n{"sizes.s4.hole_ratio": 0.3}\n```', {"sizes.s4.hole_ratio": 0.3}),
        ('```\n{"sizes": {"s4": {"wait_ratio": 1}}}\n```', {"sizes.s4.wait_ratio": 1.0}),
        (
            "```yaml\nsizes:\n  7x7:\n    hole_ratio: .1  # fewer\n"
            "  s3:\n    wait_ratio: 2e-1\n```",
            {"sizes.s7.hole_ratio": 0.1, "sizes.s3.wait_ratio": 0.2},
        ),
        ("```yml\nenv.sizes.7.data_ratio: 0.2\n```", {"sizes.s7.data_ratio": 0.2}),
        ("```yaml\n- `sizes.s5.hole_ratio`: -1\n```", {"sizes.s5.hole_ratio": -1.0}),
        (
            "I suggest:\n- sizes.s5.hole_ratio: 0.1\n* `env.sizes.s6.wait_ratio` = 0.9\nthanks",
            {"sizes.s5.hole_ratio": 0.1, "sizes.s6.wait_ratio": 0.9},
        ),
        (
            "<think>\n```yaml\nsizes.s3.hole_ratio: 0.5\n```\n</think>\n"
            "```yaml\nsizes.s3.hole_ratio: 0\n```",
            {"sizes.s3.hole_ratio": 0.0},
        ),
        (
            "```yaml\nsizes.s3.hole_ratio: 0.4\n```\nsecond thoughts:\n"
            "```yaml\nsizes.s4.hole_ratio: 0.1\n```",
            {"sizes.s4.hole_ratio": 0.1},
        ),
        (
            "```yaml\nsizes.s3.hole_ratio: 0.4\nsizes.s3.hole_ratio: 0.4\n```",
            {"sizes.s3.hole_ratio": 0.4},
        ),
    ],
)
def test_parses_accepted_forms(text, diff):
    p = P.parse_proposal(text)
    assert P.diff_dict(p.diff) == diff and p.error == ""


def test_summary_and_source():
    p = P.parse_proposal("```json\n{}\n```\n**Summary:** Make 5x5 easier.\n\nignored")
    assert p.summary == "Make 5x5 easier." and p.source == "json block" and p.diff == ()
    assert P.parse_proposal("Summary: a\nsizes.s3.hole_ratio: 0.1").source == "bare lines"


@pytest.mark.parametrize(
    "text, item, reason",
    [
        ("```yaml\nsizes.s7.colour: 0.1\n```", "sizes.s7.colour", "unknown key"),
        ("```yaml\nseed: 3\n```", "seed", "unknown key"),
        ("```yaml\nnum_agents: 5\n```", "num_agents", "unknown key"),
        ("```yaml\nreward.optimal_bonus: 1\n```", "reward", "unknown key"),
        ("```yaml\nsizes.big.hole_ratio: 0.1\n```", "sizes.big", "not a map size"),
        ("```yaml\nsizes.s7.hole_ratio: high\n```", "high", "not a number"),
        ('```yaml\nsizes.s7.hole_ratio: "0.1"\n```', "0.1", "not a number"),
        ("```yaml\nsizes.s7.hole_ratio: 5%\n```", "5%", "not a number"),
        ('```json\n{"sizes.s7.hole_ratio": true}\n```', "True", "not a number"),
        ('```json\n{"sizes.s7.hole_ratio": "0.1"}\n```', "0.1", "not a number"),
        ('```json\n{"sizes.s7.hole_ratio": null}\n```', "None", "not a number"),
        ('```json\n{"sizes.s7.hole_ratio": NaN}\n```', "NaN", "finite"),
        ('```json\n{"sizes.s7.hole_ratio": [0.1]}\n```', "[0.1]", "not a number"),
        ("```yaml\nsizes.s7.hole_ratio: 1e999\n```", "1e999", "finite"),
        ("```json\n[1, 2]\n```", "[1, 2]", "not an object"),
        ("```json\n{broken\n```", "{broken", "invalid JSON"),
        ("```yaml\nsizes.s7.hole_ratio: 0.1\nsizes.s7.hole_ratio: 0.2\n```", "s7", "twice"),
        ('```json\n{"sizes.s7.hole_ratio": 0.1, "sizes.s7.hole_ratio": 0.2}\n```', "s7", "twice"),
        ("```yaml\njust words\n```", "just words", "key: value"),
        ("```python\nimport os\n```", "python", "only yaml or json"),
    ],
)
def test_rejects_with_reason(text, item, reason):
    p = P.parse_proposal(text)
    assert p.diff == ()
    assert p.error
    assert any(item in i and reason in r for i, r in p.rejected), p.rejected


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "no ```yaml"),
        ("I would make it harder.", "no ```yaml"),
        ("<think>sizes.s3.hole_ratio: 0.1 and then", "inside <think>"),
        ("```yaml\nsizes.s3.hole_ratio: 0.1\nsizes.s4.hole", "no ```yaml"),
        ("```yaml\n```", "empty"),
    ],
)
def test_nothing_usable_says_why(text, words):
    p = P.parse_proposal(text)
    assert p.diff == () and words in p.error
    d = P.apply_proposal(p, CUR, "t")
    assert d.kept_current and words in d.reason and d.config.to_dict() == CUR.to_dict()


def test_too_many_edits_rejects_the_rewrite():
    lines = [f"sizes.s{n}.{f}: 0.1" for n in (3, 4, 5) for f in ("hole_ratio", "wait_ratio")]
    text = "```yaml\n" + "\n".join(lines + ["sizes.s6.hole_ratio: 0.1"]) + "\n```"
    assert P.parse_proposal(text, max_edits=7).diff
    p = P.parse_proposal(text, max_edits=6)
    assert p.diff == () and "too many edits (7 > 6)" in p.error


def test_not_text_and_endless_text():
    assert "not text" in P.parse_proposal(None).error
    p = P.parse_proposal("sizes.s3.hole_ratio: 0.1\n" + "x" * (P.MAX_CHARS + 10))
    assert p.diff == (P.Edit(3, "hole_ratio", 0.1),)
    assert ("<answer>", f"cut at {P.MAX_CHARS} of its {P.MAX_CHARS + 35} characters") in p.rejected
    assert "unparseable" not in P.parse_proposal("```json\n" + "[" * 50_000 + "\n```").error


KEYS = ["sizes.s3.hole_ratio", "env.sizes.7x7.data_ratio", "sizes.4.wait_ratio", "seed"]
FRAGMENTS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["```yaml\n", "```json\n", "```\n", "\n```\n", "<think>", "</think>", "Summary: ", "{", "}"]
    ),
    st.builds(
        lambda k, v, sep: f"{k}{sep}{v}\n",
        st.sampled_from(KEYS + ["sizes.s99.hole_ratio", "sizes.s2.data_ratio", "sizes:"]),
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True).map(repr),
            st.integers(-(10**30), 10**30).map(str),
            st.sampled_from(["", "x", "true", "null", "[1]", "1e400", "-0.0", ".5"]),
        ),
        st.sampled_from([": ", " = ", ":", ":\n  "]),
    ),
)


def check_decision(p, d):
    for e in p.diff:
        assert P.parse_key(e.key) == (e.size, e.field) and math.isfinite(e.value)
    validate(d.config)
    assert d.config.num_agents == CUR.num_agents and d.config.seed == CUR.seed
    assert d.config.oracle.to_dict() == CUR.oracle.to_dict()
    for e in d.config.sizes.values():
        assert 0 <= e.hole_ratio <= MAX_HOLE_RATIO and 0 <= e.wait_ratio <= 1
    assert math.isclose(sum(e.data_ratio for e in d.config.sizes.values()), 1.0)
    assert d.kept_current == (d.config.to_dict() == CUR.to_dict())
    assert d.kept_current == bool(d.reason)


@settings(max_examples=300, deadline=None)
@given(st.lists(FRAGMENTS, max_size=12).map("".join))
def test_adversarial_text_never_raises_and_stays_legal(text):
    p = P.parse_proposal(text)
    check_decision(p, P.apply_proposal(p, CUR, "t"))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises(text):
    p = P.parse_proposal(text)
    check_decision(p, P.apply_proposal(p, CUR, "t"))


DIFFS = st.dictionaries(
    st.builds(
        lambda n, f: f"sizes.s{n}.{f}",
        st.integers(3, 7),
        st.sampled_from(["data_ratio", "hole_ratio", "wait_ratio"]),
    ),
    st.floats(-2, 2, allow_nan=False),
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(
    DIFFS,
    st.text(st.characters(blacklist_characters="`\n"), max_size=40).filter(
        lambda t: not t.lstrip().startswith(("**", "__"))  # bold closing the `Summary:` label
    ),
)
def test_format_parse_round_trip_and_projection(mapping, summary):
    diff = P.edits_from_dict(mapping)
    p = P.parse_proposal(P.format_diff(diff, summary))
    assert p.diff == diff and P.diff_dict(p.diff) == mapping
    assert p.summary == " ".join(summary.split())
    d = P.apply_proposal(p, CUR, "t")
    if diff:
        full, _ = P.complete_data_ratios(diff, CUR)
        expected, changes = project(P.diff_dict(full), CUR)
        assert d.config.to_dict() == expected.to_dict()
        assert set(changes) <= set(d.changes)


def test_set_data_ratios_are_kept_and_others_scaled():
    p = P.parse_proposal("```yaml\nsizes.s7.data_ratio: 0.4\nsizes.s3.data_ratio: 0.1\n```")
    d = P.apply_proposal(p, CUR, "t")
    s = d.config.sizes
    assert math.isclose(s.s7.data_ratio, 0.4) and math.isclose(s.s3.data_ratio, 0.1)
    # 4x4, 5x5, 6x6 shared 0.6 of the data and now share 0.5, in the same proportions.
    for k in ("s4", "s5", "s6"):
        assert math.isclose(s[k].data_ratio, 0.5 / 3)
    assert any("scaled" in c for c in d.changes)
    assert CUR.sizes.s7.data_ratio == 0.2  # the current config is not mutated


def test_illegal_sizes_are_dropped_others_applied():
    text = (
        "```yaml\nsizes.s11.hole_ratio: 0.1\nsizes.s1.wait_ratio: 0.1\n"
        "sizes.s4.hole_ratio: 0.9\n```"
    )
    d = P.apply_proposal(P.parse_proposal(text), CUR, "t")
    assert d.diff == (P.Edit(4, "hole_ratio", 0.9),)
    assert d.config.sizes.s4.hole_ratio == 0.5 and "s11" not in d.config.sizes
    reasons = dict(d.rejected)
    assert "outside" in reasons["sizes.s11.hole_ratio: 0.1"]
    assert "outside" in reasons["sizes.s1.wait_ratio: 0.1"]
    assert any("clipped" in c for c in d.changes)
    with pytest.raises(ConfigError):
        project({"sizes.s11.hole_ratio": 0.1}, CUR)


def test_new_size_and_no_op_diff():
    d = P.apply_proposal(P.parse_proposal("sizes.s9.data_ratio: 0.1"), CUR, "t")
    assert math.isclose(d.config.sizes.s9.data_ratio, 0.1) and not d.kept_current
    same = P.apply_proposal(P.parse_proposal("sizes.s3.hole_ratio: 0.2"), CUR, "t")
    assert same.kept_current and "unchanged" in same.reason


def test_generator_achieves_the_projected_config():
    cur = default_config(sizes=(3, 4, 5))
    cur.oracle.processes = 1
    text = "sizes.s3.data_ratio: 0.5\nsizes.s4.hole_ratio: 0.3\nsizes.s3.wait_ratio: 0.5"
    d = P.apply_proposal(P.parse_proposal(text), cur, "t")
    problems = generate(jax.random.key(0), d.config, 24).problems
    # By hand: 24 x (0.5, 0.25, 0.25) instances; round(ratio x area) holes; round(n x wait).
    expected = {3: (12, 2, 6), 4: (6, 5, 2), 5: (6, 5, 2)}
    for size, (n, holes, waits) in expected.items():
        got = [p for p in problems if p.height == size]
        assert len(got) == n
        assert all(sum(row.count("H") for row in p.grid) == holes for p in got)
        assert sum(bool(p.needs_wait) for p in got) == waits


def test_decision_json_round_trip():
    text = "sizes.s3.hole_ratio: 0.3\nenv.sizes.4x4.data_ratio: 0.5\nSummary: x"
    d = P.apply_proposal(P.parse_proposal(text), CUR, "e", prompt="PROMPT", k=1)
    assert d.diff == (P.Edit(3, "hole_ratio", 0.3), P.Edit(4, "data_ratio", 0.5))
    stored = json.loads(json.dumps(d.to_dict()))
    # decision.json keeps the readable {dotted key: value} form.
    assert stored["diff"] == {"sizes.s3.hole_ratio": 0.3, "sizes.s4.data_ratio": 0.5}
    back = P.Decision.from_dict(stored)
    assert back == d and back.prompt == "PROMPT" and back.extra == {"k": 1}
    assert back.config.sizes.s3.hole_ratio == 0.3
    # Text -> Edits -> text -> Edits.
    assert P.parse_proposal(P.format_diff(d.diff)).diff == d.diff
    assert P.edits_from_dict(P.diff_dict(d.diff)) == d.diff
    old = {k: v for k, v in stored.items() if k != "prompt"}  # written before `prompt` existed
    assert P.Decision.from_dict(old).prompt == ""
    with pytest.raises(ValueError, match="'seed'.*allowed"):
        P.edits_from_dict({"seed": 1})


def test_a_whole_data_distribution_is_one_edit():
    data = [f"sizes.s{n}.data_ratio: {0.05 * (n - 2)}" for n in range(3, 11)]  # 8 sizes
    holes = [f"sizes.s{n}.hole_ratio: 0.1" for n in range(3, 8)]  # 5 sizes
    p = P.parse_proposal("```yaml\n" + "\n".join(data + holes) + "\n```", max_edits=6)
    assert p.error == "" and len(p.diff) == 13 and P.count_edits(p.diff) == 6
    cur = default_config()
    d = P.apply_proposal(p, cur, "t")
    assert not d.kept_current
    total = sum(0.05 * (n - 2) for n in range(3, 11))
    for n in range(3, 11):
        assert math.isclose(d.config.sizes[f"s{n}"].data_ratio, 0.05 * (n - 2) / total)
    one_more = P.parse_proposal("\n".join(data + holes + ["sizes.s9.wait_ratio: 0.5"]))
    assert one_more.diff == () and "too many edits (7 > 6)" in one_more.error


def test_overflowing_data_ratios_are_projected_not_raised():
    # Two ratios of 1e308 used to overflow the sum and leave every ratio 0 (ConfigError).
    text = "```yaml\nsizes.s6.data_ratio: 1e308\nsizes.s7.data_ratio: 1e308\n```"
    d = P.apply_proposal(P.parse_proposal(text), CUR, "t")
    check_decision(P.parse_proposal(text), d)
    assert d.config.sizes.s6.data_ratio == d.config.sizes.s7.data_ratio == 0.5
    assert any("2.000e+308" in c for c in d.changes)


def test_huge_integer_is_rejected_with_reason():
    # 10**400 does not fit a float: project raised OverflowError.
    with pytest.raises(ConfigError, match="401 digits"):
        project({"sizes.s7.data_ratio": 10**400}, CUR)
    d = P.apply_proposal(P.Proposal("raw", (P.Edit(7, "data_ratio", 10**400),)), CUR, "t")
    assert d.kept_current and "401 digits" in d.reason and d.config.to_dict() == CUR.to_dict()


def test_unprojectable_diff_keeps_the_config_and_says_why(monkeypatch):
    real = P.project_edits

    def fails_on_whole_diffs(edits, current):
        if len(edits) > 1:
            raise ConfigError("sizes.*.data_ratio sums to 0; allowed: a sum of 1")
        return real(edits, current)

    monkeypatch.setattr(P, "project_edits", fails_on_whole_diffs)
    text = "sizes.s3.hole_ratio: 0.3\nsizes.s4.data_ratio: 0.5"
    d = P.apply_proposal(P.parse_proposal(text), CUR, "t")
    assert d.kept_current and "cannot be projected" in d.reason and "sums to 0" in d.reason
    assert d.config.to_dict() == CUR.to_dict() and d.rejected[-1][0] == "<diff>"


def test_engineers_survive_an_unprojectable_answer():
    from mapfjax.engineer import engineers

    text = "```yaml\nsizes.s6.data_ratio: 1e308\nsizes.s7.data_ratio: 1e308\n```"
    e = engineers.PolicyEngineer(generate_fn=lambda prompts, n: [text] * n, mode="free")
    d = e.propose("context", CUR, 0)
    validate(d.config)


EXTREME = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**400), 10**400),
    st.sampled_from([1e308, -1e308, 5e-324, 1.7976931348623157e308, 10**400, 0, -0.0]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.integers(0, 12), st.sampled_from(["data_ratio", "hole_ratio", "wait_ratio"])),
        EXTREME,
        max_size=8,
    )
)
def test_apply_proposal_never_raises_on_extreme_values(diff):
    edits = tuple(P.Edit(n, f, v) for (n, f), v in diff.items())
    d = P.apply_proposal(P.Proposal("raw", edits), CUR, "t")
    validate(d.config)
    for e in d.config.sizes.values():
        assert 0 <= e.hole_ratio <= MAX_HOLE_RATIO and 0 <= e.wait_ratio <= 1
    assert d.kept_current == (d.config.to_dict() == CUR.to_dict())
    assert d.kept_current == bool(d.reason)
    finite = tuple(e for e in edits if isinstance(e.value, float) and math.isfinite(e.value))
    p = P.parse_proposal(P.format_diff(finite), max_edits=len(finite))  # the same via text
    check_decision(p, P.apply_proposal(p, CUR, "t"))


def test_a_huge_reply_is_stored_as_far_as_it_is_read_with_its_full_length():
    from mapfjax.engineer import proposal as prop
    from mapfjax.env.config import default_config

    reply = "sizes.s3.hole_ratio: 0.3\n" + "x" * 10_000_000
    p = prop.parse_proposal(reply)
    assert len(p.raw) == prop.MAX_CHARS
    assert ("<answer>", f"cut at {prop.MAX_CHARS} of its {len(reply)} characters") in p.rejected
    d = prop.apply_proposal(p, default_config(2), "api")
    assert len(d.to_dict()["raw"]) == prop.MAX_CHARS and not d.kept_current
