r"""Ahead-of-time memory plans on fake CPU devices (nothing is allocated): a training run's every
phase on a target machine, with the time a round takes there; or one model's computations.

    python launch/memory_plan.py --config configs/paper_qwen3_4b.py --target h100x8
    python launch/memory_plan.py --config configs/paper_qwen3_4b.py --target v4-8 \
        --set train.problems_per_step=16 --set optim.accum_steps=4
    python launch/memory_plan.py --model qwen3-4b --devices 8 --sizes 8x2048,32x4096

With --config, the run's phases (`loop.memory_plan`: the GRPO step's rollout with its cache
growth and its update, validation, the engineer's sampling, the benchmark) are compiled for
the target's devices on the run's mesh and compared with the memory those devices allow; the
time per round is estimated from the committed accelerator figures (--figures). The exit
status is 1 when a phase does not fit. launch/train.py makes the same check on the devices it
runs on before any work.
"""

import argparse
import glob
import json
import math
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "projects" / "accelerator" / "results"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="a run config (FILE or FILE:ARG): plan each of its phases")
    ap.add_argument(
        "--target", default="h100x8", help="with --config: a mapfjax.parallel.TARGETS name"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="with --config: override a config key (repeatable), e.g. optim.accum_steps=16",
    )  # fmt: skip
    ap.add_argument(
        "--mem_fraction", type=float,
        help="with --config: the share of a device's memory allowed (default: the target's; "
        "GPUs: the XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 the recipes set)",
    )  # fmt: skip
    ap.add_argument(
        "--figures", default=str(FIGURES), help="with --config: the accelerator figures' folder"
    )
    ap.add_argument(
        "--model", default=None,
        help="a name in mapfjax.models.qwen3.PRESETS, e.g. tiny (with --config: default the "
        "checkpoint's config.json, else the preset its name spells; else qwen3-4b)",
    )  # fmt: skip
    ap.add_argument(
        "--devices",
        type=int,
        help="fake CPU devices (default 8, or the target's); "
        "with --target, a job of several such nodes (h100x8 --devices 32: 4 nodes)",
    )
    ap.add_argument("--meshes", default="fsdp8,fsdp4-tp2,data2-fsdp4,tp8", help="axisN-axisM,...")
    ap.add_argument("--sizes", default="8x2048,8x8192", help="batch x sequence length, comma list")
    ap.add_argument("--computations", default="all", help="names from COMPUTATIONS, or all")
    return ap.parse_args(argv)


def _fake_devices(n: int) -> None:
    """Must precede the first jax import: the fake device count is read once at start-up."""
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# ------------------------------------------------------------------------ one model's computations


def lowered_call(method):
    """Lowers model.<method>(tokens)[0] on [B, T] tokens with train rules: "__call__" gives
    float32 logits [B, T, V], "hidden_states" the final hidden states [B, T, H] (as chunked
    log-prob code uses them)."""

    def build(graphdef, state, mesh, b, t):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from mapfjax import parallel

        spec = parallel.logical_to_sharding(("batch", "seq"), mesh, "train", (b, t))
        fn = jax.jit(lambda s, x: getattr(nnx.merge(graphdef, s), method)(x)[0])
        return fn.lower(state, jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=spec))

    return build


