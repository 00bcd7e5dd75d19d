"""Greedy decode throughput of `mapfjax.models.sampler.generate` against transformers'
`generate` on the same checkpoint, measured in one run: a random tiny Qwen3 (hidden 128, 4
layers, vocab 2048, fp32) and the shipped tiny model, batch 1 and 64, several lengths; also
the time per decode step at each length (it should stay flat as the cache fills).
`--schedules` instead times sampled decoding at a GRPO rollout's shape (32 prompts of 200
tokens x 8 samples, temperature 1, 640 new tokens, compaction on, a random model of the trace
policy's shape whose rows stop at random) under cache-window schedules: the sampler's doubling
(the reference) against windows growing by a fixed number of slots, and with
`--fused-windows` for each value of `qwen3.CPU_FUSED_WINDOW`, with `--merged-prefix` for
each value of `qwen3.CPU_MERGED_PREFIX` and with `--cpu-kernel` for each value of
`qwen3.CPU_DECODE_KERNEL` (1 or 0; the first given is the reference).

    python benchmarks/bench_sampler.py [--lengths 64,256,1024 --batches 1,64 --repeats 2]
    python benchmarks/bench_sampler.py --schedules double,128,64 [--repeats 3]
    python benchmarks/bench_sampler.py --schedules double --fused-windows 256,1
    python benchmarks/bench_sampler.py --schedules double --merged-prefix 0,1 --repeats 3
    python benchmarks/bench_sampler.py --schedules double --cpu-kernel 0,1 --repeats 3
    python benchmarks/bench_sampler.py --cpu-kernel 0,1 --batches 64 --lengths 64,256
    python benchmarks/bench_sampler.py --attention-bound --batches 64 --lengths 64,256

`--attention-bound` adds a row per shape with the decode steps' attention removed (each layer
passes its queries through; tokens differ): the ratio no attention kernel can exceed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

# Local imports below: sys.path must hold the repository first when run as a script.


def make_checkpoint(path: str, seed: int = 0):
    """A random Qwen3 (hidden 128, 4 layers, 4 query / 2 KV heads, vocab 2048) saved to
    `path` (a context long enough for 1,024 new tokens); returns transformers' model."""
    import torch
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


def _best(run, repeats: int) -> tuple[float, float, object]:
    """(seconds of the first call, compile included; best of `repeats` later calls; output)."""
    t0 = time.perf_counter()
    out = run()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    return first, best, out


def time_ours(model, prompts, n, repeats):
    import jax
    import numpy as np

    from mapfjax.models import sampler

    def run():
        out = sampler.generate(model, prompts, n, stop_tokens=())
        return np.asarray(jax.block_until_ready(out).tokens)

    return _best(run, repeats)


def time_theirs(model, prompts, n, repeats):
    import torch

    ids = torch.tensor(prompts)
    kw = dict(
        attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
        min_new_tokens=n, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip

    def run():
        with torch.no_grad():
            return model.generate(ids, **kw)[:, ids.shape[1] :].numpy()

    return _best(run, repeats)


def _linear_windows(step: int):
    """A `sampler._windows` replacement: the first window, then `step` more slots each time."""

    def windows(max_new_tokens: int, first: int) -> list[int]:
        need = max(1, max_new_tokens - 1)
        out = [min(need, first)]
        while out[-1] < need:
            out.append(min(need, out[-1] + step))
        return out

    return windows


def trace_shaped_model(vocab_size: int = 1024):
    """A random fp32 Qwen3 of the trace policies' shape (6 layers, width 128)."""
    import jax.numpy as jnp

    from mapfjax.models.qwen3 import Qwen3, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_layers=6,
        num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e4, max_position_embeddings=1024,
    )  # fmt: skip
    return Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32)


