"""Curriculum comparison: per-run records from run directories, means over seeds and paired
differences against the reference engineer (checked against NumPy), refusal of runs that used
another held-out set or budget, the files written; a two-engineer x two-seed sweep end to end."""

import json
import pathlib

import numpy as np
import pytest

from mapfjax.eval import compare

ROOT = pathlib.Path(__file__).resolve().parents[2]


def fake_run(
    path: pathlib.Path, seed: int, greedy: list[list[bool]], lr=1e-4, held=b"abc", wait=0.3
):
    """A finished run directory: start + one validation per round (greedy bits per puzzle)."""
    sizes = [3, 3, 4, 4, 5, 5][: len(greedy[0])]
    cfg = {"rounds": len(greedy) - 1, "train": {"instances": 16}, "optim": {"lr": lr}}
    path.mkdir(parents=True)
    (path / "run_config.json").write_text(json.dumps(cfg))
    (path / "validation_set.jsonl").write_bytes(held)

    def validation(d, bits):
        d.mkdir(exist_ok=True)
        rows = [
            {"id": f"p{i}", "size": s, "valid": b, "samples": 4, "samples_valid": 2 * b + seed % 2}
            for i, (s, b) in enumerate(zip(sizes, bits, strict=True))
        ]
        (d / "validation.json").write_text(json.dumps({"rows": rows}))

    validation(path / "start", greedy[0])
    for n, bits in enumerate(greedy[1:]):
        d = path / f"round_{n}"
        validation(d, bits)
        ratio = 0.5 if n % 2 else 1 / 3
        sizes_cfg = {f"s{s}": {"data_ratio": ratio, "hole_ratio": 0.2, "wait_ratio": wait}
                     for s in (3, 4, 5)}  # fmt: skip
        (d / "config.json").write_text(json.dumps({"sizes": sizes_cfg}))
        (d / "decision.json").write_text(json.dumps({"engineer": "x", "diff": {}, "summary": "s"}))
        (d / "DONE").write_text("")
    return path


def records(tmp_path):
    rng = np.random.default_rng(0)
    out = []
    for engineer in ("fixed", "learnability"):
        for seed in (0, 1, 2):
            bits = rng.random((3, 6)) < (0.3 if engineer == "fixed" else 0.6)
            run = fake_run(tmp_path / f"{engineer}_{seed}", seed, bits.tolist())
            out.append(compare.run_record(run, f"{engineer}_s{seed}", engineer, seed))
    return out


def test_curves_and_paired_differences_match_numpy(tmp_path):
    recs = records(tmp_path)
    bits = lambda r: np.array([c == "1" for c in r["rounds"][-1]["validation"]["greedy"]])
    final = {(r["engineer"], r["seed"]): bits(r) for r in recs}
    c = compare.curves(recs)
    rates = [final[("learnability", s)].mean() for s in range(3)]
    e = c["learnability"]["greedy"][-1]
    assert e.value == pytest.approx(np.mean(rates)) and e.n == 3
    half = 4.302652729911275 * np.std(rates, ddof=1) / np.sqrt(3)  # t(0.975, df=2)
    assert (e.low, e.high) == pytest.approx((np.mean(rates) - half, np.mean(rates) + half))
    p = compare.paired_vs(recs)["learnability"]
    d = [final[("learnability", s)].mean() - final[("fixed", s)].mean() for s in range(3)]
    assert p["seeds"].value == pytest.approx(np.mean(d)) and p["seeds"].n == 3
    a = np.concatenate([final[("learnability", s)] for s in range(3)])
    b = np.concatenate([final[("fixed", s)] for s in range(3)])
    assert p["puzzles"].value == pytest.approx((a.astype(float) - b).mean())
    assert p["discordant"] == int((a != b).sum())
    start = {(r["engineer"], r["seed"]): np.array([c == "1" for c in r["start"]["greedy"]])
             for r in recs}  # fmt: skip
    g = compare.gains_vs_start(recs)["learnability"]
    d = [final[("learnability", s)].mean() - start[("learnability", s)].mean() for s in range(3)]
    half = 4.302652729911275 * np.std(d, ddof=1) / np.sqrt(3)
    assert (g.value, g.low, g.high) == pytest.approx(
        (np.mean(d), np.mean(d) - half, np.mean(d) + half)
    )


