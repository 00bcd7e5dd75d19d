"""What one decode step launches: the compiled decode loop's body, counted by kernel.

A decode step's fixed cost on a GPU is mostly kernel launches (1.52 ms a step on one H200,
results/README.md), and the weights' read at batch 1 depends on which kernel each matrix-vector
product becomes (a cuBLAS call, a Triton GEMM fusion, a loop fusion). This compiles the
sampler's prefill + decode (`sampler.lower_generate`) for random weights of a Qwen3 preset on
the device jax sees, without running it, finds the decode `while` loop's body in XLA's
optimized HLO and counts what it launches per iteration: fusions by kind, library calls by
target, other kernels by opcode, command buffers (XLA's CUDA graphs) and the products with
their shapes. Nothing is allocated on the device beyond the compile.

    python -m projects.accelerator.decode_kernels --model 1.7b --batch 1 --out DIR
    python -m projects.accelerator.decode_kernels --model tiny --batch 2 --out /tmp/k   # CPU

Writes DIR/kernels_<device>_<model>_b<batch>.json and .md. Compare runs with and without
XLA_FLAGS (e.g. command buffers) by their `xla_flags` field.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import sys

from benchmarks.accelerator import SIZES as MODELS  # the benchmark's model names
from benchmarks.accelerator import device_slug
from mapfjax import files

# Instructions that launch nothing: views, tuples, parameters, constants.
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
    "opt-barrier", "partition-id", "replica-id",
}  # fmt: skip
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INST = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")


def computations(hlo: str) -> dict[str, list[str]]:
    """HLO text -> {computation name: its instruction lines}."""
    comps: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m and not line[0].isspace():  # a header; instructions are indented
            name = m.group(1)
            comps[name] = []
        elif line.strip() == "}":
            name = None
        elif name is not None and line.strip():
            comps[name].append(line)
    return comps


def _instructions(lines):
    for line in lines:
        m = _INST.match(line)
        if m:
            yield m.group(1), m.group(2), m.group(3), line


def decode_body(comps: dict[str, list[str]]) -> str:
    """The name of the decode loop's body: of the `while` loops whose metadata names the
    sampler's decode, the one whose body launches the most kernels (the prefill's layer scan
    is a loop too)."""
    best, best_n = None, -1
    for lines in comps.values():
        for _, _, op, line in _instructions(lines):
            if op != "while" or "decode" not in line:
                continue
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            n = len(census(comps, body)["kernels"])
            if n > best_n:
                best, best_n = body, n
    if best is None:
        raise ValueError("no while loop of the decode in the compiled HLO")
    return best


def _fusion_kind(line: str) -> str:
    kind = re.search(r"kind=(k\w+)", line)
    kind = kind.group(1) if kind else "?"
    custom = re.search(r'"(?:kind|name)":"(__[\w]+)"', line)
    return f"{kind} {custom.group(1)}" if kind == "kCustom" and custom else kind


def census(comps: dict[str, list[str]], body: str) -> dict:
    """What the computation `body` launches per run: a list of (kind, shape, name) for each
    kernel, library call or nested loop, and the products (dots, GEMM fusions and calls)."""
    kernels, products = [], []
    for name, shape, op, line in _instructions(comps.get(body, [])):
        if op in _FREE:
            continue
        if op == "fusion":
            kind = "fusion " + _fusion_kind(line)
            called = re.search(r"calls=%?([\w.\-]+)", line)
            inner = comps.get(called.group(1), []) if called else []
            has_dot = any(o in ("dot", "convolution") for _, _, o, _ in _instructions(inner))
            if has_dot or "gemm" in kind:
                products.append({"name": name, "kind": kind, "shape": shape})
        elif op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            kind = "custom-call " + (target.group(1) if target else "?")
            if re.search(r"gemm|cublas|matmul", kind, re.I):
                products.append({"name": name, "kind": kind, "shape": shape})
        elif op == "dot":
            kind = "dot"
            products.append({"name": name, "kind": kind, "shape": shape})
        else:
            kind = op
        kernels.append({"kind": kind, "shape": shape, "name": name})
    return {"kernels": kernels, "products": products}


def run(model: str, batch: int, prompt_len: int, new_tokens: int, samples: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from mapfjax.models import qwen3, sampler

    cfg = qwen3.PRESETS[MODELS[model]]
    dt = jnp.bfloat16 if jax.default_backend() != "cpu" else jnp.float32
    abstract = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, dtype=dt, param_dtype=dt))
    graphdef, state = nnx.split(abstract)
    lowered = sampler.lower_generate(
        graphdef, state, batch=batch, prompt_len=prompt_len, max_new_tokens=new_tokens,
        cache_dtype=dt, num_samples=samples,
    )  # fmt: skip
    hlo = lowered.compile().as_text()
    comps = computations(hlo)
    body = decode_body(comps)
    found = census(comps, body)
    by_kind = collections.Counter(k["kind"] for k in found["kernels"])
    device = jax.devices()[0]
    return {
        "device": getattr(device, "device_kind", device.platform),
        "platform": device.platform,
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "model": MODELS[model],
        "num_layers": cfg.num_layers,
        "batch": batch,
        "samples_per_prompt": samples,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "body": body,
        "kernels_per_step": len(found["kernels"]),
        "kernels_per_layer": round(len(found["kernels"]) / cfg.num_layers, 2),
        "by_kind": dict(by_kind.most_common()),
        "command_buffers": sum(v for k, v in by_kind.items() if "command" in k.lower()),
        "products": found["products"],
    }


def markdown(r: dict) -> str:
    lines = [
        f"# One decode step's kernels: {r['model']}, batch {r['batch']}, {r['device']}",
        "",
        f"jax {r['jax']}; XLA_FLAGS `{r['xla_flags'] or '(none)'}`; prompt {r['prompt_len']}, "
        f"{r['new_tokens']} new tokens, {r['samples_per_prompt']} sample(s) per prompt. The "
        f"decode loop's body (`{r['body']}`) launches **{r['kernels_per_step']}** kernels or "
        f"calls per step ({r['kernels_per_layer']} per layer of {r['num_layers']}); command "
        f"buffers: {r['command_buffers']}.",
        "",
        "| kind | per step |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in r["by_kind"].items()),
        "",
        "Products (matrix-vector or matrix-matrix) and the kernel each became:",
        "",
        "| kind | shape | count |",
        "|---|---|---|",
    ]
    counts = collections.Counter((p["kind"], p["shape"]) for p in r["products"])
    lines += [f"| {k} | `{s}` | {n} |" for (k, s), n in counts.most_common()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="1.7b", help=f"one of {sorted(MODELS)}")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--samples", type=int, default=1, help="samples per prompt (divides batch)")
    ap.add_argument("--prompt_len", type=int, default=256)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.model not in MODELS:
        ap.error(f"--model {a.model!r}; allowed: {', '.join(sorted(MODELS))}")
    for key in ("batch", "samples", "prompt_len", "new_tokens"):
        if getattr(a, key) < 1:
            ap.error(f"--{key} {getattr(a, key)}: must be at least 1")
    if a.batch % a.samples:
        ap.error(f"--batch {a.batch} is not a multiple of --samples {a.samples}")
    r = run(a.model, a.batch, a.prompt_len, a.new_tokens, a.samples)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"kernels_{device_slug(r['device'])}_{a.model}_b{a.batch}"
    files.atomic_write(out / (stem + ".json"), json.dumps(r, indent=1) + "\n")
    files.atomic_write(out / (stem + ".md"), markdown(r))
    print(f"{r['kernels_per_step']} kernels per decode step ({r['kernels_per_layer']} per "
          f"layer); {out / (stem + '.md')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