def time_schedules(
    names: list[str], repeats: int, fused=(None,), merged=(None,), groups=32, group_size=8,
    new=640, kernel=(None,),
) -> None:  # fmt: skip
    """Decode seconds of one rollout-shaped `generate` call per window schedule ("double" or
    a step in slots), `qwen3.CPU_FUSED_WINDOW` value in `fused`, `qwen3.CPU_MERGED_PREFIX`
    value in `merged` and `qwen3.CPU_DECODE_KERNEL` value in `kernel` (None: as it is), the
    variants alternating within each repeat; prints the best of `repeats` warm calls, its
    ratio to the first variant and whether the tokens equal its."""
    import jax
    import numpy as np

    from mapfjax.models import qwen3, sampler

    model = trace_shaped_model()
    prompts = np.random.default_rng(0).integers(8, 1024, (groups, 200)).tolist()
    doubling = sampler._windows
    # Three stop tokens of 1,024: a row stops after ~340 tokens on average, some at the budget.
    kw = dict(temperature=1.0, key=jax.random.key(1), num_samples=group_size,
              stop_tokens=(5, 6, 7), compact=True)  # fmt: skip

    threshold, merge, compiled = (
        qwen3.CPU_FUSED_WINDOW,
        qwen3.CPU_MERGED_PREFIX,
        qwen3.CPU_DECODE_KERNEL,
    )
    variants = [(name, f, m, c) for c in kernel for m in merged for f in fused for name in names]

    def run(variant):
        name, f, m, c = variant
        sampler._windows = doubling if name == "double" else _linear_windows(int(name))
        qwen3.CPU_FUSED_WINDOW = threshold if f is None else f
        qwen3.CPU_MERGED_PREFIX = merge if m is None else m
        qwen3.CPU_DECODE_KERNEL = compiled if c is None else c
        sampler._decode.clear_cache()  # both are read when the loop is traced
        t = {}
        try:
            sampler.generate(model, prompts, new, **kw)  # compiles
            out = sampler.generate(model, prompts, new, timings=t, **kw)
        finally:
            sampler._windows, qwen3.CPU_FUSED_WINDOW = doubling, threshold
            qwen3.CPU_MERGED_PREFIX, qwen3.CPU_DECODE_KERNEL = merge, compiled
        return t["decode_s"], np.asarray(out.tokens), np.asarray(out.lengths)

    best, tokens = {}, {}
    for _ in range(repeats):
        for variant in variants:
            seconds, tokens[variant], lengths = run(variant)
            best[variant] = min(best.get(variant, float("inf")), seconds)
    print(
        f"{groups} prompts x {group_size} samples, {new} new tokens; completions: mean "
        f"{lengths.mean():.0f}, {np.mean(lengths >= new):.0%} at the budget; best of {repeats}"
    )
    print("| windows | fused from | merged prefix | kernel | decode s | vs first | "
          "ms per generated token | same tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    ref = best[variants[0]]
    for variant in variants:
        name, f, m, c = variant
        label = "doubling" if name == "double" else f"+{name} slots"
        same = np.array_equal(tokens[variant], tokens[variants[0]])
        print(f"| {label} | {threshold if f is None else f} | {merge if m is None else m} | "
              f"{compiled if c is None else c} | {best[variant]:.1f} | "
              f"{ref / best[variant]:.2f}x | {1e3 * best[variant] / lengths.sum():.2f} | "
              f"{same} |", flush=True)  # fmt: skip


@contextlib.contextmanager
def _decode_variant(variant):
    """Decode steps with `qwen3.CPU_DECODE_KERNEL = variant` (a bool), or with attention
    removed ("no attention": the XLA path's attention returns its queries)."""
    from mapfjax.models import qwen3, sampler

    saved = qwen3.CPU_DECODE_KERNEL, qwen3._decode_attend
    if variant == "no attention":
        qwen3.CPU_DECODE_KERNEL = False
        qwen3._decode_attend = lambda q, prefix, own, allowed: q
    else:
        qwen3.CPU_DECODE_KERNEL = bool(variant)
    sampler._decode.clear_cache()  # both are read when the loop is traced
    try:
        yield
    finally:
        qwen3.CPU_DECODE_KERNEL, qwen3._decode_attend = saved
        sampler._decode.clear_cache()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--lengths", default="64,256,1024", help="new tokens, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="warm runs; the best is kept")
    parser.add_argument("--models", default="random,shipped")
    parser.add_argument("--schedules", default="", help='e.g. "double,128,64" (see above)')
    parser.add_argument(
        "--fused-windows", default="", help="with --schedules: CPU_FUSED_WINDOW values, e.g. 256,1"
    )
    parser.add_argument(
        "--merged-prefix", default="", help="with --schedules: CPU_MERGED_PREFIX values, e.g. 0,1"
    )
    parser.add_argument(
        "--cpu-kernel", default="", help="qwen3.CPU_DECODE_KERNEL values, e.g. 0,1 (see above)"
    )
    parser.add_argument(
        "--attention-bound", action="store_true",
        help="also time decoding with attention removed (an upper bound; see above)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    kernel = [c.strip() for c in args.cpu_kernel.split(",") if c.strip()]
    if not all(c in ("0", "1") for c in kernel):
        parser.error(f"--cpu-kernel: {args.cpu_kernel!r}; allowed: 0 and 1")
    kernel = [c == "1" for c in kernel] or [None]
    if args.schedules:
        for name in args.schedules.split(","):
            if name != "double" and not (name.isdigit() and int(name) > 0):
                parser.error(f"--schedules: {name!r}; allowed: double or a slot step >= 1")
        fused = [f.strip() for f in args.fused_windows.split(",") if f.strip()]
        if not all(f.isdigit() and int(f) >= 1 for f in fused):
            parser.error(f"--fused-windows: {args.fused_windows!r}; allowed: ints >= 1")
        fused = [int(f) for f in fused] or [None]
        merged = [m.strip() for m in args.merged_prefix.split(",") if m.strip()]
        if not all(m in ("0", "1") for m in merged):
            parser.error(f"--merged-prefix: {args.merged_prefix!r}; allowed: 0 and 1")
        merged = [m == "1" for m in merged] or [None]
        time_schedules(args.schedules.split(","), args.repeats, fused, merged, kernel=kernel)
        return
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from mapfjax.models import qwen3
    from mapfjax.models.hf import from_pretrained

    shipped = os.path.join(os.path.dirname(__file__), "..", "mapfjax", "assets", "tiny")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}")
    print(f"{args.prompt_len}-token prompts, greedy, fp32; best of {args.repeats} warm runs")
    print("| model | kernel | batch | new tokens | mapfjax tok/s | transformers tok/s | ratio | "
          "mapfjax ms/step | same tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    compiled = qwen3.CPU_DECODE_KERNEL
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "random":
                theirs, path = make_checkpoint(tmp), tmp
            else:
                path = shipped
                theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
            ours = from_pretrained(path, dtype=jnp.float32)
            vocab = ours.config.vocab_size
            for batch in (int(b) for b in args.batches.split(",")):
                for n in (int(x) for x in args.lengths.split(",")):
                    if args.prompt_len + n > ours.config.max_position_embeddings:
                        continue
                    prompts = rng.integers(3, vocab, (batch, args.prompt_len)).tolist()
                    _, t_best, t_tok = time_theirs(theirs, prompts, n, args.repeats)
                    rows = kernel + (["no attention"] if args.attention_bound else [])
                    for c in rows:  # each value of qwen3.CPU_DECODE_KERNEL against one run
                        label = c if isinstance(c, str) else int(compiled if c is None else c)
                        with _decode_variant(compiled if c is None else c):
                            _, o_best, o_tok = time_ours(ours, prompts, n, args.repeats)
                        same = int((o_tok == t_tok).all(axis=1).sum())
                        print(
                            f"| {name} | {label} | {batch} | {n} | "
                            f"{batch * n / o_best:,.0f} | {batch * n / t_best:,.0f} | "
                            f"{t_best / o_best:.1f}x | {1e3 * o_best / n:.2f} | {same}/{batch} |",
                            flush=True,
                        )


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    main()