def test_the_difference_after_each_round_matches_numpy(tmp_path):
    """paired_vs(at=n) pairs the runs' validations after round n; the by-round table writes one
    column per round, and leaves out a run that has not reached a round."""
    recs = records(tmp_path)  # 2 rounds per run
    bits = lambda r, n: np.array([c == "1" for c in r["rounds"][n]["validation"]["greedy"]])
    for n in (0, 1):
        runs = {(r["engineer"], r["seed"]): bits(r, n) for r in recs}
        a = np.concatenate([runs[("learnability", s)] for s in range(3)])
        b = np.concatenate([runs[("fixed", s)] for s in range(3)])
        p = compare.paired_vs(recs, at=n)["learnability"]
        assert p["puzzles"].value == pytest.approx((a.astype(float) - b).mean())
        assert p["discordant"] == int((a != b).sum()) and p["seeds"].n == 3
    assert compare.paired_vs(recs, at=-1) == compare.paired_vs(recs)
    md = compare.by_round_markdown(recs)
    assert "| engineer | after R0 | after R1 |" in md
    row = next(line for line in md.splitlines() if line.startswith("| learnability"))
    at0 = compare._fmt(compare.paired_vs(recs, at=0)["learnability"]["puzzles"], True)
    assert row.startswith(f"| learnability | {at0} (3) |")
    short = fake_run(tmp_path / "short", 3, [[True] * 6] * 2)  # seed 3 stopped after R0
    recs += [compare.run_record(short, "learnability_s3", "learnability", 3)]
    fixed3 = fake_run(tmp_path / "fixed3", 3, [[False] * 6] * 3)
    recs += [compare.run_record(fixed3, "fixed_s3", "fixed", 3)]
    assert compare.paired_vs(recs, at=0)["learnability"]["seeds"].n == 4
    assert compare.paired_vs(recs, at=1)["learnability"]["seeds"].n == 3
    assert compare.by_round_markdown([r for r in recs if r["engineer"] != "fixed"]) == ""
    assert compare.by_round_markdown([r for r in recs if r["engineer"] == "fixed"]) == ""


def test_runs_with_another_held_out_set_or_budget_are_refused(tmp_path):
    recs = records(tmp_path)
    other = fake_run(tmp_path / "odd", 9, [[True] * 6] * 3, held=b"other puzzles")
    bad = compare.run_record(other, "odd_s9", "random", 9)
    with pytest.raises(compare.MismatchError, match="'fixed_s0' and 'odd_s9'.*validation_set"):
        compare.check_comparable([*recs, bad])
    lr = fake_run(tmp_path / "lr", 9, [[True] * 6] * 3, lr=3e-4)
    with pytest.raises(compare.MismatchError, match=r"optim\.lr: 0\.0001 vs 0\.0003"):
        compare.check_comparable([recs[0], compare.run_record(lr, "lr_s9", "random", 9)])


def test_per_seed_table_writes_each_runs_final_rate_and_change(tmp_path):
    recs = records(tmp_path)
    md = compare.summary_markdown(recs)
    assert "| engineer | seed 0 | seed 1 | seed 2 |" in md
    for engineer in ("fixed", "learnability"):
        cells = []
        for r in [r for r in recs if r["engineer"] == engineer]:
            final = np.mean([c == "1" for c in r["rounds"][-1]["validation"]["greedy"]])
            start = np.mean([c == "1" for c in r["start"]["greedy"]])
            cells.append(f"{100 * final:.1f} ({100 * (final - start):+.1f})")
        assert f"| {engineer} | {' | '.join(cells)} |" in md
    # A seed without a finished run of one engineer: its cell is "-".
    md = compare.summary_markdown([r for r in recs if r["run"] != "fixed_s1"])
    assert "| fixed | " in md and md.split("| fixed | ")[-1].split(" | ")[1] == "-"


