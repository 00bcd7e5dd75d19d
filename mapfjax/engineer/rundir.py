"""The closed loop's run directory: its recorded config (secrets redacted), JSON written
atomically, the digests of the files a resume trusts, the checkpoint's data position, and
errors that say what to delete or restore."""

from __future__ import annotations

import json
import pathlib
from typing import NamedTuple

import ml_collections

from mapfjax import files
from mapfjax.checks import is_int
from mapfjax.env import config as env_config
from mapfjax.env import io

# Keys that may differ when an existing run directory is continued (everything else must match):
# more rounds; how the model computes attention (the same function; a run recorded before the
# key existed resumes too).
RESUMABLE_CHANGES = ("rounds", "model.attention_impl")
SECRET_KEYS = ("api_key",)  # never written to a run directory (results get copied and shared)
DIGESTS = "digests.json"  # SHA-256 of the files a resume trusts, by path under the workdir
START_OVER = "start over: rerun the same command with a new --workdir"


class RunDirError(ValueError):
    """The run directory belongs to a different config, or is corrupt."""


def write_json(path: pathlib.Path, obj) -> None:
    """`obj` as indented, key-sorted JSON, written atomically."""
    files.atomic_write(
        path, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode()
    )


def read_json(path: pathlib.Path, advice: str):
    """The JSON in `path`; an unreadable file raises RunDirError saying what to do about it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"{path}: unreadable ({e}); {advice}") from e


def redo_advice(workdir: pathlib.Path, n: int, position: Position) -> str:
    """What recomputes finished round n's validation, decision and record (which files to
    delete), or why nothing can."""
    if position.round == n:
        return (
            f"delete {workdir / f'round_{n}' / 'DONE'} and rerun: round {n}'s validation, "
            "decision.json and record.json are recomputed from its checkpoint (no retraining)"
        )
    return (
        f"round {n} cannot be recomputed (the checkpoint is at round {position.round}); "
        "restore the file from a copy, or start another --workdir"
    )


# ------------------------------------------------------------------------ the recorded config


def redacted(obj):
    """A JSON-like value with every non-empty SECRET_KEYS entry replaced by "<set>"."""
    if isinstance(obj, dict):
        return {k: "<set>" if k in SECRET_KEYS and v else redacted(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redacted(v) for v in obj]
    return obj


def check_run_dir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """Record the run's config on first use; refuse a different one later, naming the keys."""
    try:
        files.check_dir(workdir, "--workdir")
    except NotADirectoryError as e:
        raise RunDirError(str(e)) from None
    path = workdir / "run_config.json"
    current = redacted(json.loads(config.to_json_best_effort()))
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        write_json(path, current)
        return
    # Never advise deleting run_config.json: a new one would skip this check.
    advice = "it records this run's config: restore it from a copy, or use another --workdir"
    before = env_config.flatten(read_json(path, advice))
    now = env_config.flatten(current)
    differ = sorted(
        k
        for k in set(before) | set(now)
        if before.get(k) != now.get(k)
        and k not in RESUMABLE_CHANGES
        and k.rsplit(".", 1)[-1] not in SECRET_KEYS  # a key may move to the environment
    )
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in differ[:10])
        raise RunDirError(
            f"{workdir} holds a run with a different config ({len(differ)} key(s) differ: "
            f"{shown}); use another --workdir or the same config"
        )


# ------------------------------------------------------------------------ digests


def _digests(workdir: pathlib.Path) -> dict:
    path = workdir / DIGESTS
    if not path.exists():
        return {}
    advice = "it records what this run wrote: restore it from a copy, or " + START_OVER
    digests = read_json(path, advice)
    if not isinstance(digests, dict):
        raise RunDirError(f"{path}: not a JSON object; {advice}")
    return digests


def record_digests(workdir: pathlib.Path, *paths: pathlib.Path) -> None:
    """Remember what `paths` hold now (checked by `check_digest` when they are read back)."""
    digests = _digests(workdir)
    digests.update({p.relative_to(workdir).as_posix(): files.sha256(p) for p in paths})
    write_json(workdir / DIGESTS, digests)


def check_digest(workdir: pathlib.Path, path: pathlib.Path) -> None:
    """Refuse a file the run wrote and then someone changed: results paired over "the same
    puzzles" would silently compare different ones. A run written before digests existed gets
    its files recorded as they are."""
    want = _digests(workdir).get(path.relative_to(workdir).as_posix())
    if want is None:
        record_digests(workdir, path)
    elif files.sha256(path) != want:
        raise RunDirError(
            f"{path}: changed since this run wrote it (its SHA-256 differs from the one in "
            f"{workdir / DIGESTS}); restore the original, or {START_OVER}"
        )


def save_instances(workdir: pathlib.Path, path: pathlib.Path, problems: list) -> None:
    """Write a problem set of this run and record its digest."""
    io.save_instances(path, problems)
    record_digests(workdir, path)


def read_instances(workdir: pathlib.Path, path: pathlib.Path) -> list:
    """A problem set this run wrote, checked against its digest."""
    check_digest(workdir, path)
    problems = io.load_instances(path)
    if not problems:
        raise RunDirError(f"{path}: no instances; {START_OVER}")
    return problems


# ------------------------------------------------------------------------ the data position


class Position(NamedTuple):
    """Where training stands: `step` updates done in round `round` (a checkpoint saves it as
    {"round": r, "step": s}; `check_position` checks one read back)."""

    round: int
    step: int

    @classmethod
    def of(cls, saved: dict) -> Position:
        """From a checkpoint's saved position ({} when there is no checkpoint yet: round 0,
        step 0); a missing field is None, which `check_position` refuses."""
        return cls(0, 0) if not saved else cls(saved.get("round"), saved.get("step"))

    def to_dict(self) -> dict:
        return {"round": self.round, "step": self.step}


def check_position(
    position: Position, workdir: pathlib.Path, ckpt_dir: pathlib.Path, steps: int
) -> None:
    """Refuse a checkpoint whose data position disagrees with the round records: training
    would skip updates (a step past the round's end) or redo finished rounds."""
    names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.is_dir() else []
    saved = sorted(int(n) for n in names if n.isdigit())
    where = f"{ckpt_dir / str(saved[-1])}" if saved else str(ckpt_dir)
    advice = (
        f"delete {where} to resume from the checkpoint before it, or {START_OVER}"
        if saved and len(saved) > 1
        else START_OVER
    )
    r, st = position
    if not (is_int(r) and is_int(st) and r >= 0 and 0 <= st <= steps):
        raise RunDirError(
            f"{where}: data position {position.to_dict()} is not a round >= 0 and a step in "
            f"[0, {steps}] (train.* gives {steps} updates per round); {advice}"
        )
    done = [p.parent.name[6:] for p in workdir.glob("round_*/DONE")]
    last = max((int(n) for n in done if n.isdigit()), default=-1)
    if r < last or (r == last and st != steps):
        raise RunDirError(
            f"{where}: data position {position.to_dict()} disagrees with the round records "
            f"({workdir / f'round_{last}' / 'DONE'} exists, so the checkpoint must be at round "
            f"{last} step {steps} or later); {advice}"
        )
