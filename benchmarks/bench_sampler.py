"""Greedy decode throughput of `mapfjax.models.sampler.generate` vs transformers' `generate`
on one random tiny Qwen3 checkpoint (fp32, CPU). Run: python benchmarks/bench_sampler.py
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from mapfjax.models import sampler
from mapfjax.models.hf import from_pretrained


def make_checkpoint(path: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A random Qwen3 (hidden 256, 4 layers, vocab 4096) saved to `path`; returns it."""
    config = transformers.Qwen3Config(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
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


def time_ours(model, prompts, new_tokens, repeats):
    """(seconds of the first call incl. compile, best seconds of `repeats` warm calls, tokens)."""

    def run():
        out = sampler.generate(model, prompts, new_tokens, stop_tokens=())
        return jax.block_until_ready(out)

    first, best, out = _time(run, repeats)
    return first, best, np.asarray(out.tokens)


def time_theirs(model, prompts, new_tokens, repeats):
    """As `time_ours` for transformers' greedy generate (prompts share one length)."""
    ids = torch.tensor(prompts)
    kw = dict(
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )

    def run():
        with torch.no_grad():
            return model.generate(ids, **kw)[:, ids.shape[1] :].numpy()

    return _time(run, repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs; the best is kept")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as path:
        theirs = make_checkpoint(path)
        ours = from_pretrained(path, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}")
    print(f"{args.prompt_len}-token prompts, {args.new_tokens} greedy new tokens, fp32")
    header = (
        f"{'batch':>5} | {'ours tok/s':>11} | {'HF tok/s':>10} | {'ours/HF':>7} | "
        f"{'ours 1st call s':>15} | {'HF 1st call s':>13} | same tokens"
    )
    print(header)
    print("-" * len(header))
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = rng.integers(0, 4096, (batch, args.prompt_len)).tolist()
        o_first, o_best, o_tok = time_ours(ours, prompts, args.new_tokens, args.repeats)
        t_first, t_best, t_tok = time_theirs(theirs, prompts, args.new_tokens, args.repeats)
        n = batch * args.new_tokens
        same = int((o_tok == t_tok).all(axis=1).sum())
        print(
            f"{batch:>5} | {n / o_best:>11.0f} | {n / t_best:>10.0f} | "
            f"{t_best / o_best:>6.1f}x | {o_first:>15.2f} | {t_first:>13.2f} | {same}/{batch} rows"
        )


def _time(run, repeats):
    """(seconds of the first call, including compilation; best of `repeats` later calls; the
    last output)."""
    t0 = time.perf_counter()
    out = run()
    first = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    return first, best, out


if __name__ == "__main__":
    main()
