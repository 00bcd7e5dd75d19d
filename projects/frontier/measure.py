r"""The frontier map of a checkpoint: greedy valid, mean@k, pass@k, mixed groups, p(1-p) and
flip share per (map size, hole ratio, needs-wait) cell, with 95 % intervals.

    python -m projects.frontier.measure --checkpoint mapfjax/assets/tiny \
        --out_dir projects/frontier/results/tiny_broad
    python -m projects.frontier.measure --checkpoint DIR --agents 3 --sizes 3-10 \
        --hole_ratios 0,0.1,0.2,0.3,0.4,0.5 --per_cell 24 --samples 8 --seed 0

Writes frontier.md, frontier.csv, frontier.json and frontier_<metric>.png to --out_dir.
"""

import sys

from absl import app, flags

from mapfjax import hostalloc

_CKPT = flags.DEFINE_string("checkpoint", None, "Hugging Face Qwen3 checkpoint directory")
_AGENTS = flags.DEFINE_integer("agents", 2, "agents per puzzle")
_SIZES = flags.DEFINE_string("sizes", "3-10", "map sizes: N-M and/or comma-separated N")
_HOLES = flags.DEFINE_string("hole_ratios", "0,0.1,0.2,0.3,0.4,0.5", "comma-separated")
_PER_CELL = flags.DEFINE_integer("per_cell", 24, "puzzles per (size, hole ratio) cell")
_SAMPLES = flags.DEFINE_integer("samples", 8, "samples per puzzle (k) at --temperature")
_WAIT = flags.DEFINE_float("wait_ratio", 0.5, "share of needs-wait puzzles asked for per cell")
_TEMP = flags.DEFINE_float("temperature", 1.0, "sampling temperature (greedy is run too)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 80, "response budget")
_ROWS = flags.DEFINE_integer("batch_rows", 256, "sequences per sampler call")
_OUT = flags.DEFINE_string("out_dir", "frontier", "where frontier.{md,csv,json,png} go")
_SEED = flags.DEFINE_integer("seed", 0, "puzzle and sampling seed")
_DTYPE = flags.DEFINE_string("dtype", "float32", "checkpoint compute dtype")
flags.mark_flag_as_required("checkpoint")


def main(argv):
    del argv
    # Imported after flag parsing: --help and flag errors answer without loading JAX.
    import jax
    import jax.numpy as jnp

    from mapfjax import parallel
    from mapfjax.env import config as env_config
    from mapfjax.models import hf
    from mapfjax.models import tokenizer as tok_lib
    from projects.frontier import frontier

    parallel.enable_compilation_cache()
    try:
        cfg = frontier.FrontierConfig(
            agents=_AGENTS.value,
            sizes=env_config.parse_sizes(_SIZES.value),
            hole_ratios=frontier.parse_ratios(_HOLES.value),
            per_cell=_PER_CELL.value,
            samples=_SAMPLES.value,
            wait_ratio=_WAIT.value,
            temperature=_TEMP.value,
            max_new_tokens=_MAX_NEW.value,
            batch_rows=_ROWS.value,
            seed=_SEED.value,
        )
        cfg.validate()
        mesh = parallel.make_mesh({"data": -1}) if jax.device_count() > 1 else None
        kw = {"mesh": mesh, "rules": "sample"} if mesh is not None else {}
        dt = jnp.dtype(_DTYPE.value)
        model = hf.from_pretrained(_CKPT.value, dtype=dt, param_dtype=dt, **kw)
        tokenizer = tok_lib.load_tokenizer(_CKPT.value)
        result = frontier.run(model, tokenizer, cfg, _CKPT.value, mesh)
        paths = frontier.write(result, _OUT.value)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for m in result.messages:
        print(f"warning: {m}", file=sys.stderr)
    print(frontier.markdown_table(result.by_size(), cfg.samples))
    pngs = sum(p.suffix == ".png" for p in paths.values())
    print(f"{result.seconds['total']:.0f} s; {paths['md']}, .csv, .json and {pngs} heatmap PNGs")
    return 0


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    app.run(main)
