"""Train-state checkpoints with orbax (async, atomic, keep last N; params, optimiser state, step,
RNG and a JSON data dict) and Hugging Face export of the trained model."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from mapfjax.files import CheckpointError


class CorruptCheckpoint(CheckpointError):
    """A checkpoint step that cannot be read (truncated or half-written files), as opposed to
    one written for another model: an older step may still be good."""


def _first_line(e: Exception) -> str:
    """`Type: first line of the message` (TensorStore errors run to a hundred lines of spec)."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line[:200]}{'...' if len(line) > 200 or len(text) > 1 else ''}"


def _name(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


def flatten_state(state) -> dict[str, jax.Array]:
    """A TrainState -> {dotted leaf path: array}; PRNG keys become their uint32 key data."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        flat[_name(path)] = leaf
    return flat


def unflatten_state(template, flat: dict[str, jax.Array]):
    """Inverse of `flatten_state` with `template`'s tree structure and key implementations."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        value = flat[_name(path)]
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
            value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
        out.append(value)
    return jax.tree_util.tree_unflatten(treedef, out)


def _abstract(flat: dict[str, jax.Array]) -> dict[str, jax.ShapeDtypeStruct]:
    return {
        k: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=getattr(v, "sharding", None))
        for k, v in flat.items()
    }


class Checkpointer:
    """An orbax CheckpointManager over `directory` (one subdirectory per step).

    Saves are asynchronous (the device-to-host copy happens before `save` returns, so the
    train state may be donated right after) and atomic (a step directory appears only when
    complete); the newest `keep` steps are kept.
    """

    def __init__(self, directory, keep: int = 3, async_save: bool = True):
        self.directory = pathlib.Path(directory).expanduser().resolve()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True
        )
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )

    def steps(self) -> list[int]:
        """Completed checkpoint steps, oldest first."""
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest completed step, or None."""
        return self.manager.latest_step()

    def wait(self):
        """Blocks until pending asynchronous writes are finished. A failed write (a full disk,
        say) raises CheckpointError in one line; the storage threads' tracebacks go to
        `errors.log` in the checkpoint directory."""
        with errors_to_log(self.directory):
            self.manager.wait_until_finished()

    def close(self):
        """Finishes pending writes and releases the manager."""
        self.manager.close()


@contextlib.contextmanager
def errors_to_log(directory: pathlib.Path):
    """While writing a checkpoint, the process's stderr (file descriptor 2: orbax's and
    tensorstore's threads print there, and a failed write makes dozens of tracebacks) goes to
    `directory/errors.log`; an exception leaves as one CheckpointError naming the log."""
    log = pathlib.Path(directory) / "errors.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:  # no room even for the log: leave stderr alone
        target = None
    if target is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target, 2)
    os.close(target)
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001  orbax and tensorstore raise many types
        full = "no space left on device" in str(e).lower()
        hint = "the disk is full: free space or use another --workdir; " if full else ""
        raise CheckpointError(
            f"writing a checkpoint in {directory} failed: {hint}{_first_line(e)} (details: {log})"
        ) from e
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if log.exists() and log.stat().st_size == 0:
            log.unlink(missing_ok=True)


def save_state(ckpt: Checkpointer, state, data: dict) -> int:
    """Starts saving `state` (a TrainState) and a JSON-serialisable `data` dict at state.step."""
    step = int(jax.device_get(state.step))
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(flatten_state(state)), data=ocp.args.JsonSave(dict(data))
    )
    with errors_to_log(ckpt.directory):
        ckpt.manager.save(step, args=args, force=True)
    return step


def _check_metadata(ckpt: Checkpointer, step: int, expected: dict[str, jax.ShapeDtypeStruct]):
    where = f"checkpoint {ckpt.directory / str(step)}"
    try:
        meta = ckpt.manager.item_metadata(step)["state"]
    except Exception as e:  # noqa: BLE001  orbax raises many types for unreadable metadata
        raise CorruptCheckpoint(f"{where}: unreadable metadata ({_first_line(e)})") from e
    if meta is None:
        raise CheckpointError(f"{where}: no 'state' item (not a train-state checkpoint)")
    saved = {k: tuple(getattr(v, "shape", ())) for k, v in dict(meta).items()}
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"{where} does not match this trainer: leaves missing from the checkpoint "
            f"{missing[:5]}, unexpected leaves {extra[:5]} (another model or optimiser?)"
        )
    for k, spec in expected.items():
        if saved[k] != tuple(spec.shape):
            raise CheckpointError(
                f"{where} does not match this model: leaf {k!r} has shape {saved[k]} in the "
                f"checkpoint but {tuple(spec.shape)} here"
            )


def restore_state(ckpt: Checkpointer, template, step: int | None = None):
    """Returns (state, data) of `step` (default: latest) laid out like `template` (same
    shardings). Raises CheckpointError naming the directory and the first mismatching leaf;
    nothing is modified on failure."""
    ckpt.wait()
    steps = ckpt.steps()
    if not steps:
        raise CheckpointError(f"no checkpoint in {ckpt.directory}")
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise CheckpointError(f"no step {step} in {ckpt.directory}: allowed steps {steps}")
    expected = _abstract(flatten_state(template))
    _check_metadata(ckpt, step, expected)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(expected), data=ocp.args.JsonRestore())
    try:
        restored = ckpt.manager.restore(step, args=args)
    except Exception as e:  # noqa: BLE001  re-raised with the directory named
        raise CorruptCheckpoint(
            f"checkpoint {ckpt.directory / str(step)} could not be read "
            f"({_first_line(e)}); it may be corrupt or incomplete"
        ) from e
    flat = dict(restored["state"])
    for k, spec in expected.items():
        if flat[k].dtype != spec.dtype:
            raise CheckpointError(
                f"checkpoint {ckpt.directory / str(step)}: leaf {k!r} has dtype "
                f"{flat[k].dtype} but {spec.dtype} here"
            )
    return unflatten_state(template, flat), dict(restored["data"] or {})


def export_hf(trainer, path, tokenizer_dir=None, dtype=None) -> pathlib.Path:
    """Writes the trainer's current model as a transformers checkpoint directory (atomic).

    tokenizer_dir: an HF checkpoint directory whose token ids, generation config and tokenizer
    files are carried over (`mapfjax.models.hf.save_pretrained(copy_from=...)`).
    """
    from mapfjax.models.hf import save_pretrained

    return save_pretrained(trainer.model(), path, dtype=dtype, copy_from=tokenizer_dir)
