"""The go / no-go gate on hand-made run directories: each criterion holds or fails on its own,
the figures are the paired differences over the same puzzles, and runs that do not share a
start or a held-out set are refused."""

import json

import numpy as np
import pytest

from mapfjax import stats
from mapfjax.rl.metrics import GroupOutcome
from projects.go_no_go import gate


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


@pytest.mark.parametrize("seconds, holds", [(600.0, True), (900.0, True), (1000.0, False)])
def test_the_budget_is_the_matched_arms_logged_grpo_time(tmp_path, seconds, holds):
    start = _draw(0.3, seed=1)
    runs = _runs(tmp_path, start, start | _draw(0.15, seed=2), start)
    # two updates of `seconds` each; a step logged again after a resume counts once
    steps = [{"step": 1, "seconds": 5.0}, {"step": 1, "seconds": seconds}]
    steps.append({"step": 2, "seconds": seconds})
    (runs[0] / "round_0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    criteria, rows, _ = gate.evaluate(*runs, budget_minutes=30)
    assert [c.name for c in criteria][2] == "matched GRPO wall time (minutes)"
    assert criteria[2].measured == f"{2 * seconds / 60:.1f}" and criteria[2].passed is holds
    assert [c.passed for c in criteria] == [True, True, holds, True]
    verdict = gate.markdown(criteria, rows, [], 400)
    assert verdict.startswith("**GO**" if holds else "**NO-GO**")
    assert len(gate.evaluate(*runs)[0]) == 3  # no budget given: the first verdicts' criteria


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
    with pytest.raises(ValueError, match="missing: no start/validation.json"):
        gate.evaluate(a, tmp_path / "missing")
    late = tmp_path / "late"  # a run whose start is lost: round 0 is not read as its start
    _write(late, "round_0", start)
    _write(late, "round_1", start)
    with pytest.raises(ValueError, match="late: no start/validation.json"):
        gate.evaluate(a, late)
    with pytest.raises(ValueError, match="no start/validation.json"):
        gate.evaluate(a, a, reference=tmp_path / "missing")


def _arm(results, name, start, end, lr=1e-4, kl=0.0, trace_loss="all", seconds=(30.0, 40.0),
         objective="grpo", temperature=1.0, groups=8, bonus=None, logged=(),
         seed=None, lora=0, held_out_seed=None, top_p=None, optimizer=None,
         screen=None, valid_counts=(), greedy=None, fresh=False):  # fmt: skip
    run = results / name / "matched"
    _write(run, "start", start, {0: gate.PARSE_ERROR})
    _write(run, "round_0", end)
    metrics = [{"step": i + 1, "seconds": s} for i, s in enumerate(seconds)]
    for row, valid in zip(metrics, valid_counts, strict=False):  # one 3x3 group of 8 an update
        row["groups"] = [GroupOutcome(3, valid, 1.0, 0 < valid < 8).to_record()]
    if logged:  # the sampled groups of the first update: [size, valid, sum |A|, mixed]
        metrics[0]["groups"] = [list(x) for x in logged]
    (run / "round_0" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    config = {
        "model": {"path": f"/somewhere/{name}_policy"},
        "optim": {"lr": lr, **({"lora_rank": lora, "lora_alpha": 16.0} if lora else {})},
        "grpo": {"kl_coef": kl},
        "train": {
            "trace_loss": trace_loss,
            "objective": objective,
            "temperature": temperature,
            "problems_per_step": groups,
        },
        "env": {"sizes": {"s3": {"wait_ratio": 0.3}, "s4": {"wait_ratio": 1.0, "data_ratio": 0}}},
    }
    if seed is not None:  # older records have no seed: 0
        config["seed"] = seed
    if top_p is not None:  # older records have no top_p: 1
        config["train"]["top_p"] = top_p
    if optimizer is not None:  # older records have no optimizer: adamw
        config["optim"]["optimizer"] = optimizer
    if screen is not None:  # older records have no screen: off
        config["train"]["screen"] = screen
    if fresh:  # --fresh_puzzles: 2 updates of 2 x 8 sampled puzzles from 32, each drawn once
        config["train"].update(steps=2, instances=32, oversample=2.0)
    if greedy is not None:  # older records have no greedy member: off
        config["train"]["greedy_member"] = greedy
    if held_out_seed is not None:
        config["validation"] = {"seed": held_out_seed}
    if bonus is not None:  # older records have no reward block: the default bonus, 0.5
        config["reward"] = {"optimal_bonus": bonus, "valid_reward": 1.0}
    (run / "run_config.json").write_text(json.dumps(config))
    return run


def test_arms_summarise_every_finished_arm(tmp_path):
    start = _draw(0.3, seed=1)
    gain = start | _draw(0.15, seed=2)
    _arm(tmp_path, "b_kl", start, gain, lr=3e-5, kl=0.1, trace_loss="moves", temperature=0.7,
         top_p=0.95, optimizer="momentum", screen=2.0, greedy=True)  # fmt: skip
    _arm(tmp_path, "a_plain", start, start)
    _arm(tmp_path, "g_momentum", start, start, lr=0.9305, optimizer="momentum", groups=32)
    _arm(tmp_path, "c_rft", start, start, objective="rft", bonus=0.5, fresh=True)
    _arm(tmp_path, "e_placebo", start, start, kl=0.1, objective="placebo", groups=32, lora=4)
    # An arm stopped before its first round finished is left out.
    _write(tmp_path / "d_stopped" / "matched", "start", start)
    (tmp_path / "d_stopped" / "matched" / "run_config.json").write_text("{}")
    logged = [(3, 8, 4.0, True), (3, 4, 6.0, True), (3, 8, 0.0, False), (4, 2, 5.0, True)]
    _arm(tmp_path, "f_valid_only", start, start, kl=0.1, bonus=0.0, logged=logged, seed=2)
    a, b, c, e, f, g = gate.arms(tmp_path)
    assert g.settings.startswith("lr 0.93, momentum optimiser, 32 groups per update")
    assert [a.name, b.name, c.name] == ["a_plain/matched", "b_kl/matched", "c_rft/matched"]
    assert c.settings == "RFT, lr 1e-4, each puzzle once, trains all, wait ratio 0.3, 3x3 only"
    assert e.settings == (
        "placebo, lr 1e-4, LoRA rank 4, alpha 16, KL 0.1, 32 groups per update, trains all, "
        "wait ratio 0.3, 3x3 only"
    )
    assert a.settings == "lr 1e-4, trains all, wait ratio 0.3, 3x3 only"
    assert f.settings == (
        "lr 1e-4, KL 0.1, optimal bonus 0, seed 2, trains all, wait ratio 0.3, 3x3 only"
    )
    assert b.settings == (
        "lr 3e-5, momentum optimiser, KL 0.1, temperature 0.7, top_p 0.95, screen 2, "
        "greedy member, trains moves, wait ratio 0.3, 3x3 only"
    )
    assert (a.policy, a.updates, a.minutes) == ("a_plain_policy", 2, pytest.approx(70 / 60))
    assert a.change.value == 0 and a.parses.value == pytest.approx(399 / 400)
    # 3 groups carry a gradient, 1 of them with every sample valid: told apart by the bonus only
    assert f.bonus_only == pytest.approx(1 / 3) and a.bonus_only is None
    assert gate.arms_markdown([f]).rstrip().endswith("| 0.0 [0, 0] | - | 33 | no | yes |")
    want = stats.paired_proportion_difference(list(gain), list(start))
    assert b.change.value == pytest.approx(want.value) and b.end.value == pytest.approx(gain.mean())
    table = gate.arms_markdown([a, b])
    assert table.startswith("Greedy valid on the same 400 held-out puzzles")
    lines = table.strip().splitlines()
    # b gains ~10 points, a none; both within the budget
    assert lines[-1].endswith("| - | - | yes | yes |")
    assert lines[-2].endswith("| - | - | no | yes |")
    slow = gate.arms_markdown([a, b], budget_minutes=0.0).strip().splitlines()[-1]
    assert b.minutes > 0 and slow.endswith("| - | - | yes | no |")  # the gain, but past the budget
    gate.plot_arms([a, b], tmp_path / "arms.png")
    assert (tmp_path / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arms_on_other_puzzles_form_their_own_set(tmp_path):
    start = _draw(0.3, seed=1)
    _arm(tmp_path, "a", start, start)
    _arm(tmp_path, "b", start[:300], start[:300])
    # the same puzzle ids drawn with another validation seed are other puzzles
    _arm(tmp_path, "c", start, start | _draw(0.15, seed=2), held_out_seed=12348)
    _arm(tmp_path, "d", start, start, held_out_seed=12348)
    a, b, c, d = gate.arms(tmp_path)
    assert [a.held_out, b.held_out, c.held_out, d.held_out] == [0, 1, 2, 2]
    table = gate.arms_markdown([a, b, c, d])
    titles = [line for line in table.splitlines() if line.startswith("Held-out set")]
    assert [a.draw, b.draw, c.draw, d.draw] == [None, None, 12348, 12348]
    tail = "greedy valid, 95 % intervals; changes are paired within the set, not across sets."
    assert titles == [
        f"Held-out set 1 (400 puzzles, first used by `a/matched`): {tail}",
        f"Held-out set 2 (300 puzzles, first used by `b/matched`): {tail}",
        f"Held-out set 3 (draw 12348, 400 puzzles, first used by `c/matched`): {tail}",
    ]
    # each arm's row stands under its own set's title
    assert table.index("| c/matched |") > table.index(titles[2]) > table.index("| b/matched |")
    gate.plot_arms([a, b, c, d], tmp_path / "arms.png")
    assert (tmp_path / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arms_refuse_an_empty_folder_and_broken_config(tmp_path):
    start = _draw(0.3, seed=1)
    with pytest.raises(ValueError, match="no finished arm"):
        gate.arms(tmp_path / "empty")
    broken = _arm(tmp_path / "broken", "a", start, start)
    (broken / "run_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"a/matched/run_config.json: not readable as JSON"):
        gate.arms(tmp_path / "broken")


def test_gate_summary_script_writes_the_table_and_the_picture(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[3]
    script = [sys.executable, "-m", "projects.go_no_go.gate_summary"]
    start = _draw(0.3, seed=1)
    _arm(tmp_path, "a", start, start)
    out = subprocess.run(
        [*script, f"--results={tmp_path}"], capture_output=True, text=True, cwd=root
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "arms.md").read_text() in out.stdout + "\n"
    assert (tmp_path / "arms.png").exists()
    missing = f"--results={tmp_path / 'none'}"
    out = subprocess.run([*script, missing], capture_output=True, text=True, cwd=root)
    assert out.returncode == 2 and "no finished arm" in out.stderr


def test_an_arm_started_from_a_recipes_export_is_named_with_its_run():
    assert gate._policy_name("/r/runs/tiny_trace_long/export") == "tiny_trace_long/export"
    assert gate._policy_name("/r/runs/tiny_trace_grid/export_aw10_6000") == "export_aw10_6000"


def test_a_mismatched_arm_not_run_fails_its_criterion_and_says_so(tmp_path):
    start = _draw(0.3, seed=1)
    matched, _ = _runs(tmp_path, start, start | _draw(0.15, seed=2), start)
    criteria, rows, notes = gate.evaluate(matched, None)
    assert [c.passed for c in criteria] == [True, True, False]
    assert criteria[2].measured == "not run" and len(rows) == 2
    assert any("not run" in n for n in notes)
    assert gate.markdown(criteria, rows, notes, 400).startswith("**NO-GO**")
    _write(matched, "round_0", _draw(0.3, n=399))  # other puzzles at the end: refused
    with pytest.raises(ValueError, match="validated on other puzzles"):
        gate.evaluate(matched, None)


def _label(run, waits):
    """Write needs_wait labels (bool per puzzle) into an arm's start rows."""
    path = run / "start" / "validation.json"
    doc = json.loads(path.read_text())
    for row, w in zip(doc["rows"], waits, strict=True):
        row["needs_wait"] = bool(w)
    path.write_text(json.dumps(doc))


def test_pooled_change_is_the_paired_interval_of_every_arms_pairs_together(tmp_path):
    """Two arms on different puzzles pooled: the same estimate as their pairs concatenated (a
    NumPy reference), its n the pairs of both; one arm alone is its own paired change."""
    s1, s2 = _draw(0.5, seed=1), _draw(0.6, n=300, seed=2)
    e1, e2 = s1 | _draw(0.1, seed=3), s2 & ~_draw(0.05, n=300, seed=4)
    a = _arm(tmp_path, "a", s1, e1)
    b = _arm(tmp_path, "b", s2, e2)
    d = np.concatenate([e1, e2]).astype(float) - np.concatenate([s1, s2])
    half = 1.959964 * d.std() / np.sqrt(d.size)
    got = gate.pooled_change([a, b])
    assert got.n == 700
    assert got.value == pytest.approx(d.mean())
    assert (got.low, got.high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-5)
    alone = gate.pooled_change([a])
    want = stats.paired_proportion_difference(list(e1), list(s1))
    assert (alone.value, alone.low, alone.high) == pytest.approx((want.value, want.low, want.high))
    with pytest.raises(ValueError, match="no arm given"):
        gate.pooled_change([])
    with pytest.raises(ValueError, match="has no needs_wait label"):
        gate.pooled_change([a], needs_wait=True)
    w1, w2 = _draw(0.5, seed=7), _draw(0.5, n=300, seed=8)
    _label(a, w1)
    _label(b, w2)
    for kind, keep in [(True, np.concatenate([w1, w2])), (False, ~np.concatenate([w1, w2]))]:
        part = gate.pooled_change([a, b], needs_wait=kind)
        assert part.n == keep.sum() and part.value == pytest.approx(d[keep].mean())


def test_pools_are_named_arms_and_bad_specs_say_what_is_allowed(tmp_path):
    import pathlib
    import subprocess
    import sys

    start = _draw(0.4, seed=5)
    waits = np.arange(400) % 2 == 0
    _label(_arm(tmp_path, "a", start, start | _draw(0.1, seed=6)), waits)
    _label(_arm(tmp_path, "b", start, start), waits)
    pools = gate.parse_pools(["two=a/matched, b/matched"], tmp_path)
    assert pools == [("two", [tmp_path / "a" / "matched", tmp_path / "b" / "matched"])]
    text = gate.pooled_markdown(pools)
    assert (
        "| **two, pooled** | 2 arms | 800 |" in text
        and "| two | b/matched | 400 | 0.0 [0, 0] | 200 | 0.0 [0, 0] | 200 | 0.0 [0, 0] |" in text
    )
    for spec, message in [("a/matched", "expected NAME=ARM"), ("x=", "expected NAME=ARM"),
                          ("x=c/matched", "arm 'c/matched' has no")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            gate.parse_pools([spec], tmp_path)
    root = pathlib.Path(__file__).resolve().parents[3]
    script = [sys.executable, "-m", "projects.go_no_go.gate_summary", f"--results={tmp_path}"]
    out = subprocess.run(
        [*script, "--pool=two=a/matched,b/matched"], capture_output=True, text=True, cwd=root
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pooled.md").read_text() == text
    out = subprocess.run(
        [*script, "--pool=two=a/matched,zz"], capture_output=True, text=True, cwd=root
    )
    assert out.returncode == 2 and "arm 'zz' has no" in out.stderr


def test_truncated_ids_and_answers_redone_at_a_larger_budget():
    start = [{"id": "a", "valid": False, "truncated": True}, {"id": "b", "valid": True}]
    end = [{"id": "a", "valid": False}, {"id": "b", "valid": False, "truncated": True}]
    assert gate.truncated_ids(start, end) == ["a", "b"]
    assert gate.truncated_ids(start[1:], end[:1]) == []
    assert gate.with_redone(start, {"a": True}) == {"a": True, "b": True}
    with pytest.raises(ValueError, match=r"not in the validation rows: \['z'\]"):
        gate.with_redone(start, {"z": True})


def test_budget_check_script_without_truncated_answers_reruns_nothing(tmp_path):
    """No answer ran out of budget: nothing is answered again, both budgets give the same
    change; puzzles missing from --instances are named (with the real script)."""
    import pathlib
    import subprocess
    import sys

    start = _draw(0.5, seed=9)
    run = _arm(tmp_path, "a", start, start | _draw(0.1, seed=10))
    (run / "run_config.json").write_text(json.dumps({"validation": {"max_new_tokens": 640}}))
    inst = tmp_path / "held.jsonl"
    inst.write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in range(400)))
    root = pathlib.Path(__file__).resolve().parents[3]
    args = [sys.executable, "-m", "projects.go_no_go.budget_check", f"--arm={run}",
            f"--instances={inst}", "--start=s", "--end=e", f"--out={tmp_path / 'out'}"]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "out" / "budget.md").read_text()
    want = stats.interval_text(
        stats.paired_proportion_difference(list(start | _draw(0.1, seed=10)), list(start)), True
    )
    assert f"| 640 (the arm's) | 0 | {want} |" in text and f"| 800 | 0 | {want} |" in text
    assert "| start | 0 | 0 | 0 |" in text and "| end | 0 | 0 | 0 |" in text
    assert not (tmp_path / "out" / "start").exists()  # no evaluation ran
    doc = json.loads((run / "round_0" / "validation.json").read_text())
    doc["rows"][3]["truncated"] = True
    (run / "round_0" / "validation.json").write_text(json.dumps(doc))
    inst.write_text(json.dumps({"id": "p0"}) + "\n")
    out = subprocess.run(args, capture_output=True, text=True, cwd=root)
    assert out.returncode != 0 and "lacks the arm's puzzles ['p3']" in out.stderr


def test_arms_report_the_training_rollouts_first_and_last_updates(tmp_path):
    start = _draw(0.3, seed=1)
    # the windows of the arm's report.md: a quarter of the run, at least 1 update, at most 30
    _arm(tmp_path, "a", start, start, seconds=(30.0,) * 5, valid_counts=(4, 5, 8, 6, 7))
    _arm(tmp_path, "b", start, start, seconds=(30.0,) * 12, valid_counts=(4,) * 5 + (6,) * 7)
    _arm(tmp_path, "c", start, start, seconds=(30.0,) * 3, valid_counts=(4,))  # none in the last
    _arm(tmp_path, "d", start, start)  # no group logged
    a, b, c, d = gate.arms(tmp_path)
    assert a.rollouts == pytest.approx((4 / 8, 7 / 8, 1))
    assert b.rollouts == pytest.approx((4 / 8, 6 / 8, 3))
    assert c.rollouts is None and d.rollouts is None
    rows = gate.arms_markdown([a, b, c, d]).strip().splitlines()[-4:]
    assert "| 50.0 -> 87.5 (w=1) |" in rows[0] and "| 50.0 -> 75.0 (w=3) |" in rows[1]
    assert all(len(r.split("|")) == len(rows[0].split("|")) for r in rows)
