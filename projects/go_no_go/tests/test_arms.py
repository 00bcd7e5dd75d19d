"""The shell scripts that chain hours of planned runs: every one parses, and the helpers they
share (`arms/arms.sh`) tell a NO-GO verdict from a failure and refuse bad update counts."""

import json
import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
ARMS = ROOT / "projects" / "go_no_go" / "arms"
RECIPES = "projects/go_no_go/configs/tiny_model.py"
SCRIPTS = sorted(ARMS.glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _bash(tmp_path, body: str, fake_python: bool = True) -> subprocess.CompletedProcess:
    """`body` run by bash in tmp_path with arms.sh sourced and `python` a stub that exits with
    $RC, writes the file $WRITE (a verdict's name) into its last argument when it is set and
    appends its arguments to calls.txt (fake_python=False: the real Python)."""
    script = f"set -euo pipefail\nsource {ARMS / 'arms.sh'}\n{body}\n"
    if not fake_python:
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(
        '#!/usr/bin/env bash\nargs="$*"\necho "${args#-m }" >> calls.txt\n'
        '[ -n "${WRITE:-}" ] && touch "${@: -1}/$WRITE"\nexit "${RC:-0}"\n'
    )
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    cmd = ["bash", "-c", script]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "rc, write, ok",
    [(0, True, True), (1, True, True), (1, False, False), (2, True, False), (0, False, False)],
)
@pytest.mark.parametrize("mismatched", [None, "3x3", "no_wait"])
def test_gate_counts_a_fresh_verdict_with_exit_0_or_1(tmp_path, rc, write, ok, mismatched):
    """The verdict looked for is the one the run writes (verdict_<name>.md against a mismatch
    other than 3x3), and only when written by this run: another arm's, or an older one,
    does not count."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "verdict.md").touch()  # the 3x3 verdict of an earlier command
    old = tmp_path / "out" / "verdict_no_wait.md"
    old.touch()
    os.utime(old, (1, 1))
    os.utime(tmp_path / "out" / "verdict.md", (1, 1))
    name = "verdict.md" if mismatched in (None, "3x3") else f"verdict_{mismatched}.md"
    env = f"RC={rc} " + (f"WRITE={name} " if write else "")
    flag = "" if mismatched is None else f"--mismatched {mismatched} "
    out = _bash(tmp_path, f"export {env}\nif gate {flag}out; then echo ok; else echo failed; fi")
    assert out.stdout.strip() == ("ok" if ok else "failed"), out.stderr


@pytest.mark.parametrize("value, ok", [("12", True), ("1", True), ("0", False), ("", False),
                                       ("3x", False), (None, False)])  # fmt: skip
def test_check_counts_refuses_what_is_not_a_count(tmp_path, value, ok):
    assign = "" if value is None else f"N={value}\n"
    out = _bash(tmp_path, f"{assign}check_counts pilots.txt N\necho passed")
    assert (out.returncode == 0 and out.stdout.strip() == "passed") == ok
    if not ok:
        assert out.returncode == 2 and "pilots.txt holds N=" in out.stderr


@pytest.mark.parametrize("built", [0, 2, 3])
def test_build_start_runs_the_recipe_steps_not_built_yet_with_extra_flags(tmp_path, built):
    """build_start skips each step whose export holds VALIDATION.md and passes EXTRA's flags
    to the others, in the recipe's order."""
    exports = [
        "tiny_trace_grid/export_aw10_6000",
        "tiny_trace_long/export",
        "tiny_trace_wait/export",
    ]
    for d in exports[:built]:
        (tmp_path / "runs" / d).mkdir(parents=True)
        (tmp_path / "runs" / d / "VALIDATION.md").touch()
    out = _bash(tmp_path, 'EXTRA="--config.processes=14 --config.x=1" build_start\necho done')
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    log = tmp_path / "calls.txt"
    calls = log.read_text().splitlines() if log.exists() else []
    variants = [":trace ", ":trace_long ", ":trace_wait "][built:]
    assert len(calls) == len(variants), calls
    for call, variant in zip(calls, variants, strict=True):
        assert call.startswith(f"launch/train_tiny.py --config {RECIPES}" + variant)
        assert call.endswith("--config.processes=14 --config.x=1"), call
    if built == 0:
        assert "--config.out_dir=runs/tiny_trace_grid/export_aw10_6000" in calls[0]


