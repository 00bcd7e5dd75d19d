"""Sweep expansion into train.py commands (parsed back by the same flag machinery), skipping
finished runs, local execution order, and the summary across run directories."""

import json
import pathlib
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from mapfjax import configfile
from mapfjax.engineer.context import RoundRecord, failure_breakdown
from mapfjax.env import benchmark, io
from mapfjax.eval import sweep as sw

ROOT = pathlib.Path(__file__).resolve().parents[2]
SWEEP_FILE = str(ROOT / "configs" / "sweep_ablation.py")
sys.path.insert(0, str(ROOT / "configs"))
import sweep_ablation  # noqa: E402

variants = configfile.load_module("configs/engineer/variants.py")


def _sweep(**kw):
    c = sweep_ablation.get_config()
    for k, v in kw.items():
        c[k] = v
    return c


def _parse_train_argv(argv):
    """The config `launch/train.py` would build from this argv."""
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv[1:])
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    fv(["train.py", *argv[2:]])
    return fv.config, fv.workdir


def test_expand_commands_build_the_intended_configs(tmp_path):
    runs = sw.expand(_sweep(seeds=(0, 1)), tmp_path, sweep_ablation.get_config)
    names = [r.name for r in runs]
    want = {f"policy_V{i}_Tbookkeeping_s{s}" for i in range(1, 7) for s in (0, 1)}
    want |= {f"base_V6_Tbookkeeping_s{s}" for s in (0, 1)}
    want |= {f"policy_V6_Tfull_s{s}" for s in (0, 1)} | {"fixed_s0", "fixed_s1"}
    assert sorted(names) == sorted(want) and len(names) == len(set(names))
    commands = sw.plan(runs, _sweep(), SWEEP_FILE)
    assert len(commands) == len(runs)  # no evaluation configured
    for run, argv in zip(runs, commands, strict=True):
        assert argv[:2] == ["python", "launch/train.py"]
        cfg, workdir = _parse_train_argv(argv)
        assert workdir == str(tmp_path / run.name)
        assert cfg.seed == run.seed and cfg.rounds == run.rounds == 3
        assert cfg.engineer.settings.name == run.engineer
        assert "num_samples" not in cfg.engineer.settings or run.engineer != "fixed"
        if run.engineer != "fixed":
            expect = variants.get_config(run.variant).modules.to_dict()
            expect["T"]["detail"] = run.t_detail
            assert cfg.engineer.modules.to_dict() == expect
            assert cfg.engineer.variant == run.variant


def test_overrides_and_errors(tmp_path):
    sweep = _sweep(overrides="rounds=2, train.instances=32", train_arg="smoke")
    runs = sw.expand(sweep, tmp_path, sweep_ablation.get_config)
    assert {r.rounds for r in runs} == {2}
    cfg, _ = _parse_train_argv(sw.train_command(runs[0], SWEEP_FILE))
    assert cfg.rounds == 2 and cfg.train.instances == 32 and cfg.validation.per_size == 2
    with pytest.raises(ValueError, match=r"'train.bogus'.*no key 'bogus' under train"):
        sw.expand(_sweep(overrides="train.bogus=1"), tmp_path, sweep_ablation.get_config)
    bad = _sweep()
    bad.groups.context.variants = ("V9",)
    with pytest.raises(ValueError, match=r"variant 'V9'; allowed"):
        sw.expand(bad, tmp_path, sweep_ablation.get_config)
    with pytest.raises(ValueError, match="expected key=value"):
        sw.parse_overrides("rounds")
    spec = "validation.sizes=(3,4), engineer.variant='V1,x', a.b=[1,(2,3)],model.path=/p/q"
    assert sw.parse_overrides(spec) == {
        "validation.sizes": (3, 4),
        "engineer.variant": "V1,x",
        "a.b": [1, (2, 3)],
        "model.path": "/p/q",
    }


