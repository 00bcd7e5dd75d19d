"""Context modules: failure breakdown counts, round records, variant contents, determinism."""

import dataclasses
import json
from pathlib import Path

import pytest

from mapfjax import configfile
from mapfjax.engineer import context as C
from mapfjax.engineer.prompt import build_prompt
from mapfjax.engineer.proposal import Edit, parse_proposal
from mapfjax.env.config import default_config

VARIANTS_FILE = Path(__file__).parents[2] / "configs" / "engineer" / "variants.py"


def load_variant(name):
    return configfile.get_config(VARIANTS_FILE, name)


def row(size, failure=None, optimal=False, tokens=100, truncated=False):
    return {
        "id": f"x{size}",
        "size": size,
        "num_agents": 2,
        "valid": failure is None,
        "optimal": optimal,
        "failure": failure,
        "response_tokens": tokens,
        "truncated": truncated,
    }


ROWS = [
    row(3, optimal=True, tokens=10),
    row(3, tokens=20),
    row(3, "hole", tokens=30),
    row(3, "hole", tokens=40),
    row(5, "parse_error", tokens=1000, truncated=True),
    row(5, "edge_conflict", tokens=200),
]


def test_failure_breakdown_counts_by_hand():
    b = C.failure_breakdown(ROWS)
    assert list(b) == ["s3", "s5"]
    zero = {
        "parse_error": 0,
        "illegal_move": 0,
        "hole": 0,
        "vertex_conflict": 0,
        "edge_conflict": 0,
        "goal_not_reached": 0,
    }
    assert b["s3"] == {
        "n": 4,
        "valid": 2,
        "optimal": 1,
        "failures": {**zero, "hole": 2},
        "truncated": 0,
        "tokens": 100,
        "tokens_n": 4,
    }
    assert b["s5"]["failures"] == {**zero, "parse_error": 1, "edge_conflict": 1}
    assert (b["s5"]["valid"], b["s5"]["truncated"], b["s5"]["tokens"]) == (0, 1, 1200)
    table = C.render_breakdown(b)
    # s3: valid 2/4, optimal 1/4, holes 2 (50%), mean tokens 25; all: 2/6 valid.
    assert "| s3 (3x3) | 4 | 50.0 | 25.0 | 0 | 0 | 2 (50%) | 0 | 0 | 0 | 25 | 0 |" in table
    assert "| all | 6 | 33.3 | 16.7 |" in table
    assert "| s5 (5x5) | 2 | 0.0 | 0.0 | 1 (50%) |" in table


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"size": 3, "valid": True, "optimal": False}, ["row 1", "failure"]),
        ({**row(3, "hole"), "failure": "lava"}, ["row 1", "lava", "goal_not_reached"]),
        ({**row(3), "valid": False, "failure": None}, ["row 1", "None"]),
        ({**row(3), "failure": "hole", "valid": True}, ["row 1", "valid"]),
        ({**row(3, "hole"), "optimal": True}, ["row 1", "optimal"]),
    ],
)
def test_failure_breakdown_rejects_bad_rows(bad, words):
    with pytest.raises(ValueError) as e:
        C.failure_breakdown([row(4), bad])
    for w in words:
        assert w in str(e.value)


def test_wait_breakdown_splits_labelled_rows_by_hand():
    labels = [True, False, True, None, False, True]  # ROWS in order; the 4th is unlabelled
    split = C.wait_breakdown([r | {"needs_wait": w} for r, w in zip(ROWS, labels)])
    assert list(split) == ["needs_wait", "no_wait"]
    # needs a wait: row 0 (valid, optimal), row 2 (hole), row 5 (edge_conflict).
    w, o = split["needs_wait"], split["no_wait"]
    assert (w["n"], w["valid"], w["optimal"], w["tokens"]) == (3, 1, 1, 240)
    assert w["failures"]["hole"] == 1 and w["failures"]["edge_conflict"] == 1
    # needs none: row 1 (valid), row 4 (parse error, truncated).
    assert (o["n"], o["valid"], o["truncated"], o["failures"]["parse_error"]) == (2, 1, 1, 1)
    table = C.render_wait_split(split)
    # 3 failures in all: 2 on puzzles that need a wait (67 %), 1 on the others (33 %).
    assert "| needs a wait | 3 | 33.3 | 33.3 |" in table and "| 80 | 0 | 67 |\n" in table
    assert "| needs none | 2 | 50.0 | 0.0 | 1 (50%) |" in table
    assert table.endswith("| 510 | 50 | 33 |")
    # Unlabelled rows (older validation files) give no split; one half alone is kept alone.
    assert C.wait_breakdown(ROWS) == {}
    assert list(C.wait_breakdown([ROWS[0] | {"needs_wait": False}])) == ["no_wait"]
    with pytest.raises(ValueError, match="row 1.*lava"):
        C.wait_breakdown([row(3), {**row(3, "hole"), "failure": "lava", "needs_wait": True}])