def _shipped_made(tmp_path) -> None:
    """What evaluate.py writes for the shipped model on arm x (the stub writes nothing)."""
    made = tmp_path / "runs" / "gng_x_shipped"
    made.mkdir(parents=True)
    for name in ("results.md", "results.csv", "verdicts.jsonl"):
        (made / name).write_text(name)


def _arm_rounds(tmp_path, *rounds: int) -> None:
    """An exported arm out/arm with these rounds validated."""
    for k in rounds:
        d = tmp_path / "out" / "arm" / "matched" / f"round_{k}"
        d.mkdir(parents=True)
        (d / "validation.json").write_text("{}")


def test_vs_shipped_evaluates_the_shipped_model_once_then_compares(tmp_path):
    """The shipped model is evaluated on the arm's held-out puzzles the first time only (its
    files copied beside the arm's), the three-way comparison every time."""
    _arm_rounds(tmp_path, 0)
    _shipped_made(tmp_path)
    body = 'vs_shipped out/arm runs/gng_x "GRPO (arm)"\nvs_shipped out/arm runs/gng_x "GRPO (arm)"'
    out = _bash(tmp_path, body)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[0] for c in calls] == [
        "launch/evaluate.py", "launch/compare_evals.py", "launch/compare_evals.py"
    ]  # fmt: skip
    assert "--instances runs/gng_x/matched/validation_set.jsonl" in calls[0]
    assert "--out_dir runs/gng_x_shipped" in calls[0]
    assert (tmp_path / "out" / "arm" / "shipped" / "verdicts.jsonl").read_text() == "verdicts.jsonl"
    assert "out/arm/matched/round_0/validation.json,out/arm/shipped" in calls[1]
    assert "start (trace_wait),GRPO (arm),shipped model" in calls[1]
    assert calls[1].endswith("--out out/arm/vs_shipped.md")


@pytest.mark.parametrize("rounds, want", [((0, 1, 2, 10), "round_10"), ((), None)])
def test_vs_shipped_compares_the_last_round(tmp_path, rounds, want):
    """A run of several rounds is compared at its last (by number, round_10 after round_2); an
    arm with no validated round is refused before the shipped model is evaluated."""
    _arm_rounds(tmp_path, *rounds)
    _shipped_made(tmp_path)
    out = _bash(tmp_path, 'vs_shipped out/arm runs/gng_x "GRPO (arm)"')
    if want is None:
        assert out.returncode == 2 and "holds no round_*/validation.json" in out.stderr
        assert not (tmp_path / "calls.txt").exists()
    else:
        assert out.returncode == 0, out.stderr
        calls = (tmp_path / "calls.txt").read_text().splitlines()
        assert f"out/arm/matched/{want}/validation.json,out/arm/shipped" in calls[-1]


@pytest.mark.parametrize("labels", ['"GRPO (flags, seed 3)"', '"GRPO (arm)" "grid, 6000"'])
def test_vs_shipped_refuses_a_label_with_a_comma_before_running_anything(tmp_path, labels):
    out = _bash(tmp_path, f"vs_shipped out/arm runs/gng_x {labels}")
    assert out.returncode == 2 and "holds a comma" in out.stderr
    assert not (tmp_path / "calls.txt").exists()


def test_vs_shipped_names_the_start_it_is_given(tmp_path):
    _arm_rounds(tmp_path, 0)
    _shipped_made(tmp_path)
    out = _bash(tmp_path, 'vs_shipped out/arm runs/gng_x "GRPO (arm)" "grid trace 6000"')
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert "start (grid trace 6000),GRPO (arm),shipped model" in calls[-1]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_vs_shipped_label_is_one_label(script):
    """compare_evals splits --labels at commas: a label with one stops the arm's last step
    (every quoted argument of the call, continuation lines joined, and every quoted value of
    a variable the calls take their labels from)."""
    for line in script.read_text().replace("\\\n", " ").splitlines():
        label_var = re.search(r"\b(GRPO|LABEL|ML)=\"", line)
        if line.startswith(("vs_shipped ", "pilot_then_arm ")) or label_var:
            labels = line.split('"')[1::2]
            assert labels, f"{script.name}: {line}"
            for label in labels:
                assert "," not in label, f"{script.name}: {line}"


