r"""A checkpoint or an API model on the benchmark: answers, verification, tables beside the paper.

    python -m mapfjax.env benchmark --out bench.jsonl
    python launch/evaluate.py --checkpoint runs/tiny/round_2/model --instances bench.jsonl \
        --answers_out answers.jsonl --out_dir runs/tiny/eval
    python launch/evaluate.py --api_model gpt-5.4 --instances bench.jsonl --out_dir eval_gpt

Rerun the same command to continue: answers already in --answers_out (tied to their puzzles by
a hash) are not regenerated. Unlabelled instances get valid rates with optimal unknown; --label
labels them first with the exact oracle (or use `python -m mapfjax.env label`).

A checkpoint is decoded with the thinking mode and response budget its generation_config.json
records (`mapfjax.models.hf.generation_settings`) unless --enable_thinking / --noenable_thinking
or --max_new_tokens is given; one line on stderr says which settings are used and where each
came from.
"""

import dataclasses
import pathlib
import sys

from absl import app, flags

from mapfjax import configfile, hostalloc

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
_MAX_NEW = flags.DEFINE_integer(
    "max_new_tokens",
    None,
    "response budget in tokens (checkpoint); default: the checkpoint's generation_config.json, "
    "512 when it sets none",
)
_THINK = flags.DEFINE_bool(
    "enable_thinking",
    None,
    "Qwen3 thinking mode (checkpoint); default: the checkpoint's generation_config.json, off "
    "when it sets none",
)
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
flags.register_validator(
    "max_new_tokens", lambda v: v is None or v >= 1, "--max_new_tokens: an integer >= 1"
)


def generation_choice(checkpoint, enable_thinking=None, max_new_tokens=None):
    """(settings, line): the checkpoint's `hf.GenerationSettings` with enable_thinking and
    max_new_tokens replaced by the flags' values where given (None: the flag was not given),
    and one line saying which values are used and where each came from (the flag, the
    checkpoint's generation_config.json, or the default where the file sets none)."""
    from mapfjax.models import hf

    stored = hf.generation_settings(checkpoint)
    file = pathlib.Path(checkpoint).expanduser() / hf.GENERATION_CONFIG
    flags_given = {hf.THINKING_KEY: enable_thinking, "max_new_tokens": max_new_tokens}
    chosen = {k: v for k, v in flags_given.items() if v is not None}
    settings = dataclasses.replace(stored, **chosen)
    parts = []
    for key in flags_given:
        if key in chosen:
            source = f"--{'no' if chosen[key] is False else ''}{key}"
        elif key in stored.given:
            source = str(file)
        else:
            source = f"default: {file} does not set it"
        parts.append(f"{key}={getattr(settings, key)} ({source})")
    return settings, "generation settings: " + ", ".join(parts)


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
            solver = ev.CheckpointSolver(
                _CKPT.value, dtype=_DTYPE.value, mesh=mesh, seed=_SEED.value
            )
            # After the solver: it names a missing or malformed checkpoint directory first.
            gen, line = generation_choice(_CKPT.value, _THINK.value, _MAX_NEW.value)
            flags_line = f"temperature={_TEMP.value:g}, top_p={_TOP_P.value:g}"
            print(f"{line}; {flags_line} (--temperature, --top_p)", file=sys.stderr)
            sampling = dataclasses.replace(
                ev.EVAL_SAMPLING,
                enable_thinking=gen.enable_thinking,
                max_new_tokens=gen.max_new_tokens,
                temperature=_TEMP.value,
                top_p=_TOP_P.value,
            )
            if _BIAS.value:
                sampling = dataclasses.replace(
                    sampling, logit_bias=ev.logit_bias_ids(solver.tokenizer, _BIAS.value)
                )
            solver.sampling = sampling
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
    configfile.quiet_backend_probe()
    app.run(main)
