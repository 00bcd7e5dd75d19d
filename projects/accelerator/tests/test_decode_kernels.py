"""The decode kernel census in its CPU form (`projects.accelerator.decode_kernels --model
tiny`), and its HLO reading on a hand-written module."""

import json
import pathlib
import subprocess
import sys

from projects.accelerator import decode_kernels

ROOT = pathlib.Path(__file__).resolve().parents[3]

HLO = """HloModule m

%body.1 (p: (s32[], f32[2,8])) -> (s32[], f32[2,8]) {
  %p = (s32[], f32[2,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[2,8]{1,0} get-tuple-element(%p), index=1
  %f = f32[2,8]{1,0} fusion(%x), kind=kLoop, calls=%fused
  %g = f32[2,8]{1,0} custom-call(%f), custom_call_target="__cublas$gemm"
  %d = f32[2,8]{1,0} dot(%g, %g), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[2,8]{1,0}) tuple(%i, %d)
}

%fused (a: f32[2,8]) -> f32[2,8] {
  %a = f32[2,8]{1,0} parameter(0)
  ROOT %n = f32[2,8]{1,0} negate(%a)
}

ENTRY %main.9 (a: f32[2,8], /*index=1*/b: s32[]) -> f32[2,8] {
  %a = f32[2,8]{1,0} parameter(0)
  %w = (s32[], f32[2,8]{1,0}) while(%t0), condition=%c, body=%body.1, metadata={op_name="_decode"}
  ROOT %r = f32[2,8]{1,0} get-tuple-element(%w), index=1
}
"""


def test_the_census_reads_the_decode_loops_body():
    comps = decode_kernels.computations(HLO)
    assert set(comps) == {"body.1", "fused", "main.9"}
    assert decode_kernels.decode_body(comps) == "body.1"
    found = decode_kernels.census(comps, "body.1")
    assert [k["kind"] for k in found["kernels"]] == [
        "fusion kLoop", "custom-call __cublas$gemm", "dot",
    ]  # fmt: skip
    # the loop fusion holds no product; the library call and the dot are products
    assert [p["name"] for p in found["products"]] == ["g", "d"]


def test_the_cpu_form_counts_every_layers_projections(tmp_path, one_device_env):
    cmd = [sys.executable, "-m", "projects.accelerator.decode_kernels", "--model", "tiny",
           "--batch", "2", "--prompt_len", "8", "--new_tokens", "8",
           "--out", str(tmp_path)]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, env=one_device_env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "kernels_cpu_tiny_b2.json").read_text())
    assert r["platform"] == "cpu" and r["batch"] == 2 and r["num_layers"] == 2
    assert r["kernels_per_step"] == sum(r["by_kind"].values()) > 0
    # q, k, v, o, gate, up and down in each layer, and the output head, at least
    assert len(r["products"]) >= 7 * r["num_layers"] + 1
    assert "kernels or calls per step" in (tmp_path / "kernels_cpu_tiny_b2.md").read_text()


def test_bad_arguments_are_one_line(tmp_path):
    cmd = [sys.executable, "-m", "projects.accelerator.decode_kernels", "--out", str(tmp_path)]
    for bad, needle in ((["--model", "qwen9"], "allowed"), (["--batch", "3", "--samples", "2"],
                                                             "not a multiple")):  # fmt: skip
        res = subprocess.run([*cmd, *bad], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 2 and needle in res.stderr, res.stderr
