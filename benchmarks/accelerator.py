"""What the Qwen3 path does on the device jax sees, for random-weight Qwen3 models of the real
shapes in bf16: bf16 against fp32 logits, prefill and decode throughput with the decode step's
fraction of the memory-bandwidth roofline, one GRPO step (rollout and update, the update's
model FLOPs utilisation), peak device memory beside the ahead-of-time plan, and compile times.
Writes <device>.json and <device>.md under --out. Nothing is downloaded.

    python benchmarks/accelerator.py --models 0.6b,1.7b,4b --out projects/accelerator/results
    python benchmarks/accelerator.py --models tiny --out /tmp/accelerator   # CPU, ~30 s
    python benchmarks/accelerator.py --models 0.6b --steps-per-loop 1,4,8   # K decode steps
                                                                            # per loop vs 1
    python benchmarks/accelerator.py --models 0.6b --profile   # + one decode step's parts
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

# Local imports below: sys.path must hold the repository first when run as a script.

SIZES = {"0.6b": "qwen3-0.6b", "1.7b": "qwen3-1.7b", "4b": "qwen3-4b", "tiny": "tiny"}

# Peak HBM bandwidth and dense bf16 FLOP/s by device kind: mapfjax.parallel.DEVICE_KINDS.


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The measured shapes: sampling at each batch x new-token budget after prompt_len-token
    prompts; a GRPO step of grpo_prompts x grpo_group completions of grpo_tokens tokens;
    parity over parity_prompts x parity_len tokens."""

    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: tuple[int, ...]
    grpo_prompts: int
    grpo_group: int
    grpo_tokens: int
    parity_prompts: int
    parity_len: int
    accum: int

    @classmethod
    def parse(cls, opts) -> Shapes:
        """Real shapes for real models; small ones when the tiny model is the only known size
        asked for."""
        tiny = {m for m in opts.models.split(",") if m in SIZES} == {"tiny"}
        grpo = opts.grpo or ("2x2x16" if tiny else "16x8x1024")
        parity = opts.parity or ("2x16" if tiny else "8x64")
        p, g, t = (int(x) for x in grpo.split("x"))
        n, length = (int(x) for x in parity.split("x"))
        return cls(
            batches=_ints(opts.batches or ("1,2" if tiny else "1,64,256")),
            prompt_len=opts.prompt_len or (16 if tiny else 256),
            new_tokens=_ints(opts.new_tokens or ("4,8" if tiny else "256,2048")),
            grpo_prompts=p, grpo_group=g, grpo_tokens=t, parity_prompts=n, parity_len=length,
            accum=opts.accum or (1 if tiny else 4),
        )  # fmt: skip


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse_args(argv=None):
    from mapfjax.models.qwen3 import ATTENTION_IMPLS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="0.6b,1.7b,4b", help=f"comma list of {sorted(SIZES)}")
    ap.add_argument("--out", default="projects/accelerator/results")
    ap.add_argument("--batches", help="sampling batch sizes (default 1,64,256)")
    ap.add_argument("--prompt-len", type=int, help="prompt tokens (default 256)")
    ap.add_argument("--new-tokens", help="decode budgets (default 256,2048)")
    ap.add_argument("--grpo", help="prompts x group x completion tokens (default 16x8x1024)")
    ap.add_argument("--parity", help="prompts x tokens for bf16 vs fp32 (default 8x64)")
    ap.add_argument("--accum", type=int, help="micro-batches per GRPO update (default 4)")
    ap.add_argument("--remat", default="full", help="remat policy of the update")
    ap.add_argument(
        "--attention",
        default="fused",
        choices=sorted(ATTENTION_IMPLS),
        help="attention_impl of prefill and the update (splash: the TPU kernel, interpreted "
        "elsewhere)",
    )
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first")
    ap.add_argument(
        "--steps-per-loop",
        default="1",
        help="comma list of decode steps per loop iteration (sampler.generate(steps_per_loop)) "
        "to sample with, each measured against 1 in the same run (default 1)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also attribute one decode step's time to its parts (projections, MLP, norms, "
        "rope, attention over the cache, cache write, embedding, lm head, sampling, the loop's "
        "predicate), each timed alone at the step's shapes, at batches 1 and 64 (tiny: its "
        "batches; --batches: those): a table beside the others (benchmarks/decode_profile.py)",
    )
    ap.add_argument("--peak-bandwidth", type=float, help="bytes/s (default: parallel.DEVICE_KINDS)")
    ap.add_argument("--peak-flops", type=float, help="bf16 FLOP/s (default: parallel.DEVICE_KINDS)")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # one model's result, for the parent
    opts = ap.parse_args(argv)
    try:
        opts.steps_per_loop = _steps_per_loop(opts.steps_per_loop)
    except ValueError:
        ap.error(f"--steps-per-loop {opts.steps_per_loop!r}: allowed: a comma list of ints >= 1")
    return opts