def test_pilot_then_arm_with_its_count_kept_runs_the_arm_and_its_comparison(tmp_path):
    """The arm's flags, pilot count, seed, draw, no-wait mismatch, workdir and output follow
    NAME and the kept count; its table beside the shipped model comes last."""
    r = tmp_path / "projects" / "go_no_go" / "results"
    r.mkdir(parents=True)
    (r / "trace_x_pilot.txt").write_text("NX=7\n")
    _shipped_made(tmp_path)
    (r / "trace_wait_x" / "matched" / "round_0").mkdir(parents=True)
    (r / "trace_wait_x" / "matched" / "round_0" / "validation.json").write_text("{}")
    body = (
        "export WRITE=verdict_no_wait.md\nTRACE_WAIT=(--policy p)\n"
        'pilot_then_arm x NX 4 99 "GRPO (X)" --groups 2 --screen 2\necho "NX=$NX"'
    )
    out = _bash(tmp_path, body)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert out.returncode == 0 and out.stdout.strip().endswith("NX=7"), out.stderr
    assert [c.split()[0] for c in calls] == [
        "projects.go_no_go.go_no_go", "launch/evaluate.py", "launch/compare_evals.py"
    ]  # fmt: skip
    assert calls[0] == (
        "projects.go_no_go.go_no_go --policy p --groups 2 --screen 2 --updates 7 --seed 4 "
        "--held_out_seed 99 --mismatched no_wait --mismatched_when gain --workdir runs/gng_x "
        "--out projects/go_no_go/results/trace_wait_x"
    )
    assert "GRPO (X),shipped model" in calls[2]


@pytest.mark.parametrize("verdict, rc", [(None, 2), ("**GO** (400 held-out puzzles)", 0)])
def test_arm_i_runs_only_after_arm_h_missed_the_gate(tmp_path, verdict, rc):
    """arms/trace_optim.sh refuses to start before H's verdict exists and runs nothing when H
    passed."""
    (tmp_path / "projects" / "go_no_go" / "arms").mkdir(parents=True)
    for name in ("arms.sh", "trace_optim.sh"):
        (tmp_path / "projects" / "go_no_go" / "arms" / name).write_text((ARMS / name).read_text())
    if verdict is not None:
        h = tmp_path / "projects" / "go_no_go" / "results" / "trace_wait_more"
        h.mkdir(parents=True)
        (h / "verdict_no_wait.md").write_text(verdict + "\n")
    out = _bash(tmp_path, "bash projects/go_no_go/arms/trace_optim.sh")
    assert out.returncode == rc, out.stderr
    assert not (tmp_path / "calls.txt").exists()  # nothing was run
    assert ("runs after arm H" in out.stderr) if rc else ("arm I is not run" in out.stdout)


@pytest.mark.parametrize("grad_norm, want", [(0.05, "6"), (2.0, None)])
def test_momentum_lr_is_twice_adams_step_per_unit_of_gradient(tmp_path, grad_norm, want):
    """PLAN_optim.md's rule, with the real Python: Adam's updates moved 1500 x the scheduled lr
    for gradients of norm 0.05, so momentum needs lr 2 x 1e-4 x 1500 / 0.05 = 6 for twice the
    step (1e-4: the run's peak lr); a clipped gradient breaks the rule and is refused."""
    d = tmp_path / "matched" / "round_0"
    d.mkdir(parents=True)
    (d / "record.json").write_text("{}")
    lrs = [1e-4 / 3, 2e-4 / 3, 1e-4, 1e-4]
    rows = [
        {"step": k + 1, "train_lr": lr, "train_grad_norm": grad_norm,
         "train_update_norm": 1500 * lr * (1 + 0.01 * k)}
        for k, lr in enumerate(lrs)
    ]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _bash(tmp_path, "momentum_lr matched", fake_python=False)
    if want is None:
        assert out.returncode != 0 and "was clipped" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert float(out.stdout) == pytest.approx(6 * 1.015, rel=1e-3)  # the median's 1.015