def test_wait_split_is_recorded_and_shown_only_in_v6_wait():
    labels = [True, False, True, False, False, True]
    rows = [r | {"needs_wait": w} for r, w in zip(ROWS, labels)]
    cfg = default_config(sizes=(3, 4, 5))
    r = C.RoundRecord(
        1, cfg.to_dict(), C.failure_breakdown(rows), wait_split=C.wait_breakdown(rows)
    )
    assert C.RoundRecord.from_json(r.to_json()) == r
    old = {k: v for k, v in r.to_dict().items() if k != "wait_split"}  # an older record
    assert C.RoundRecord.from_dict(old).wait_split == {}
    plain = C.build_context([r], cfg, load_variant("V6").modules)
    shown = C.build_context([r], cfg, load_variant("V6_wait").modules)
    assert "needs a wait" not in plain and "| needs a wait | 3 |" in shown
    assert shown.replace(sections(shown)["Failure breakdown"], "") == plain.replace(
        sections(plain)["Failure breakdown"], ""
    )  # only F differs
    # V6's modules config is as it was (runs recorded before V6_wait compare equal).
    assert "wait_split" not in load_variant("V6").modules.F
    # V6_wait on a record without a split shows F as V6 does.
    assert (
        C.build_context([C.RoundRecord.from_dict(old)], cfg, load_variant("V6_wait").modules)
        == plain
    )
    with pytest.raises(ValueError, match="modules.F.wait_split = 'yes'"):
        C.check_modules({"F": {"enabled": True, "wait_split": "yes"}})


def record(n, hole=0.2, summary="", training=None):
    cfg = default_config(sizes=(3, 4, 5), hole_ratio=hole)
    return C.RoundRecord(n, cfg.to_dict(), C.failure_breakdown(ROWS), summary, training or {})


