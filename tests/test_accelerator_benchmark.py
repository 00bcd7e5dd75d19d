"""benchmarks/accelerator.py in its tiny mode on CPU: every figure of the JSON is present and
finite, except those the run names as not measured (CPU keeps no memory statistics; an unknown
model size is skipped with a message), and the Markdown table is written beside it; with
--profile, the decode step's parts are in both."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _leaves(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, tree


def test_tiny_mode_writes_every_figure(tmp_path, one_device_env):
    # As a user runs it: its own process on one CPU device.
    # --profile: the decode profile's tiny form (off by default), in the same run.
    argv = ["--models", "tiny,13b", "--out", str(tmp_path), "--repeats", "1", "--profile"]
    # CPU has no entry in the peak table: name peaks so that roofline and MFU are computed.
    argv += ["--peak-bandwidth", "2e10", "--peak-flops", "1e11"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/accelerator.py"), *argv],
        env=one_device_env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "unknown model size '13b'" in run.stderr
    (path,) = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    assert path.stem == "cpu" and result["device"]["jax"] == jax.__version__
    text = path.with_suffix(".md").read_text()
    assert "| tiny |" in text

    missing = result["missing"]
    # and, where a decode-profile part measured 0, its bandwidth fraction (_check_profile)
    parts_named = {m for m in missing if m.startswith("models.tiny.profile[")}
    assert set(missing) - parts_named == {"models.13b", "models.tiny.memory.peak"}, missing
    assert "unknown model size '13b'" in missing["models.13b"]
    assert "no memory statistics" in missing["models.tiny.memory.peak"]

    tiny = result["models"]["tiny"]
    for section in ("grpo", "memory", "parity", "sampling", "profile"):
        assert tiny[section], section
    assert len(tiny["sampling"]) == 4  # batches 1, 4 x budgets 8, 32
    numbers = 0
    for path, value in _leaves({k: v for k, v in result.items() if k != "missing"}):
        if value is None:
            assert any(path.startswith(m) for m in missing), f"{path} is None but not named"
        elif isinstance(value, int | float) and not isinstance(value, bool):
            assert math.isfinite(value), path
            numbers += 1
    assert numbers > 40
    assert 0 < tiny["parity"]["top1_agreement"] <= 1 and tiny["grpo"]["mfu"] > 0
    # The default attention is "fused": its own error against bf16 einsum is reported too.
    assert 0 < tiny["parity"]["attention_vs_einsum_top1_agreement"] <= 1
    assert tiny["memory"]["plan_step_bytes"] >= tiny["memory"]["plan_update_bytes"] > 0
    _check_profile(tiny["profile"], text, bench_parts(), missing)


def bench_parts():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "decode_profile", ROOT / "benchmarks/decode_profile.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name, _ in module.PARTS]


def _check_profile(rows, text, parts, missing):
    """Every part at each of the tiny mode's batches with a time >= 0, its share of the whole
    step and its bandwidth fraction (a peak was named; a part no longer than the timing loop's
    own iteration, taken off, measures 0 and has none, named in `missing`); the sum against the
    step; the table."""
    assert [r["batch"] for r in rows] == [1, 2]  # the tiny mode's sampling batches
    unmeasured = set()
    for i, r in enumerate(rows):
        assert [p["part"] for p in r["parts"]] == parts
        assert r["full_step_ms"] > 0 and r["window"] >= 1 and r["column"] >= 1
        for j, p in enumerate(r["parts"]):
            assert p["ms"] >= 0 and p["bytes"] > 0, p
            assert math.isclose(p["share"], p["ms"] / r["full_step_ms"], rel_tol=1e-6), p
            if p["bandwidth_fraction"] is None:
                assert p["ms"] == 0, p
                unmeasured.add(f"models.tiny.profile[{i}].parts[{j}].bandwidth_fraction")
            else:
                assert p["bandwidth_fraction"] >= 0, p
        total = sum(p["ms"] for p in r["parts"])
        assert math.isclose(r["sum_of_parts_ms"], total, rel_tol=1e-6)
        assert math.isclose(r["other_ms"], r["full_step_ms"] - total, rel_tol=1e-6, abs_tol=1e-9)
        assert math.isclose(r["sum_share"] + r["other_share"], 1.0, rel_tol=1e-6)
    assert unmeasured == {m for m in missing if m.startswith("models.tiny.profile[")}
    assert "Decode step profile" in text
    for part in [*parts, "sum of parts", "overlap/other", "**full step**"]:
        assert f"| tiny | 2 | 16 + 7 @ 4 | {part} |" in text, part


def test_a_part_no_longer_than_the_empty_iteration_is_named_not_measured(monkeypatch):
    """A part whose time, less the timing loop's own iteration, is 0 has no bandwidth
    fraction, and the report names it at the JSON's path; measured parts keep theirs."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("dp", ROOT / "benchmarks/decode_profile.py")
    dp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dp)
    part = {"what": "-", "count": 1, "bytes": 1000}
    measured = {
        "prompt_len": 8, "column": 4, "window": 4, "full_step_s": 1e-3, "call_overhead_s": 0.0,
        "parts": {"rope": {**part, "s": 0.0, "per_call_s": 0.0},
                  "MLP": {**part, "s": 1e-4, "per_call_s": 1e-4}},
    }  # fmt: skip
    monkeypatch.setattr(dp, "profile_batch", lambda *a, **k: measured)
    named = {}
    report = types.SimpleNamespace(lack=lambda field, why: named.setdefault(field, why))
    opts, shapes = (
        types.SimpleNamespace(repeats=1),
        types.SimpleNamespace(new_tokens=(8,), prompt_len=8),
    )
    rows = dp.profile(None, None, opts, shapes, {"peak_bandwidth": 1e10}, report, "tiny", (1, 2))
    assert [p["bandwidth_fraction"] for p in rows[1]["parts"]] == [None, 1000 / 1e10 / 1e-4]
    assert set(named) == {f"models.tiny.profile[{i}].parts[0].bandwidth_fraction" for i in (0, 1)}
    assert named["models.tiny.profile[1].parts[0].bandwidth_fraction"].startswith("rope: ")