def _steps_per_loop(text: str) -> tuple[int, ...]:
    """The sampling table's steps per loop: 1 first (the baseline of the ratios), then the
    others asked for, each once."""
    asked = _ints(text)
    if any(k < 1 for k in asked):
        raise ValueError(text)
    return tuple(dict.fromkeys((1, *asked)))


class Report:
    """Collects results; a figure that could not be measured is None, with a one-line message
    naming it in `missing` (the rest of the table is still written)."""

    def __init__(self):
        self.missing: dict[str, str] = {}

    def lack(self, field: str, why: str):
        self.missing[field] = why
        print(f"{field}: {why}", file=sys.stderr, flush=True)
        return None


def device_info(opts, report: Report) -> dict:
    """The device's name, jax's version, the date and the peaks used for the roofline/MFU."""
    import jax

    from mapfjax import parallel

    dev = jax.devices()[0]
    kind = dev.device_kind
    match = parallel.device_kind(kind)
    bw, flops = opts.peak_bandwidth, opts.peak_flops
    source = "given on the command line" if bw and flops else None
    if match and not (bw and flops):
        bw, flops, source = bw or match.bandwidth, flops or match.flops, match.describe()
    if not bw:
        bw = report.lack("device.peak_bandwidth", f"no peak bandwidth known for {kind!r}; pass "
                         "--peak-bandwidth")  # fmt: skip
    if not flops:
        flops = report.lack("device.peak_flops", f"no peak FLOP/s known for {kind!r}; pass "
                            "--peak-flops")  # fmt: skip
    return {
        "name": kind,
        "platform": dev.platform,
        "count": jax.device_count(),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "peak_bandwidth": bw,
        "peak_flops": flops,
        "peak_source": source or "none",
    }


def _stage_times(fn, repeats: int) -> tuple[dict, dict]:
    """Calls fn(times) 1 + `repeats` times, each filling a fresh dict of stage -> seconds.
    Returns (the first call's times, compiles included; each stage's best later time)."""
    runs = []
    for _ in range(repeats + 1):
        times = {}
        fn(times)
        runs.append(times)
    later = runs[1:] or runs
    return runs[0], {k: min(r[k] for r in later) for k in runs[0]}


def _failure(e: Exception) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
        return f"out of memory ({first[:160]})"
    return f"{type(e).__name__}: {first[:200]}"


def _model_factory(cfg, opts, dtype_name="bfloat16", attention=None):
    import jax.numpy as jnp

    from mapfjax.models.qwen3 import Qwen3

    dt = jnp.dtype(dtype_name)

    def make():
        return Qwen3(cfg, dtype=dt, param_dtype=dt, remat=opts.remat,
                     attention_impl=attention or opts.attention, attention_block=0)  # fmt: skip

    return make


def _prompts(rng, count: int, length: int, vocab: int) -> list[list[int]]:
    return [list(map(int, rng.integers(1, vocab, length))) for _ in range(count)]