@pytest.mark.parametrize(
    "seconds, scale, want",
    [
        ([200.0, 100.0, 110.0, 90.0], "", "16"),
        ([200.0, 100.0, 110.0, 90.0], " 4", "4"),  # 1650 / (4 x 100)
        ([200.0, 100.0, 110.0, 90.0], " 0", "allowed: a number > 0"),
        ([200.0], "", "fewer than 2 updates"),
    ],
)
def test_updates_that_fit_leave_out_the_first_update(tmp_path, seconds, scale, want):
    """BUDGET_S over the mean seconds of the updates after the first (1650 / 100 -> 16), times
    an optional scale, with the real Python; a run of one update has no such mean and is
    refused, and so is a scale that is not positive."""
    d = tmp_path / "matched" / "round_0"
    d.mkdir(parents=True)
    (d / "record.json").write_text("{}")
    rows = [{"step": k + 1, "seconds": s} for k, s in enumerate(seconds)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _bash(tmp_path, f"BUDGET_S=1650 updates_that_fit matched{scale}", fake_python=False)
    if not want.isdigit():
        assert out.returncode != 0 and want in out.stderr
    else:
        assert out.returncode == 0 and out.stdout.strip() == want, out.stderr


def test_kept_count_is_counted_once_then_kept(tmp_path):
    """The first call counts the updates that fit (1650 / (4 x 100) -> 4) and keeps them in the
    file; a later call reads the file, whatever the run says by then; a kept count that is not
    a count stops the script."""
    d = tmp_path / "matched" / "round_0"
    d.mkdir(parents=True)
    (d / "record.json").write_text("{}")
    rows = [{"step": k + 1, "seconds": s} for k, s in enumerate([200.0, 100.0, 110.0, 90.0])]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    body = 'BUDGET_S=1650 kept_count c.txt NX updates_that_fit matched 4\necho "NX=$NX"'
    out = _bash(tmp_path, body, fake_python=False)
    assert out.returncode == 0 and out.stdout.strip() == "NX=4", out.stderr
    assert (tmp_path / "c.txt").read_text() == "NX=4\n"
    (tmp_path / "c.txt").write_text("NX=9\n")
    out = _bash(tmp_path, body, fake_python=False)
    assert out.returncode == 0 and out.stdout.strip() == "NX=9", out.stderr
    (tmp_path / "c.txt").write_text("NX=0\n")
    out = _bash(tmp_path, body, fake_python=False)
    assert out.returncode == 2 and "c.txt holds NX=0" in out.stderr


def test_held_out_answers_evaluates_a_start_on_the_gates_puzzles_once(tmp_path):
    """A start's greedy answers on the gate's 400 (thinking on, 640 tokens) are made the first
    time only: answers.jsonl in the evaluation directory means done."""
    body = "held_out_answers runs/s/export runs/s_eval\nmkdir -p runs/s_eval\n"
    body += "touch runs/s_eval/answers.jsonl\nheld_out_answers runs/s/export runs/s_eval"
    out = _bash(tmp_path, body)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("launch/evaluate.py --checkpoint runs/s/export")
    for flag in ("--enable_thinking", "--max_new_tokens 640",
                 "--instances projects/go_no_go/results/held_out_400.jsonl",
                 "--out_dir runs/s_eval",
                 "--answers_out runs/s_eval/answers.jsonl"):  # fmt: skip
        assert flag in calls[0]


def test_read_start_builds_evaluates_compares_and_checks_a_start(tmp_path):
    """A start built by its recipe unless built (VALIDATION.md), then its answers on the gate's
    400, compared with trace_wait's and checked line by line by the form given (relay by
    default)."""
    body = 'read_start cfg.py:v runs/s/export runs/s_eval out "s (6000)" relay_retry_end\n'
    body += "mkdir -p runs/t/export && touch runs/t/export/VALIDATION.md\n"
    body += 'read_start cfg.py:w runs/t/export runs/t_eval out2 "t"'
    out = _bash(tmp_path, body)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[0] for c in calls] == [
        "launch/train_tiny.py", "launch/evaluate.py", "launch/compare_evals.py",
        "projects.go_no_go.lookahead_check", "launch/evaluate.py", "launch/compare_evals.py",
        "projects.go_no_go.lookahead_check",
    ]  # fmt: skip
    assert calls[0] == "launch/train_tiny.py --config cfg.py:v"
    want = "trace_wait_kl0.1_wait0.5/matched/start/validation.json,runs/s_eval"
    assert want in calls[2] and "--labels trace_wait,s (6000) --out out/comparison.md" in calls[2]
    assert calls[3].endswith("--eval runs/s_eval --form relay_retry_end --out out/retry_check.md")
    assert calls[6].endswith("--eval runs/t_eval --form relay --out out2/retry_check.md")
    assert (tmp_path / "out2").is_dir()