def sample(graphdef, state, mesh, b, t):
    """Sampling: prefill T/2 prompt tokens, decode T/2 more over a bf16 KV cache of T slots."""
    from mapfjax.models import sampler

    kw = dict(batch=b, prompt_len=t // 2, max_new_tokens=t - t // 2, mesh=mesh)
    return sampler.lower_generate(graphdef, state, **kw)


# name -> (sharding rules for the parameters, fn(graphdef, state, mesh, batch, seq) -> lowered)
COMPUTATIONS = {
    "forward": ("train", lowered_call("__call__")),
    "hidden": ("train", lowered_call("hidden_states")),
    "sample": ("sample", sample),
}


def model_plans(opts) -> int:
    import jax

    from mapfjax import parallel
    from mapfjax.models import sampler
    from mapfjax.models.qwen3 import PRESETS, Qwen3

    name = opts.model or "qwen3-4b"
    cfg = PRESETS[name]
    names = list(COMPUTATIONS) if opts.computations == "all" else opts.computations.split(",")
    sizes = [tuple(int(v) for v in s.split("x")) for s in opts.sizes.split(",")]
    print(
        f"{name}, {jax.device_count()} devices, GiB per device "
        "(peak = args + out - aliased + temp, + the cache's last growth when sampling)"
    )
    for spec in opts.meshes.split(","):
        mesh = parallel.mesh_from_spec(spec)
        for comp in names:
            rules, build = COMPUTATIONS[comp]
            graphdef, state = parallel.abstract_sharded_state(lambda: Qwen3(cfg), mesh, rules)
            for b, t in sizes:
                with jax.set_mesh(mesh):  # activates the model's activation constraints
                    mem = parallel.memory_per_device(build(graphdef, state, mesh, b, t))
                if comp == "sample":  # the last cache growth holds the old cache beside it
                    kw = dict(batch=b, max_new_tokens=t - t // 2, mesh=mesh)
                    mem["growth"] = sampler.growth_bytes(cfg, **kw)
                line = parallel.describe_memory(mem)
                print(f"{spec:>12} {comp:>8} B={b:<4} T={t:<6} {line}", flush=True)
    return 0


# ------------------------------------------------------------------------ a run on a target


def run_config(spec: str, overrides):
    """The run config `spec` (FILE or FILE:ARG) with KEY=VALUE overrides applied (a value is
    read as a Python literal, else kept as text); ValueError naming a malformed one."""
    import ast

    from mapfjax import configfile

    path, _, arg = spec.partition(":")
    c = configfile.get_config(path, arg)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}; allowed: KEY=VALUE, e.g. optim.accum_steps=16")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        parent, last = configfile.key_path(c, key)
        parent[last] = value
    return c


def model_config(s, preset: str | None):
    """(Qwen3Config, tokenizer or None, where it came from) for the run's model: a preset named
    by --model; else the checkpoint's own config.json and tokenizer when model.path is a local
    directory; else the preset its last part spells (Qwen/Qwen3-4B: qwen3-4b)."""
    from mapfjax.models import hf
    from mapfjax.models import tokenizer as tok_lib
    from mapfjax.models.qwen3 import PRESETS

    if preset:
        if preset not in PRESETS:
            raise ValueError(f"--model {preset!r}; allowed: {', '.join(sorted(PRESETS))}")
        return PRESETS[preset], None, f"preset {preset}"
    path = pathlib.Path(s.model.path).expanduser()
    if (path / "config.json").is_file():
        return hf.read_config(path)[0], tok_lib.load_tokenizer(path), str(path)
    name = path.name.lower()
    if name in PRESETS:
        return PRESETS[name], None, f"preset {name} (model.path {s.model.path} is not here)"
    raise ValueError(
        f"model.path = {s.model.path!r} is not a local checkpoint and names no preset; pass "
        f"--model (one of {', '.join(sorted(PRESETS))})"
    )


def committed_figures(folder) -> dict[str, dict]:
    """Per device name ("NVIDIA H200"): the decode points (bytes a step reads, ms per step, of
    the one-step loop) and the update MFU per model preset, from every <device>.json under
    `folder` (written by benchmarks/accelerator.py) of a known accelerator
    (parallel.DEVICE_KINDS)."""
    from mapfjax import parallel

    out: dict[str, dict] = {}
    for file in sorted(glob.glob(os.path.join(str(folder), "**", "*.json"), recursive=True)):
        try:
            data = json.loads(pathlib.Path(file).read_text())
            device = data["device"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if parallel.device_kind(str(device)) is None:  # a CPU run of the benchmark's tiny form
            continue
        entry = out.setdefault(device, {"decode": [], "mfu": {}, "files": []})
        entry["files"].append(os.path.relpath(file, ROOT))
        for m in data.get("models", {}).values():
            for r in m.get("sampling", []) or []:
                one_step = r.get("steps_per_loop", 1) == 1  # the sampler's default loop
                if one_step and r.get("bytes_per_step") and r.get("decode_ms_per_step"):
                    entry["decode"].append((r["bytes_per_step"], r["decode_ms_per_step"]))
            mfu = (m.get("grpo") or {}).get("mfu")
            if mfu:
                entry["mfu"][m.get("preset", "?")] = mfu
    return {k: v for k, v in out.items() if v["decode"]}


class Speed:
    """The time model of one device kind, from the committed figures of the nearest measured
    one: a decode step costs `fixed_ms` + `ms_per_gb` x the GB it reads (a least-squares line
    through the measured points; the slope scaled by the ratio of peak bandwidths when the
    figures come from another kind), the update runs at `mfu` of the kind's peak FLOP/s."""

    def __init__(self, kind, figures: dict[str, dict], preset: str | None):
        import numpy as np

        from mapfjax import parallel

        if not figures:
            raise ValueError("no accelerator figures to estimate times from (--figures)")
        same = [d for d in figures if parallel.device_kind(d) == kind]
        source = same[0] if same else sorted(figures)[0]
        measured = parallel.device_kind(source)
        x, y = np.asarray(figures[source]["decode"], float).T
        a = np.vstack([np.ones_like(x), x / 1e9]).T
        fixed, slope = np.linalg.lstsq(a, y, rcond=None)[0]
        scale = measured.bandwidth / kind.bandwidth if measured and not same else 1.0
        self.fixed_ms, self.ms_per_gb = float(fixed), float(slope) * scale
        mfus = figures[source]["mfu"]
        self.mfu = mfus.get(preset) or (sum(mfus.values()) / len(mfus) if mfus else 0.3)
        self.flops = kind.flops
        how = "" if same else f", scaled to the {kind.name} by peak bandwidth"
        self.source = (
            f"decode step {self.fixed_ms:.2f} ms + {self.ms_per_gb:.3f} ms per GB read (a line "
            f"through {len(x)} points measured on the {source}{how}); the update at "
            f"{self.mfu:.1%} MFU (measured on the {source}) of {kind.flops / 1e12:.0f} TFLOP/s"
        )

    def decode_s(self, steps: int, gb_per_step: float) -> float:
        return steps * (self.fixed_ms + self.ms_per_gb * gb_per_step) / 1e3

    def compute_s(self, flops_per_device: float) -> float:
        return flops_per_device / (self.mfu * self.flops)


def round_times(s, config, params: int, shards: int, devices: int, speed: Speed, prompt_len):
    """[(phase, count, seconds each)] of one round and of the run's once-only phases, every
    response running to its token budget (the bound a thinking model's rollouts approach)."""
    from mapfjax.engineer import loop
    from mapfjax.rl import metrics

    weights_gb = params * 2 / 1e9  # bf16: every device reads every weight once per step
    kv = config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2  # bytes per token

    def decode(rows: int, prompt: int, budget: int) -> float:
        per_device = math.ceil(rows / shards)
        gb = weights_gb + per_device * (prompt + budget / 2) * kv / 1e9
        prefill = speed.compute_s(2 * params * per_device * prompt)
        return prefill + speed.decode_s(budget, gb)

    g, val, out = s.grpo, s.validation, []
    p = prompt_len(int(s.env.num_agents), max(int(k[1:]) for k in s.env.sizes))
    t = g.sampling.max_new_tokens
    out.append(("rollout", g.steps, decode(g.drawn_per_step * g.group_size, p, t)))
    flops = metrics.update_flops(config, params, g.problems_per_step, g.group_size, p, t)
    out.append(("update", g.steps * g.num_iterations, speed.compute_s(flops / devices)))
    n_val = val.per_size * len(val.sizes) * (1 + len(val.extra_seeds))
    p_val = prompt_len(val.num_agents, max(val.sizes))
    each = decode(val.batch_size, p_val, val.max_new_tokens)
    chunks = math.ceil(n_val / val.batch_size) * (1 + (val.samples > 0) * val.samples)
    out.append(("validation", chunks, each))
    e = s.engineer
    if e.name in ("policy", "base"):
        n = int(e.settings.get("num_samples", 1))
        out.append(("engineer", 1, decode(n, loop.ENGINEER_PROMPT_TOKENS, e.max_new_tokens)))
    once = []
    b = s.benchmark
    if b is not None:
        n_b = b.per_cell * len(b.spec().cells())
        p_b = prompt_len(max(b.agents), max(b.sizes))
        each = decode(b.batch_size, p_b, b.max_new_tokens)
        once.append(("benchmark (start and final model)", 2 * math.ceil(n_b / b.batch_size), each))
    once.append(("start validation", chunks, out[2][2]))
    return out, once


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def run_plan(opts) -> int:
    import jax

    from mapfjax import parallel, stats
    from mapfjax.engineer import loop
    from mapfjax.engineer.settings import RunSettings

    kind, count = parallel.target(opts.target)
    count = opts.devices or count  # several nodes of the target's devices: --devices 32
    if jax.device_count() != count:
        raise ValueError(
            f"--target {opts.target} has {count} devices but {jax.device_count()} were made "
            "(--devices)"
        )
    c = run_config(opts.config, opts.set)
    s = RunSettings.from_config(c)  # the mesh is checked against the target's devices here
    config, tokenizer, origin = model_config(s, opts.model)
    sampling = s.grpo.sampling
    tokens = loop.prompt_tokens(tokenizer, sampling.bucket, sampling.enable_thinking)
    mesh = parallel.make_mesh(dict(s.mesh))
    fraction = opts.mem_fraction or kind.usable
    limit = int(kind.memory * fraction)
    shape = "-".join(f"{a}{n}" for a, n in mesh.shape.items())
    print(
        f"{opts.config} on {opts.target}: {count} x {kind.name}, {loop.size_text(limit)} "
        f"allowed per device ({kind.memory / 2**20:,.0f} MiB x {fraction:g}"
        + (", with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (JAX's default is 0.75)" if "NVIDIA"
           in kind.name and not opts.mem_fraction else "")
        + f"); mesh {shape}; model {origin}; XLA's plan per device, compiled on CPU",
        flush=True,
    )  # fmt: skip
    plans = loop.memory_plan(s, mesh, config, tokens, accelerator_graph=True)
    rows = [
        [p.phase, p.what, loop.size_text(p.program), loop.size_text(p.resident),
         loop.size_text(p.total), "yes" if p.total <= limit else f"**no**: {p.settings}"]
        for p in plans
    ]  # fmt: skip
    header = ["phase", "what", "program", "resident", "total", "fits"]
    print(stats.markdown_table(header, rows), flush=True)
    _print_times(opts, s, config, kind, mesh, count, tokens)
    bad = [p for p in plans if p.total > limit]
    print(
        f"does not fit: {', '.join(p.phase for p in bad)}"
        if bad
        else f"every phase fits {count} x {kind.name}"
    )
    return 1 if bad else 0


def _print_times(opts, s, config, kind, mesh, count, tokens) -> None:
    from mapfjax import stats
    from mapfjax.models.qwen3 import PRESETS

    preset = next((n for n, c in PRESETS.items() if c == config), None)
    try:
        speed = Speed(kind, committed_figures(opts.figures), preset)
    except ValueError as e:
        print(f"No time estimate: {e}")
        return
    params = _param_count(config)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    per_round, once = round_times(s, config, params, shards, count, speed, tokens)
    table = [[p, n, f"{t:.1f} s", _hours(n * t)] for p, n, t in per_round]
    round_s = sum(n * t for _, n, t in per_round)
    once_s = sum(n * t for _, n, t in once)
    table += [[p, n, f"{t:.1f} s", _hours(n * t)] for p, n, t in once]
    print(
        f"\nTime on {count} x {kind.name}, every response to its budget: {speed.source}. Not "
        "in it: compiles (minutes each, once), the per-step gather of fsdp-sharded weights "
        "while decoding, checkpoints, host work.\n"
    )
    print(stats.markdown_table(["phase", "count", "each", "total"], table))
    print(
        f"\nper round: {_hours(round_s)}; the run ({s.rounds} rounds, once-only phases "
        f"included): {_hours(s.rounds * round_s + once_s)}",
        flush=True,
    )


def _param_count(config) -> int:
    import jax
    from flax import nnx

    from mapfjax.models.qwen3 import Qwen3

    abstract = nnx.eval_shape(lambda: Qwen3(config))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def main(argv=None) -> int:
    opts = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    # jax reads the fake device count when its backend starts (the first device query), so it
    # is set here, after the imports that only name jax.
    from mapfjax import parallel

    if not opts.config:
        _fake_devices(opts.devices or 8)
        return model_plans(opts)
    try:
        _fake_devices(opts.devices or parallel.target(opts.target)[1])
        return run_plan(opts)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