def parity(model, cfg, opts, shapes: Shapes) -> dict:
    """bf16 logits of the benchmarked model against fp32 logits of the same weights through the
    reference attention (einsum) on the same fixed prompts; where the benchmarked attention is
    not einsum, also bf16 against bf16 einsum (the fast path's own error)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    tokens = np.random.default_rng(0).integers(
        0, cfg.vocab_size, (shapes.parity_prompts, shapes.parity_len)
    )
    graph32, _ = nnx.split(nnx.eval_shape(_model_factory(cfg, opts, "float32", "einsum")))
    graph16, _ = nnx.split(nnx.eval_shape(_model_factory(cfg, opts, "bfloat16", "einsum")))
    state32 = jax.tree.map(lambda x: x.astype(jnp.float32), nnx.state(model))

    def stats(lo, ref):
        same = jnp.argmax(lo, -1) == jnp.argmax(ref, -1)
        return jnp.max(jnp.abs(lo.astype(jnp.float32) - ref)), jnp.mean(same)

    @jax.jit
    def compare(state16, state32, tokens):
        lo16 = nnx.merge(nnx.graphdef(model), state16)(tokens)[0]
        lo32 = nnx.merge(graph32, state32)(tokens)[0]
        ref16 = nnx.merge(graph16, state16)(tokens)[0].astype(jnp.float32)
        return stats(lo16, lo32), stats(lo16, ref16), jnp.max(jnp.abs(lo32))

    (err, agree), (err_attn, agree_attn), scale = jax.device_get(
        compare(nnx.state(model), state32, jnp.asarray(tokens))
    )
    out = {
        "max_abs_error": float(err),
        "max_abs_logit": float(scale),
        "top1_agreement": float(agree),
        "prompts": shapes.parity_prompts,
        "tokens": shapes.parity_len,
    }
    if opts.attention != "einsum":
        out["attention_vs_einsum_max_abs_error"] = float(err_attn)
        out["attention_vs_einsum_top1_agreement"] = float(agree_attn)
    return out


def _kv_bytes_per_token(cfg) -> int:
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # bf16 keys and values


def _param_bytes(model) -> int:
    import jax
    from flax import nnx

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def sampling(
    model, cfg, opts, shapes: Shapes, device: dict, report: Report, name: str, rows=None, done=None
):
    """Prefill and decode tokens/s per batch x budget; the decode step's roofline fraction:
    (weights + the KV slots a step must read, on average) / peak bandwidth / step time.
    Each shape's row is appended to `rows` (a new list if None, returned) as it is measured,
    then done(stage) is called, where given, so that a caller can write what is measured."""
    import numpy as np

    from mapfjax.models import sampler

    rows = [] if rows is None else rows
    rng, p = np.random.default_rng(1), shapes.prompt_len
    weights = _param_bytes(model)
    for b in shapes.batches:
        prompts = _prompts(rng, b, p, cfg.vocab_size)
        for n in shapes.new_tokens:
            base = None  # the K = 1 row of this shape
            for k in opts.steps_per_loop:
                field = f"models.{name}.sampling.b{b}_n{n}" + (f"_k{k}" if k > 1 else "")

                def gen(times, n=n, prompts=prompts, k=k):
                    kw = dict(stop_tokens=(), pad_id=0, bucket="exact", timings=times)
                    sampler.generate(model, prompts, n, steps_per_loop=k, **kw)

                try:
                    first, best = _stage_times(gen, opts.repeats)
                except Exception as e:  # noqa: BLE001 - report it, write the rest
                    report.lack(field, f"batch {b} x {n} new tokens, {k} steps/loop: {_failure(e)}")
                    continue
                step_s = best["decode_s"] / max(n - 1, 1)  # column 0 comes from the prefill
                # A step reads every weight once and, on average, the prompt plus half the budget.
                read = weights + b * (p + n / 2) * _kv_bytes_per_token(cfg)
                bw = device["peak_bandwidth"]
                if bw:
                    roofline = read / bw / step_s
                else:
                    roofline = report.lack(field + ".roofline_fraction", "no peak bandwidth")
                rows.append({
                    "batch": b, "prompt_len": p, "new_tokens": n, "steps_per_loop": k,
                    "prefill_tokens_per_s": b * p / best["prefill_s"],
                    "decode_tokens_per_s": b / step_s,
                    "decode_ms_per_step": 1e3 * step_s,
                    "bytes_per_step": read,
                    "roofline_fraction": roofline,
                    "compile_s": sum(first.values()) - sum(best.values()),
                })  # fmt: skip
                if k == 1:
                    base = rows[-1]
                vs = ""
                if k > 1 and base is not None:
                    ratio = step_s / (base["decode_ms_per_step"] / 1e3)
                    rows[-1]["ms_per_step_vs_1"] = ratio
                    vs = f" ({ratio:.2f}x the ms/step of 1 step/loop)"
                _say(name, f"batch {b} x {n} new tokens, {k} steps/loop: {b / step_s:,.0f} "
                     f"decode tok/s, {1e3 * step_s:.2f} ms/step{vs}, compile "
                     f"{rows[-1]['compile_s']:.1f} s")  # fmt: skip
                if done is not None:
                    done(f"sampling at batch {b} x {n} new tokens, {k} steps/loop")
    return rows


def grpo_step(make_model, cfg, opts, shapes: Shapes, device: dict, report: Report, name: str):
    """One GRPO step (rollout of G samples per prompt, then the update), best of repeats; the
    XLA plan of both for the same shapes; the device's peak memory after the step.
    Returns (timings, memory, the trainer, whose model the later measurements use)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mapfjax import parallel
    from mapfjax.models import sampler
    from mapfjax.rl import metrics
    from mapfjax.rl.batch import GroupBatch
    from mapfjax.rl.grpo import GRPOConfig
    from mapfjax.rl.trainer import OptimConfig, Trainer, num_params

    P, G, T, B = shapes.prompt_len, shapes.grpo_group, shapes.grpo_tokens, shapes.grpo_prompts
    optim = OptimConfig(lr=1e-6, total_steps=100, accum_steps=shapes.accum, remat=opts.remat)
    loss_cfg = GRPOConfig(group_size=G)
    trainer = Trainer(make_model(), optim, "grpo", loss_cfg=loss_cfg)
    prompts = _prompts(np.random.default_rng(2), B, P, cfg.vocab_size)
    prompt_tokens = jnp.asarray(prompts, jnp.int32)
    out = {"prompts": B, "group": G, "prompt_len": P, "completion_len": T}
    params = num_params(trainer.params)
    calls, last = iter(range(opts.repeats + 1)), {}

    def step(times):
        key = jax.random.fold_in(jax.random.key(3), next(calls))
        t0 = time.perf_counter()
        sample = sampler.generate(
            trainer.model(), prompts, T, temperature=1.0, key=key, num_samples=G,
            stop_tokens=(), pad_id=0, bucket="exact",
        )  # fmt: skip
        jax.block_until_ready(sample.tokens)
        times["rollout_s"], t0 = time.perf_counter() - t0, time.perf_counter()
        live = (jnp.arange(T)[None, :] < sample.lengths[:, None]).reshape(B, G, T)
        batch = GroupBatch(
            prompt_tokens=prompt_tokens,
            prompt_mask=jnp.ones((B, P), bool),
            tokens=sample.tokens.reshape(B, G, T),
            attention_mask=live,
            loss_mask=live,
            old_logprobs=sample.logprobs_full.reshape(B, G, T),
            advantages=jax.random.normal(jax.random.fold_in(key, 1), (B, G)),
        )
        trainer.step(batch)  # returns host metrics: the update has finished
        times["update_s"] = time.perf_counter() - t0
        last["batch"] = batch

    first, best = _stage_times(step, opts.repeats)
    rollout, update = best["rollout_s"], best["update_s"]
    flops = metrics.update_flops(cfg, params, B, G, P, T)
    out.update(
        params=params,
        rollout_s=rollout,
        update_s=update,
        tokens_per_s=B * G * T / (rollout + update),
        update_tflops=flops / 1e12,
        compile_rollout_s=first["rollout_s"] - rollout,
        compile_update_s=first["update_s"] - update,
    )
    peak = device["peak_flops"]
    out["mfu"] = flops / update / peak if peak else report.lack(
        f"models.{name}.grpo.mfu", "no peak FLOP/s"
    )  # fmt: skip
    mem = {"peak_bytes": _device_peak(report, name)}
    mesh = parallel.make_mesh({}, devices=jax.devices()[:1])
    try:
        upd = parallel.memory_per_device(trainer.lower_step(last["batch"]))["peak"]
        graphdef, state = parallel.abstract_sharded_state(make_model, mesh, "sample")
        roll = parallel.memory_per_device(sampler.lower_generate(
            graphdef, state, batch=B * G, prompt_len=P, max_new_tokens=T, num_samples=G, mesh=mesh
        ))["peak"]  # fmt: skip
        # The last cache growth holds the old cache beside the last segment's arrays.
        roll += sampler.growth_bytes(cfg, batch=B * G, max_new_tokens=T, num_samples=G, mesh=mesh)
        # During the rollout the optimiser moments stay resident beside the sampler's arrays.
        moments = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(trainer.state.opt_state))
        plan = max(upd, roll + moments)
    except Exception as e:  # noqa: BLE001
        upd = roll = plan = report.lack(f"models.{name}.memory.plan", _failure(e))
    mem.update(plan_update_bytes=upd, plan_rollout_bytes=roll, plan_step_bytes=plan)
    known = mem["peak_bytes"] is not None and plan is not None
    mem["peak_over_plan"] = mem["peak_bytes"] / plan if known else None
    return out, mem, trainer