def test_bare_answers_counts_empty_think_blocks_and_their_valid_share(tmp_path):
    """arms.sh's bare_answers: per validation.json, the greedy answers written after an empty
    think block and the valid share of each kind, with 95 % intervals."""
    rows = [{"bare_answer": j < 3, "valid": j in (0, 3, 4)} for j in range(5)]
    (tmp_path / "v.json").write_text(json.dumps({"rows": rows}))
    out = _bash(tmp_path, "bare_answers v.json", fake_python=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| validation | n | bare answers | valid among them |")
    assert lines[2].startswith("| v.json | 5 | 3 | 33.3 [") and "| 2 | 100.0 [" in lines[2]


@pytest.mark.parametrize(
    "n, stages",
    [("1500", "(1500,)"), ("3000", "(1500,3000)"), ("6000", "(1500,3000,6000)"), ("scratch", None)],
)
def test_mix_starts_builds_the_ending_prefix_then_trace_mix_from_it(tmp_path, n, stages):
    """mix_starts N: the ending start's recipe cut at the stage ending at N (the whole recipe
    at 6000, into the exports the first build used), then trace_mix from that export, each
    with EXTRA's flags (N=scratch: trace_mix_scratch alone); a built export is skipped."""
    out = _bash(tmp_path, f'EXTRA="--config.processes=14" mix_starts {n}')
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    ending = "export" if n == "6000" else f"export_{n}"
    mix = "runs/tiny_trace_mix" if n == "6000" else f"runs/tiny_trace_mix_{n}"
    if n == "scratch":
        want = [f"launch/train_tiny.py --config {RECIPES}:trace_mix_scratch "
                "--config.processes=14"]  # fmt: skip
        dirs = [f"{mix}/export"]
    else:
        want = [
            f"launch/train_tiny.py --config {RECIPES}:trace_end_scratch "
            f"--config.sft.stages={stages} --config.out_dir=runs/tiny_trace_end_scratch/{ending} "
            "--config.processes=14",
            f"launch/train_tiny.py --config {RECIPES}:trace_mix "
            f"--config.init=runs/tiny_trace_end_scratch/{ending} --config.workdir={mix} "
            f"--config.out_dir={mix}/export --config.processes=14",
        ]
        dirs = [f"runs/tiny_trace_end_scratch/{ending}", f"{mix}/export"]
    assert calls == want
    again = tmp_path / "built"
    for d in dirs:
        (again / d).mkdir(parents=True)
        (again / d / "VALIDATION.md").touch()
    out = _bash(again, f"mix_starts {n}")
    assert out.returncode == 0 and not (again / "calls.txt").exists(), out.stderr


def test_mix_starts_refuses_a_count_that_ends_no_stage(tmp_path):
    out = _bash(tmp_path, "mix_starts 2000")
    assert out.returncode == 2 and "1500, 3000, 6000" in out.stderr
    assert not (tmp_path / "calls.txt").exists()


def test_config_trace_mix_scratch_is_trace_end_scratchs_first_stage_with_the_mix():
    """configs/tiny_model.py:trace_mix_scratch differs from trace_end_scratch in its mix, its
    stages (the first one) and its folders only."""
    from mapfjax import configfile

    tiny_model = configfile.load_module(RECIPES)

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    a = dict(flat(tiny_model.get_config("trace_end_scratch").to_dict()))
    b = dict(flat(tiny_model.get_config("trace_mix_scratch").to_dict()))
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {
        "workdir", "out_dir", "sft.answer_only", "sft.stages"
    }  # fmt: skip
    assert b["sft.answer_only"] == 0.6 and b["sft.stages"] == (a["sft.stages"][0],)
    assert tiny_model.get_config("trace_mix").sft.answer_only == b["sft.answer_only"]


@pytest.mark.parametrize("n", ["scratch", "1500"])
@pytest.mark.parametrize("built", [0, 1, 2])
def test_device_starts_builds_what_is_missing_with_the_gpu_flags_then_packs_it(tmp_path, n, built):
    """arms/device_starts.sh: N's starts (scratch by default: trace_mix_scratch; 1500: the
    ending start's first 1,500 updates, then trace_mix from it), each skipped where its export
    holds VALIDATION.md and built otherwise by python3 with the device flags; the exports and
    SFT logs are packed into $OUT/starts.tgz. Without OUT it stops before running anything."""
    import tarfile

    if n == "scratch":
        dirs, logs = (
            ["runs/tiny_trace_mix_scratch/export"],
            ["runs/tiny_trace_mix_scratch/log.jsonl"],
        )
        variants = ["trace_mix_scratch"]
    else:
        dirs = ["runs/tiny_trace_end_scratch/export_1500", "runs/tiny_trace_mix_1500/export"]
        logs = ["runs/tiny_trace_end_scratch/log.jsonl", "runs/tiny_trace_mix_1500/log.jsonl"]
        variants = ["trace_end_scratch", "trace_mix"]
    for k, (d, log) in enumerate(zip(dirs, logs, strict=True)):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / log).write_text("{}\n")
        if k < built:
            (tmp_path / d / "VALIDATION.md").write_text(d)
    (tmp_path / "projects" / "go_no_go").mkdir(parents=True)
    (tmp_path / "projects" / "go_no_go" / "arms").symlink_to(ARMS)
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text('#!/usr/bin/env bash\necho "$*" >> calls.txt\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    if n != "scratch":
        env["N"] = n
    run = lambda e: subprocess.run(["bash", "projects/go_no_go/arms/device_starts.sh"],
                                   cwd=tmp_path, env=e,
                                   capture_output=True, text=True)  # fmt: skip
    out = run(env)
    assert out.returncode != 0 and "OUT" in out.stderr and not (tmp_path / "calls.txt").exists()
    (tmp_path / "out").mkdir()
    out = run(env | {"OUT": str(tmp_path / "out")})
    assert out.returncode == 0, out.stderr
    log = tmp_path / "calls.txt"
    calls = log.read_text().splitlines() if log.exists() else []
    assert [c.split()[2] for c in calls] == [f"{RECIPES}:{v}" for v in variants[built:]]
    for c in calls:
        assert c.startswith("launch/train_tiny.py --config ")
        assert c.endswith("--config.sft.completion_multiple=1152 --config.processes=14 "
                          "--config.sft.checkpoint_every=500")  # fmt: skip
    with tarfile.open(tmp_path / "out" / "starts.tgz") as t:
        packed = set(t.getnames())
    assert set(dirs + logs) <= packed


@pytest.mark.parametrize("n, recorded", [("scratch", False), ("1500", False), ("1500", True)])
def test_trace_mix_reach_reads_a_short_start_once_then_runs_the_large_arm(tmp_path, n, recorded):
    """projects/go_no_go/arms/trace_mix_reach.sh: the start by mix_starts (N=scratch by default:
    trace_mix_scratch, no ending start to read), a first-stage ending start read on the gate's
    400 unless its committed record is there, then arms/trace_mix.sh with the plan's seed,
    draw and large mismatched arm, run always."""
    (tmp_path / "projects" / "go_no_go" / "arms").mkdir(parents=True)
    for name in ("arms.sh", "trace_mix_reach.sh"):
        (tmp_path / "projects" / "go_no_go" / "arms" / name).symlink_to(ARMS / name)
    (tmp_path / "projects" / "go_no_go" / "arms" / "trace_mix.sh").write_text(
        'echo "trace_mix N=$N SEED=$SEED DRAW=$DRAW MISMATCH=$MISMATCH WHEN=$WHEN OUT=$OUT"'
        " >> calls.txt\n"
    )
    built = ["runs/tiny_trace_mix_scratch/export"]
    if n != "scratch":
        built = ["runs/tiny_trace_end_scratch/export_1500", "runs/tiny_trace_mix_1500/export"]
    for d in built:
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "VALIDATION.md").touch()
    record = tmp_path / "projects" / "go_no_go" / "results" / f"trace_mix_reach_start_{n}"
    if recorded:
        record.mkdir(parents=True)
        (record / "retry_check.md").touch()
    env = "" if n == "scratch" else f"N={n} "  # scratch is the default
    out = _bash(tmp_path, env + "bash projects/go_no_go/arms/trace_mix_reach.sh")
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    reads = ["launch/evaluate.py", "launch/compare_evals.py", "projects.go_no_go.lookahead_check"]
    read = n != "scratch" and not recorded
    assert [c.split()[0] for c in calls[:-1]] == (reads if read else [])
    assert calls[-1] == (
        f"trace_mix N={n} SEED=20 DRAW=12370 MISMATCH=large WHEN=always "
        "OUT=projects/go_no_go/results/trace_mix_reach_20"
    )
    assert not (record / "rebuild.txt").exists()


