"""Checkpoints: exact resume, keep-last-N, refusals of other shapes and corrupt files (state
untouched), Hugging Face export; the metrics logger."""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax import parallel
from mapfjax.models import hf
from mapfjax.models.qwen3 import PRESETS, Qwen3
from mapfjax.rl.batch import make_batch
from mapfjax.rl.checkpoint import CheckpointError, export_hf
from mapfjax.rl.grpo import GRPOConfig
from mapfjax.rl.metrics import MetricsLogger, read_metrics
from mapfjax.rl.trainer import OptimConfig, Trainer

CFG = PRESETS["tiny"]
OPTIM = OptimConfig(lr=1e-3, warmup_steps=2, total_steps=10, end_lr_ratio=0.1, weight_decay=0.01)
GRPO = GRPOConfig(group_size=4)


def tiny_model(cfg=CFG, seed=0):
    return Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def data_stream(index):
    """The batch at a data position (deterministic in the index)."""
    rng = np.random.default_rng(index)
    prompts = [list(rng.integers(1, CFG.vocab_size, rng.integers(2, 8))) for _ in range(8)]
    comps = [list(rng.integers(1, CFG.vocab_size, rng.integers(1, 8))) for _ in range(8)]
    old = [list(rng.normal(-5.5, 0.2, len(c))) for c in comps]
    return make_batch(prompts, comps, 0, 8, 8, old, rng.normal(size=8))


def _host(tree):
    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return jax.tree.map(one, jax.device_get(tree))


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(_host(a)), jax.tree.leaves(_host(b))
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


@pytest.mark.slow
def test_interrupt_and_resume_is_exact(tmp_path):
    mesh = parallel.make_mesh({"fsdp": 4, "tp": 2})
    run = Trainer(tiny_model(), OPTIM, "grpo", mesh, loss_cfg=GRPO, seed=7)
    k = 2
    for i in range(k):
        run.step(data_stream(i))
    run.next_key()
    run.save(tmp_path, {"data_index": k}, wait=True)
    run.step(data_stream(k))  # the uninterrupted run goes on
    run.close()

    fresh = Trainer(tiny_model(seed=1), OPTIM, "grpo", mesh, loss_cfg=GRPO, seed=0)
    assert not leaves_equal(fresh.params, run.params)
    data = fresh.restore(tmp_path)
    assert data == {"data_index": k} and int(fresh.state.step) == k
    assert fresh.params["embedding"][...].sharding == run.params["embedding"][...].sharding
    fresh.step(data_stream(data["data_index"]))
    assert leaves_equal(fresh.state.params, run.state.params)
    assert leaves_equal(fresh.state.opt_state, run.state.opt_state)
    assert np.array_equal(
        jax.random.key_data(fresh.next_key()), jax.random.key_data(run.next_key())
    )
    fresh.close()


def test_keeps_last_n_steps(tmp_path):
    tr = Trainer(tiny_model(), OPTIM, "sft")
    for i in range(4):
        tr.step(data_stream(i))
        tr.save(tmp_path, {"i": i}, keep=2)
    tr.wait()
    steps = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert steps == [3, 4]
    assert tr.restore(tmp_path, step=3) == {"i": 2} and int(tr.state.step) == 3
    with pytest.raises(CheckpointError, match="no step 1 .*allowed steps \\[3, 4\\]"):
        tr.restore(tmp_path, step=1)
    tr.close()


def test_refuses_other_model_shape_and_keeps_state(tmp_path):
    src = Trainer(tiny_model(), OPTIM, "sft")
    src.step(data_stream(0))
    src.save(tmp_path, wait=True)
    src.close()
    other = Trainer(tiny_model(dataclasses.replace(CFG, intermediate_size=96)), OPTIM, "sft")
    before = _host(other.state)
    with pytest.raises(CheckpointError, match=f"{tmp_path}.*leaf '.*mlp.*' has shape"):
        other.restore(tmp_path)
    assert leaves_equal(before, other.state)
    other.close()


def test_refuses_corrupt_checkpoint_and_keeps_state(tmp_path):
    src = Trainer(tiny_model(), OPTIM, "sft")
    src.step(data_stream(0))
    src.save(tmp_path, wait=True)
    src.close()
    # Truncate every array data file of the saved state.
    data_files = [p for p in (tmp_path / "1" / "state").rglob("*") if p.is_file()]
    data_files = [p for p in data_files if p.parent.name == "d"]
    assert data_files
    for p in data_files:
        p.write_bytes(b"\0" * 7)
    fresh = Trainer(tiny_model(seed=3), OPTIM, "sft")
    before = _host(fresh.state)
    with pytest.raises(CheckpointError, match=f"{tmp_path / '1'}"):
        fresh.restore(tmp_path)
    assert leaves_equal(before, fresh.state)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        fresh.restore(tmp_path / "empty")
    fresh.close()


