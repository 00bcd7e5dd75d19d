"""A training run's work directory at a URL (files.RemoteMirror): malformed URLs and missing
packages or credentials are one line before any work, the local copy and the remote agree
after push and pull, an upload cut short leaves the last whole snapshot in force, and a run
killed with SIGKILL continues on another machine (a fresh local copy) from what it uploaded.
In-memory (memory://) and local (file://) filesystems stand in for gs:// and s3://."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import fsspec
import pytest

from mapfjax import files

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def url(request):
    """A fresh in-memory location per test."""
    name = f"memory://bucket/{request.node.name}"
    yield name
    fs, path = fsspec.url_to_fs(name)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.mark.parametrize(
    "text,words",
    [
        ("gs:/bucket/run", "write gs://bucket/run, or ./gs:/bucket/run for a local folder"),
        ("gs:bucket", "write gs://bucket"),
        ("gs://", "no bucket or path after gs://"),
        ("s3:///run", "no bucket or path after s3://"),
        ("nosuch://bucket/run", "unknown protocol nosuch://; allowed: gs://"),
    ],
)
def test_a_malformed_url_is_one_line_naming_the_fix(text, words):
    with pytest.raises(files.RemoteError) as e:
        files.remote_url(text)
    assert words in str(e.value) and str(e.value).startswith(f"--workdir {text}:")
    assert "\n" not in str(e.value)


def test_local_paths_are_not_urls():
    for text in ("runs/a", "/tmp/run", "runs/a:b", "./gs:/bucket", pathlib.Path("x")):
        assert files.remote_url(text) is None
    assert files.remote_url("gs://bucket/run") == "gs://bucket/run"


def test_a_missing_filesystem_package_is_named():
    if _importable("gcsfs"):
        pytest.skip("gcsfs is installed here")
    with pytest.raises(
        files.RemoteError, match=r"gs://b/run: .*gcsfs.* \(pip install \"mapfjax\[gcs\]\""
    ):
        files.RemoteMirror("gs://b/run", "/nonexistent")


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_missing_credentials_are_one_line(url, tmp_path, monkeypatch):
    mirror = files.RemoteMirror(url, tmp_path / "copy")

    def refuse(*args, **kwargs):
        raise PermissionError("403 Forbidden: anonymous caller does not have storage access\n...")

    monkeypatch.setattr(mirror.fs, "pipe", refuse)
    with pytest.raises(files.RemoteError) as e:
        mirror.check_writable()
    text = str(e.value)
    assert "cannot write there (PermissionError: 403 Forbidden" in text and "credentials" in text
    assert "\n" not in text


def _write(root: pathlib.Path, rel: str, data: str = "x") -> None:
    files.atomic_write(root / rel, data)


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != files.MIRROR_MANIFEST
    }


def test_push_and_pull_give_the_same_tree(url, tmp_path):
    a = files.RemoteMirror(url, tmp_path / "a")
    assert a.pull() == 0
    _write(a.local, "run_config.json", "{}")
    _write(a.local, "round_0/validation.json", '{"rows": []}')
    _write(a.local, "round_0/DONE", "")
    _write(a.local, "checkpoints/4/state/blob", "weights")
    (a.local / "LOCK").write_text("held")  # never uploaded
    (a.local / "round_0" / ".x.json.123.tmp").write_text("half")  # an atomic write in flight
    assert a.push() == 4 and a.push() == 0  # nothing changed: nothing uploaded
    b = files.RemoteMirror(url, tmp_path / "b")
    assert b.pull() == 4
    assert _tree(b.local) == {
        k: v for k, v in _tree(a.local).items() if "tmp" not in k and k != "LOCK"
    }
    # a deletion (orbax dropping an old step) reaches the remote and the other copy
    (a.local / "checkpoints" / "4" / "state" / "blob").unlink()
    _write(a.local, "checkpoints/8/state/blob", "newer")
    assert a.push() == 1
    assert b.pull() == 1
    assert "checkpoints/4/state/blob" not in _tree(b.local)
    assert _tree(b.local)["checkpoints/8/state/blob"] == b"newer"


def test_an_upload_cut_short_leaves_the_last_snapshot(url, tmp_path, monkeypatch):
    a = files.RemoteMirror(url, tmp_path / "a")
    a.pull()
    _write(a.local, "round_0/DONE", "")
    a.push()
    _write(a.local, "round_1/validation.json", "{}")
    _write(a.local, "round_1/DONE", "")
    put = a.fs.put_file
    sent = []

    def fail_after_one(src, dst, **kw):
        if sent:
            raise ConnectionError("connection reset")
        sent.append(dst)
        return put(src, dst, **kw)

    monkeypatch.setattr(a.fs, "put_file", fail_after_one)
    with pytest.raises(ConnectionError):
        a.push()
    assert sent[0].endswith("round_1/validation.json")  # DONE markers go last
    b = files.RemoteMirror(url, tmp_path / "b")
    b.pull()
    assert sorted(_tree(b.local)) == ["round_0/DONE"]  # the file sent since is not in force


def test_pull_refuses_what_is_not_a_copy_of_the_run(url, tmp_path):
    stray = tmp_path / "stray"
    _write(stray, "notes.txt")
    with pytest.raises(files.RemoteError, match="holds files but is no local copy"):
        files.RemoteMirror(url, stray).pull()
    fs, root = fsspec.url_to_fs(url)
    fs.pipe(f"{root}/someone_elses.txt", b"x")
    with pytest.raises(files.RemoteError, match="holds files but no .mapfjax_mirror.json"):
        files.RemoteMirror(url, tmp_path / "fresh").pull()
    a = files.RemoteMirror(url + "_other", tmp_path / "a")
    a.pull()
    with pytest.raises(files.RemoteError, match="is the local copy of memory://"):
        files.RemoteMirror(url, tmp_path / "a").pull()


def test_the_staging_folder_is_named_after_the_url(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPFJAX_STAGING", str(tmp_path))
    one, two = files.default_staging("gs://b/run1"), files.default_staging("gs://b/run2")
    assert one.parent == tmp_path and one != two and "gs_b_run1" in one.name


# --------------------------------------------------------------------------- the training command


def _train(args, env, **kw):
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "train.py"), *args],
        env=env, capture_output=True, text=True, cwd=kw.pop("cwd", ROOT), timeout=900, **kw,
    )  # fmt: skip


def test_train_refuses_a_bad_url_before_any_work(tmp_path, one_device_env):
    for workdir, words in (
        ("gs:/bucket/run", "write gs://bucket/run"),
        ("gs://bucket/run", "gcsfs"),
    ):
        if words == "gcsfs" and _importable("gcsfs"):
            continue
        res = _train(
            [f"--config={ROOT / 'configs' / 'tiny_cpu.py'}:smoke", f"--workdir={workdir}"],
            {**one_device_env, "MAPFJAX_STAGING": str(tmp_path / "staging")},
            cwd=tmp_path,
        )
        assert res.returncode == 2, res.stderr[-2000:]
        lines = [x for x in res.stderr.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr
        assert not (tmp_path / "gs:").exists() and not (tmp_path / "staging").exists()


@pytest.mark.slow
def test_a_killed_remote_run_continues_from_another_copy(tiny_model_dir, tmp_path, one_device_env):
    """SIGKILL while the run trains; the same command with a fresh --staging_dir (another
    machine) pulls what was uploaded and finishes with the artifacts of an uninterrupted run."""
    remote = f"file://{tmp_path / 'bucket' / 'run'}"
    args = [
        "--config=configs/tiny_cpu.py:smoke", f"--config.model.path={tiny_model_dir}",
        f"--workdir={remote}", "--sync_every=0.5",
    ]  # fmt: skip
    env = {**one_device_env, "PYTHONPATH": str(ROOT)}
    uploaded = tmp_path / "bucket" / "run" / files.MIRROR_MANIFEST
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "launch" / "train.py"), *args,
         f"--staging_dir={tmp_path / 'first'}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 600

    def checkpointed():
        return uploaded.exists() and any(
            k.startswith("checkpoints/") for k in json.loads(uploaded.read_text())["files"]
        )

    while time.time() < deadline and proc.poll() is None and not checkpointed():
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert checkpointed(), "no checkpoint was uploaded before the kill"
    manifest = json.loads(uploaded.read_text())["files"]
    assert "round_1/DONE" not in manifest  # killed mid-run
    res = _train([*args, f"--staging_dir={tmp_path / 'second'}"], env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"report: {remote}/report.md" in res.stdout
    done = tmp_path / "bucket" / "run"
    assert (done / "round_1" / "DONE").exists() and (done / "report.md").exists()
    assert (done / "report.md").read_text().startswith(f"# Run report: {remote}")
    # the same as an uninterrupted run of the same config, written locally
    ref = tmp_path / "ref"
    res = _train([*args[:2], f"--workdir={ref}"], env)
    assert res.returncode == 0, res.stderr[-3000:]
    for n in (0, 1):
        for name in ("config.json", "record.json"):
            a = json.loads((ref / f"round_{n}" / name).read_text())
            b = json.loads((done / f"round_{n}" / name).read_text())
            assert a == b, (n, name)
