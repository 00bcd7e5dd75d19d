"""The go / no-go gate on hand-made run directories: each criterion holds or fails on its own,
the figures are the paired differences over the same puzzles, and runs that do not share a
start or a held-out set are refused."""

import json

import numpy as np
import pytest

from mapfjax import stats
from mapfjax.eval import gate


def _write(run, label, valid, failures=None):
    d = run / label
    d.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": f"p{i}", "valid": bool(v), "failure": (failures or {}).get(i)}
        for i, v in enumerate(valid)
    ]
    (d / "validation.json").write_text(json.dumps({"rows": rows}))
    if label != "start":
        (d / "record.json").write_text("{}")


def _runs(tmp_path, start, matched, mismatched, failures=None):
    out = []
    for name, end in [("matched", matched), ("mismatched", mismatched)]:
        _write(tmp_path / name, "start", start, failures)
        _write(tmp_path / name, "round_0", end)
        out.append(tmp_path / name)
    return out


def _draw(rate, n=400, seed=0):
    return np.random.default_rng(seed).random(n) < rate


def test_go_when_every_criterion_holds(tmp_path):
    start = _draw(0.3, seed=1)
    matched = start | _draw(0.15, seed=2)  # only gains: about +10 points
    runs = _runs(tmp_path, start, matched, start)
    criteria, rows, _ = gate.evaluate(*runs)
    assert [c.passed for c in criteria] == [True, True, True]
    want = stats.paired_proportion_difference(list(matched), list(start))
    assert criteria[1].measured.startswith(f"+{stats.percent(want.value)} [")
    assert rows[1][1].startswith(stats.percent(matched.mean()))
    assert gate.markdown(criteria, rows, [], 400).startswith("**GO** (400 held-out")


def test_each_criterion_fails_on_its_own(tmp_path):
    start = _draw(0.3, seed=1)
    gain = start | _draw(0.15, seed=2)
    # The start does not parse on 10 % of the puzzles.
    failures = {i: gate.PARSE_ERROR for i in range(40)}
    criteria, _, _ = gate.evaluate(*_runs(tmp_path / "a", start, gain, start, failures))
    assert [c.passed for c in criteria] == [False, True, True]
    # A gain of about 2 points: its interval may include 0, and it is below 5 points.
    small = start | _draw(0.03, seed=3)
    criteria, rows, _ = gate.evaluate(*_runs(tmp_path / "b", start, small, start))
    assert not criteria[1].passed
    assert "NO-GO" in gate.markdown(criteria, rows, [], 400)
    # The mismatched run gains as much: what it trained on did not matter.
    criteria, _, _ = gate.evaluate(*_runs(tmp_path / "c", start, gain, gain))
    assert [c.passed for c in criteria] == [True, True, False]


def test_reference_is_reported_not_gated(tmp_path):
    start = _draw(0.3, seed=1)
    runs = _runs(tmp_path, start, start | _draw(0.15, seed=2), start)
    _write(tmp_path / "shipped", "start", _draw(0.4, seed=4))
    criteria, rows, notes = gate.evaluate(*runs, reference=tmp_path / "shipped")
    assert len(criteria) == 3 and rows[-1][0] == "reference (shipped start)"
    assert notes and "against the reference" in notes[0]


def test_runs_must_share_start_and_puzzles(tmp_path):
    start = _draw(0.3, seed=1)
    a, b = _runs(tmp_path, start, start, start)
    _write(b, "start", ~start)
    with pytest.raises(ValueError, match="do not start from the same policy"):
        gate.evaluate(a, b)
    _write(b, "start", start[:300])
    with pytest.raises(ValueError, match="other puzzles"):
        gate.evaluate(a, b)
    with pytest.raises(ValueError, match="no finished round"):
        gate.evaluate(a, tmp_path / "missing")
    with pytest.raises(ValueError, match="no start/validation.json"):
        gate.evaluate(a, a, reference=tmp_path / "missing")
