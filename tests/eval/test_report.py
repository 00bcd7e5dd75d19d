"""The report's training-rollout trend: mean@G over the first and last updates, their
difference and the stop criterion, against a NumPy transcription on synthetic metrics."""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mapfjax.eval import report

Z = 1.959963984540054


def _curve(steps, rise, g=8, groups=16, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(1, steps + 1):
        p = 0.3 + rise * (s - 1) / max(steps - 1, 1)
        out.append(
            (s, {"groups": [[3, int(rng.binomial(g, p)), 0.0, True] for _ in range(groups)]})
        )
    return out


def _shares(rows, g):
    return np.array([n / g for _, r in rows for _, n, *_ in r["groups"]])


@pytest.mark.parametrize("rise, verdict", [(0.0, "met: a rise of"), (0.4, "not met: a rise of")])
def test_rollout_trend_matches_numpy_and_judges_the_stop_criterion(rise, verdict):
    curve = _curve(300, rise)
    text = report.rollout_trend(curve, 8)
    first, last = _shares(curve[:30], 8), _shares(curve[-30:], 8)
    diff = last.mean() - first.mean()
    half = Z * np.sqrt(last.var(ddof=1) / last.size + first.var(ddof=1) / first.size)
    sign = "+" if diff > 0 else ""
    expect = f"{sign}{100 * diff:.1f} [{100 * (diff - half):.0f}, {100 * (diff + half):.0f}]"
    assert f"| change (points) | - | {expect} |" in text
    assert "| first 30 (1-30) | 480 |" in text and "| last 30 (271-300) | 480 |" in text
    assert verdict in text and f"{100 * diff:+.1f} points" in text


def test_rollout_trend_short_runs_and_missing_outcomes():
    short = report.rollout_trend(_curve(40, 0.0), 8)
    assert "first 10 (1-10)" in short and "not judged: 40 updates, fewer than 300" in short
    assert report.rollout_trend([], 8) == "No training updates logged."
    assert "no per-group outcomes" in report.rollout_trend([(1, {}), (2, {})], 8)


def _run(path, start_bits, final_bits, curve, ids=None):
    """A finished one-round run directory: start and round_0 validations, metrics, config."""
    ids = ids or [f"p{i}" for i in range(len(start_bits))]
    for name, bits in (("start", start_bits), ("round_0", final_bits)):
        (path / name).mkdir(parents=True)
        rows = [{"id": i, "valid": bool(b), "samples": 4, "samples_valid": 3 * int(b)}
                for i, b in zip(ids, bits, strict=True)]  # fmt: skip
        (path / name / "validation.json").write_text(json.dumps({"rows": rows}))
    (path / "round_0" / "record.json").write_text("{}")
    lines = [json.dumps({"step": s, **r}) for s, r in curve]
    (path / "round_0" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "run_config.json").write_text(json.dumps({"train": {"group_size": 8}}))
    return path


def test_compare_runs_pairs_against_start_and_the_first_run(tmp_path):
    rng = np.random.default_rng(3)
    start = rng.random(60) < 0.4
    a_bits, b_bits = rng.random(60) < 0.5, rng.random(60) < 0.3
    a = _run(tmp_path / "a", start, a_bits, _curve(40, 0.2, seed=1))
    b = _run(tmp_path / "b", start, b_bits, _curve(40, 0.0, seed=2))
    text = report.compare_runs([a, b], ["GRPO", "RFT"])
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines()}

    def paired(x, y):
        d = x.astype(float) - y
        diff, half = d.mean(), Z * d.std() / np.sqrt(d.size)
        sign = "+" if diff > 0 else ""
        return f"{sign}{100 * diff:.1f} [{100 * (diff - half):.0f}, {100 * (diff + half):.0f}]"

    assert f"| {paired(a_bits, start)} | - |" in lines["GRPO"]
    assert f"| {paired(b_bits, start)} | {paired(b_bits, a_bits)} |" in lines["RFT"]
    assert lines["start"].startswith("| start | 0 |") and "| RFT | 40 |" in lines["RFT"]
    other = _run(tmp_path / "c", start, b_bits, [], ids=[f"q{i}" for i in range(60)])
    with pytest.raises(ValueError, match="c was validated on other puzzles than"):
        report.compare_runs([a, other])
    with pytest.raises(ValueError, match="no such run directory"):
        report.compare_runs([a, tmp_path / "missing"])


