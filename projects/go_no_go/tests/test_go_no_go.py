"""projects/go_no_go/go_no_go.py's arms: the flags reach the loop config (run in a subprocess: absl
flags are process-global)."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
_PROBE = """
import importlib.util, json, sys
from absl import flags
spec = importlib.util.spec_from_file_location("go_no_go", "projects/go_no_go/go_no_go.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
flags.FLAGS(["go_no_go", "--policy=p", "--out=o", *sys.argv[1:]])
c = m.arm_config((3,))
print(json.dumps([c.validation.samples, c.train.max_new_tokens, c.validation.max_new_tokens,
                  c.train.enable_thinking, c.optim.lr, c.grpo.kl_coef, c.train.trace_loss,
                  [s.wait_ratio for s in c.env.sizes.values()], c.rounds, c.train.instances,
                  c.train.objective, c.train.temperature]))
"""


def _run_probe(probe: str, args) -> list:
    """What `probe` prints last with these flags, parsed (it must exit 0)."""
    out = subprocess.run(
        [sys.executable, "-c", probe, *args], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _refused(args) -> str:
    """The error of a go_no_go flag parse that must refuse these flags."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode != 0, out.stdout
    return out.stderr


@pytest.mark.parametrize(
    "args, want",
    [
        ([], [4, 64, 64, False, 1e-4, 0.0, "all", [0.3], 1, 1200, "grpo", 1.0]),
        (["--thinking"], [4, 640, 640, True, 1e-4, 0.0, "all", [0.3], 1, 1200, "grpo", 1.0]),
        (
            ["--thinking", "--samples=0", "--lr=1e-5"],
            [0, 640, 640, True, 1e-5, 0.0, "all", [0.3], 1, 1200, "grpo", 1.0],
        ),
        (
            ["--max_new_tokens=100"],
            [4, 100, 100, False, 1e-4, 0.0, "all", [0.3], 1, 1200, "grpo", 1.0],
        ),
        (
            ["--kl_coef=0.05", "--trace_loss=moves"],
            [4, 64, 64, False, 1e-4, 0.05, "moves", [0.3], 1, 1200, "grpo", 1.0],
        ),
        (["--wait_ratio=1"], [4, 64, 64, False, 1e-4, 0.0, "all", [1.0], 1, 1200, "grpo", 1.0]),
        (
            ["--trace_loss=answer"],
            [4, 64, 64, False, 1e-4, 0.0, "answer", [0.3], 1, 1200, "grpo", 1.0],
        ),
        (
            ["--updates=40", "--rounds=5"],
            [4, 64, 64, False, 1e-4, 0.0, "all", [0.3], 5, 320, "grpo", 1.0],
        ),
        (["--objective=rft"], [4, 64, 64, False, 1e-4, 0.0, "all", [0.3], 1, 1200, "rft", 1.0]),
        (
            ["--objective=placebo", "--kl_coef=0.1"],  # GRPO, placebo in its phase hooks
            [4, 64, 64, False, 1e-4, 0.1, "all", [0.3], 1, 1200, "grpo", 1.0],
        ),
        (
            ["--temperature=0.7"],
            [4, 64, 64, False, 1e-4, 0.0, "all", [0.3], 1, 1200, "grpo", 0.7],
        ),
    ],
)
def test_flags_reach_the_arm_config(args, want):
    assert _run_probe(_PROBE, args) == want


@pytest.mark.parametrize("args, want", [([], 1.0), (["--top_p=0.95"], 0.95)])
def test_top_p_reaches_the_rollouts(args, want):
    probe = _PROBE.replace(
        "c.train.objective, c.train.temperature]",
        "c.train.top_p, driver.GRPOSettings.from_config(c).sampling.top_p]",
    ).replace("print(", "from mapfjax.rl import driver\nprint(")
    assert _run_probe(probe, args)[-2:] == [want, want]


@pytest.mark.parametrize("args, want", [([], ["", "unset"]), (["--screen=2"], ["screen 2", 2.0])])
def test_screen_reaches_the_phase_hooks_and_leaves_the_config_alone_when_off(args, want):
    probe = _PROBE.replace(
        "c.train.objective, c.train.temperature]",
        "driver.PhaseHooks.from_config(c).name, c.get('phase_hooks', {}).get('screen', 'unset')]",
    ).replace("print(", "from mapfjax.rl import driver\nprint(")
    assert _run_probe(probe, args)[-2:] == want


@pytest.mark.parametrize(
    "args, want", [([], [None, 5, 40, 40]), (["--fresh_puzzles"], [5, 5, 80, 80])]
)
def test_fresh_puzzles_draw_each_training_puzzle_once(args, want):
    """--updates 5 --groups 8 samples 16 puzzles an update: by default from 40 training puzzles
    (each drawn twice), with --fresh_puzzles from 80 (each once); 5 updates either way."""
    probe = _PROBE.replace(
        "c.train.objective, c.train.temperature]",
        "c.train.get('steps'), s.steps, c.train.instances, len({p for k in range(s.steps) for p "
        "in driver.step_problems(list(range(c.train.instances)), s.drawn_per_step, k, [0])})]",
    ).replace(
        "print(", "from mapfjax.rl import driver\ns = driver.GRPOSettings.from_config(c)\nprint("
    )
    assert _run_probe(probe, ["--updates=5", "--groups=8", *args])[-4:] == want


def test_a_thinking_arm_pads_completions_to_powers_of_two_and_its_settings_load():
    """The CPU config's multiples of 8 would compile an update per 8 tokens of a 640-token
    trace budget; a thinking arm goes back to power-of-two widths, passes the checks and
    updates in two parts by completion length."""
    probe = _PROBE.split("print(")[0] + (
        "from mapfjax.rl import driver\n"
        "s = driver.GRPOSettings.from_config(c)\n"
        "o = driver.optim_config(c, 10, 1)\n"
        "print(json.dumps([s.sampling.completion_bucket, s.sampling.max_new_tokens, "
        "o.length_split, o.group_split]))\n"
    )
    got = []
    for args in ([], ["--thinking"]):
        got.append(_run_probe(probe, args))
    # traces: the update in 4 parts of 4 pieces (half groups) by length
    assert got == [["x8", 64, 1, 1], ["pow2", 640, 4, 2]]


def test_optimizer_flag_reaches_the_optimiser_and_the_default_config_is_unchanged():
    probe = _PROBE.split("print(")[0] + (
        "from mapfjax.rl import driver\n"
        "print(json.dumps(['optimizer' in c.optim, driver.optim_config(c, 10, 1).optimizer]))\n"
    )
    got = []
    for args in ([], ["--optimizer=momentum", "--lr=2.0"]):
        got.append(_run_probe(probe, args))
    # the earlier arms' configs (no optimizer key) are what adamw runs
    assert got == [[False, "adamw"], [True, "momentum"]]
    assert "--optimizer" in _refused(["--optimizer=sgd"])


def test_groups_set_the_update_batch_and_the_round_budget():
    probe = _PROBE.replace("c.train.objective, c.train.temperature]", "c.train.problems_per_step]")
    args = ["--groups=32", "--updates=10"]
    got = _run_probe(probe, args)
    assert got[-2:] == [320, 32]  # 10 updates of 32 groups: 320 training puzzles per round
    assert "--groups" in _refused(["--groups=0"])


def test_optimal_bonus_sets_the_reward():
    probe = _PROBE.replace(
        "c.train.objective, c.train.temperature]", "c.reward.optimal_bonus, c.reward.valid_reward]"
    )
    from mapfjax import configfile

    default = configfile.get_config("projects/grpo_effect/configs/grpo_effect.py").reward
    default = default.optimal_bonus
    cases = [([], [default, 1.0]), (["--optimal_bonus=0"], [0.0, 1.0])]
    cases += [(["--optimal_bonus=0.25"], [0.25, 1.0])]
    for args, want in cases:
        assert _run_probe(probe, args)[-2:] == want, args


def test_lora_flags_reach_the_optimiser():
    probe = _PROBE.split("print(")[0] + (
        "from mapfjax.rl import driver\n"
        "o = driver.optim_config(c, 10, 1)\n"
        "print(json.dumps([o.lora_rank, o.lora_alpha, list(o.lora_targets)]))\n"
    )
    got = []
    for args in ([], ["--lora_rank=4", "--lora_alpha=8"]):
        got.append(_run_probe(probe, args))
    kernels = ["q", "k", "v", "o", "gate", "up", "down"]
    assert got == [[0, 32.0, kernels], [4, 8.0, kernels]]
    assert "--lora_rank: an int >= 0" in _refused(["--lora_rank=-1"])


@pytest.mark.parametrize(
    "args, want",
    [
        (["--groups=32"], 1),  # 64-token answers: the update whole
        (["--thinking", "--groups=8"], 1),  # 4 parts of 4 half groups
        (["--thinking", "--groups=32"], 1),  # 16 parts of 4 half groups
        (["--thinking", "--groups=32", "--length_split=1"], 8),  # whole, 8 x 4 groups
        (["--thinking", "--groups=32", "--length_split=2"], 4),  # 2 x 32 half groups, 4 x 8
        (["--thinking", "--groups=32", "--group_split=1"], 1),  # 8 parts of 4 groups
        (["--thinking", "--groups=32", "--group_split=1", "--length_split=2"], 4),  # 2 x 16
        (["--thinking", "--groups=12", "--group_split=1", "--length_split=2"], 2),  # 2 x 6
        (["--thinking", "--groups=3"], 1),  # 6 half groups not in parts of 4: 2 parts of 3
        (["--thinking", "--groups=32", "--accum_steps=2"], 2),
    ],
)
def test_a_thinking_update_runs_in_micro_batches_of_at_most_four_groups(args, want):
    """A 640-token update of 16 groups in one piece peaked at 20 GB resident on the CPU: the
    micro-batches keep the peak of the backward pass small, with the same gradient."""
    probe = _PROBE.replace("c.train.objective, c.train.temperature]", "c.optim.accum_steps]")
    assert _run_probe(probe, args)[-1] == want


@pytest.mark.parametrize(
    "args, wants",
    [
        (["--wait_ratio=1.5"], ["--wait_ratio=1.5", "in [0, 1]"]),
        (["--rounds=0"], ["--rounds=0", "not a positive integer"]),
        (["--temperature=0"], ["--temperature=0", "in (0, 2]"]),
        (["--top_p=0"], ["--top_p=0", "in (0, 1]"]),
        (["--screen=0.5"], ["--screen=0.5", "0 (off) or a number >= 1"]),
        (["--top_p=1.5"], ["--top_p=1.5", "in (0, 1]"]),
        (["--optimal_bonus=-1"], ["--optimal_bonus=-1", "not a non-negative number"]),
        (
            ["--objective=rft", "--kl_coef=0.1"],
            ["kl_coef=0.1, objective=rft", "--objective rft takes none"],
        ),
        (
            ["--thinking", "--groups=32", "--accum_steps=3"],
            ["accum_steps=3, groups=32", "--accum_steps: must divide the pieces of each part"],
        ),
        (["--group_split=3"], ["--group_split=3", "one of <0|1|2|4|8>"]),
        (["--length_split=-1"], ["--length_split=-1", "not a non-negative integer"]),
    ],
)
def test_a_bad_flag_is_refused_before_any_work(args, wants):
    out = subprocess.run(
        [sys.executable, "-m", "projects.go_no_go.go_no_go", "--policy=p", "--out=o", *args],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0
    for want in wants:
        assert want in out.stderr, (want, out.stderr[-500:])


def test_mismatched_arm_choices():
    probe = _PROBE.replace(
        "c = m.arm_config((3,))",
        "c = m.arm_config(*m.MISMATCHES[flags.FLAGS.mismatched])",
    ).replace("c.train.objective, c.train.temperature]", "sorted(c.env.sizes)]")
    for args, waits, sizes in [
        ([], [0.5], ["s3"]),  # 3x3 only, at --wait_ratio
        (["--mismatched=no_wait"], [0.0] * 4, ["s3", "s4", "s5", "s6"]),
        (["--mismatched=large"], [0.5] * 4, ["s10", "s7", "s8", "s9"]),
    ]:
        got = _run_probe(probe, ["--wait_ratio=0.5", *args])
        assert got[7] == waits and got[-1] == sizes, args
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "projects.go_no_go.go_no_go",
            "--policy=p",
            "--out=o",
            "--mismatched=5x5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "--mismatched" in bad.stderr and "no_wait" in bad.stderr
    # both mismatched arms of one matched run can share an --out: each its own verdict
    names = subprocess.run(
        [sys.executable, "-c", _PROBE.split("flags.FLAGS(")[0]
         + "print(m.verdict_name('3x3'), m.verdict_name('no_wait'), m.verdict_name('large'))"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    want = ["verdict.md", "verdict_no_wait.md", "verdict_large.md"]
    assert names.stdout.split() == want, names.stderr


def _probe_fields(fields: str, *arg_sets) -> list:
    """The arm config's `fields` (Python expressions over `c`, comma-separated) under each set
    of flags."""
    probe = _PROBE.replace("c.train.objective, c.train.temperature]", f"{fields}]")
    got = []
    for args in arg_sets:
        got.append(_run_probe(probe, args)[-fields.count(",") - 1 :])
    return got


def test_seed_sets_the_training_seed_only():
    got = _probe_fields("c.seed, c.validation.seed", [], ["--seed=3"])
    assert got[1][0] == 3 and got[0][0] != 3
    assert got[0][1] == got[1][1]  # the held-out puzzles' seed is not the training seed


def test_held_out_seed_draws_fresh_puzzles_and_the_default_is_the_gates():
    """--held_out_seed: the gate's 400 puzzles (12345) by default, which every setting so far
    was chosen on; another seed draws fresh puzzles of the same kind for a claim."""
    got = _probe_fields("c.validation.seed", [], ["--held_out_seed=12348"])
    assert got == [[12345], [12348]]


_FLOW = """
import importlib.util, json, pathlib, sys
from absl import flags
from mapfjax.engineer import loop
from mapfjax.eval import report
spec = importlib.util.spec_from_file_location("go_no_go", "projects/go_no_go/go_no_go.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
gain = sys.argv[1] == "gain"
ran = []

def fake_run(cfg, workdir):  # start: 30 of 100 valid; the matched arm gains 20 or nothing
    ran.append(workdir.name)
    ends = {"matched": 50 if gain else 30, "mismatched_3x3": 30}
    for label, k in [("start", 30), ("round_0", ends[workdir.name])]:
        d = workdir / label
        d.mkdir(parents=True, exist_ok=True)
        rows = [{"id": f"p{i}", "valid": i < k, "failure": None} for i in range(100)]
        (d / "validation.json").write_text(json.dumps({"rows": rows}))
    (workdir / "round_0" / "record.json").write_text("{}")

loop.run = fake_run
report.write_report = lambda workdir: None
flags.FLAGS(["go_no_go", "--policy=p", *sys.argv[2:]])
code = m.main([])
print(json.dumps([code, ran]))
"""


@pytest.mark.parametrize(
    "gain, when, want_runs, want_code",
    [
        ("none", "gain", ["matched"], 1),  # no gain: the mismatched arm is not run
        ("gain", "gain", ["matched", "mismatched_3x3"], 0),
        ("none", "always", ["matched", "mismatched_3x3"], 1),
    ],
)
def test_mismatched_when_gain_runs_that_arm_only_after_a_passing_matched_arm(
    tmp_path, gain, when, want_runs, want_code
):
    out = subprocess.run(
        [sys.executable, "-c", _FLOW, gain, f"--workdir={tmp_path / 'w'}",
         f"--out={tmp_path / 'o'}", f"--mismatched_when={when}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    code, ran = json.loads(out.stdout.strip().splitlines()[-1])
    assert ran == want_runs and code == want_code
    verdict = (tmp_path / "o" / "verdict.md").read_text()
    assert ("not run" in verdict) == (want_runs == ["matched"])


def test_the_thinking_main_job_trains_as_the_gates_matched_arm():
    """configs/tiny_cpu.py, the main job (projects/main_job/results/PLAN_think.md), is the gate's
    matched arm (projects/go_no_go/arms/trace_mix.sh's flags) in the loop's rounds: the same
    training, update split, reward,
    generator and held-out set; only the policy's path, the rounds, the updates per round and the
    engineer differ."""
    from mapfjax import configfile

    flags = ["--thinking", "--optimal_bonus=0", "--kl_coef=0.1", "--wait_ratio=0.5"]
    flags += ["--samples=0", "--groups=32", "--lr=1e-4"]
    probe = _PROBE.replace("c = m.arm_config((3,))", "c = m.arm_config(m.HELD_OUT_SIZES)")
    probe = probe[: probe.index("print(")] + "print(json.dumps(c.to_dict(), default=list))\n"
    arm = _flat(_run_probe(probe, flags))
    think = _flat(
        json.loads(
            json.dumps(configfile.get_config("configs/tiny_cpu.py", "").to_dict(), default=list)
        )
    )
    differ = {k for k in arm.keys() | think.keys() if arm.get(k, "-") != think.get(k, "-")}
    assert differ == {
        "model.path", "rounds", "train.instances",
        "engineer.settings.name", "engineer.settings.max_edits", "engineer.settings.mode",
        "engineer.settings.num_samples",
    }  # fmt: skip
    assert think["model.path"].endswith("mapfjax/assets/tiny_think")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out
