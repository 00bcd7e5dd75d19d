r"""Does a policy's state, where it starts to answer, say whether the puzzle needs a wait? A
linear probe per model and layer (`projects.wait_probe.probe`), fitted on fresh puzzles drawn
like the held-out set and scored by AUC on the held-out set, every model on the same bootstrap
draws.

    python -m projects.wait_probe.probe_wait \\
        --models random:mapfjax/assets/tiny,shipped:mapfjax/assets/tiny \\
        --test projects/main_job/results/held_out_1200/held_out_1200.jsonl \\
        --out projects/wait_probe/results

A model named `random` is the checkpoint's shape with fresh random weights. Writes
<out>/probe.json and <out>/probe.md; each model's features are kept in
<cache>/<label>.npz (default runs/wait_probe) so that a rerun only computes what is new.
"""

import argparse
import json
import pathlib
import sys

import numpy as np

from mapfjax import configfile, files, hostalloc, stats  # noqa: E402
from mapfjax.engineer.settings import ValidationSettings  # noqa: E402
from mapfjax.env import io  # noqa: E402
from mapfjax.rl import data  # noqa: E402
from projects.wait_probe import probe  # noqa: E402


def parse_models(text: str) -> list[tuple[str, str]]:
    out = []
    for item in filter(None, text.split(",")):
        label, sep, path = item.partition(":")
        if not sep or not label or not path:
            raise SystemExit(f"--models: {item!r}; allowed: label:checkpoint_dir, comma-separated")
        out.append((label, path))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"--models: repeated labels in {labels}")
    return out


def fit_set(n: int, seed: int, test) -> list:
    """`n` puzzles drawn like the main job's held-out set from `seed`, those in `test` left out."""
    v = ValidationSettings.from_config(configfile.get_config("configs/tiny_cpu.py", ""))
    drawn = data.generate_problems(v.generator_config(), n, seed, 2, v.hole_ratios)
    return io.held_out(drawn, {io.puzzle_hash(p) for p in test})[0]


def load_model(label: str, path: str):
    import jax.numpy as jnp
    from flax import nnx

    from mapfjax.models import hf, qwen3

    model = hf.from_pretrained(path, dtype=jnp.float32)
    if label == "random":
        return qwen3.Qwen3(model.config, dtype=jnp.float32, param_dtype=jnp.float32,
                           rngs=nnx.Rngs(0))  # fmt: skip
    return model


def features(label, path, problems, layers, cache: pathlib.Path, tokenizer) -> dict:
    """{layer: [N, 2H]} for the fit + test puzzles, read from `cache` when it holds them."""
    ids = [p.id for p in problems]
    if cache.exists():
        with np.load(cache) as kept:
            if list(kept["ids"]) == ids and all(f"layer{k}" in kept for k in layers):
                return {k: kept[f"layer{k}"] for k in layers}
    feats = probe.prompt_features(load_model(label, path), tokenizer, problems, layers)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, ids=np.array(ids), **{f"layer{k}": feats[k] for k in layers})
    tmp.replace(cache)
    return feats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="label:checkpoint_dir,...")
    ap.add_argument("--test", required=True, help="labelled held-out puzzles (JSON lines)")
    ap.add_argument("--reference", default="shipped", help="the model others are compared with")
    ap.add_argument("--fit_n", type=int, default=2000)
    ap.add_argument("--fit_seed", type=int, default=20001)
    ap.add_argument("--layers", default="6,12")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--probe", choices=sorted(probe.PROBES), default="logistic",
                    help="logistic regression, or a one-hidden-layer ReLU network")  # fmt: skip
    ap.add_argument("--fit_limit", type=int, default=0,
                    help="fit on the first N fitting puzzles only (0: all)")  # fmt: skip
    ap.add_argument("--name", default="probe", help="output file stem: <out>/<name>.md, .json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="runs/wait_probe", help="feature files (not results)")
    args = ap.parse_args()
    from mapfjax import parallel

    parallel.enable_compilation_cache()
    from mapfjax.models import tokenizer as tok_lib

    models = parse_models(args.models)
    if args.reference not in [label for label, _ in models]:
        raise SystemExit(f"--reference {args.reference!r} is not one of the --models labels")
    layers = [int(x) for x in args.layers.split(",")]
    out = pathlib.Path(args.out)
    test = io.require_instances(args.test)
    missing = [p.id for p in test if p.needs_wait is None]
    if missing:
        raise SystemExit(f"{args.test}: {len(missing)} puzzles lack needs_wait, e.g. {missing[0]}")
    fit = fit_set(args.fit_n, args.fit_seed, test)
    y_fit = np.array([p.needs_wait for p in fit], bool)
    y_test = np.array([p.needs_wait for p in test], bool)
    print(f"fit: {len(fit)} puzzles ({y_fit.mean():.1%} need a wait); "
          f"test: {len(test)} ({y_test.mean():.1%})", flush=True)  # fmt: skip
    fit_probe, grid = probe.PROBES[args.probe]
    used = min(args.fit_limit or len(fit), len(fit))
    tokenizer = tok_lib.load_tokenizer(models[0][1])
    rows, record = [], {"probe": args.probe, "fit_n": used, "fit_seed": args.fit_seed,
                        "test": args.test,
                        "test_n": len(test), "layers": layers, "models": {}}  # fmt: skip
    feats_of = {
        label: features(
            label, path, fit + test, layers, pathlib.Path(args.cache) / f"{label}.npz", tokenizer
        )  # fmt: skip
        for label, path in models
    }
    for layer in layers:
        scores, chosen, acc = {}, {}, {}
        for label, _ in models:
            feats = feats_of[label][layer]
            x_fit, x_test = feats[:used], feats[len(fit) :]
            l2 = probe.choose_l2(x_fit, y_fit[:used], grid, fit=fit_probe)
            fitted = fit_probe(x_fit, y_fit[:used], l2)
            scores[label] = fitted.scores(x_test)
            chosen[label], acc[label] = l2, float(np.mean((scores[label] > 0) == y_test))
            print(f"layer {layer} {label}: AUC {stats.auc(scores[label], y_test):.3f}", flush=True)
        boot = probe.bootstrap_aucs(scores, y_test, args.reference, args.resamples)
        for label, _ in models:
            auc, diff = boot[label]
            record["models"].setdefault(label, {})[f"layer{layer}"] = {
                "auc": auc.as_dict(), "accuracy": acc[label], "l2": chosen[label],
                "minus_reference": None if diff is None else diff.as_dict(),
            }  # fmt: skip
            rows.append([
                label, layer, f"{auc.value:.3f} [{auc.low:.3f}, {auc.high:.3f}]",
                f"{acc[label]:.1%}",
                "-" if diff is None else f"{diff.value:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]",
                f"{chosen[label]:g}",
            ])  # fmt: skip
    header = ["model", "layers", "AUC [95 %]", "accuracy", f"minus {args.reference}", "L2"]
    table = stats.markdown_table(header, rows)
    files.atomic_write(out / f"{args.name}.md", (table + "\n").encode())
    record_text = json.dumps(record, indent=1) + "\n"
    files.atomic_write(out / f"{args.name}.json", record_text.encode())
    print(table)
    return 0


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    sys.exit(main())