def test_split_by_whether_a_held_out_puzzle_needs_a_wait(tmp_path):
    waits = [True, False, True, True, False, False]
    held = "".join(
        json.dumps({"id": f"p{i}", "needs_wait": w, "grid": ["F"]}) + "\n"
        for i, w in enumerate(waits)
    ).encode()
    rng = np.random.default_rng(5)
    recs = []
    for engineer in ("fixed", "rule"):
        for seed in (0, 1, 2):
            bits = rng.random((3, 6)) < 0.5
            run = fake_run(tmp_path / f"{engineer}_{seed}", seed, bits.tolist(), held=held)
            recs.append(compare.run_record(run, f"{engineer}_s{seed}", engineer, seed))
    assert all(r["needs_wait"] == "101100" for r in recs)
    md = compare.summary_markdown(recs)
    assert "| engineer | seeds | needs a wait (n=3): start % | change (points) |" in md
    w = np.array(waits)
    for engineer in ("fixed", "rule"):
        mine = [r for r in recs if r["engineer"] == engineer]
        bits = lambda v, part: np.array([c == "1" for c in v["greedy"]])[part]
        cells = [engineer, "3"]
        for part in (w, ~w):
            start = [bits(r["start"], part).mean() for r in mine]
            final = [bits(r["rounds"][-1]["validation"], part).mean() for r in mine]
            d = np.subtract(final, start)
            half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t(0.975, df=2)
            mean = 100 * d.mean()
            lo, hi = 100 * (d.mean() - half), 100 * (d.mean() + half)
            sign = "+" if mean > 0 else ""
            cells += [f"{100 * np.mean(start):.1f}", f"{sign}{mean:.1f} [{lo:.1f}, {hi:.1f}]"]
        assert f"| {' | '.join(cells)} |" in md
    # Records without labels (a held-out file that is not labelled JSONL): no split table.
    plain = records(tmp_path / "plain")
    assert "needs_wait" not in plain[0]
    assert "needs a wait" not in compare.summary_markdown(plain)
    assert "needs a wait" not in compare.summary_markdown([*recs[:3], *plain[3:]])


def test_results_files(tmp_path):
    recs = records(tmp_path)
    out = compare.write_results(recs, tmp_path / "results", note="note")
    md = out.read_text()
    assert "| learnability | 3 | 2 |" in md and "vs fixed" in md
    plots = ("held_out.png", "final_sizes.png", "data_ratio.png", "wait_and_holes.png")
    plots += ("gain_vs_wait.png",)
    for name in plots:
        assert f"![{name}]({name})" in md
    for name in (*plots, "summary.csv"):
        assert (tmp_path / "results" / name).stat().st_size > 100
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 6
    rows = (tmp_path / "results" / "summary.csv").read_text().splitlines()
    assert rows[0].startswith("run,engineer,seed,point") and len(rows) == 1 + 6 * 3


def test_mixed_ratio_weights_sizes_by_their_data_share():
    sizes = {
        "s3": {"data_ratio": 0.75, "wait_ratio": 0.2},
        "s4": {"data_ratio": 0.25, "wait_ratio": 1},
    }
    assert compare.mixed_ratio(sizes, "wait_ratio") == pytest.approx(0.75 * 0.2 + 0.25)


def test_gain_against_the_training_wait_share_over_runs_and_within_seeds(tmp_path):
    rng = np.random.default_rng(3)
    recs, x, y, seeds = [], [], [], []
    for engineer, wait in (("fixed", 0.2), ("random", 0.5), ("rule", 0.9)):
        for seed in (0, 1, 2):
            bits = rng.random((3, 6)) < 0.5
            w = wait + 0.05 * seed
            run = fake_run(tmp_path / f"{engineer}_{seed}", seed, bits.tolist(), wait=w)
            recs.append(compare.run_record(run, f"{engineer}_s{seed}", engineer, seed))
            x.append(w)
            y.append(bits[-1].mean() - bits[0].mean())
            seeds.append(seed)
    rows = compare.gain_vs_training(recs)
    assert [r["wait_ratio"] for r in rows] == pytest.approx(x)
    assert [r["gain"] for r in rows] == pytest.approx(y)
    x, y, seeds = np.array(x), np.array(y), np.array(seeds)
    over, within = compare.gain_correlations(rows)
    assert over == pytest.approx(np.corrcoef(x, y)[0, 1])
    # Within seeds: the same after subtracting each seed's means (a NumPy transcription).
    xm = np.array([x[seeds == s].mean() for s in seeds])
    ym = np.array([y[seeds == s].mean() for s in seeds])
    assert within == pytest.approx(np.corrcoef(x - xm, y - ym)[0, 1])
    md = compare.summary_markdown(recs)
    assert f"r = {over:.2f} over the 9 runs, r = {within:.2f} within seeds" in md
    # One wait share for every run (the records() fixture): no correlation, no sentence.
    same = records(tmp_path / "same")
    assert np.isnan(compare.gain_correlations(compare.gain_vs_training(same))[0])
    assert "training share of puzzles that need a wait" not in compare.summary_markdown(same)


def test_summary_states_the_designs_detectable_difference(tmp_path):
    """Pooled per-seed spread of the paired differences -> stats.detectable_difference."""
    recs = records(tmp_path)
    p = compare.paired_vs(recs)
    d = np.array(p["learnability"]["seed_differences"])
    mdd, n = compare.detectable_difference(p)
    assert n == 3 and mdd == pytest.approx((4.303 + 1.061) * d.std(ddof=1) / np.sqrt(3), rel=1e-3)
    md = compare.summary_markdown(recs)
    assert f"Detectable difference of this design: {100 * mdd:.1f} points against fixed" in md