def _finish(run, rounds=None, rows=None):
    """A fake finished run directory: record.json for every round, DONE markers."""
    rounds = run.rounds if rounds is None else rounds
    rows = rows or [{"size": 3, "valid": True, "optimal": True, "failure": None}]
    for n in range(rounds):
        d = run.workdir / f"round_{n}"
        d.mkdir(parents=True, exist_ok=True)
        rec = RoundRecord(n, {"sizes": {}}, failure_breakdown(rows) if n == rounds - 1 else {})
        (d / "record.json").write_text(json.dumps(rec.to_dict()))
        (d / "DONE").write_text("")


def test_finished_runs_are_skipped(tmp_path):
    sweep = _sweep()
    sweep.evaluate.instances = "bench.jsonl"
    runs = sw.expand(sweep, tmp_path, sweep_ablation.get_config)
    _finish(runs[0])
    _finish(runs[1], rounds=runs[1].rounds - 1)  # not finished: last round missing
    (runs[0].eval_dir).mkdir()
    (runs[0].eval_dir / "results.json").write_text("{}")
    commands = sw.plan(runs, sweep, SWEEP_FILE)
    flat = [" ".join(c) for c in commands]
    assert not any(f"--workdir={runs[0].workdir}" in c for c in flat)
    assert not any(f"--out_dir={runs[0].eval_dir}" in c for c in flat)
    assert sum(f"--workdir={runs[1].workdir}" in c for c in flat) == 1
    assert len(commands) == 2 * len(runs) - 2

    executed = []

    def execute(argv):  # a fake runner: training "finishes" except for runs[2]
        executed.append(argv)
        if argv[1] == "launch/train.py":
            run = next(r for r in runs if f"--workdir={r.workdir}" in argv)
            if run is not runs[2]:
                _finish(run)
                return sw.Exit(0)
            return sw.Exit(2, "train.epochs = 0; allowed: an integer >= 1")
        out = pathlib.Path(argv[5].split("=", 1)[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text("{}")
        return sw.Exit(0)

    failed = sw.run_local(runs, sweep, SWEEP_FILE, "py", execute, log=lambda s: None)
    why = "training: train.epochs = 0; allowed: an integer >= 1"
    assert failed == {runs[2].name: why}
    row = sw.run_summary(runs[2], failed[runs[2].name])
    assert row["status"] == f"failed ({why})" and row["rounds_done"] == 0
    assert f"| failed ({why}) |" in sw.summary_tables([row])[0]
    trained = [a for a in executed if a[1] == "launch/train.py"]
    assert len(trained) == len(runs) - 1 and all(a[0] == "py" for a in executed)
    assert sw.plan(runs, sweep, SWEEP_FILE) == [sw.train_command(runs[2], SWEEP_FILE)] + [
        sw.eval_command(runs[2], sweep.evaluate)
    ]


def test_summary_reads_records_and_evaluations(tmp_path):
    runs = sw.expand(_sweep(), tmp_path, sweep_ablation.get_config)[:3]
    rows = [
        {"size": 3, "valid": True, "optimal": True, "failure": None},
        {"size": 3, "valid": False, "optimal": False, "failure": "hole"},
        {"size": 4, "valid": True, "optimal": False, "failure": None},
        {"size": 4, "valid": True, "optimal": False, "failure": None},
        {"size": 4, "valid": False, "optimal": False, "failure": "vertex_conflict"},
        {"size": 4, "valid": True, "optimal": True, "failure": None},
    ]
    _finish(runs[0], rows=rows)
    _finish(runs[1], rounds=1)
    runs[0].eval_dir.mkdir()
    means = {"all": {"3": [40.0, 20.0], "4": [10.0, 5.0]}}
    (runs[0].eval_dir / "results.json").write_text(json.dumps({"means": means}))
    got = [sw.run_summary(r) for r in runs]
    # size 3: 1/2 valid, 1/2 optimal; size 4: 3/4 valid, 1/4 optimal; mean over sizes.
    assert got[0]["valid"] == pytest.approx(62.5) and got[0]["optimal"] == pytest.approx(37.5)
    assert got[0]["rounds_done"] == 3 and got[0]["bench_3ag_valid"] == 40.0
    assert got[0]["bench_4ag_optimal"] == 5.0
    assert got[1]["rounds_done"] == 1 and got[1]["valid"] == 100.0
    assert got[2]["rounds_done"] == 0 and "bench_3ag_valid" not in got[2]
    assert [g["status"] for g in got] == ["finished", "unfinished", "unfinished"]
    md_path = sw.write_summary(runs, tmp_path)
    md = md_path.read_text()
    assert f"| {runs[0].name} |" in md and "| 62.5 | 37.5 |" in md
    csv_lines = (tmp_path / "summary.csv").read_text().splitlines()
    assert len(csv_lines) == 4 and csv_lines[0].startswith("run,engineer,variant")
    (runs[2].workdir / "round_0").mkdir(parents=True)
    (runs[2].workdir / "round_0" / "record.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"round_0/record.json: not a round record"):
        sw.run_summary(runs[2])


def test_launch_sweep_dry_run(tmp_path):
    cmd = [sys.executable, "launch/sweep.py", f"--config={SWEEP_FILE}", "--dry_run"]
    cmd += [f"--workdir={tmp_path}", "--config.seeds=(3,)"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("python launch/train.py")]
    assert len(lines) == 9
    assert any(f"--workdir={tmp_path}/fixed_s3 --config.seed=3" in ln for ln in lines)


def test_launch_sweep_workdir_that_is_a_file(tmp_path):
    work = tmp_path / "runs"
    work.write_text("not a directory")
    cmd = [sys.executable, "launch/sweep.py", f"--config={SWEEP_FILE}", "--dry_run"]
    res = subprocess.run(
        [*cmd, f"--workdir={work}"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: --workdir {work}: {work} is a file; expected a directory"
    ]


@pytest.mark.slow
def test_local_sweep_end_to_end(tiny_model_dir, tmp_path, monkeypatch, one_device_env):
    """The fixed baseline for real: train.py accepts the generated command, evaluate.py scores
    the final model, a second pass skips everything, and the summary has both parts."""
    monkeypatch.setenv("XLA_FLAGS", one_device_env["XLA_FLAGS"])  # the runs' subprocesses
    spec = benchmark.BenchmarkSpec(agents=(3,), sizes=(3,), wait_ratios=(0.25,), per_cell=2)
    io.save_instances(tmp_path / "bench.jsonl", benchmark.build(spec, progress=False)[0])
    sweep = _sweep(train_arg="smoke", overrides=f"model.path={tiny_model_dir}")
    sweep.groups = {"baseline": sweep.groups.baseline.to_dict()}
    sweep.evaluate.instances = str(tmp_path / "bench.jsonl")
    sweep.evaluate.max_new_tokens = 16
    runs = sw.expand(sweep, tmp_path / "sweep", sweep_ablation.get_config)
    assert [r.name for r in runs] == ["fixed_s0"]
    logs = []
    assert sw.run_local(runs, sweep, SWEEP_FILE, sys.executable, log=logs.append) == {}
    assert runs[0].finished and (runs[0].eval_dir / "results.json").exists()
    assert sw.run_local(runs, sweep, SWEEP_FILE, sys.executable, log=logs.append) == {}
    assert logs[-1].endswith("finished, skipped")
    row = sw.run_summary(runs[0])
    assert row["rounds_done"] == 2 and 0.0 <= row["valid"] <= 100.0
    assert 0.0 <= row["bench_3ag_valid"] <= 100.0


def test_a_failed_command_keeps_its_error_line(capfd):
    """The summary shows why a run failed, not `rounds_done 0` and blanks."""
    say = "import sys; sys.stderr.write('step 1\\r step 2\\nerror: {}\\n'); sys.exit({})"
    done = sw.run_command([sys.executable, "-c", say.format("rounds = 0; allowed", 2)])
    assert done == sw.Exit(2, "rounds = 0; allowed")
    assert "step 1\r step 2\nerror: rounds = 0" in capfd.readouterr().err  # passed through
    code = "import sys; sys.stderr.write('Traceback\\nKeyError: 3\\n'); sys.exit(1)"
    assert sw.run_command([sys.executable, "-c", code]) == sw.Exit(1, "KeyError: 3")
    assert sw.run_command([sys.executable, "-c", "print(1)"]) == sw.Exit(0, "")