def test_export_hf_round_trip(tmp_path):
    tr = Trainer(tiny_model(), OPTIM, "sft")
    tr.step(data_stream(0))
    path = export_hf(tr, tmp_path / "hf")
    assert (pathlib.Path(path) / "config.json").exists()
    loaded = hf.from_pretrained(path, dtype=jnp.float32)
    assert leaves_equal(nnx.state(loaded, nnx.Param), tr.params)


# --------------------------------------------------------------------------- metrics log


class _FakeWriter:
    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))

    def close(self):
        self.calls.append("closed")


def test_metrics_logger_jsonl_and_sinks(tmp_path):
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False) as log:
        log.tb = _FakeWriter()
        writer = log.tb
        log.log(1, {"loss": np.float32(0.5), "note": "warmup", "nan": float("nan")})
        with pytest.warns(UserWarning, match="truncation_rate=0.90"):
            log.log(2, {"loss": jnp.asarray(0.25), "truncation_rate": 0.9})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["loss"] == 0.5 and records[0]["note"] == "warmup"
    assert np.isnan(records[0]["nan"]) and records[1]["loss"] == 0.25
    assert ("loss", 0.25, 2) in writer.calls and writer.calls[-1] == "closed"
    assert not any(c[0] == "note" for c in writer.calls[:-1])


def test_read_metrics_names_the_bad_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.1}\n{"step": 2, "loss":\n')
    with pytest.raises(ValueError, match=f"{path}:2: not a JSON object"):
        read_metrics(path)
    path.write_text('{"step": 1, "loss": 0.1}\n{"step": 2, "loss" 0.2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object .*delete that line"):
        read_metrics(path)


def test_a_torn_last_metrics_line_is_skipped_and_cut_before_the_next_append(tmp_path, caplog):
    """A crash mid-append leaves half a line: reading skips it with a warning; a resumed
    logger cuts it off so the next step does not join the fragment."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.1}\n{"step": 2, "lo')
    with caplog.at_level("WARNING"):
        assert [r["step"] for r in read_metrics(path)] == [1]
    assert f"{path}:2: the last line is torn" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"), MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(2, {"loss": 0.2})
    assert "removing its 15 bytes" in caplog.text
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2}')  # a whole last line without its newline
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(3, {"loss": 0.3})
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


def _truncate(step_dir: pathlib.Path) -> None:
    """Truncate every array data file of a saved state (a crash or a full disk mid-write)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    data_files = [p for p in files if p.parent.name == "d"]
    assert data_files
    for p in data_files:
        p.write_bytes(b"\0" * 7)


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    from mapfjax.rl import driver

    src = Trainer(tiny_model(), OPTIM, "sft")
    for i in range(2):
        src.step(data_stream(i))
        src.save(tmp_path, {"round": 0, "step": i + 1}, wait=True)
    src.close()
    _truncate(tmp_path / "2")
    fresh = Trainer(tiny_model(seed=3), OPTIM, "sft")
    with caplog.at_level("WARNING"):
        assert driver.restore(fresh, tmp_path) == {"round": 0, "step": 1}
    assert int(fresh.state.step) == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"checkpoint {tmp_path / '2'}") and len(line) < 600
    assert line.endswith("trying the checkpoint before it") and "\n" not in line
    assert sorted(p.name for p in tmp_path.iterdir() if p.name[0] != ".") == ["1", "2.corrupt"]
    fresh.step(data_stream(1))  # training goes on and saves step 2 again
    fresh.save(tmp_path, {"round": 0, "step": 2}, wait=True)
    fresh.close()
    again = Trainer(tiny_model(seed=4), OPTIM, "sft")
    assert driver.restore(again, tmp_path) == {"round": 0, "step": 2}
    again.close()
    for step in ("1", "2"):
        _truncate(tmp_path / step)
    with pytest.raises(CheckpointError) as e:
        driver.restore(Trainer(tiny_model(), OPTIM, "sft"), tmp_path)
    assert str(e.value) == (
        f"{tmp_path}: no readable checkpoint (steps [2, 1] are corrupt); restore the directory "
        "from a copy, or start the training over in a new directory"
    )


def test_a_failed_write_is_one_line_and_its_tracebacks_go_to_a_log(tmp_path, capfd):
    """A full disk made orbax's storage threads print dozens of tracebacks before the error;
    while a checkpoint is written they go to errors.log, and the error is one line."""
    import os

    from mapfjax.files import CheckpointError
    from mapfjax.rl.checkpoint import errors_to_log

    with pytest.raises(CheckpointError) as e:
        with errors_to_log(tmp_path):
            os.write(2, b"Traceback (most recent call last):\n  a storage thread\n")
            raise ValueError("RESOURCE_EXHAUSTED: Failed writing: No space left on device\nmore")
    message = str(e.value)
    assert "\n" not in message and "the disk is full" in message
    assert f"details: {tmp_path / 'errors.log'}" in message
    assert "a storage thread" in (tmp_path / "errors.log").read_text()
    os.write(2, b"after\n")  # stderr is back
    assert capfd.readouterr().err == "after\n"
    with errors_to_log(tmp_path / "quiet"):
        pass
    assert not (tmp_path / "quiet" / "errors.log").exists()  # nothing written, no log left
