"""launch/train_tiny.py end to end on its "quick" config: tokenizer -> SFT (two stages, with
the coordinate targets) -> GRPO -> export -> validation, as the user runs it; a rerun resumes."""

import json
import math
import subprocess
import sys

import jax.numpy as jnp
import pytest

from mapfjax.configfile import ROOT
from mapfjax.models import hf
from mapfjax.models import tokenizer as tok_lib


@pytest.mark.slow
def test_quick_run_exports_a_loadable_validated_model(tmp_path, one_device_env):
    work, out = tmp_path / "work", tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train_tiny.py"),
        f"--config={ROOT / 'configs' / 'tiny_model.py'}:quick",
        f"--config.workdir={work}",
        f"--config.out_dir={out}",
        "--config.processes=1",
    ]
    env = {**one_device_env, "PYTHONPATH": str(ROOT)}

    def run():
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=900, cwd=ROOT)
        sft = (work / "log.jsonl").read_text().splitlines()
        grpo = (work / "grpo" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in sft], [json.loads(line) for line in grpo]

    log, grpo = run()
    assert [r["phase"] for r in log] == ["sft"] * 16
    assert [r["step"] for r in log] == [*range(1, 17)]
    # GRPO runs through the shared driver: its steps, the phase position and dynamic-sampling
    # bookkeeping are in grpo/metrics.jsonl.
    assert [r["step"] for r in grpo] == [1, 2, 3, 4] and {r["phase"] for r in grpo} == {"grpo"}
    assert all("kept_mixed" in r and len(r["groups"]) == 2 for r in grpo)
    assert all(math.isfinite(r["loss"]) for r in log)
    assert all(math.isfinite(r["train_loss"]) for r in grpo)
    # Every SFT batch has the answer tokens and the 8 coordinate tokens (2 agents x 4) per row.
    assert all(r["num_tokens"] > 16 * 8 for r in log if r["phase"] == "sft")

    model = hf.from_pretrained(out, dtype=jnp.float32)
    assert model.config.vocab_size == len(tok_lib.load_tokenizer(out))
    report = (out / "VALIDATION.md").read_text()
    assert "| 2 | 3x3 | 4 |" in report and "| 2 | 10x10 | 4 |" in report

    # A rerun finds every stage done: no new training steps, the same exported weights.
    weights = (out / "model.safetensors").read_bytes()
    assert run() == (log, grpo)
    assert (out / "model.safetensors").read_bytes() == weights
