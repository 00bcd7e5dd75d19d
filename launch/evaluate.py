r"""A checkpoint or an API model on the benchmark: answers, verification, tables beside the paper.

    python -m mapfjax.env benchmark --out bench.jsonl
    python launch/evaluate.py --checkpoint runs/tiny/round_2/model --instances bench.jsonl \
        --answers_out answers.jsonl --out_dir runs/tiny/eval
    python launch/evaluate.py --api_model gpt-5.4 --instances bench.jsonl --out_dir eval_gpt

Rerun the same command to continue: answers already in --answers_out (tied to their puzzles by
a hash) are not regenerated. Unlabelled instances get valid rates with optimal unknown; --label
labels them first with the exact oracle (or use `python -m mapfjax.env label`).
"""

import dataclasses
import sys

from absl import app, flags

from mapfjax import hostalloc

_CKPT = flags.DEFINE_string("checkpoint", None, "Hugging Face Qwen3 checkpoint directory")
_API = flags.DEFINE_string("api_model", None, "OpenAI-compatible model name (instead of a ckpt)")
_API_URL = flags.DEFINE_string("api_base_url", "", "endpoint; default $OPENAI_BASE_URL")
_API_CONC = flags.DEFINE_integer("api_concurrency", 8, "API requests in flight at once")
_INSTANCES = flags.DEFINE_string("instances", None, "instance JSONL (labels optional)")
_LABEL = flags.DEFINE_bool("label", False, "label unlabelled instances with the exact oracle")
_ANSWERS = flags.DEFINE_string("answers_out", None, 'raw {"id", "text"} JSONL, appended per batch')
_OUT = flags.DEFINE_string("out_dir", "eval", "where results.{md,csv,png,json} go")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy")
_TOP_P = flags.DEFINE_float(
    "top_p", 1.0, "nucleus when temperature > 0: a token is drawn while the mass above it < top_p"
)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "response budget (checkpoint)")
_THINK = flags.DEFINE_bool("enable_thinking", False, "Qwen3 thinking mode (checkpoint)")
_BATCH = flags.DEFINE_integer("batch_size", 32, "problems per generation call")
_DTYPE = flags.DEFINE_string("dtype", "float32", "checkpoint compute dtype")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed when temperature > 0")
_BIAS = flags.DEFINE_multi_string(
    "logit_bias",
    [],
    "TEXT=VALUE: add VALUE to the logit of TEXT (one token) at every step "
    "(checkpoint; a diagnostic, e.g. taken=1.5); repeatable",
)
_DUPS = flags.DEFINE_enum("duplicates", "error", ["error", "first", "last"], "id answered twice")
flags.mark_flag_as_required("instances")
flags.register_validator("top_p", lambda v: 0 < v <= 1, "--top_p: a probability mass, in (0, 1]")


def main(argv):
    del argv
    # Imported after flag parsing: --help and flag errors answer without loading JAX.
    import jax

    from mapfjax import parallel
    from mapfjax.env import io
    from mapfjax.env.cli import label_summary_line
    from mapfjax.eval import evaluate as ev
    from mapfjax.eval import paper

    parallel.enable_compilation_cache()
    if bool(_CKPT.value) == bool(_API.value):
        print("error: give exactly one of --checkpoint DIR or --api_model NAME", file=sys.stderr)
        return 2
    try:
        problems = io.require_instances(_INSTANCES.value)
        ev.check_out_dir(_OUT.value)
        if _LABEL.value and any(p.optimal_soc is None for p in problems):
            problems, summary = ev.label_unlabelled(problems)
            print(f"{_INSTANCES.value}: {label_summary_line(summary)}", file=sys.stderr)
        if _CKPT.value:
            mesh = parallel.make_mesh({"data": -1}) if jax.device_count() > 1 else None
            new = {
                "max_new_tokens": _MAX_NEW.value,
                "temperature": _TEMP.value,
                "top_p": _TOP_P.value,
            }
            sampling = dataclasses.replace(ev.EVAL_SAMPLING, enable_thinking=_THINK.value, **new)
            solver = ev.CheckpointSolver(_CKPT.value, sampling, _DTYPE.value, mesh, _SEED.value)
            if _BIAS.value:
                bias = ev.logit_bias_ids(solver.tokenizer, _BIAS.value)
                solver.sampling = dataclasses.replace(sampling, logit_bias=bias)
            label, family = _CKPT.value, paper.model_family(checkpoint=_CKPT.value)
        else:
            solver = ev.ApiSolver(
                _API.value, _API_URL.value, temperature=_TEMP.value, concurrency=_API_CONC.value
            )
            label, family = _API.value, paper.model_family(api_model=_API.value)
        args = (solver, problems, _OUT.value, label, family, _ANSWERS.value, _BATCH.value)
        paths = ev.evaluate(*args, duplicates=_DUPS.value)
    except (ValueError, OSError, ev.ApiUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(paths["md"].read_text())
    print(f"results: {paths['md']} {paths['csv']} {paths['png']}")
    return 0


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    app.run(main)