def _device_peak(report: Report, name: str):
    """The device's high-water mark of allocated bytes (None, with a message, where the
    backend keeps no memory statistics, e.g. CPU)."""
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats:
        why = f"the {dev.platform} backend ({dev.device_kind}) keeps no memory statistics"
        return report.lack(f"models.{name}.memory.peak", why)
    return int(stats["peak_bytes_in_use"])


def _say(name: str, text: str) -> None:
    """One progress line on stderr (a model's measurements take minutes on a GPU)."""
    print(f"[{name}] {text}", file=sys.stderr, flush=True)


def run_model(name: str, opts, shapes: Shapes, report: Report, progress=None) -> tuple[dict, dict]:
    """(device info, this model's results): GRPO first, so the device's high-water mark
    after it is the step's; then parity and sampling on the trained weights. After each
    measurement, progress(device, result so far, what was last measured) where given."""
    from mapfjax.models.qwen3 import PRESETS

    device = device_info(opts, report)
    cfg = PRESETS[SIZES[name]]
    make = _model_factory(cfg, opts)
    result = {"preset": SIZES[name], "remat": opts.remat, "attention_impl": opts.attention}

    def done(stage):
        if progress is not None:
            progress(device, result, stage)

    _say(name, "GRPO step (compiling the rollout and the update first)")
    try:
        result["grpo"], result["memory"], trainer = grpo_step(
            make, cfg, opts, shapes, device, report, name
        )
        g = result["grpo"]
        took = f"rollout {g['rollout_s']:.2f} s + update {g['update_s']:.2f} s"
        _say(name, f"GRPO step: {took} (compile {g['compile_rollout_s']:.1f} s, "
             f"{g['compile_update_s']:.1f} s)")  # fmt: skip
        done("the GRPO step")
    except Exception as e:  # noqa: BLE001
        report.lack(f"models.{name}.grpo", f"GRPO step: {_failure(e)}")
        trainer = None
    try:
        model = trainer.model() if trainer is not None else make()
        trainer = None  # frees the optimiser state before sampling's larger batches
        result["parity"] = parity(model, cfg, opts, shapes)
        _say(name, f"bf16 vs fp32: top-1 {result['parity']['top1_agreement']:.1%}")
        done("parity")
        result["sampling"] = []
        sampling(model, cfg, opts, shapes, device, report, name, result["sampling"], done)
    except Exception as e:  # noqa: BLE001
        report.lack(f"models.{name}.parity", _failure(e))
        model = None
    if opts.profile:
        _say(name, "decode step profile")
        try:
            model = model if model is not None else make()
            batches = profile_batches(opts, shapes)
            result["profile"] = _decode_profile().profile(
                model, cfg, opts, shapes, device, report, name, batches
            )
            for r in result["profile"]:
                _say(name, f"profile at batch {r['batch']}: full step {r['full_step_ms']:.3f} "
                     f"ms, parts {r['sum_of_parts_ms']:.3f} ms")  # fmt: skip
            done("the decode profile")
        except Exception as e:  # noqa: BLE001
            report.lack(f"models.{name}.profile", _failure(e))
    return device, result


