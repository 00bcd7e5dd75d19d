"""The launch scripts' restart with tcmalloc preloaded (mapfjax/hostalloc.py)."""

import os
import subprocess
import sys

import pytest

from mapfjax import hostalloc

LIB = "libtcmalloc_minimal.so.4"


def test_restart_environment_preloads_tcmalloc_once():
    env = hostalloc.restart_environment({"PATH": "/bin"}, LIB, "linux")
    assert env["LD_PRELOAD"] == LIB and env["PATH"] == "/bin"
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40
    # another preload is kept, after it
    env = hostalloc.restart_environment({"LD_PRELOAD": "libx.so"}, LIB, "linux")
    assert env["LD_PRELOAD"] == f"{LIB} libx.so"
    # the restarted process (or one the loader refused the preload for) does not restart again
    assert hostalloc.restart_environment(env, LIB, "linux") is None
    # a threshold the user set is theirs
    threshold = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "5"}
    assert hostalloc.restart_environment(threshold, LIB, "linux")[next(iter(threshold))] == "5"


@pytest.mark.parametrize(
    "environ, lib, platform",
    [
        ({"MAPFJAX_TCMALLOC": "0"}, LIB, "linux"),  # turned off
        ({}, None, "linux"),  # not installed
        ({}, LIB, "darwin"),  # not Linux
    ],
)
def test_no_restart(environ, lib, platform):
    assert hostalloc.restart_environment(environ, lib, platform) is None


_CHILD = (
    "import os, sys\n"
    "from mapfjax import hostalloc\n"
    "hostalloc.use_tcmalloc()\n"
    "maps = open('/proc/self/maps').read()\n"
    "print(os.getpid(), 'tcmalloc' in maps, sys.argv[1:])\n"
)


def _run(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("MAPFJAX_TCMALLOC", "LD_PRELOAD")}
    return subprocess.run(
        [sys.executable, "-c", _CHILD, "a", "--b=1"], env={**base, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(
    sys.platform != "linux" or hostalloc.library() is None,
    reason="tcmalloc is not installed here (apt install libtcmalloc-minimal4)",
)
def test_a_script_restarts_itself_with_tcmalloc_loaded():
    out = _run()
    assert out.returncode == 0, out.stderr
    pid, loaded, args = out.stdout.strip().split(maxsplit=2)
    assert loaded == "True" and args == "['a', '--b=1']"  # same arguments after the restart
    assert "restarting with" in out.stderr and "MAPFJAX_TCMALLOC=0" in out.stderr
    off = _run(MAPFJAX_TCMALLOC="0")
    assert off.stdout.split()[1] == "False" and not off.stderr