def test_profile_is_off_by_default(monkeypatch):
    bench = _bench(monkeypatch)
    assert bench.parse_args([]).profile is False
    assert bench.parse_args(["--profile"]).profile is True
    opts = bench.parse_args(["--models", "0.6b"])
    assert bench.profile_batches(opts, bench.Shapes.parse(opts)) == (1, 64)
    opts = bench.parse_args(["--models", "0.6b", "--batches", "8"])
    assert bench.profile_batches(opts, bench.Shapes.parse(opts)) == (8,)
    # A result without a profile has no profile table (the default run is unchanged).
    device = {"name": "cpu", "platform": "cpu", "count": 1, "jax": "0", "date": "now",
              "peak_bandwidth": None, "peak_flops": None, "peak_source": "none"}  # fmt: skip
    settings = {"remat": "full", "attention": "fused"}
    result = {"device": device, "shapes": {"accum": 1}, "missing": {}, "settings": settings,
              "models": {"tiny": {}}}  # fmt: skip
    assert "Decode step profile" not in bench.markdown(result)


# A GRPO step's figures as grpo_step returns them (the fields the tables read).
GRPO = {"prompts": 2, "group": 2, "prompt_len": 16, "completion_len": 16, "rollout_s": 1.0,
        "update_s": 2.0, "tokens_per_s": 21.3, "mfu": 0.1, "compile_rollout_s": 3.0,
        "compile_update_s": 4.0}  # fmt: skip