@pytest.mark.slow
def test_sweep_results_keep_records_of_runs_finished_elsewhere(tmp_path):
    """A sweep split across machines: a run whose directory is not here keeps its committed
    record; with no run directory at all the records alone give the same files."""
    import ml_collections

    from mapfjax.eval import sweep as sw

    rng = np.random.default_rng(1)
    runs = []
    for engineer in ("fixed", "learnability"):
        for seed in (0, 1, 2):
            bits = (rng.random((3, 6)) < 0.5).tolist()
            work = fake_run(tmp_path / "runs" / f"{engineer}_{seed}", seed, bits)
            name = f"{engineer}_s{seed}"
            runs.append(sw.Run(name, engineer, "V6", "bookkeeping", seed, "", (), work, 2))
    sweep = ml_collections.ConfigDict({"results": str(tmp_path / "results"), "reference": "fixed"})
    first = sw.write_results(runs, sweep, "python launch/sweep.py --config X --workdir W")
    md, csv = first.read_text(), (tmp_path / "results" / "summary.csv").read_text()
    assert "6 of 6 runs finished" in md and "`python launch/sweep.py --config X --workdir W" in md
    assert "`python launch/sweep.py --config X --workdir W --results_only`" in md
    for r in runs[3:]:  # learnability's directories are on another machine now
        (r.workdir / "round_1" / "DONE").unlink()
    again = sw.write_results(runs, sweep, "python launch/sweep.py --config X --workdir W")
    assert again.read_text() == md and (tmp_path / "results" / "summary.csv").read_text() == csv
    for r in runs:  # no run directory at all
        (r.workdir / "round_1" / "DONE").unlink(missing_ok=True)
    sw.write_results(runs, sweep, "python launch/sweep.py --config X --workdir W")
    assert first.read_text() == md and "Not summarised here" not in md
    # A sweep narrowed to seed 2 (--config.seeds='(2,)') summarises its own runs and names the
    # records it leaves out; they stay under runs/.
    narrow = sw.write_results([r for r in runs if r.seed == 2], sweep).read_text()
    assert "2 of 2 runs finished" in narrow
    assert "Not summarised here: 4 more records under runs/ from runs outside this sweep" in narrow
    assert "(fixed_s0, fixed_s1, learnability_s0, ...)" in narrow
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 6
    sw.write_results(runs, sweep, "python launch/sweep.py --config X --workdir W")
    assert first.read_text() == md
    (tmp_path / "results" / "runs" / "fixed_s0.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"fixed_s0\.json: not a run record"):
        sw.write_results(runs, sweep)


@pytest.mark.slow
def test_a_malformed_record_writes_nothing_and_names_its_field(tmp_path):
    """A committed record whose greedy string was cut, or that is {} or [], is refused in one
    line naming the file and field, before any file of the results is rewritten."""
    import ml_collections

    from mapfjax.eval import sweep as sw

    rng = np.random.default_rng(2)
    runs = []
    for seed in (0, 1):
        bits = (rng.random((3, 6)) < 0.5).tolist()
        work = fake_run(tmp_path / "runs" / f"fixed_{seed}", seed, bits)
        runs.append(sw.Run(f"fixed_s{seed}", "fixed", "V6", "bookkeeping", seed, "", (), work, 2))
    sweep = ml_collections.ConfigDict({"results": str(tmp_path / "results"), "reference": "fixed"})
    results = tmp_path / "results"
    sw.write_results(runs, sweep)
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    for r in runs:  # the records alone from now on
        (r.workdir / "round_1" / "DONE").unlink()
    path = results / "runs" / "fixed_s1.json"
    record = json.loads(path.read_text())
    record["rounds"][-1]["validation"]["greedy"] = record["rounds"][-1]["validation"]["greedy"][:3]
    for bad, message in [
        (record, r"fixed_s1.json: not a run record \(.*rounds\[1\].validation.greedy: 3 puzzles"),
        ({}, r"fixed_s1.json: not a run record \(.*field 'run' = None; allowed: a str"),
        ([], r"fixed_s1.json: not a run record \(.*a list; allowed: a run record"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            sw.write_results(runs, sweep)
        untouched = {p: p.read_bytes() for p in results.rglob("*") if p.is_file() and p != path}
        assert untouched == {p: b for p, b in before.items() if p != path}
