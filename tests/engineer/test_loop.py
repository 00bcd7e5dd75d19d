"""The closed loop end to end on a tiny random MAPF model: artifacts, resume, refusal, report."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from mapfjax.engineer.rundir import Position
from mapfjax.engineer.settings import RunSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "configs"))
import tiny_cpu  # noqa: E402


def smoke_config(model_dir):
    c = tiny_cpu.get_config("smoke")
    c.model.path = str(model_dir)
    return c


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    """One uninterrupted 2-round run (in-process), shared by the tests below."""
    from mapfjax.engineer import loop

    work = tmp_path_factory.mktemp("loop") / "run"
    return work, loop.run(smoke_config(tiny_model_dir), work)


def test_two_rounds_end_to_end(tiny_model_dir, reference_run):
    from mapfjax.engineer import loop
    from mapfjax.eval import report

    work, records = reference_run
    assert [r.round for r in records] == [0, 1]
    for n in (0, 1):
        d = work / f"round_{n}"
        for name in (
            "DONE",
            "config.json",
            "train_set.jsonl",
            "metrics.jsonl",
            "validation.json",
            "validation.md",
            "record.json",
        ):
            assert (d / name).exists(), (n, name)
    decision = json.loads((work / "round_0" / "decision.json").read_text())
    assert decision["engineer"] == "policy"
    # a random tiny model writes no usable YAML: the likelihood choice among local edits decides
    assert decision["extra"]["mode"] == "constrained" and not decision["kept_current"]
    r1 = json.loads((work / "round_1" / "config.json").read_text())
    assert r1 == decision["config"]
    assert (work / "round_1" / "model" / "model.safetensors").exists()
    steps = [
        json.loads(x)["step"] for x in (work / "round_0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4]  # 16 instances x 1 epoch / 4 problems per step
    rows = json.loads((work / "round_0" / "validation.json").read_text())["rows"]
    assert len(rows) == 2 * 3 and {r["size"] for r in rows} == {3, 4, 5}
    # Each row carries its puzzle's needs-wait label; the record counts the two halves.
    labels = [r["needs_wait"] for r in rows]
    assert all(isinstance(w, bool) for w in labels)
    split = records[0].wait_split
    assert sum(e["n"] for e in split.values()) == len(rows)
    assert split.get("needs_wait", {}).get("n", 0) == sum(labels)
    md = report.write_report(work).read_text()
    assert "| R0 |" in md and "| R1 |" in md and "After R0 (policy)" in md
    assert "## Held-out validation (greedy and sampled, 95 % intervals)" in md
    assert (work / "validation.png").exists() and (work / "configs.png").exists()
    # rerunning the same command recomputes nothing
    stamp = (work / "round_1" / "DONE").stat().st_mtime_ns
    again = loop.run(smoke_config(tiny_model_dir), work)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in records]
    assert (work / "round_1" / "DONE").stat().st_mtime_ns == stamp


def test_a_finished_run_given_more_rounds_continues(tiny_model_dir, reference_run, tmp_path):
    """rounds is a resumable change: the engineer decides after what was the last round (it
    had not), and the new round trains on that decision; finished rounds stay as they were."""
    import shutil

    from mapfjax.engineer import loop

    work = tmp_path / "run"
    shutil.copytree(reference_run[0], work)
    before = {p: p.read_bytes() for p in work.glob("round_[01]/*.json")}
    assert not (work / "round_1" / "decision.json").exists()
    c = smoke_config(tiny_model_dir)
    c.rounds = 3
    records = loop.run(c, work, progress=False)
    assert [r.round for r in records] == [0, 1, 2]
    assert all(p.read_bytes() == b for p, b in before.items())
    decision = json.loads((work / "round_1" / "decision.json").read_text())
    assert decision["engineer"] == "policy"
    assert json.loads((work / "round_2" / "config.json").read_text()) == decision["config"]
    assert (work / "round_2" / "DONE").exists()
    assert (work / "round_2" / "model" / "model.safetensors").exists()
    assert loop.run(c, work, progress=False)[-1].to_dict() == records[-1].to_dict()  # resumes


def test_refuses_a_run_dir_of_another_config(tiny_model_dir, tmp_path):
    from mapfjax.engineer import loop

    work = tmp_path / "run"
    work.mkdir()
    c = smoke_config(tiny_model_dir)
    loop.check_run_dir(work, c)
    c.train.group_size = 2
    c.optim.lr = 0.5
    with pytest.raises(loop.RunDirError) as e:
        loop.check_run_dir(work, c)
    assert "train.group_size" in str(e.value) and "optim.lr" in str(e.value)


@pytest.mark.slow
def test_kill_and_resume_gives_the_same_artifacts(tiny_model_dir, reference_run, tmp_path):
    """Kill a real training process mid-run, rerun the command: the same final artifacts as the
    uninterrupted run."""
    ref, _ = reference_run
    args = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'tiny_cpu.py'}:smoke",
        f"--config.model.path={tiny_model_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [*args, f"--workdir={cut}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 600
    while time.time() < deadline and not list(cut.glob("round_0/metrics.jsonl")):
        time.sleep(0.5)
    time.sleep(2.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (cut / "round_1" / "DONE").exists()
    subprocess.run(
        [*args, f"--workdir={cut}"], check=True, env=env, capture_output=True, timeout=900
    )
    for n in (0, 1):
        for name in ("config.json", "record.json"):
            a = json.loads((ref / f"round_{n}" / name).read_text())
            b = json.loads((cut / f"round_{n}" / name).read_text())
            assert a == b, (n, name)
    a, b = (json.loads((d / "round_0" / "decision.json").read_text()) for d in (ref, cut))
    assert a["config"] == b["config"] and a["diff"] == b["diff"]


# --------------------------------------------------------------------------- a damaged run dir


def _finished_rounds(work, c):
    """A run directory with rounds 0 and 1 finished, written the way `loop.run` writes them."""
    from mapfjax.engineer import context, proposal, rundir
    from mapfjax.engineer import records as rec

    rows = [
        {"size": 3, "valid": True, "optimal": True, "failure": None, "response_tokens": 9},
        {"size": 4, "valid": False, "optimal": False, "failure": "hole", "response_tokens": 4},
    ]
    current = c.env
    records = []
    for n in (0, 1):
        out = work / f"round_{n}"
        out.mkdir(parents=True)
        rundir.write_json(out / "config.json", current.to_dict())
        rundir.write_json(out / "validation.json", {"rows": rows})
        # Two logged steps; step 1 logged twice (a resumed step: the last row counts).
        steps = [(1, [[3, 1, 2.0, True]]), (1, [[3, 4, 0.0, False]]), (2, [[5, 2, 4.0, True]])]
        lines = [json.dumps({"step": s, "groups": g}) for s, g in steps]
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        summary = "more 4x4" if n == 1 else ""
        record = context.RoundRecord(
            n,
            current.to_dict(),
            context.failure_breakdown(rows),
            summary,
            rec.training_info(RunSettings.from_config(c), n),
            rollouts=rec.rollouts(out, RunSettings.from_config(c)),
        )
        if n == 0:
            d = proposal.apply_proposal(
                proposal.parse_proposal("sizes.s4.data_ratio: 0.5\nSummary: more 4x4"), current
            )
            rundir.write_json(out / "decision.json", d.to_dict())
            current = d.config
        rundir.write_json(out / "record.json", record.to_dict())
        (out / "DONE").write_bytes(b"")
        records.append(record)
    return records


def test_a_deleted_or_corrupt_record_is_recomputed(tmp_path, caplog):
    from mapfjax.engineer import loop

    c = tiny_cpu.get_config("smoke")
    work = tmp_path / "run"
    records = _finished_rounds(work, c)
    (work / "round_0" / "record.json").unlink()  # what the old advice said to do
    (work / "round_1" / "record.json").write_text("{ torn")
    position = Position(1, 4)
    with caplog.at_level("WARNING"):
        got = [loop.finished_round(work, n, RunSettings.from_config(c), position) for n in (0, 1)]
    assert [r.to_dict() for r, _ in got] == [r.to_dict() for r in records]
    g = c.train.group_size  # 4 in the smoke config
    assert got[0][0].rollouts["sizes"]["3"] == {
        "groups": 1, "samples": g, "valid_rate": 1.0, "mixed_groups": 0.0,
        "learnability": 0.0, "mean_abs_advantage": 0.0,
    }  # fmt: skip
    assert got[0][0].rollouts["sizes"]["5"]["learnability"] == 0.25
    assert got[0][1].config.sizes.s4.data_ratio == 0.5 and got[1][1] is None
    assert "recomputed from config.json and validation.json" in caplog.text
    assert json.loads((work / "round_1" / "record.json").read_text()) == records[1].to_dict()


def test_unrecoverable_files_say_exactly_what_to_delete(tmp_path):
    from mapfjax.engineer import loop

    c = tiny_cpu.get_config("smoke")
    work = tmp_path / "run"
    _finished_rounds(work, c)
    (work / "round_0" / "decision.json").write_text("not json")
    with pytest.raises(loop.RunDirError) as e:
        loop.finished_round(work, 0, RunSettings.from_config(c), Position(0, 4))
    msg = str(e.value)
    assert msg.startswith(f"{work / 'round_0' / 'decision.json'}: unreadable")
    assert f"delete {work / 'round_0' / 'DONE'} and rerun" in msg and "run_config" not in msg
    with pytest.raises(loop.RunDirError, match="round 0 cannot be recomputed .* round 1"):
        loop.finished_round(work, 0, RunSettings.from_config(c), Position(1, 4))
    # Recomputing round 1's record reads round 0's decision (its summary): the error names it,
    # not round 1's validation rows.
    (work / "round_1" / "record.json").unlink()
    with pytest.raises(loop.RunDirError) as e:
        loop.finished_round(work, 1, RunSettings.from_config(c), Position(1, 4))
    assert str(e.value).startswith(f"{work / 'round_0' / 'decision.json'}: unreadable")
    assert "no usable 'rows'" not in str(e.value)
    (work / "round_1" / "validation.json").write_text("")
    with pytest.raises(
        loop.RunDirError, match=r"validation\.json: unreadable .*record\.json cannot"
    ):
        loop.finished_round(work, 1, RunSettings.from_config(c), Position(1, 4))
    # run_config.json: never advise deleting it (a new one would skip the config check).
    loop.check_run_dir(work, c)
    (work / "run_config.json").write_text("{")
    with pytest.raises(loop.RunDirError) as e:
        loop.check_run_dir(work, c)
    assert "delete" not in str(e.value) and "restore it" in str(e.value)


def test_a_workdir_that_is_a_file_is_one_error(tmp_path):
    from mapfjax.engineer import loop

    (tmp_path / "file").write_text("x")
    for work in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(loop.RunDirError, match=r"--workdir .*file.*is a file; expected a dir"):
            loop.check_run_dir(work, tiny_cpu.get_config("smoke"))


def test_recomputed_records_match_the_real_run(reference_run, tmp_path):
    import shutil

    from mapfjax.engineer import loop

    ref, records = reference_run
    work = tmp_path / "copy"
    shutil.copytree(ref, work)
    for n in (0, 1):
        (work / f"round_{n}" / "record.json").unlink()
    c = tiny_cpu.get_config("smoke")
    got = [
        loop.finished_round(work, n, RunSettings.from_config(c), Position(1, 4))[0] for n in (0, 1)
    ]
    assert [r.to_dict() for r in got] == [r.to_dict() for r in records]


BAD_CONFIGS = [
    # (override, what the one-line error must say): each used to surface only after the start
    # validation or round 0's training, or not at all, with the workdir already claimed.
    (("env", "sizes", "s3", "data_ratio"), -1.0, r"env\.sizes\.s3\.data_ratio = -1\.0; allowed"),
    (("engineer", "settings", "name"), "bogus", r"engineer\.name = 'bogus'; allowed: \['api'"),
    (("engineer", "settings", "num_samples"), 0, r"engineer\.num_samples = 0"),
    (("engineer", "modules", "T", "detail"), "all", r"modules\.T\.detail = 'all'"),
    (("engineer", "variant"), "V99", r"engineer\.variant = 'V99'; allowed: one of \['V1'"),
    (("engineer", "temperature"), -1.0, r"engineer\.temperature = -1\.0"),
    (("validation", "per_size"), 0, r"validation\.per_size = 0; allowed: an integer >= 1"),
    (("validation", "sizes"), (3, 12), r"validation\.sizes = \(3, 12\); allowed: map sizes in"),
    (("validation", "sizes"), (), r"validation\.sizes = \(\); allowed: a non-empty tuple"),
    (("validation", "hole_ratios"), (0.1, 0.9), r"validation\.hole_ratios = \(0\.1, 0\.9\);"),
    (("validation", "samples"), -1, r"validation\.samples = -1"),
    (("optim", "lr"), -0.1, r"OptimConfig\.lr=-0\.1 is invalid"),
    (("train", "group_size"), 1, r"GRPOConfig\.group_size=1 is invalid"),
    (("train", "objective"), "ppo", r"train\.objective = 'ppo'"),
    (("rounds",), 0, r"rounds = 0; allowed"),
    (("env_start",), "randm", r"env_start = 'randm'; allowed: one of \['config', 'random'\]"),
    (("env_start_max_wait",), 0.0, r"env_start_max_wait = 0\.0; allowed: a number in \(0, 1\]"),
    (("env_start_max_wait",), True, r"env_start_max_wait = True; allowed: a number in \(0, 1\]"),
    (("model", "dtype"), "float7", r"model\.dtype = 'float7'"),
    # Values that used to claim the workdir before failing (or never failing).
    (("train", "instances"), 0, r"train\.instances = 0; allowed: an integer in \[1, "),
    (("train", "instances"), 10**8, r"train\.instances = 100000000; allowed: an integer in"),
    (("train", "epochs"), 0, r"train\.epochs = 0; allowed: an integer >= 1"),
    (("train", "checkpoint_every"), 0, r"train\.checkpoint_every = 0; allowed"),
    (("train", "problems_per_step"), 0, r"train\.problems_per_step = 0; allowed"),
    (("train", "max_new_tokens"), 0, r"train\.max_new_tokens = 0; allowed"),
    (("train", "top_p"), 0.0, r"train\.top_p = 0\.0; allowed: a number in \(0, 1\]"),
    (("optim", "lr"), float("inf"), r"optim\.lr = inf; allowed: a finite number > 0"),
    (("optim", "accum_steps"), 3, r"optim\.accum_steps = 3; allowed: a divisor of train\.prob"),
    (("optim", "group_split"), 3, r"optim\.group_split = 3; allowed: a divisor of train\.group"),
    (("mesh", "tp"), 3, r"mesh = \{.*'tp': 3\}: .*allowed: --config\.mesh"),
]


@pytest.mark.parametrize("keys,value,message", BAD_CONFIGS, ids=lambda x: str(x)[:40])
def test_a_bad_config_is_refused_before_anything_is_written(tmp_path, keys, value, message):
    from mapfjax.engineer import loop

    c = tiny_cpu.get_config("smoke")
    node = c
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    with pytest.raises(ValueError, match=message):
        loop.run(c, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_random_start_is_drawn_from_the_seed_over_the_configs_sizes():
    """env_start = "random": round 0's config is the random engineer's draw over c.env's sizes,
    the same for every run of a seed (so engineers compared on a seed start alike, and a resumed
    run starts where it started), another for another seed; "config" is c.env itself."""
    from mapfjax.engineer import loop
    from mapfjax.env import config as env_config

    c = tiny_cpu.get_config("answer_only")
    c.env_start = "random"
    draws = []
    for seed in (0, 0, 1):
        c.seed = seed
        start = loop.start_config(RunSettings.from_config(c))
        env_config.validate_at(start, "start")  # legal: ratios in range, data summing to 1
        assert sorted(start.sizes) == sorted(c.env.sizes)
        draws.append(start.to_dict())
    assert draws[0] == draws[1] and draws[0] != draws[2]
    waits = [s["wait_ratio"] for s in draws[0]["sizes"].values()]
    assert len(set(waits)) == len(waits)  # drawn per size, not c.env's 0.5 everywhere
    c.env_start = "config"
    assert loop.start_config(RunSettings.from_config(c)).to_dict() == c.env.to_dict()


def test_a_random_start_with_few_waits_scales_only_the_wait_draws():
    """env_start_max_wait = 0.3 (the curriculum comparison's wait test): the same seed draws
    the same data and hole ratios, and waits ~ U[0, 0.3] (the U[0, 1] draws x 0.3)."""
    from mapfjax.engineer import loop

    wide, few = tiny_cpu.get_config("answer_only"), tiny_cpu.get_config("answer_only")
    wide.env_start = few.env_start = "random"
    few.env_start_max_wait = 0.3
    assert few.env_start_max_wait == 0.3 and "env_start_max_wait" not in wide
    for seed in (0, 5, 9):
        wide.seed = few.seed = seed
        a, b = (
            loop.start_config(RunSettings.from_config(wide)).sizes,
            loop.start_config(RunSettings.from_config(few)).sizes,
        )
        for s in a:
            assert b[s].data_ratio == a[s].data_ratio and b[s].hole_ratio == a[s].hole_ratio
            assert b[s].wait_ratio == pytest.approx(0.3 * a[s].wait_ratio, abs=1e-4)
            assert 0 <= b[s].wait_ratio <= 0.3


def test_a_variant_that_does_not_match_its_modules_names_the_fix():
    """engineer.variant is a label: changing it alone would run V6 under V3's name."""
    from mapfjax.engineer import loop

    c = tiny_cpu.get_config("smoke")
    for arg in tiny_cpu.VARIANTS:
        loop.check_config(tiny_cpu.get_config(arg))
    c.engineer.variant = "V3"
    with pytest.raises(ValueError) as e:
        loop.check_config(c)
    msg = str(e.value)
    assert msg.startswith("engineer.variant = 'V3' but engineer.modules are not V3's")
    for fix in ("H.include_default=True", "S.enabled=False", "T.enabled=False"):
        assert f"--config.engineer.modules.{fix}" in msg
    for k, v in (("S.enabled", False), ("T.enabled", False), ("H.include_default", True)):
        m, opt = k.split(".")
        c.engineer.modules[m][opt] = v
    loop.check_config(c)  # now it is V3
    c.engineer.modules.T.enabled = True
    c.engineer.variant = "custom"
    loop.check_config(c)


def test_a_bad_model_path_leaves_no_run_behind(tmp_path):
    from mapfjax.engineer import loop

    c = tiny_cpu.get_config("smoke")
    c.model.path = str(tmp_path / "missing")
    with pytest.raises(OSError, match="missing: no such directory"):
        loop.run(c, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_api_key_in_the_config_is_not_written_to_the_run_directory(tmp_path):
    """Run directories get copied into results/ and shared; the key stays in the environment."""
    from mapfjax.engineer import loop

    c = tiny_cpu.engineer_settings("api")
    run = tiny_cpu.get_config("smoke")
    run.engineer = c
    run.engineer.settings.api_key = "sk-secret-123"
    loop.check_config(run)
    loop.check_run_dir(tmp_path / "run", run)
    text = (tmp_path / "run" / "run_config.json").read_text()
    assert "sk-secret" not in text
    assert json.loads(text)["engineer"]["settings"]["api_key"] == "<set>"
    for key in ("sk-another-key", ""):  # a new key, or the key moved to the environment
        run.engineer.settings.api_key = key
        loop.check_run_dir(tmp_path / "run", run)
    run.engineer.settings.model = "another-model"  # other settings still must match
    with pytest.raises(loop.RunDirError, match="engineer.settings.model: '' -> 'another-model'"):
        loop.check_run_dir(tmp_path / "run", run)


def test_an_unknown_config_variant_is_one_line_naming_the_known_ones(tmp_path):
    """A typo after the colon used to start the full ~15-minute job."""
    with pytest.raises(ValueError, match=r"tiny_cpu\.py:nosuch: no such variant; allowed: '', "):
        tiny_cpu.get_config("nosuch")
    work = tmp_path / "run"
    args = [sys.executable, str(ROOT / "launch" / "train.py")]
    config = f"{ROOT / 'configs' / 'tiny_cpu.py'}:nosuch"
    for how in ([f"--config={config}"], ["--config", config]):
        done = subprocess.run(
            [*args, *how, f"--workdir={work}"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines() == [
            "error: configs/tiny_cpu.py:nosuch: no such variant; allowed: '', 'answer_only', "
            "'smoke'"
        ]
    assert not work.exists()


def test_a_checkpoint_position_that_disagrees_with_the_rounds_is_refused(tmp_path):
    """A data position past the round's end would skip its updates and mark it done."""
    from mapfjax.engineer import loop, rundir

    work, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    for step in (2, 4):
        (ckpt / str(step)).mkdir(parents=True)
    rundir.check_position(rundir.Position.of({"round": 0, "step": 2}), work, ckpt, 4)
    with pytest.raises(loop.RunDirError) as e:
        rundir.check_position(rundir.Position.of({"round": 0, "step": 99}), work, ckpt, 4)
    msg = str(e.value)
    assert msg.startswith(f"{ckpt / '4'}: data position {{'round': 0, 'step': 99}} is not")
    assert f"delete {ckpt / '4'} to resume from the checkpoint before it" in msg
    (work / "round_0").mkdir()
    (work / "round_0" / "DONE").write_bytes(b"")
    rundir.check_position(rundir.Position.of({"round": 0, "step": 4}), work, ckpt, 4)
    rundir.check_position(rundir.Position.of({"round": 1, "step": 1}), work, ckpt, 4)
    for bad in ({"round": 0, "step": 2}, {"step": 4}, {"round": "1", "step": 0}):
        with pytest.raises(loop.RunDirError, match="data position"):
            rundir.check_position(rundir.Position.of(bad), work, ckpt, 4)


def test_extra_seeds_extend_the_held_out_set_after_its_first_draw(tmp_path):
    """`validation.extra_seeds`: the `seed` draw is the set's first part, unchanged; each extra
    seed adds its own draw with prefixed ids and no puzzle twice."""
    from mapfjax.engineer.settings import ValidationSettings
    from mapfjax.engineer.validation import held_out_set
    from mapfjax.env import io

    c = tiny_cpu.get_config("smoke")
    c.validation.per_size = 3
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base = held_out_set(tmp_path / "a", ValidationSettings.from_config(c))
    c.validation.extra_seeds = (c.validation.seed + 1, c.validation.seed + 2)
    both = held_out_set(tmp_path / "b", ValidationSettings.from_config(c))
    n = len(base)
    assert [p.id for p in both[:n]] == [p.id for p in base]
    assert [io.puzzle_hash(p) for p in both[:n]] == [io.puzzle_hash(p) for p in base]
    extra = both[n:]
    assert n < len(both) <= 3 * n
    assert {p.id.split("_")[0] for p in extra} == {f"x{s}" for s in c.validation.extra_seeds}
    hashes = [io.puzzle_hash(p) for p in both]
    assert len(set(hashes)) == len(hashes)
    assert len({p.id for p in both}) == len(both)


def test_the_main_jobs_held_out_set_begins_with_the_gates_400_puzzles(tmp_path):
    """The main job's first draw (validation.seed, before extra_seeds) is the go/no-go gate's
    committed held-out set, puzzle for puzzle: what makes its first 400 comparable with every
    gate arm and its other 800 fresh."""
    from mapfjax import configfile
    from mapfjax.engineer.settings import ValidationSettings
    from mapfjax.engineer.validation import held_out_set
    from mapfjax.env import io

    c = tiny_cpu.get_config("answer_only")
    assert c.validation.extra_seeds  # the answer-only job draws more after the gate's 400
    c.validation.extra_seeds = ()
    drawn = held_out_set(tmp_path, ValidationSettings.from_config(c))
    gate = io.load_instances(
        configfile.ROOT / "projects" / "go_no_go" / "results" / "held_out_400.jsonl"
    )
    assert [p.id for p in drawn] == [p.id for p in gate]
    assert [io.puzzle_hash(p) for p in drawn] == [io.puzzle_hash(p) for p in gate]
    # The committed 1,200 (projects/main_job/results/held_out_1200) are those 400, then the 800
    # fresh.
    part = configfile.ROOT / "projects" / "main_job" / "results" / "held_out_1200"
    whole = io.load_instances(part / "held_out_1200.jsonl")
    fresh = io.load_instances(part / "extra_800.jsonl")
    assert [p.id for p in whole] == [p.id for p in gate + fresh]
    assert all(p.id.startswith(("x12346_", "x12347_")) for p in fresh) and len(whole) == 1200


def test_an_edited_run_file_is_refused_naming_it(tmp_path):
    """Held-out set, training sets and finished rounds' files are checked against the digests
    recorded when they were written (an edited held-out set used to be paired silently)."""
    from mapfjax.engineer import loop
    from mapfjax.engineer.settings import ValidationSettings
    from mapfjax.engineer.validation import held_out_set

    c = tiny_cpu.get_config("smoke")
    c.validation.per_size = 1
    work = tmp_path / "run"
    work.mkdir()
    v = ValidationSettings.from_config(c)
    first = held_out_set(work, v)
    assert [p.id for p in held_out_set(work, v)] == [p.id for p in first]
    path = work / "validation_set.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([rows[1], rows[0], *rows[2:]]) + "\n")  # same puzzles, reordered
    with pytest.raises(loop.RunDirError) as e:
        held_out_set(work, v)
    assert str(e.value).startswith(f"{path}: changed since this run wrote it")
    assert "rerun the same command with a new --workdir" in str(e.value)

    _finished_rounds(work, c)  # written without digests: recorded as they are on first read
    loop.finished_round(work, 1, RunSettings.from_config(c), Position(1, 4))
    val = work / "round_1" / "validation.json"
    val.write_text(val.read_text().replace('"valid": false', '"valid": true'))
    with pytest.raises(loop.RunDirError, match=r"round_1/validation\.json: changed since"):
        loop.finished_round(work, 1, RunSettings.from_config(c), Position(1, 4))
    (work / "round_0" / "validation.json").write_text('{"rows": [')  # torn: named, no traceback
    (work / "digests.json").unlink()
    with pytest.raises(loop.RunDirError, match=r"round_0/validation\.json: unreadable"):
        loop.finished_round(work, 0, RunSettings.from_config(c), Position(1, 4))


def test_a_second_run_on_a_workdir_is_refused_and_a_stale_lock_taken_over(
    tiny_model_dir, tmp_path, caplog
):
    from mapfjax import files
    from mapfjax.engineer import loop

    work = tmp_path / "run"
    work.mkdir()
    hold = f"from mapfjax import files\nwith files.dir_lock({str(work)!r}, 'x'): input()"
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (work / "LOCK").exists() and time.time() < deadline:
            time.sleep(0.1)
        lock = (work / "LOCK").read_text()
        assert json.loads(lock)["pid"] == holder.pid
        with pytest.raises(files.LockedError) as e:
            loop.run(smoke_config(tiny_model_dir), work)
        assert str(e.value).startswith(f"--workdir {work} is in use by pid {holder.pid} on ")
        assert f"delete {work / 'LOCK'} if it is no longer running" in str(e.value)
        assert (work / "LOCK").read_text() == lock
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is taken over, and released when the block ends
    with caplog.at_level("WARNING"), files.dir_lock(work, "--workdir"):
        assert json.loads((work / "LOCK").read_text())["pid"] == os.getpid()
        with pytest.raises(files.LockedError, match=f"in use by pid {os.getpid()}"):
            with files.dir_lock(work, "--workdir"):
                pass
    assert f"taking over the lock of pid {holder.pid}" in caplog.text
    assert sorted(p.name for p in work.iterdir()) == ["run_config.json"]  # no LOCK, no temp


def test_an_engineer_that_cannot_run_warns_or_stops_the_run(tmp_path, caplog, monkeypatch):
    """An unreachable API engineer used to be recorded in decision.json only."""
    from mapfjax.engineer import loop

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    c = tiny_cpu.get_config("smoke")
    c.engineer = tiny_cpu.engineer_settings("api")
    c.engineer.settings.model = "some-model"
    records = _finished_rounds(tmp_path / "run", c)
    out = tmp_path / "run" / "round_1"
    args = (1, records, c.env, RunSettings.from_config(c), None, None, None, out)
    with caplog.at_level("WARNING"):
        d = loop._engineer(*args, False)
    assert d.kept_current and d.config.to_dict() == c.env.to_dict()
    [line] = [r.getMessage() for r in caplog.records if "engineer failed" in r.getMessage()]
    assert line.startswith("round 1: the api engineer failed (")
    assert "--strict_engineer stops the run" in line
    (out / "decision.json").unlink()
    with pytest.raises(loop.EngineerError, match=r"round 1: the api engineer failed \("):
        loop._engineer(*args, True)
    assert not (out / "decision.json").exists()


def test_a_torn_metrics_line_or_edited_held_out_set_on_resume(
    tiny_model_dir, reference_run, tmp_path, caplog
):
    """Killed mid-append: the torn last line is dropped with a warning and the rerun finishes
    (it used to fail at the end of the round, on every rerun). An edited held-out set is
    refused before anything is trained on it."""
    import shutil

    from mapfjax.engineer import loop
    from mapfjax.eval import report

    ref, records = reference_run
    work = tmp_path / "copy"
    shutil.copytree(ref, work)
    (work / "round_1" / "DONE").unlink()
    shutil.rmtree(work / "round_1" / "model")
    for n in (0, 1):
        with open(work / f"round_{n}" / "metrics.jsonl", "a") as f:
            f.write('{"step": 5, "round": 1, "seconds": 0.')
    with caplog.at_level("WARNING"):
        again = loop.run(smoke_config(tiny_model_dir), work)
        md = report.write_report(work).read_text()
    assert [r.to_dict() for r in again] == [r.to_dict() for r in records]
    assert "| R1 |" in md and (work / "round_1" / "model" / "model.safetensors").exists()
    lines = (work / "round_1" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    assert f"{work / 'round_1' / 'metrics.jsonl'}:5: the last line is torn" in caplog.text
    assert f"{work / 'round_0' / 'metrics.jsonl'}:5: the last line is torn" in caplog.text
    # a finished run's deleted export is written again from the last round's checkpoint
    shutil.rmtree(work / "round_1" / "model")
    loop.run(smoke_config(tiny_model_dir), work)
    assert (work / "round_1" / "model" / "model.safetensors").exists()

    path = work / "validation_set.jsonl"
    path.write_text(path.read_text().replace('"id": "', '"id": "x', 1))
    c = smoke_config(tiny_model_dir)
    c.rounds = 3
    with pytest.raises(loop.RunDirError, match=r"validation_set\.jsonl: changed since this run"):
        loop.run(c, work)
    assert not (work / "round_2").exists()