def _bench(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("accelerator", ROOT / "benchmarks/accelerator.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "accelerator", bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    return bench


def test_finished_models_are_written_before_the_next_one_runs(tmp_path, monkeypatch):
    # Each model runs in its own process; the parent writes the table after each, so a run cut
    # off (a time limit, a crash) during a later model keeps the earlier ones.
    bench = _bench(monkeypatch)
    device = {"name": "Fake GPU", "platform": "gpu", "count": 1, "jax": "0", "date": "now",
              "peak_bandwidth": 1.0, "peak_flops": 1.0, "peak_source": "test"}  # fmt: skip
    seen = []

    def fake_run(cmd, check):
        name, part = cmd[cmd.index("--models") + 1], cmd[cmd.index("--part") + 1]
        seen.append(name)
        if name == "1.7b":  # the second model: the first is on disk already
            written = json.loads((tmp_path / "fake-gpu.json").read_text())
            assert set(written["models"]) == {"0.6b"}
            return subprocess.CompletedProcess(cmd, -9)
        pathlib.Path(part).write_text(json.dumps(
            {"device": device, "models": {name: {"sampling": []}}, "missing": {}}
        ))  # fmt: skip
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    result = bench.main(["--models", "0.6b,1.7b", "--out", str(tmp_path)])
    assert seen == ["0.6b", "1.7b"]
    assert set(result["models"]) == {"0.6b"}
    assert "exited with -9" in result["missing"]["models.1.7b"]
    final = json.loads((tmp_path / "fake-gpu.json").read_text())
    assert final["missing"] == result["missing"] and (tmp_path / "fake-gpu.md").exists()


def test_attention_flag_takes_the_registered_implementations(capsys, monkeypatch):
    bench = _bench(monkeypatch)
    assert bench.parse_args(["--attention", "splash"]).attention == "splash"
    assert bench.parse_args([]).attention == "fused"
    try:
        bench.parse_args(["--attention", "flash"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--attention flash was accepted")
    assert "invalid choice: 'flash'" in capsys.readouterr().err


def test_one_model_is_written_after_every_measurement(tmp_path, monkeypatch):
    # A run stopped between measurements (here: during parity) leaves the table of what it
    # measured, naming where it stopped.
    bench = _bench(monkeypatch)
    monkeypatch.setattr(bench, "grpo_step", lambda *a: (GRPO, {"peak_bytes": 5}, None))

    def stopped(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "parity", stopped)
    try:
        bench.main(["--models", "tiny", "--out", str(tmp_path), "--peak-bandwidth", "1"])
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the stop did not reach the caller")
    (path,) = tmp_path.glob("*.json")
    written = json.loads(path.read_text())
    assert written["models"]["tiny"]["grpo"] == GRPO and "parity" not in written["models"]["tiny"]
    assert "stopped after the GRPO step" in written["missing"]["models.tiny"]
    assert "stopped after the GRPO step" in path.with_suffix(".md").read_text()


def test_a_terminated_parent_stops_its_child_and_keeps_its_part(tmp_path):
    # `timeout` terminates the parent mid-model: the child is stopped, and what the child had
    # written of its part (here the GRPO step) is in the table with both reasons.
    child = tmp_path / "child.py"
    child.write_text(
        "import json, os, sys, time\n"
        "part = sys.argv[sys.argv.index('--part') + 1]\n"
        "device = {'name': 'Fake GPU', 'platform': 'gpu', 'count': 1, 'jax': '0', 'date': 'now',\n"
        "          'peak_bandwidth': 1.0, 'peak_flops': 1.0, 'peak_source': 'test'}\n"
        "why = {'models.0.6b': 'stopped after the GRPO step; later ones are absent'}\n"
        f"models = {{'0.6b': {{'grpo': {GRPO!r}}}}}\n"
        "json.dump({'device': device, 'models': models, 'missing': why}, open(part, 'w'))\n"
        f"open({str(tmp_path / 'child.pid')!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    driver = (
        "import importlib.util, sys\n"
        f"path = {str(ROOT / 'benchmarks/accelerator.py')!r}\n"
        "spec = importlib.util.spec_from_file_location('accelerator', path)\n"
        "bench = importlib.util.module_from_spec(spec); sys.modules['accelerator'] = bench\n"
        "spec.loader.exec_module(bench)\n"
        f"bench.__file__ = {str(child)!r}\n"
        f"bench.main(['--models', '0.6b,1.7b', '--out', {str(tmp_path / 'out')!r}])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    pid_file = tmp_path / "child.pid"
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    child_pid = int(pid_file.read_text())
    for _ in range(50):  # killed and reaped by the parent's subprocess.run
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the child {child_pid} outlived its parent")
    written = json.loads((tmp_path / "out" / "fake-gpu.json").read_text())
    assert written["models"] == {"0.6b": {"grpo": GRPO}}
    assert "stopped after the GRPO step" in written["missing"]["models.0.6b"]
    assert "SystemExit in the parent" in err
