"""Two real processes on localhost joined by jax.distributed run a sharded train step together
and end with the same parameters as one process with the same 8 devices."""

import json
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")
ROOT = WORKER.parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(pid, nproc, port, local):
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(local)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _result(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_two_processes_match_one_process():
    single = _result(_run(0, 1, 0, 8))
    port = _free_port()
    procs = [_run(i, 2, port, 4) for i in range(2)]
    multi = [_result(p) for p in procs]
    assert [m["process"] for m in multi] == [0, 1]
    for m in multi:
        assert m["processes"] == 2 and m["devices"] == 8
        np.testing.assert_allclose(m["losses"], single["losses"], rtol=1e-5)
        np.testing.assert_allclose(
            [m["sum"], m["sumsq"]], [single["sum"], single["sumsq"]], rtol=1e-5
        )
    assert single["losses"][1] < single["losses"][0]  # the steps really updated the weights
