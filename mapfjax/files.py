"""Low-level file helpers every layer may import: atomic writes and the error for a malformed
model checkpoint (no mapfjax imports here, so dependencies keep pointing down)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint is missing, malformed or does not match the Qwen3 architecture."""


def missing_local_dir(path) -> bool:
    """True when `path` names nothing on disk and cannot be a hub id ("owner/name") either:
    the one rule for "no such model directory" (checkpoints and tokenizers alike)."""
    return not Path(path).expanduser().exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(path))


def check_dir(path, flag: str) -> None:
    """Refuse a directory path that is a file or lies under one, before any work:
    NotADirectoryError naming the flag, the path and the file in the way."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise NotADirectoryError(f"{flag} {path}: {p} is a file; expected a directory")


def atomic_write(path, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to `path` via a temp file in the same directory and
    os.replace, so readers never see a half-written file. Creates missing parent directories."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; expected a file name to write")
    for parent in (path.parent, *path.parent.parents):
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(f"{path}: cannot write there, {parent} is a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600 files; keep an existing file's mode, else the usual 0644.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
