r"""Which map transcription can a small model learn? SFT on the trace's header alone (the map in
each style of `projects.go_no_go.styles.STYLES`, then the agent lines), same model, data and
budget per style, greedy-checked on held-out puzzles as it trains. Appends one JSON line per
check to <out>/<style>.jsonl (a finished style is skipped on a rerun).

    python -m projects.trace_probe.trace_probe --styles holes,rows,grid --updates 600 \
        --out projects/trace_probe/results/probe
"""

import argparse
import json
import pathlib
import time

from mapfjax import hostalloc  # noqa: E402

if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # before JAX is imported: a restart costs only the lines above

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from mapfjax import configfile  # noqa: E402
from mapfjax.env import io, text, trace  # noqa: E402
from mapfjax.models import bpe, qwen3  # noqa: E402
from mapfjax.models import tokenizer as tok_lib  # noqa: E402
from mapfjax.rl import data, rollout  # noqa: E402
from mapfjax.rl.trainer import OptimConfig, Trainer  # noqa: E402
from projects.go_no_go import styles  # noqa: E402


def header(p, style):
    return f"{trace.THINK_OPEN}\n" + "\n".join(styles.render_header(p, style)) + "\n"


def examples(tok, problems, style):
    end = tok_lib.special_ids(tok).im_end
    prompts = data.encode_prompts(tok, problems, enable_thinking=True)
    ids = [
        tok(header(p, style) + trace.THINK_CLOSE, add_special_tokens=False)["input_ids"]
        for p in problems
    ]
    return [
        data.Example(p.id, tuple(x), (*y, end))
        for p, x, y in zip(problems, prompts, ids, strict=True)
    ]


def check(model, tok, held, style):
    cfg = rollout.SamplingConfig(200, 0.0, enable_thinking=True)
    texts = rollout.sample(model, tok, held, 1, cfg, None).texts
    hit = miss = extra = exact_map = exact_header = 0
    for p, t in zip(held, texts, strict=True):
        want = set(trace.hole_cells(p))
        lines = (trace.thinking_text(t + trace.THINK_CLOSE) or "").splitlines()
        got = styles.read_holes("\n".join(lines)) or set()
        hit, miss, extra = hit + len(got & want), miss + len(want - got), extra + len(got - want)
        exact_map += got == want
        exact_header += lines == styles.render_header(p, style)
    n = len(held)
    found = hit / max(1, hit + miss)
    return dict(map_exact=exact_map / n, header_exact=exact_header / n, holes_found=found,
                holes_spurious=extra, n=n)  # fmt: skip


def summary(out: pathlib.Path) -> None:
    """<out>/summary.md: one row per style and check, from the JSON lines."""
    from mapfjax import files, stats

    rows = [json.loads(x) for p in sorted(out.glob("*.jsonl")) for x in p.open()]
    pct = lambda x: f"{100 * x:.1f}"
    table = stats.markdown_table(
        ["style", "updates", "completion tokens", "map exact %", "header exact %",
         "holes found %", "spurious hole cells", "n"],
        [[r["style"], r["updates"], r["tokens"], pct(r["map_exact"]), pct(r["header_exact"]),
          pct(r["holes_found"]), r["holes_spurious"], r["n"]] for r in rows],
    )  # fmt: skip
    files.atomic_write(out / "summary.md", (table + "\n").encode())
    print(table)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--styles", default=",".join(styles.STYLES))
    ap.add_argument("--updates", type=int, default=600)
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--instances", type=int, default=12000)
    ap.add_argument("--held_out", default="projects/trace_probe/results/pilot/held_out.jsonl")
    ap.add_argument("--out", default="projects/trace_probe/results/probe")
    ap.add_argument("--workdir", default="runs/trace_probe", help="the tokenizer's files")
    ap.add_argument("--summary", action="store_true", help="only write <out>/summary.md")
    a = ap.parse_args()
    if a.summary:
        return summary(pathlib.Path(a.out))
    c = configfile.get_config("projects/go_no_go/configs/tiny_model.py", "trace")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    held = io.load_instances(a.held_out)
    problems, _ = io.held_out(
        data.generate_problems(c.sft.env, a.instances, c.seed + 1, 2, c.sft.hole_ratios),
        {io.puzzle_hash(p) for p in held},
    )
    texts = [text.render_prompt(p) + header(p, s) for p in problems[:2000] for s in styles.STYLES]
    built = bpe.build_tokenizer(texts, c.tokenizer.vocab_size, coordinates=True)
    tok = tok_lib.load_tokenizer(bpe.save_tokenizer(pathlib.Path(a.workdir) / "tokenizer", built))
    pad = tok_lib.special_ids(tok).pad
    for style in a.styles.split(","):
        path = out / f"{style}.jsonl"
        if path.exists() and any(json.loads(x)["updates"] == a.updates for x in path.open()):
            continue
        path.unlink(missing_ok=True)
        ex = examples(tok, problems, style)
        model = qwen3.Qwen3(qwen3.Qwen3Config(vocab_size=len(tok), **c.model), dtype=jnp.float32,
                            param_dtype=jnp.float32, rngs=nnx.Rngs(c.seed))  # fmt: skip
        warm = dict(warmup_steps=min(c.sft.optim.warmup_steps, a.updates // 4))
        sft = Trainer(
            model,
            OptimConfig(**c.sft.optim.to_dict() | warm, total_steps=a.updates),
            "sft",
            seed=c.seed,
        )
        t0, tokens = time.time(), sum(len(e.completion) for e in ex) / len(ex)
        for u, batch in enumerate(data.sft_batches(ex, c.sft.batch_size, pad, c.seed, None), 1):
            loss = sft.step(batch)["loss"]
            if u % a.every == 0 or u == a.updates:
                row = dict(style=style, updates=u, loss=round(float(loss), 4),
                           s=round(time.time() - t0), tokens=round(tokens, 1))  # fmt: skip
                row |= check(sft.model(), tok, held, style)
                print(json.dumps(row), flush=True)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            if u == a.updates:
                break


if __name__ == "__main__":
    main()