def test_round_record_json_round_trip():
    r = record(2, summary="more 5x5", training={"round": 2, "epoch": 2, "opt": {"lr": 1e-6}})
    text = r.to_json()
    back = C.RoundRecord.from_json(text)
    assert back == r
    assert json.loads(text)["validation"]["s3"]["failures"]["hole"] == 2
    with pytest.raises(ValueError, match="colour"):
        C.RoundRecord.from_dict({**r.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="validation"):
        C.RoundRecord.from_dict({"round": 0, "config": {}})


# The paper's ablation ladder (docs/paper.md section 4), read cumulatively.
EXPECTED = {
    "V1": {"F"},
    "V2": {"F", "G"},
    "V3": {"F", "G", "H"},
    "V4": {"F", "G", "H"},
    "V5": {"F", "G", "H", "S"},
    "V6": {"F", "G", "H", "S", "T"},
    "V6_full_T": {"F", "G", "H", "S", "T"},
    "V6_wait": {"F", "G", "H", "S", "T"},
}


def records3():
    return [
        record(0, hole=0.123, training={"round": 0, "epoch": 2, "learning_rate": 1e-6}),
        record(1, hole=0.25, summary="I lowered holes.", training={"round": 1, "epoch": 2}),
        record(2, hole=0.3, summary="PREVIOUS-SUMMARY", training={"round": 2, "epoch": 4}),
    ]


def sections(text):
    return {
        part.split("\n", 1)[0]: part.split("\n", 1)[1] if "\n" in part else ""
        for part in ("\n" + text).split("\n## ")[1:]
    }


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_variant_context_contains_exactly_its_modules(variant):
    cfg = load_variant(variant)
    text = C.build_context(records3(), default_config(sizes=(3, 4, 5)), cfg.modules)
    for name, module in C.MODULES.items():
        assert (module.header in text) == (name in EXPECTED[variant]), (variant, name)
    assert C.CURRENT_HEADER in text
    assert set(C.enabled_modules(cfg.modules)) == EXPECTED[variant]
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(heads) == len(EXPECTED[variant]) + 1


def test_unknown_variant_names_the_allowed_ones():
    with pytest.raises(ValueError, match="V7.*V6"):
        load_variant("V7")


def test_history_with_and_without_the_default_round():
    recs, cur = records3(), default_config(sizes=(3, 4, 5))
    with_default = sections(C.build_context(recs, cur, load_variant("V3").modules))
    without = sections(C.build_context(recs, cur, load_variant("V4").modules))
    h = "History of earlier rounds"
    assert "0.123" in with_default[h] and "| 0 | s3 (3x3)" in with_default[h]
    assert "0.123" not in without[h] and "\n| 0 | s" not in without[h]
    assert "| 1 | s3 (3x3) | 0.333 | 0.25 |" in without[h] and "| 2 |" in without[h]


def test_summary_training_and_failures_sections():
    recs, cur = records3(), default_config(sizes=(3, 4, 5))
    s6 = sections(C.build_context(recs, cur, load_variant("V6").modules))
    full = sections(C.build_context(recs[:1], cur, load_variant("V6_full_T").modules))
    assert s6["Your summary from the previous round"].strip() == "PREVIOUS-SUMMARY"
    assert "- epoch: 4" in s6["Training progress"] and "round 3" in s6["Training progress"]
    assert "learning_rate" not in s6["Training progress"]
    assert "- learning_rate: 1e-06" in full["Training progress"]
    assert "Validation after round 2" in s6["Failure breakdown"]
    guideline = (VARIANTS_FILE.parent / "guideline.md").read_text().strip()
    assert s6["Guideline"].strip() == guideline


ROLLOUTS = {
    "sizes": {
        "3": {
            "groups": 4,
            "samples": 32,
            "valid_rate": 0.75,
            "mixed_groups": 0.5,
            "learnability": 0.125,
            "mean_abs_advantage": 0.4,
        },
        "5x5": {
            "groups": 2,
            "samples": 16,
            "valid_rate": 0.0625,
            "mixed_groups": 0.5,
            "learnability": 0.0586,
            "mean_abs_advantage": 0.25,
        },
        "6": {"groups": 0, "samples": 0},  # incomplete: left out
    }
}


def test_rollouts_are_stored_read_and_shown_in_module_f():
    r = dataclasses.replace(record(1), rollouts=ROLLOUTS)
    assert C.RoundRecord.from_json(r.to_json()) == r
    old = {k: v for k, v in r.to_dict().items() if k != "rollouts"}  # an older record
    assert C.RoundRecord.from_dict(old).rollouts == {}
    assert list(C.rollout_stats(r)) == ["s3", "s5"]
    sig = C.size_signals(r)
    assert sig["s3"] == C.SizeSignal(0.75, 0.125, 0.4, 32, "rollouts") and "s4" not in sig
    # Without rollouts: the validation rate p, p(1-p) and 2 sqrt(p(1-p)).
    fallback = C.size_signals(record(1))["s3"]
    assert fallback == C.SizeSignal(0.5, 0.25, 1.0, 4, "validation")
    f = sections(C.build_context([r], default_config(sizes=(3, 4, 5)), {"F": True}))
    text = f["Failure breakdown"]
    assert "Validation after round 1" in text and "Training rollouts of round 1" in text
    assert "| size | groups | samples | valid % | mixed groups % | p(1-p) | mean |A| |" in text
    assert "| s3 (3x3) | 4 | 32 | 75.0 | 50 | 0.125 | 0.400 |" in text
    assert "| s5 (5x5) | 2 | 16 | 6.2 | 50 | 0.059 | 0.250 |" in text
    plain = sections(C.build_context([record(1)], default_config(sizes=(3, 4, 5)), {"F": True}))
    assert "Training rollouts" not in plain["Failure breakdown"]


def test_empty_records_and_determinism():
    cur = default_config(sizes=(3, 4))
    text = C.build_context([], cur, load_variant("V6").modules)
    assert "No validation results yet." in text and "Training has not started yet." in text
    recs = records3()
    a = C.build_context(recs, cur, load_variant("V6").modules)
    shuffled = [
        C.RoundRecord.from_dict(json.loads(json.dumps(r.to_dict(), sort_keys=True))) for r in recs
    ]
    # Reversed dict insertion order of the modules config must not change the text.
    mods = load_variant("V6").modules.to_dict()
    assert C.build_context(shuffled, cur, dict(reversed(list(mods.items())))) == a


def test_bad_module_configs_name_the_key():
    mods = load_variant("V6").modules.to_dict()
    with pytest.raises(ValueError, match="X.*allowed"):
        C.build_context([], default_config(), {**mods, "X": {"enabled": True}})
    with pytest.raises(ValueError, match="modules.T.detail.*verbose"):
        C.build_context([], default_config(), {**mods, "T": {"enabled": True, "detail": "verbose"}})
    with pytest.raises(ValueError, match="nope.md"):
        C.build_context([], default_config(), {"G": {"enabled": True, "path": "/nope/nope.md"}})
    with pytest.raises(ValueError, match="modules.H.*colour"):
        C.build_context([], default_config(), {"H": {"enabled": True, "colour": 1}})


def test_prompt_has_rules_context_schema_and_a_parseable_example():
    cur = default_config(sizes=(3, 4, 5))
    ctx = C.build_context(records3(), cur, load_variant("V6").modules)
    p = build_prompt(ctx, cur, max_edits=4)
    assert ctx.strip() in p
    assert "sizes.s<N>.<field>" in p and "[0, 0.5]" in p and "At most 4 edits" in p
    assert "current sizes: s3, s4, s5" in p and "Summary:" in p
    example = p.split("# Answer format", 1)[1]
    parsed = parse_proposal(example)
    assert parsed.diff == (Edit(6, "data_ratio", 0.15), Edit(6, "wait_ratio", 0.4))
    assert parsed.summary.startswith("6x6 has a learnable")