def _decode_profile():
    """benchmarks/decode_profile.py (this file's neighbour, imported however this one was)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import decode_profile

    return decode_profile


def profile_batches(opts, shapes: Shapes) -> tuple[int, ...]:
    """The decode profile's batches: --batches where given, the tiny mode's, else 1 and 64."""
    tiny = {m for m in opts.models.split(",") if m in SIZES} == {"tiny"}
    if opts.batches or tiny:
        return shapes.batches
    return (1, 64)


def _children(names, opts, argv, done=None) -> tuple[dict | None, dict, dict]:
    """Runs each model in its own process (a clean device and high-water mark per model);
    done(device, models, missing) after each, so what finished is written even if a later
    model's run is cut off. A child writes its part after every measurement, so a child that
    fails or is stopped (this process terminated: it stops the child) keeps what it measured,
    with a line saying where it stopped."""
    device, models, missing = None, {}, {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            part = os.path.join(tmp, "part.json")
            cmd = [sys.executable, __file__, *argv, "--models", name, "--part", part]
            stopped = None
            try:
                code = subprocess.run(cmd, check=False).returncode
            except BaseException as e:  # SIGTERM (a time limit), Ctrl-C: run() kills the child
                stopped, code = e, f"{type(e).__name__} in the parent"
            if code:
                missing[f"models.{name}"] = f"{name}: the run exited with {code}"
                print(missing[f"models.{name}"], file=sys.stderr)
            if os.path.exists(part):  # all of it, or what was measured before it stopped
                with open(part) as f:
                    data = json.load(f)
                device = device or data["device"]
                models.update(data["models"])
                missing.update(data["missing"])
        if done is not None and device is not None:
            done(device, models, missing)
        if stopped is not None:
            raise stopped
    return device, models, missing


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv)
    shapes = Shapes.parse(opts)
    report = Report()
    names = []
    for name in opts.models.split(","):
        if name in SIZES:
            names.append(name)
        else:
            report.lack(f"models.{name}", f"unknown model size {name!r}; allowed {list(SIZES)}")

    def result_of(device, models, missing):
        return {
            "device": device,
            "shapes": dataclasses.asdict(shapes),
            "settings": {
                "remat": opts.remat,
                "attention": opts.attention,
                "repeats": opts.repeats,
                "steps_per_loop": list(opts.steps_per_loop),
                "profile": opts.profile,
            },  # fmt: skip
            "models": models,
            "missing": {**report.missing, **missing},
        }

    if len(names) > 1:

        def done(device, models, missing):  # the finished models, written as they finish
            write(result_of(device, models, missing), opts.out, quiet=True)

        # `timeout` sends SIGTERM: exit through Python so the child is stopped and its part kept.
        before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        try:
            device, models, missing = _children(names, opts, _without_models(argv), done)
        finally:
            signal.signal(signal.SIGTERM, before)
        report.missing.update(missing)
    else:
        device, models = None, {}
        for name in names:

            def progress(dev, partial, stage, name=name):  # written after every measurement
                why = f"stopped after {stage}; the measurements after it are absent"
                interim = result_of(dev, {**models, name: partial}, {f"models.{name}": why})
                _save(interim, opts.part, opts.out)

            device, models[name] = run_model(name, opts, shapes, report, progress)
    if device is None:
        device = device_info(opts, report)
    result = result_of(device, models, {})
    if opts.part:
        _save(result, opts.part, opts.out)
    else:
        write(result, opts.out)
    return result


def _save(result: dict, part: str | None, out_dir: str) -> None:
    """The parent's part file (a child's run), else <device>.json and .md, atomically."""
    from mapfjax import files

    if part:
        files.atomic_write(part, json.dumps(result))
    else:
        write(result, out_dir, quiet=True, say=False)


def _without_models(argv):
    """argv without --models and its value (either form)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--models":
            skip = True
        elif not a.startswith("--models="):
            out.append(a)
    return out


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def write(result: dict, out_dir: str, quiet: bool = False, say: bool = True):
    """<device>.json and <device>.md under out_dir, each replaced atomically."""
    from mapfjax import files

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, device_slug(result["device"]["name"]))
    files.atomic_write(stem + ".json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    files.atomic_write(stem + ".md", markdown(result))
    if not quiet:
        print(markdown(result))
    if say:
        print(f"wrote {stem}.json and {stem}.md", flush=True)


def _fmt(x, spec=",.0f", scale=1.0):
    return "-" if x is None else format(x * scale, spec)


def markdown(result: dict) -> str:
    """The tables of a result, one section per measurement."""
    d = result["device"]
    lines = [
        f"# {d['name']} ({d['platform']} x {d['count']}), jax {d['jax']}, {d['date']}",
        "",
        f"Peaks used: {d['peak_source']}. Random-weight models, bf16 parameters and "
        f"activations; update: remat {result['settings']['remat']}, attention "
        f"{result['settings']['attention']}, {result['shapes']['accum']} micro-batches.",
        "",
        "| model | batch | prompt | new | steps/loop | prefill tok/s | decode tok/s | ms/step "
        "| ms/step vs 1 | roofline | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in result["models"].items():
        for r in m.get("sampling", []):
            lines.append(
                f"| {name} | {r['batch']} | {r['prompt_len']} | {r['new_tokens']} | "
                f"{r.get('steps_per_loop', 1)} | "
                f"{_fmt(r['prefill_tokens_per_s'])} | {_fmt(r['decode_tokens_per_s'])} | "
                f"{_fmt(r['decode_ms_per_step'], '.2f')} | "
                f"{_fmt(r.get('ms_per_step_vs_1'), '.2f')} | "
                f"{_fmt(r['roofline_fraction'], '.1%')} | {_fmt(r['compile_s'], '.1f')} |"
            )
    lines += ["", "| model | GRPO step | rollout s | update s | tok/s | MFU | compile s "
              "(rollout, update) | peak GiB | plan GiB | peak / plan |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, m in result["models"].items():
        g, mem = m.get("grpo"), m.get("memory", {})
        if g is None:
            continue
        lines.append(
            f"| {name} | {g['prompts']}x{g['group']}x{g['completion_len']} | "
            f"{_fmt(g['rollout_s'], '.2f')} | {_fmt(g['update_s'], '.2f')} | "
            f"{_fmt(g['tokens_per_s'])} | {_fmt(g['mfu'], '.1%')} | "
            f"{_fmt(g['compile_rollout_s'], '.1f')}, {_fmt(g['compile_update_s'], '.1f')} | "
            f"{_fmt(mem.get('peak_bytes'), '.2f', 2**-30)} | "
            f"{_fmt(mem.get('plan_step_bytes'), '.2f', 2**-30)} | "
            f"{_fmt(mem.get('peak_over_plan'), '.2f')} |"
        )
    attn = result["settings"]["attention"]
    lines += ["", f"bf16 ({attn} attention) against fp32 (einsum attention), and against bf16 "
              "with einsum attention (the fast path's own error; - when it is einsum):", "",
              "| model | vs fp32: max abs error | max abs logit | top-1 agreement "
              "| vs bf16 einsum: max abs error | top-1 agreement |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, m in result["models"].items():
        p = m.get("parity")
        if p is not None:
            lines.append(
                f"| {name} ({p['prompts']}x{p['tokens']}) | {p['max_abs_error']:.3g} | "
                f"{p['max_abs_logit']:.3g} | {p['top1_agreement']:.1%} | "
                f"{_fmt(p.get('attention_vs_einsum_max_abs_error'), '.3g')} | "
                f"{_fmt(p.get('attention_vs_einsum_top1_agreement'), '.1%')} |"
            )
    if any(m.get("profile") for m in result["models"].values()):
        lines += _decode_profile().markdown(result)
    if result["missing"]:
        lines += ["", "Not measured:", ""]
        lines += [f"- {k}: {v}" for k, v in result["missing"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
