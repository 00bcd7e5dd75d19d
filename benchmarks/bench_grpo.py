r"""One GRPO step (rollout + update) on the shipped tiny model (or `--model`, a trace policy with
`--thinking`), measured in one run for: mapfjax
with shared prompts and length-aware shapes (the default), mapfjax with one prompt per row and
completions padded to the budget (the layout before prefix sharing), and the same step written
plainly in PyTorch (transformers' sampling `generate` on the 128 rows, then one padded
forward/backward and AdamW on the same weights and puzzles). Optionally google-tunix's GRPO
learner on a random model of the same shape and batch (`--tunix`, in its own virtualenv).

    python benchmarks/bench_grpo.py [--prompts 16 --group 8 --new-tokens 64 --steps 3]
    python benchmarks/bench_grpo.py --model runs/tiny_trace_grid/export_1000 --thinking \
        --prompts 8 --new-tokens 640 --steps 2 [--length-split 2]
    python benchmarks/bench_grpo.py --tunix --tunix-venv /tmp/tunix-venv
    python benchmarks/bench_grpo.py --update-cuts 2:1:4,16:2:1 [--prompts 32 --batches 2]

`--update-cuts` times only the update, on a random model of the trace policies' shape, of
batches of `--prompts` groups x `--group` traces whose lengths are those of a trace policy's
held-out answers (`--lengths-from`, a `validation.json`; per row x N(1, 0.12), and `--wander`
of the rows at the 640-token budget), cut as `parts:group_split:accum_steps` each
(`OptimConfig.length_split`, `group_split`, `accum_steps`); every cut runs the same batches
once to compile, then once timed. `--out-of-loss F` clears the loss mask of a share F of each
batch's groups (dynamic sampling's padding groups) and times each cut also with every part
run, the parts out of the loss included (how updates ran before those parts were skipped):

    python benchmarks/bench_grpo.py --update-cuts 16:2:1 --prompts 32 --out-of-loss 0.5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--prompts", type=int, default=16)
ARGS.add_argument("--group", type=int, default=8)
ARGS.add_argument("--new-tokens", type=int, default=64)
ARGS.add_argument("--sizes", default="3-6", help="map sizes of the puzzles, e.g. 3-6")
ARGS.add_argument("--steps", type=int, default=3, help="timed steps per side after a warm-up")
ARGS.add_argument("--model", default="", help="model directory (default: the shipped tiny)")
ARGS.add_argument("--thinking", action="store_true", help="the policy writes a trace first")
ARGS.add_argument("--skip-torch", action="store_true")
ARGS.add_argument(
    "--length-split", type=int, default=1,
    help="also time mapfjax with OptimConfig.length_split = this (> 1): the update in parts "
    "of groups sorted by length, each padded to its own longest completion",
)  # fmt: skip
ARGS.add_argument(
    "--skip-unshared", action="store_true", help="leave out the one-prompt-per-row path"
)
ARGS.add_argument(
    "--update-cuts", default="",
    help="time only the update, cut each of these ways (parts:group_split:accum_steps, comma "
    "separated; the first is the reference)",
)  # fmt: skip
ARGS.add_argument("--batches", type=int, default=2, help="batches per cut (--update-cuts)")
ARGS.add_argument(
    "--lengths-from",
    default="projects/go_no_go/results/trace_wait_step_g32_lr1e-4/matched/round_0/validation.json",
    help="a validation.json whose rows' response_tokens the traces' lengths are drawn from",
)
ARGS.add_argument("--wander", type=float, default=0.06, help="share of rows at the budget")
ARGS.add_argument(
    "--out-of-loss", type=float, default=0.0,
    help="share of each batch's groups with no token in the loss (--update-cuts)",
)  # fmt: skip
ARGS.add_argument("--tunix", action="store_true", help="also time google-tunix's GRPO step")
ARGS.add_argument("--tunix-venv", default="~/.cache/mapfjax/tunix-venv")


def puzzles(opts):
    import jax

    from mapfjax import env

    lo, hi = (int(x) for x in opts.sizes.split("-"))
    cfg = env.default_config(num_agents=2, sizes=range(lo, hi + 1), hole_ratio=0.2)
    return list(env.generate(jax.random.key(0), cfg, opts.prompts).problems)


def time_mapfjax(opts, model, tok, problems, shared: bool, length_split: int = 1) -> dict:
    """Seconds per rollout and per update (best of opts.steps after a warm-up step)."""
    import jax

    from mapfjax.env import RewardConfig
    from mapfjax.rl import grpo, rollout
    from mapfjax.rl.step import split_by_length
    from mapfjax.rl.trainer import OptimConfig, Trainer

    g = opts.group
    loss_cfg = grpo.GRPOConfig(group_size=g)
    optim = OptimConfig(lr=1e-5, total_steps=100, length_split=length_split)
    trainer = Trainer(model, optim, "grpo", loss_cfg=loss_cfg)
    if shared:
        sampling = rollout.SamplingConfig(
            max_new_tokens=opts.new_tokens, enable_thinking=opts.thinking
        )
        repeats, per_row = g, problems
    else:  # one prompt per row: G copies prefilled, rows padded to the budget
        sampling = rollout.SamplingConfig(
            max_new_tokens=opts.new_tokens,
            bucket="x64",
            completion_bucket="exact",
            shared_prefix=False,
            enable_thinking=opts.thinking,
        )
        repeats, per_row = g, problems
    times = {"rollout": [], "update": []}
    tokens = 0
    for step in range(opts.steps + 1):
        key = jax.random.fold_in(jax.random.key(1), step)
        t0 = time.perf_counter()
        if shared:
            batch, stats = rollout.rollout(
                trainer, tok, per_row, repeats, sampling, RewardConfig(), key, grpo_cfg=loss_cfg
            )
        else:
            batch, stats = _unshared_rollout(trainer, tok, per_row, repeats, sampling, key)
        t1 = time.perf_counter()
        trainer.step(batch)
        t2 = time.perf_counter()
        if step:
            times["rollout"].append(t1 - t0)
            times["update"].append(t2 - t1)
        tokens = sum(map(_tokens_processed, split_by_length(batch, length_split)))
    out = {k: min(v) for k, v in times.items()}
    out.update(tokens=tokens, mean_len=stats.response_len_mean)
    return out


def _unshared_rollout(trainer, tok, problems, g, sampling, key):
    """The rollout with every row carrying its own prompt (prefilled G times), the update's
    completion columns padded to max_new_tokens."""
    import numpy as np

    from mapfjax.env import RewardConfig
    from mapfjax.models import tokenizer as tok_lib
    from mapfjax.rl import grpo, rollout
    from mapfjax.rl.batch import make_batch

    model = rollout.policy_model(trainer)
    rows = [p for p in problems for _ in range(g)]
    prompts, out, completions, texts = rollout.sample(model, tok, rows, 1, sampling, key)
    _, rew = rollout.score(rows, 1, texts, RewardConfig())
    adv = np.asarray(grpo.group_advantages(rew, g))
    n = len(completions)
    batch = make_batch(
        prompts, completions, tok_lib.special_ids(tok).pad, "x64", sampling.max_new_tokens,
        np.asarray(out.logprobs_full)[:n], adv, shared_prefix=False,
    )  # fmt: skip
    lengths = [len(c) for c in completions]
    return batch, type("S", (), {"response_len_mean": float(np.mean(lengths))})()


def _tokens_processed(batch) -> int:
    """Token positions the update's forward pass runs (padding included)."""
    import numpy as np

    from mapfjax.rl.batch import GroupBatch

    if isinstance(batch, GroupBatch):
        return int(np.prod(np.shape(batch.prompt_tokens)) + np.prod(np.shape(batch.tokens)))
    return int(np.prod(np.shape(batch.tokens)))


