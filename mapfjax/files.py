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


# ------------------------------------------------------------------------ remote work directories

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_ALMOST_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/{0,1}([^/].*)?", re.DOTALL)


class RemoteError(ValueError):
    """A remote work directory that is malformed, unreachable or not a mirror of a run."""


def remote_url(path, flag: str = "--workdir") -> str | None:
    """The URL when `path` names a remote location through fsspec ("gs://bucket/run",
    "s3://...", "file:///mnt/nfs/run", ...), None for a local path. RemoteError, naming
    `flag`, for a URL that is malformed (no bucket or path after "://", an unknown protocol)
    and for a local-looking path that starts like one with a slash missing ("gs:/bucket/run",
    "gs:bucket"), which would otherwise become a local folder named "gs:"."""
    import fsspec

    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    known = set(fsspec.available_protocols())
    m = _URL.fullmatch(text)
    if m is None:
        near = _ALMOST_URL.fullmatch(text)
        if near and near[1].lower() in known:
            raise RemoteError(
                f"{flag} {text}: looks like a {near[1]}:// URL with its slashes missing; write "
                f"{near[1]}://{(near[2] or '').lstrip('/') or 'BUCKET/PATH'}, or ./{text} for a "
                "local folder"
            )
        return None
    scheme, rest = m[1].lower(), m[2]
    if scheme not in known:
        shown = ", ".join(f"{p}://" for p in ("gs", "s3", "az", "hf", "file", "memory"))
        raise RemoteError(f"{flag} {text}: unknown protocol {scheme}://; allowed: {shown} or "
                          "another fsspec protocol")  # fmt: skip
    if not rest.strip("/") or (scheme != "file" and rest.startswith("/")):
        raise RemoteError(f"{flag} {text}: no bucket or path after {scheme}://; allowed: "
                          f"{scheme}://BUCKET/PATH")  # fmt: skip
    return text


def _remote_fs(url: str, flag: str):
    """(fsspec filesystem, root path) of a URL; RemoteError naming the package to install."""
    import fsspec

    try:
        return fsspec.url_to_fs(url)
    except ImportError as e:
        extra = {"gs": "gcs", "gcs": "gcs", "s3": "s3"}.get(url.split(":", 1)[0].lower())
        how = f'pip install "mapfjax[{extra}]"' if extra else "pip install it"
        raise RemoteError(f"{flag} {url}: {e} ({how}, then rerun)") from None
    except Exception as e:  # noqa: BLE001  each filesystem raises its own kinds
        raise RemoteError(f"{flag} {url}: {type(e).__name__}: {_first(e)}") from None


