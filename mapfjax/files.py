"""Low-level file helpers every layer may import: atomic writes, torn JSONL tails, digests and
the error for a malformed model checkpoint (no mapfjax imports here, so dependencies keep
pointing down)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


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


def torn_tail(data: bytes) -> int | None:
    """The byte offset where the last line of JSONL `data` starts when a crash mid-append tore
    it (no newline and not a whole JSON value: an object's text ends with its closing brace),
    else None. A last line without a newline that parses is complete (valid JSONL may end so)."""
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    if not tail.strip():
        return None
    try:
        json.loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return start
    return None


def warn_torn(path, data: bytes, start: int, consequence: str) -> None:
    """The one warning for a torn last line: file, line, the first bytes and what follows."""
    log.warning(
        "%s:%d: the last line is torn (no newline, not valid JSON: %r); %s",
        path, data.count(b"\n", 0, start) + 1, data[start : start + 60], consequence,
    )  # fmt: skip


def drop_torn_tail(path, consequence: str) -> None:
    """Cut a torn last line (`torn_tail`) off the JSONL file at `path`, with a warning naming
    the file, the line and `consequence`."""
    path = Path(path)
    data = path.read_bytes()
    start = torn_tail(data)
    if start is not None:
        warn_torn(path, data, start, f"removing its {len(data) - start} bytes; {consequence}")
        atomic_write(path, data[:start])


def append_lines(path, lines, sync: bool = False) -> None:
    """Append text lines (each ending in a newline) to `path`, each in one write() to an
    O_APPEND descriptor, so concurrent readers never see half a line; a file whose last line
    has no newline gets one first. sync: fsync before returning."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
        for line in lines:
            os.write(fd, line.encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class LockedError(OSError):
    """A directory is held by another running process (`dir_lock`)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _take_lock(path: Path, me: dict, flag: str) -> None:
    tmp = path.with_name(f".{path.name}.{me['pid']}")
    tmp.write_text(json.dumps(me) + "\n")
    try:
        for _ in range(3):
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # atomic and refused when the lock exists: never half-written
                return
            try:
                holder = json.loads(path.read_text())
                pid, host = int(holder["pid"]), str(holder["host"])
            except FileNotFoundError:
                continue  # released meanwhile
            except (OSError, ValueError, KeyError, TypeError):
                raise LockedError(
                    f"{path}: unreadable lock file; if no run is using {flag} {path.parent}, "
                    "delete it and rerun"
                ) from None
            if host == me["host"] and not _pid_alive(pid):
                log.warning("%s: taking over the lock of pid %d on %s (gone)", path, pid, host)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            raise LockedError(
                f"{flag} {path.parent} is in use by pid {pid} on {host} ({path}); wait for that "
                f"run to finish, or delete {path} if it is no longer running"
            )
        raise LockedError(f"{path}: could not take the lock; rerun")
    finally:
        tmp.unlink()


@contextlib.contextmanager
def dir_lock(directory, flag: str):
    """Hold `directory/LOCK` ({"pid", "host"}) while the block runs. A second holder is refused
    with LockedError naming the holder and `flag`; a lock left by a dead process on this host
    is taken over with a warning."""
    path = Path(directory) / "LOCK"
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    _take_lock(path, me, flag)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()) == me:
                path.unlink()


def report_command(build, out=None) -> int:
    """The body of a command that prints a report: `build()` returns its text, written
    atomically to `out` when given, then printed; exit status 0. A ValueError or OSError (bad
    input, named by its message) is one line on stderr instead, exit status 2."""
    try:
        text = build()
        if out:
            atomic_write(Path(out), (text + "\n").encode())
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