def time_torch(opts, path, tok, problems) -> dict:
    """The plain PyTorch step on the same weights: sampled generate for the G x prompts rows
    (left-padded), then one padded forward/backward of [prompt | completion] and AdamW."""
    import torch
    import transformers

    from mapfjax.models import tokenizer as tok_lib
    from mapfjax.rl.data import encode_prompts

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok_lib.special_ids(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prompts = encode_prompts(tok, problems, opts.thinking)
    prompts = [p for p in prompts for _ in range(opts.group)]
    width = max(map(len, prompts))
    inp = torch.tensor([[ids.pad] * (width - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    times = {"rollout": [], "update": []}
    for step in range(opts.steps + 1):
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            out = model.generate(
                inp, attention_mask=att, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=opts.new_tokens, eos_token_id=[ids.im_end, ids.pad],
                pad_token_id=ids.pad,
            )  # fmt: skip
        t1 = time.perf_counter()
        model.train()
        comp = out[:, width:]
        done = (comp == ids.im_end) | (comp == ids.pad)
        lengths = torch.where(done.any(1), done.int().argmax(1) + 1, comp.shape[1])
        loss_mask = torch.arange(comp.shape[1])[None] < lengths[:, None]
        full_mask = torch.cat([att, loss_mask.long()], 1)
        logits = model(input_ids=out, attention_mask=full_mask).logits[:, width - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, comp[..., None])[..., 0]
        adv = torch.randn(len(prompts))
        ratio = torch.exp(logp - logp.detach())
        loss = -(ratio * adv[:, None])[loss_mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        if step:
            times["rollout"].append(t1 - t0)
            times["update"].append(t2 - t1)
    res = {k: min(v) for k, v in times.items()}
    res.update(tokens=int(out.numel()), mean_len=float(lengths.float().mean()))
    return res


def trace_batches(opts, n: int, budget: int = 640, prompt_len: int = 200, vocab: int = 1024):
    """`n` GroupBatches of opts.prompts groups x opts.group random tokens whose completion
    lengths follow a trace policy's held-out answers (see --lengths-from)."""
    import json
    import pathlib

    import numpy as np

    from mapfjax.rl.batch import GroupBatch

    rows = json.loads(pathlib.Path(opts.lengths_from).read_text())["rows"]
    lengths = np.array([r["response_tokens"] for r in rows if not r["truncated"]])
    rng = np.random.default_rng(0)
    g, b = opts.group, opts.prompts
    out = []
    for _ in range(n):
        base = rng.choice(lengths, b)[:, None] * rng.normal(1.0, 0.12, (b, g))
        lens = np.where(rng.random((b, g)) < opts.wander, budget, np.clip(base, 20, budget))
        mask = np.arange(budget) < lens.astype(int)[..., None]
        in_loss = np.arange(b) >= round(opts.out_of_loss * b)  # the padding groups first
        out.append(
            GroupBatch(
                prompt_tokens=rng.integers(8, vocab, (b, prompt_len)).astype(np.int32),
                prompt_mask=np.ones((b, prompt_len), bool),
                tokens=rng.integers(8, vocab, (b, g, budget)).astype(np.int32),
                attention_mask=mask,
                loss_mask=mask & in_loss[:, None, None],
                old_logprobs=np.zeros((b, g, budget), np.float32),
                advantages=rng.standard_normal((b, g)).astype(np.float32),
            )  # fmt: skip
        )
    return out


def time_update_cuts(opts) -> None:
    """Seconds of the update of the same trace-shaped batches per cut (--update-cuts)."""
    import jax

    from benchmarks.bench_sampler import trace_shaped_model
    from mapfjax.rl import grpo
    from mapfjax.rl.trainer import OptimConfig, Trainer

    cuts = [tuple(int(x) for x in c.split(":")) for c in opts.update_cuts.split(",")]
    batches = trace_batches(opts, opts.batches)
    mean = sum(float(b.loss_mask.sum(-1).mean()) for b in batches) / len(batches)
    print(
        f"GRPO update of {opts.batches} batches of {opts.prompts} groups x {opts.group} traces "
        f"(mean {mean:.0f} "
        f"tokens, {opts.wander:.0%} at the budget), random 6-layer width-128 model, fp32, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s); compiled, then timed once"
    )  # fmt: skip
    if opts.out_of_loss:
        print(f"{opts.out_of_loss:.0%} of each batch's groups out of the loss")
    print(
        "| parts : group_split : accum_steps | parts out of the loss | update s | "
        "tokens in update | vs the first |"
    )
    print("|---|---|---|---|---|")
    first = None
    for (parts, k, accum), every in [
        (cut, every) for cut in cuts for every in ((True, False) if opts.out_of_loss else (False,))
    ]:
        optim = OptimConfig(
            lr=1e-5, total_steps=100, accum_steps=accum, length_split=parts, group_split=k
        )
        trainer = Trainer(trace_shaped_model(), optim, "grpo", loss_cfg=grpo.GRPOConfig())
        if every:
            trainer._runnable = lambda parts: parts  # as before they were skipped
        for b in batches:  # compiles every width these batches need
            trainer.step(b)
        t0 = time.perf_counter()
        for b in batches:
            trainer.step(b)
        secs = time.perf_counter() - t0
        first = first or secs
        run = [p for b in batches for p in trainer._prepare(b) if p is not None]
        tokens = sum(map(_tokens_processed, run))
        cut = f"{parts} : {k} : {accum} | {'run' if every else 'skipped'}"
        print(f"| {cut} | {secs:.1f} | {tokens:,} | {first / secs:.2f}x |")


def main(argv=None):
    opts = ARGS.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if opts.update_cuts:
        return time_update_cuts(opts)
    import jax
    import jax.numpy as jnp

    from mapfjax.models import hf
    from mapfjax.models import tokenizer as tok_lib

    path = opts.model or os.path.join(os.path.dirname(__file__), "..", "mapfjax", "assets", "tiny")
    label = opts.model or "the shipped tiny model"
    tok = tok_lib.load_tokenizer(path)
    problems = puzzles(opts)
    rows = opts.prompts * opts.group
    print(
        f"GRPO step on {label}{' (thinking)' if opts.thinking else ''}: "
        f"{opts.prompts} puzzles ({opts.sizes}) x "
        f"{opts.group} samples, {opts.new_tokens} new tokens, fp32, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s); best of {opts.steps}"
    )
    paths = [("mapfjax", True, 1)]
    if opts.length_split > 1:
        paths.append(
            (f"mapfjax, update in {opts.length_split} parts by length", True, opts.length_split)
        )
    if not opts.skip_unshared:
        paths.append(("mapfjax, one prompt per row", False, 1))
    results = {}
    for name, shared, split in paths:
        model = hf.from_pretrained(path, dtype=jnp.float32)
        results[name] = time_mapfjax(opts, model, tok, problems, shared, split)
    if not opts.skip_torch:
        results["PyTorch (transformers)"] = time_torch(opts, path, tok, problems)
    ref = results.get("PyTorch (transformers)")
    print(
        "| path | rollout s | update s | step s | samples/s | mean completion | "
        "new tokens/s | tokens in update | vs PyTorch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        step = r["rollout"] + r["update"]
        ratio = f"{(ref['rollout'] + ref['update']) / step:.2f}x" if ref else "-"
        print(
            f"| {name} | {r['rollout']:.2f} | {r['update']:.2f} | {step:.2f} | "
            f"{rows / step:.1f} | {r['mean_len']:.0f} | {rows * r['mean_len'] / step:.0f} | "
            f"{r['tokens']:,} | {ratio} |"
        )
    if opts.tunix:
        from benchmarks import tunix_grpo

        ours = results["mapfjax"]
        tunix_grpo.compare(opts, ours)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    main()
