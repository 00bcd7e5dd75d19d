"""The run's memory plan (loop.memory_plan): every phase planned on abstract shapes for the
mesh's devices, a phase that does not fit refused in one line naming the settings that shrink
it, launch/train.py's check before any work where the devices report their memory, and
launch/memory_plan.py's table and time per round for a target machine."""

import json
import pathlib
import subprocess
import sys

import pytest

from mapfjax import configfile, parallel
from mapfjax.engineer import loop
from mapfjax.engineer.settings import RunSettings
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib

ROOT = configfile.ROOT
TINY = str(ROOT / "mapfjax" / "assets" / "tiny")


def smoke(**overrides):
    c = configfile.get_config("configs/tiny_cpu.py", "smoke")
    c.model.path = TINY
    for key, value in overrides.items():
        parent, last = configfile.key_path(c, key)
        parent[last] = value
    return c


@pytest.fixture(scope="module")
def plans():
    s = RunSettings.from_config(smoke())
    config, _ = hf.read_config(pathlib.Path(TINY))
    tokens = loop.prompt_tokens(tok_lib.load_tokenizer(TINY), "x8", False)
    mesh = parallel.make_mesh(dict(s.mesh))  # the 8 fake CPU devices of the tests
    return loop.memory_plan(s, mesh, config, tokens)


@pytest.mark.slow
def test_every_phase_is_planned(plans):
    assert [p.phase for p in plans] == ["rollout", "update", "validation", "engineer"]
    for p in plans:
        assert p.program > 0 and p.resident >= 0 and p.total == p.program + p.resident
    rollout = plans[0]
    assert "6 puzzles x 4 samples" in rollout.what  # ceil(1.5 x 4) puzzles of the smoke job
    assert "train.problems_per_step" in rollout.settings


@pytest.mark.slow
def test_a_phase_that_does_not_fit_is_refused_naming_its_settings(plans):
    update = next(p for p in plans if p.phase == "update")
    fits = max(p.total for p in plans)
    loop.check_memory(plans, fits, "a device")  # exactly enough: no error
    others = [p for p in plans if p.phase != "update"]
    with pytest.raises(loop.MemoryPlanError) as e:
        loop.check_memory([*others, update], max(p.total for p in others), "a test device")
    text = str(e.value)
    assert text.startswith("memory plan: the update (") and "optim.accum_steps" in text
    assert "optim.remat" in text and "mesh.tp" in text and "a test device allows" in text
    assert "\n" not in text


@pytest.mark.slow
def test_train_refuses_before_any_work_where_memory_is_known(tmp_path, monkeypatch):
    """On a device that reports how much it may allocate (faked: CPU reports nothing), a run
    whose plan does not fit stops in one line before its work directory exists; the check
    can be turned off."""
    monkeypatch.setattr(parallel, "device_bytes_limit", lambda: 64 * 2**10)
    work = tmp_path / "run"
    with pytest.raises(loop.MemoryPlanError, match=r"^memory plan: the rollout .* allows 0\.1 MiB"):
        loop.run(smoke(), work, progress=False)
    assert not work.exists()


def test_the_prompt_length_follows_size_agents_and_padding():
    tokens = loop.prompt_tokens(None, "exact", True)
    assert tokens(5, 10) > tokens(2, 10) > tokens(2, 3)
    padded = loop.prompt_tokens(None, "pow2", True)
    assert padded(2, 10) >= tokens(2, 10) and padded(2, 10) & (padded(2, 10) - 1) == 0
    tok = tok_lib.load_tokenizer(TINY)
    assert loop.prompt_tokens(tok, "exact", False)(2, 4) < tokens(2, 4) * 4


def test_targets_name_their_devices():
    kind, count = parallel.target("h100x8")
    assert count == 8 and kind.name == "NVIDIA H100 SXM" and kind.usable_bytes < kind.memory
    assert parallel.target("v5p-8")[1] == 4  # a v5p-8 slice is 4 chips
    assert parallel.device_kind("NVIDIA H200").match == "h200"
    assert parallel.device_kind("cpu") is None
    with pytest.raises(ValueError, match="target 'h100x3'; allowed: h100x8"):
        parallel.target("h100x3")


def _plan(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "memory_plan.py"), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip


def test_the_plan_command_prints_phases_and_times_and_refuses(tmp_path):
    base = ["--config=configs/tiny_cpu.py:smoke", "--target=h100x1"]
    res = _plan(*base)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "1 x NVIDIA H100 SXM" in out and "| rollout |" in out and "| update |" in out
    assert "measured on the NVIDIA H200" in out and "per round:" in out
    assert "every phase fits 1 x NVIDIA H100 SXM" in out
    res = _plan(*base, "--mem_fraction=1e-6", "--set", "optim.accum_steps=2")
    assert res.returncode == 1, res.stderr[-3000:]
    assert "**no**: optim.accum_steps (now 2" in res.stdout and "does not fit:" in res.stdout
    res = _plan(*base, "--set", "optim.lr=-1")
    assert (
        res.returncode == 2
        and res.stderr.startswith("error: ")
        and "OptimConfig.lr=-1.0" in res.stderr
    )


def test_the_time_model_reads_the_committed_figures():
    spec = __import__("importlib.util").util.spec_from_file_location(
        "memory_plan", ROOT / "launch" / "memory_plan.py"
    )
    plan = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    figures = plan.committed_figures(plan.FIGURES)
    assert "NVIDIA H200" in figures and len(figures["NVIDIA H200"]["decode"]) >= 10
    h200 = plan.Speed(parallel.device_kind("h200"), figures, "qwen3-4b")
    h100 = plan.Speed(parallel.device_kind("h100"), figures, "qwen3-4b")
    assert h200.mfu == pytest.approx(
        json.loads((plan.FIGURES / "4b" / "nvidia-h200.json").read_text())["models"]["4b"]["grpo"][
            "mfu"
        ]
    )
    assert h100.ms_per_gb > h200.ms_per_gb > 0  # less bandwidth: a GB read costs more
    assert h100.decode_s(100, 10.0) > h200.decode_s(100, 10.0)
    # the CPU form's files (projects/accelerator/results/loop/step/cpu.json) are no device's
    assert "cpu" not in figures and set(figures) == {"NVIDIA H200"}


def test_the_time_model_reads_the_one_step_loop_only(tmp_path):
    spec = __import__("importlib.util").util.spec_from_file_location(
        "memory_plan", ROOT / "launch" / "memory_plan.py"
    )
    plan = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    rows = [
        {"bytes_per_step": 1e9, "decode_ms_per_step": 2.0},
        {"bytes_per_step": 2e9, "decode_ms_per_step": 3.0, "steps_per_loop": 1},
        {"bytes_per_step": 2e9, "decode_ms_per_step": 1.0, "steps_per_loop": 4},
    ]
    data = {"device": {"name": "NVIDIA H100 80GB HBM3"}, "models": {"x": {"sampling": rows}}}
    (tmp_path / "h100.json").write_text(json.dumps(data))
    (tmp_path / "cpu.json").write_text(json.dumps({**data, "device": {"name": "cpu"}}))
    figures = plan.committed_figures(tmp_path)
    assert list(figures) == ["NVIDIA H100 80GB HBM3"]
    assert figures["NVIDIA H100 80GB HBM3"]["decode"] == [(1e9, 2.0), (2e9, 3.0)]


@pytest.mark.slow
def test_the_paper_config_fits_one_node_of_8_h100():
    res = _plan("--config=configs/paper_qwen3_4b.py", "--target=h100x8")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "every phase fits 8 x NVIDIA H100 SXM" in res.stdout