def test_arms_puts_the_checkout_first_on_the_python_path(tmp_path):
    """Sourcing arms.sh puts this checkout first on PYTHONPATH (a path already set follows),
    so that the real Python finds its mapfjax from any directory, installed or not."""
    body = 'echo "$PYTHONPATH"; python -c "import mapfjax; print(mapfjax.__file__)"'
    out = subprocess.run(
        ["bash", "-c", f"source {ARMS / 'arms.sh'}\n{body}"],
        cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": "/elsewhere"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    path, module = out.stdout.split()
    assert path == f"{ROOT}:/elsewhere"
    assert pathlib.Path(module) == ROOT / "mapfjax" / "__init__.py"


def test_trace_mix_reach_reads_a_third_build_beside_both_earlier_ones(tmp_path):
    """N=6000 BUILD=3: the rebuilt start is read into its own folder (the second build's
    committed reading stays as it is) and rebuild.txt sets it against the first build's files
    and the second build's, line by line."""
    (tmp_path / "projects" / "go_no_go" / "arms").mkdir(parents=True)
    for name in ("arms.sh", "trace_mix_reach.sh"):
        (tmp_path / "projects" / "go_no_go" / "arms" / name).symlink_to(ARMS / name)
    (tmp_path / "projects" / "go_no_go" / "arms" / "trace_mix.sh").write_text(
        'echo "trace_mix N=$N SEED=$SEED DRAW=$DRAW OUT=$OUT" >> calls.txt\n'
    )
    for d in ("runs/tiny_trace_end_scratch/export", "runs/tiny_trace_mix/export"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "VALIDATION.md").touch()
    r = tmp_path / "projects" / "go_no_go" / "results"
    second = r / "trace_mix_reach_start_6000"
    third = r / "trace_mix_reach_start_6000_build3"
    for d in (r / "trace_end", second, third):
        d.mkdir(parents=True)
    for f in ("comparison.md", "retry_check.md"):  # the third build reads as the second did
        (second / f).write_text(f"second {f}\n")
        (third / f).write_text(f"second {f}\n")
        (r / "trace_end" / f).write_text(f"first {f}\n")
    out = _bash(
        tmp_path, "N=6000 SEED=26 DRAW=12376 BUILD=3 bash projects/go_no_go/arms/trace_mix_reach.sh"
    )
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert "runs/trace_end_scratch_eval_6000" in calls[0]  # the reading, then the arms
    assert str(third.relative_to(tmp_path)) in calls[1]
    assert calls[-1] == (
        "trace_mix N=6000 SEED=26 DRAW=12376 OUT=projects/go_no_go/results/trace_mix_reach_26"
    )
    assert (third / "rebuild.txt").read_text().splitlines() == [
        "comparison.md: differs to projects/go_no_go/results/trace_end/comparison.md",
        "retry_check.md: differs to projects/go_no_go/results/trace_end/retry_check.md",
        "comparison.md: identical to "
        "projects/go_no_go/results/trace_mix_reach_start_6000/comparison.md",
        "retry_check.md: identical to "
        "projects/go_no_go/results/trace_mix_reach_start_6000/retry_check.md",
    ]
    assert not (second / "rebuild.txt").exists()