def _first(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else ""


MIRROR_MANIFEST = ".mapfjax_mirror.json"  # what a mirror's last complete upload holds


def _skipped(rel: str) -> bool:
    """Files a mirror never uploads: temporary files of atomic writes and of orbax's steps
    in progress, the work directory's lock and the manifest itself."""
    parts = rel.split("/")
    return (
        rel == MIRROR_MANIFEST
        or parts[-1] == "LOCK"
        or any(p.endswith(".tmp") and p.startswith(".") for p in parts)
        or any("orbax-checkpoint-tmp" in p for p in parts)
    )


def _upload_rank(rel: str) -> tuple[int, str]:
    """Upload order: ordinary files, then the digests, then DONE markers (a round's marker
    never reaches the remote before its files)."""
    name = rel.rsplit("/", 1)[-1]
    return (2 if name == "DONE" else 1 if name == "digests.json" else 0, rel)


class RemoteMirror:
    """A run's work directory kept at a remote URL (any fsspec filesystem) through a local
    copy that the run writes as usual.

    `push()` uploads the files that changed since the last push (atomic-write and orbax
    temporaries left out; DONE markers last), then a manifest listing every file of the
    snapshot (path, size, mtime), then deletes the remote files the snapshot no longer has.
    `pull()` makes the local copy equal to the remote's last manifest: files it lists are
    downloaded unless the local copy already has them (same size and mtime), local files it
    does not list are deleted. A push cut short (a kill) leaves the previous manifest in
    place, and files uploaded since are ignored by the next pull, so a resumed run starts
    from a snapshot the run wrote whole (the run itself resumes from any such snapshot)."""

    def __init__(self, url: str, local, flag: str = "--workdir"):
        self.url, self.flag = url.rstrip("/"), flag
        self.local = Path(local)
        self.fs, self.root = _remote_fs(self.url, flag)
        self.root = self.root.rstrip("/")
        # An object store shows an object only once it is whole; a mounted filesystem shows a
        # file as it is written, so there each upload is written aside and renamed into place.
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self._rename = bool({"file", "local"} & set(protocols))

    def _remote(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _put(self, rel: str, local: Path | None = None, data: bytes | None = None) -> None:
        """Upload a local file (or bytes) to `rel`, whole or not at all."""
        dest = self._remote(rel)
        target = f"{dest}.{os.getpid()}.upload" if self._rename else dest
        self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        if data is None:
            self.fs.put_file(str(local), target)
        else:
            self.fs.pipe(target, data)
        if self._rename:
            self.fs.mv(target, dest)

    def check_writable(self) -> None:
        """Write and delete a probe file at the URL: RemoteError, one line, when the
        credentials or the location do not allow it."""
        probe = self._remote(f".mapfjax_probe_{os.getpid()}")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe(probe, b"probe")
            self.fs.rm(probe)
        except Exception as e:  # noqa: BLE001  missing credentials, no bucket, no permission
            raise RemoteError(
                f"{self.flag} {self.url}: cannot write there ({type(e).__name__}: {_first(e)}); "
                "check the location and the credentials (for gs://: gcloud auth "
                "application-default login, or GOOGLE_APPLICATION_CREDENTIALS)"
            ) from None

    def _remote_manifest(self) -> dict | None:
        path = self._remote(MIRROR_MANIFEST)
        if not self.fs.exists(path):
            return None
        try:
            data = json.loads(self.fs.cat(path))
            if data.get("url") != self.url or not isinstance(data.get("files"), dict):
                raise ValueError("not this mirror's manifest")
            return data
        except (ValueError, TypeError, AttributeError) as e:
            raise RemoteError(
                f"{self.flag} {self.url}: {MIRROR_MANIFEST} unreadable ({e}); restore it or use "
                "another location"
            ) from None

    def _local_manifest(self) -> dict | None:
        path = self.local / MIRROR_MANIFEST
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None

    def _scan(self) -> dict[str, dict]:
        out = {}
        for dirpath, _, names in os.walk(self.local):
            for name in names:
                full = Path(dirpath) / name
                rel = full.relative_to(self.local).as_posix()
                if _skipped(rel):
                    continue
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    st = full.stat()
                    out[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        return out

    def pull(self) -> int:
        """Make the local copy the remote's last snapshot; returns the files downloaded. A
        local folder that holds files but is no copy of this URL is refused (RemoteError)."""
        remote = self._remote_manifest()
        mine = self._local_manifest()
        if mine is not None and mine.get("url") != self.url:
            raise RemoteError(
                f"{self.local} is the local copy of {mine.get('url')}, not of {self.url}; use "
                "another staging directory"
            )
        if mine is None and self.local.exists() and any(self.local.iterdir()):
            raise RemoteError(
                f"{self.local}: holds files but is no local copy of {self.url}; use an empty "
                "staging directory"
            )
        if remote is None:
            there = self.fs.ls(self.root, detail=False) if self.fs.exists(self.root) else []
            if [p for p in there if "mapfjax_probe" not in p]:
                raise RemoteError(
                    f"{self.flag} {self.url}: holds files but no {MIRROR_MANIFEST}, so it is "
                    "not a run this mirror wrote; use an empty location"
                )
            remote = {"url": self.url, "files": {}}
        self.local.mkdir(parents=True, exist_ok=True)
        have = self._scan()
        for rel in sorted(set(have) - set(remote["files"])):
            (self.local / rel).unlink()
        fetched = 0
        for rel, want in sorted(remote["files"].items()):
            if have.get(rel) == want:
                continue
            dest = self.local / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.pull.tmp")
            self.fs.get_file(self._remote(rel), str(tmp))
            os.replace(tmp, dest)
            os.utime(dest, ns=(want["mtime_ns"], want["mtime_ns"]))
            fetched += 1
        atomic_write(self.local / MIRROR_MANIFEST, json.dumps(remote))
        return fetched

    def push(self) -> int:
        """Upload what changed since the last push, then the manifest; returns the files
        uploaded."""
        before = (self._local_manifest() or {}).get("files", {})
        now = self._scan()
        uploaded = {}
        for rel in sorted((r for r in now if before.get(r) != now[r]), key=_upload_rank):
            try:
                self._put(rel, local=self.local / rel)
            except FileNotFoundError:  # deleted since the scan (an old checkpoint step)
                now.pop(rel)
                continue
            uploaded[rel] = now[rel]
        manifest = {"url": self.url, "files": now}
        self._put(MIRROR_MANIFEST, data=json.dumps(manifest).encode())
        atomic_write(self.local / MIRROR_MANIFEST, json.dumps(manifest))
        for rel in sorted(set(before) - set(now)):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._remote(rel))
        return len(uploaded)

    @contextlib.contextmanager
    def syncing(self, every: float):
        """While the block runs, `push()` every `every` seconds from a background thread (a
        failed upload is logged and tried again next time); after it, one last push in the
        caller's thread, whose failure raises."""
        import threading

        stop = threading.Event()

        def loop():
            while not stop.wait(every):
                try:
                    n = self.push()
                    log.info("%s: %d file(s) uploaded", self.url, n)
                except Exception as e:  # noqa: BLE001  the next push tries again
                    log.warning("%s: upload failed (%s: %s); trying again in %g s",
                                self.url, type(e).__name__, _first(e), every)  # fmt: skip

        thread = threading.Thread(target=loop, name="mapfjax-mirror", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.push()


def default_staging(url: str) -> Path:
    """Where a remote work directory's local copy lives unless given: $MAPFJAX_STAGING or
    ~/.cache/mapfjax/staging, in a folder named after the URL."""
    base = os.environ.get("MAPFJAX_STAGING") or os.path.join(
        os.path.expanduser("~"), ".cache", "mapfjax", "staging"
    )
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url).strip("_")
    return Path(base) / f"{name[:80]}_{hashlib.sha256(url.encode()).hexdigest()[:8]}"
