"""Config files loaded by path: relative to the repository root, fresh modules, clear errors."""

from pathlib import Path

import pytest

from mapfjax import configfile


def test_relative_path_resolves_against_the_repository_root():
    cfg = configfile.get_config("configs/engineer/variants.py", "V2")
    assert sorted(cfg.modules.keys()) == sorted(
        configfile.get_config(configfile.ROOT / "configs/engineer/variants.py", "V2").modules
    )
    # Each load is a fresh module: edits to one do not leak into the next.
    a = configfile.load_module("configs/engineer/variants.py")
    a.get_config = None
    assert configfile.load_module("configs/engineer/variants.py").get_config is not None


def test_missing_file_and_missing_get_config_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        configfile.load_module(tmp_path / "nope.py")
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    with pytest.raises(ValueError, match="cfg.yaml.*a .py file"):
        configfile.load_module(tmp_path / "cfg.yaml")
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(AttributeError, match="empty.py.*get_config"):
        configfile.get_config(tmp_path / "empty.py")


def test_relative_path_missing_under_the_root_is_looked_up_in_the_cwd(tmp_path, monkeypatch):
    # What a wheel install needs: configs/ lives in the checkout the command runs from.
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.py").write_text("def get_config(a):\n    return a * 2\n")
    monkeypatch.chdir(tmp_path)
    assert configfile.resolve("configs/mine.py") == tmp_path / "configs" / "mine.py"
    assert configfile.get_config("configs/mine.py", 3) == 6
    assert (
        configfile.resolve("configs/engineer/variants.py").parent.parent
        == configfile.ROOT / "configs"
    )
    with pytest.raises(FileNotFoundError, match="nope.py.*looked under .* and the cwd"):
        configfile.load_module("configs/nope.py")


def test_key_path_names_the_missing_part_and_the_keys_allowed_there():
    cfg = configfile.get_config("configs/tiny_cpu.py", "smoke")
    node, last = configfile.key_path(cfg, "train.group_size")
    assert last == "group_size" and node is cfg.train
    with pytest.raises(ValueError, match=r"no key 'steps' under train; allowed: \[.*'epochs'"):
        configfile.key_path(cfg, "train.steps")
    with pytest.raises(ValueError, match=r"no key 'x' under train.group_size; allowed: \[\]"):
        configfile.key_path(cfg, "train.group_size.x")
    with pytest.raises(ValueError, match=r"no key 'trian' under <top>.*did you mean 'train'\?$"):
        configfile.key_path(cfg, "trian.steps")
    with pytest.raises(ValueError, match=r"did you mean 'temperature'\?$"):
        configfile.key_path(cfg, "train.temprature")
    with pytest.raises(ValueError) as e:  # nothing close: no guess
        configfile.key_path(cfg, "train.zzzzzz")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("script", ["train.py", "train_tiny.py"])
def test_a_launch_override_of_a_missing_key_is_one_line(tmp_path, script):
    """ml-collections raises a bare AttributeError("'steps'") from absl's flag parsing; the
    launch scripts say which key, in which config, and what is there instead."""
    import subprocess
    import sys

    config = "configs/tiny_cpu.py" if script == "train.py" else "configs/tiny_model.py:quick"
    out = subprocess.run(
        [sys.executable, f"launch/{script}", f"--config={config}", f"--workdir={tmp_path / 'w'}",
         "--config.train.stepz=3"] if script == "train.py" else
        [sys.executable, f"launch/{script}", f"--config={config}", "--config.sft.stepz=3"],
        cwd=configfile.ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    section = "train" if script == "train.py" else "sft"
    assert last.startswith(f"error: --config.{section}.stepz: configs/tiny_")
    assert f"has no key 'stepz' under {section}; allowed: [" in last
    assert "Traceback" not in out.stderr and not (tmp_path / "w").exists()


def test_a_bad_value_for_the_main_job_is_its_one_error_line(tmp_path):
    """What a typo in the main command prints: the key, the value and what is allowed, without
    JAX's INFO line about backends it probed and did not find."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # probe as a user's shell
    out = subprocess.run(
        [sys.executable, "launch/train.py", "--config=configs/tiny_cpu.py",
         f"--workdir={tmp_path / 'w'}", "--config.env_start=rand"],
        cwd=configfile.ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: env_start = 'rand'; allowed: one of ['config', 'random']"
    )
    assert "Unable to initialize backend" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "spec,message",
    [
        ("configs/tiny_model.py:nosuch", "configs/tiny_model.py: unknown variant 'nosuch'"),
        ("configs/tiny_cpu.py:trian", "configs/tiny_cpu.py:trian: no such variant"),
        ("configs/sweep_ablation.py:x", "configs/sweep_ablation.py:x: no such variant"),
        ("configs/paper_qwen3_4b.py:x", "configs/paper_qwen3_4b.py:x: no such variant"),
    ],
)
def test_a_config_that_refuses_its_variant_is_one_line_in_every_launch_script(
    spec, message, capsys
):
    """A typo after the colon used to run the file's default (the full job, or a sweep)."""
    for argv in (["prog", f"--config={spec}"], ["prog", "--config", spec]):
        with pytest.raises(SystemExit) as e:
            configfile.parse_flags(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {message}"), err


def assert_matches_record(config: dict, recorded: dict) -> None:
    """Every key a committed run_config.json recorded has the same value in `config` (keys
    added to the config since that run are not in the record and are skipped)."""
    for block in ("env", "train", "grpo", "optim", "reward", "validation"):
        for key, value in recorded[block].items():
            assert config[block][key] == value, f"{block}.{key}: {config[block][key]} != {value}"


def test_the_main_jobs_keep_the_settings_their_committed_runs_record():
    """The main job (the policy that thinks) and `:answer_only` give what their committed runs
    recorded (projects/main_job/results/think and held_out_1200), key for key: a config edit
    that would change a measured job is caught."""
    import json

    for variant, run in (("", "think/seed0"), ("answer_only", "held_out_1200/tiny1200")):
        record = configfile.ROOT / "projects" / "main_job" / "results" / run / "run_config.json"
        recorded = json.loads(record.read_text())
        config = configfile.get_config("configs/tiny_cpu.py", variant).to_dict()
        assert_matches_record(json.loads(json.dumps(config)), recorded)
        assert config["engineer"]["settings"] == recorded["engineer"]["settings"]
        # the starting checkpoint (recorded as an absolute path, which differs per checkout)
        assert Path(config["model"]["path"]).name == Path(recorded["model"]["path"]).name, variant
    main = configfile.get_config("configs/tiny_cpu.py", "answer_only").validation
    assert (main.per_size, main.extra_seeds, main.samples) == (100, (12346, 12347), 0)