def test_export_keeps_the_small_files_and_compares_the_same(tmp_path):
    rng = np.random.default_rng(4)
    start = rng.random(30) < 0.4
    a = _run(tmp_path / "runs" / "a", start, rng.random(30) < 0.5, _curve(20, 0.1, seed=5))
    b = _run(tmp_path / "runs" / "b", start, rng.random(30) < 0.5, _curve(20, 0.0, seed=6))
    (a / "checkpoints" / "20").mkdir(parents=True)
    (a / "round_0" / "model").mkdir()
    (a / "round_0" / "train_set.jsonl").write_text("{}\n")
    copies = [report.export_run(r, tmp_path / "results" / r.name) for r in (a, b)]
    kept = sorted(str(p.relative_to(copies[0])) for p in copies[0].rglob("*") if p.is_file())
    assert kept == [
        "round_0/metrics.jsonl.gz", "round_0/record.json", "round_0/validation.json",
        "run_config.json", "start/validation.json",
    ]  # fmt: skip
    assert report.compare_runs(copies) == report.compare_runs([a, b])
    with pytest.raises(ValueError, match="not a run directory"):
        report.export_run(tmp_path, tmp_path / "x")


def test_launch_compare_runs_exports_and_reports_errors(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    rng = np.random.default_rng(7)
    start = rng.random(20) < 0.4
    runs = [
        _run(tmp_path / name, start, rng.random(20) < 0.5, _curve(12, 0.1, seed=s))
        for s, name in enumerate(("grpo", "rft"))
    ]
    cmd = [sys.executable, str(root / "launch" / "compare_runs.py")]
    arg = f"--runs={runs[0]},{runs[1]}"
    out = tmp_path / "results"
    res = subprocess.run([*cmd, arg, "--labels=GRPO,RFT", f"--export={out}"], cwd=root,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    table = report.compare_runs(runs, ["GRPO", "RFT"])
    assert (out / "comparison.md").read_text() == table + "\n" and table in res.stdout
    assert (out / "rft" / "round_0" / "metrics.jsonl.gz").exists()
    bad = subprocess.run([*cmd, f"--runs={runs[0]},{tmp_path / 'nope'}"], cwd=root,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"error: {tmp_path / 'nope'}: no such run directory"


def test_engineer_failures_are_counted_in_the_report_header(tmp_path):
    """A round whose engineer could not run (decision.json extra.failure) is named in the
    report's first lines: a long run must not quietly become the fixed baseline."""
    found = []
    for n, failure in enumerate(["API unreachable: connection refused\nretry 3", None, "no key"]):
        d = tmp_path / f"round_{n}"
        d.mkdir()
        extra = {"failure": failure} if failure else {}
        (d / "decision.json").write_text(json.dumps({"engineer": "api", "extra": extra}))
        found.append((n, d))
    assert report.engineer_failures(tmp_path, found) == [
        "R0: API unreachable: connection refused",
        "R2: no key",
    ]
    assert report.engineer_failures(tmp_path, found[1:2]) == []


def test_read_validation_names_the_file_and_what_is_wrong(tmp_path):
    good = tmp_path / "validation.json"
    good.write_text(json.dumps({"rows": [{"id": "a", "valid": True}]}))
    assert report.read_validation(good) == [{"id": "a", "valid": True}]
    cases = {
        "missing.json": None,
        "torn.json": '{"rows": [',
        "norows.json": '{"round": 1}',
        "badrow.json": '{"rows": [{"id": "a"}]}',
        "notlist.json": '{"rows": 3}',
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ValueError, match=f"{path}[: ]"):
            report.read_validation(path)


def test_reward_signal_counts_what_sets_each_mixed_group_apart():
    """Mixed groups split by what differs: validity (0 < valid < G), the optimal bonus alone
    (every sample valid) or the format penalty alone (none valid); unmixed groups count only
    as sampled. Rollout rates are means over updates."""
    curve = [
        (1, {"valid_rate": 0.5, "optimal_rate": 0.25,
             "groups": [[3, 8, 4.0, True], [3, 8, 0.0, False], [4, 3, 6.0, True]]}),
        (2, {"valid_rate": 0.7, "optimal_rate": 0.35,
             "groups": [{"size": 5, "valid": 0, "abs_advantage": 2.0, "mixed": True},
                        {"size": 5, "valid": 5, "abs_advantage": 7.0, "mixed": True}]}),
    ]  # fmt: skip
    text = report.reward_signal(curve, 8)
    assert text.splitlines()[2] == "| 5 | 4 | 2 (50 %) | 1 (25 %) | 1 (25 %) | 60.0 | 30.0 |"
    assert "none was logged" in report.reward_signal([(1, {"groups": [[3, 8, 0.0, False]]})], 8)
    assert "none was logged" in report.reward_signal([], 8)


def test_held_out_table_pairs_greedy_and_mean_at_k_against_numpy():
    """The mean@k change column: per-puzzle shares of valid samples, paired with the start, a
    Student t interval (scipy-free NumPy transcription; the t quantile for 199 degrees of
    freedom is 1.9720)."""
    rng = np.random.default_rng(3)
    n, k = 200, 4
    ids = [f"p{i}" for i in range(n)]
    start_s, end_s = rng.binomial(k, 0.3, n), rng.binomial(k, 0.45, n)
    start_g, end_g = rng.random(n) < 0.35, rng.random(n) < 0.4

    def rows(g, s):
        return [{"id": i, "valid": bool(a), "samples": k, "samples_valid": int(b)}
                for i, a, b in zip(ids, g, s, strict=True)]  # fmt: skip

    text = report.held_out_table([("start", rows(start_g, start_s)), ("R0", rows(end_g, end_s))])
    header, _, first, last = text.splitlines()
    assert header.endswith("| mean@4 change vs start (points) |")
    assert first.endswith("| - | - | - |")
    d = (end_s - start_s) / k
    half = 1.9720 * d.std(ddof=1) / np.sqrt(n)
    m = d.mean()
    expect = f"{100 * m:+.1f} [{100 * (m - half):.0f}, {100 * (m + half):.0f}]"
    assert last.endswith(f"| {expect} |"), (last, expect)
    g = end_g.astype(float) - start_g
    half_g = Z * g.std() / np.sqrt(n)
    expect_g = f"{100 * g.mean():+.1f} [{100 * (g.mean() - half_g):.0f}"
    assert f"| {expect_g}, " in last and f"| {int((end_g != start_g).sum())} |" in last
    # without sampled answers the table has no mean@k columns
    plain = [{"id": i, "valid": bool(a)} for i, a in zip(ids, start_g, strict=True)]
    assert "mean@" not in report.held_out_table([("start", plain), ("R0", plain)])


def test_compare_runs_reads_each_runs_own_sample_count(tmp_path):
    """A run validated with 2 samples beside one with 4: each share is samples_valid / its own
    samples (dividing by the first run's k doubled it once), and each cell names its k."""
    rng = np.random.default_rng(5)
    start, bits = rng.random(50) < 0.4, rng.random(50) < 0.5
    a = _run(tmp_path / "a", start, bits, _curve(40, 0.1, seed=1))
    b = _run(tmp_path / "b", start, bits, _curve(40, 0.1, seed=2))
    path = b / "round_0" / "validation.json"
    rows = json.loads(path.read_text())["rows"]
    for r in rows:
        r["samples"], r["samples_valid"] = 2, int(r["valid"])  # 1 of 2 where greedy solved it
    path.write_text(json.dumps({"rows": rows}))
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in report.compare_runs([a, b]).splitlines()}
    assert "| mean@k % |" in lines["model"]
    assert f"| {100 * 0.75 * bits.mean():.1f} [" in lines["a"] and "(k=4) |" in lines["a"]
    assert f"| {100 * 0.5 * bits.mean():.1f} [" in lines["b"] and "(k=2) |" in lines["b"]
    same = report.compare_runs([a, shutil.copytree(a, tmp_path / "a2")])
    assert "| mean@4 % |" in same and "(k=" not in same


def test_wait_split_table_pairs_each_part_with_the_start():
    rng = np.random.default_rng(7)
    n = 120
    ids = [f"p{i}" for i in range(n)]
    waits = rng.random(n) < 0.5
    start, end = rng.random(n) < 0.3, rng.random(n) < 0.45
    held = "".join(
        json.dumps({"id": i, "needs_wait": bool(w), "grid": ["F"]}) + "\n"
        for i, w in zip(ids, waits, strict=True)
    ).encode()
    labels = report.needs_wait_labels(held)
    assert labels == dict(zip(ids, waits.tolist(), strict=True))
    rows = lambda g: [{"id": i, "valid": bool(a)} for i, a in zip(ids, g, strict=True)]
    text = report.wait_split_table([("start", rows(start)), ("R0", rows(end))], labels)
    header, _, first, last = text.splitlines()
    assert f"needs a wait (n={waits.sum()})" in header
    assert f"needs none (n={(~waits).sum()})" in header
    assert first.count("| - |") == 2
    for part in (waits, ~waits):
        g = end[part].astype(float) - start[part]
        half = Z * g.std() / np.sqrt(part.sum())
        rate = 100 * end[part].mean()
        assert f"| {rate:.1f} [" in last
        assert f"| {100 * g.mean():+.1f} [{100 * (g.mean() - half):.0f}, " in last, last
    # A held-out file without labels, or a split with an empty part: no table.
    assert report.needs_wait_labels(b'{"id": "p0", "grid": ["F"]}\n') is None
    assert report.needs_wait_labels(b"not json\n") is None
    assert report.needs_wait_labels(b'{"id": "p0", "needs_wait": null}\n') is None
    none_wait = dict.fromkeys(ids, False)
    assert report.wait_split_table([("start", rows(start))], none_wait) == ""
