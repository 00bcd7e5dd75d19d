"""The closed loop on one accelerator, end to end, then the paper configuration's first GRPO
step at Qwen3-4B's shapes: phase timings and peak memory beside the memory plan.

    python -m projects.accelerator.loop_check --out projects/accelerator/results/loop
    python -m projects.accelerator.loop_check --shapes tiny --out /tmp/loop_check   # CPU form

Part 1 runs `launch/train.py`'s loop in this process on random weights of `--shapes`
(Qwen3-0.6B's by default; the shipped tiny tokenizer, whose ids all lie inside any preset's
vocabulary) with `configs/paper_qwen3_4b.py` at reduced counts: two rounds of two GRPO steps
each on 3x3-4x4 puzzles, validation, the policy proposing the next round's configuration with
the same sampler (random weights propose nothing parseable: the loop keeps the configuration,
as it does for any failed proposal), the projection, the next round, and a small 3-agent
benchmark. It writes loop_<device>.md and .json: each phase's seconds and the device's peak
bytes so far (`phases.jsonl`) beside the memory plan of the same settings (`loop.memory_plan`).

Part 2 times one GRPO step of the paper configuration as one device of an 8-device node runs
it (its share: 6 puzzles x 8 samples, 4,096 new tokens after a 512-token prompt, the update in
6 micro-batches with full remat) with `benchmarks/accelerator.py` on random Qwen3-4B weights
(`--step_model`), written under step/. Each part's files are written as soon as it ends, so a
call cut short keeps what finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.accelerator import device_slug as slug

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_FROM = ROOT / "mapfjax" / "assets" / "tiny_think"


@dataclasses.dataclass(frozen=True)
class Scale:
    """The reduced counts of part 1 and the shapes of part 2."""

    new_tokens: int  # every sampler call's budget in part 1
    problems: int  # puzzles per GRPO step
    group: int
    step: str  # part 2's --grpo: prompts x group x completion tokens
    step_prompt: int
    step_accum: int


SCALES = {
    "accelerator": Scale(
        new_tokens=256, problems=8, group=4, step="6x8x4096", step_prompt=512, step_accum=6
    ),  # fmt: skip
    "cpu": Scale(new_tokens=16, problems=2, group=2, step="2x2x8", step_prompt=16, step_accum=1),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for loop_<device>.md and .json and step/")
    ap.add_argument("--shapes", default="qwen3-0.6b",
                    help="part 1's model: a mapfjax.models.qwen3.PRESETS name, or tiny (the "
                    "shipped tiny model's shapes)")  # fmt: skip
    ap.add_argument(
        "--step_model",
        default="4b",
        help="part 2's model, a benchmarks/accelerator.py --models name (tiny on CPU)",
    )
    ap.add_argument(
        "--scale",
        choices=sorted(SCALES),
        help="counts and shapes (default: cpu on a CPU, else accelerator)",
    )
    ap.add_argument("--parts", default="loop,step", help="which parts to run: loop, step or both")
    ap.add_argument(
        "--workdir",
        help="part 1's run directory and checkpoint (default: a temporary folder, removed after)",
    )
    return ap.parse_args(argv)


def build_checkpoint(shapes: str, path: pathlib.Path) -> pathlib.Path:
    """A checkpoint of random bf16 weights of `shapes` with the shipped tiny tokenizer."""
    import jax.numpy as jnp
    from flax import nnx

    from mapfjax.models import hf
    from mapfjax.models.qwen3 import PRESETS, Qwen3

    if shapes == "tiny":
        config, _ = hf.read_config(TOKENIZER_FROM)
    elif shapes in PRESETS:
        config = PRESETS[shapes]
    else:
        raise SystemExit(f"--shapes {shapes}: allowed: tiny, {', '.join(sorted(PRESETS))}")
    tokens, _ = hf.read_config(TOKENIZER_FROM)
    if config.vocab_size < tokens.vocab_size:
        raise SystemExit(f"--shapes {shapes}: vocabulary {config.vocab_size} < the tokenizer's")
    model = Qwen3(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    return hf.save_pretrained(model, path, copy_from=TOKENIZER_FROM)


def loop_config(model_path: pathlib.Path, scale: Scale):
    """configs/paper_qwen3_4b.py with its counts reduced (its structure, engineer and benchmark
    kept)."""
    import ml_collections

    from mapfjax import configfile
    from mapfjax.env.config import default_config

    c = configfile.get_config(ROOT / "configs" / "paper_qwen3_4b.py")
    c.model.path = str(model_path)
    c.rounds = 2
    c.export_every_round = False
    c.env = default_config(num_agents=2, sizes=(3, 4), hole_ratio=0.2, wait_ratio=0.3)
    c.env.oracle.processes = 1
    c.train.problems_per_step = scale.problems
    c.train.group_size = scale.group
    c.train.instances = 2 * scale.problems  # two GRPO steps a round
    c.train.epochs = 1
    c.train.max_new_tokens = scale.new_tokens
    c.train.checkpoint_every = 1000
    c.optim.accum_steps = 1
    c.optim.warmup_steps = 1
    c.validation.sizes = (3, 4)
    c.validation.per_size = 4
    c.validation.max_new_tokens = scale.new_tokens
    c.validation.batch_size = 8
    c.engineer.max_new_tokens = scale.new_tokens
    c.engineer.settings.num_samples = 1
    c.benchmark = ml_collections.ConfigDict(
        {"agents": (3,), "sizes": (3, 4), "wait_ratios": (0.5,), "per_cell": 2,
         "hole_ratio": 0.1, "seed": 0, "max_new_tokens": scale.new_tokens, "batch_size": 8,
         "bucket": "pow2_mid"}
    )  # fmt: skip
    return c


def run_loop(opts, scale: Scale, out: pathlib.Path) -> dict:
    import jax

    from mapfjax import parallel
    from mapfjax.engineer import loop
    from mapfjax.engineer.settings import RunSettings
    from mapfjax.models import hf
    from mapfjax.models import tokenizer as tok_lib

    scratch = pathlib.Path(opts.workdir or tempfile.mkdtemp(prefix="mapfjax-loop-check-"))
    workdir = scratch / "run"
    model_path = build_checkpoint(opts.shapes, scratch / "model")
    config = loop_config(model_path, scale)
    start = time.perf_counter()
    records = loop.run(config, workdir, progress=False)
    wall = time.perf_counter() - start
    phases = [json.loads(x) for x in (workdir / loop.PHASES).read_text().splitlines() if x]
    s = RunSettings.from_config(config)
    tokenizer = tok_lib.load_tokenizer(s.model.path)
    model_config, _ = hf.read_config(pathlib.Path(s.model.path))
    tokens = loop.prompt_tokens(tokenizer, s.grpo.sampling.bucket, s.grpo.sampling.enable_thinking)
    plans = loop.memory_plan(s, None, model_config, tokens)
    result = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "shapes": opts.shapes,
        "rounds_finished": len(records),
        "wall_s": round(wall, 1),
        "limit_bytes": parallel.device_bytes_limit(),
        "phases": phases,
        "plan": [dataclasses.asdict(p) | {"total": p.total} for p in plans],
    }
    stem = out / f"loop_{slug(result['device'])}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(loop_markdown(result) + "\n")
    if not opts.workdir:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def loop_markdown(r: dict) -> str:
    from mapfjax import stats
    from mapfjax.engineer.loop import size_text

    def mem(n):
        return "-" if n is None else size_text(n)

    lines = [
        f"# The loop on {r['device']} (jax {r['jax']}, random weights of {r['shapes']})",
        "",
        f"{r['rounds_finished']} rounds in {r['wall_s']} s (compiles included). Peak: the "
        "device's high-water mark of allocated bytes since the process started (none on CPU).",
        "",
        stats.markdown_table(
            ["phase", "seconds", "peak so far"],
            [[p["phase"], p["seconds"], mem(p.get("peak_bytes"))] for p in r["phases"]],
        ),
        "",
        "The memory plan of the same settings (bytes per device):",
        "",
        stats.markdown_table(
            ["phase", "what", "planned"],
            [[p["phase"], p["what"], mem(p["total"])] for p in r["plan"]],
        ),
    ]
    peaks = [p["peak_bytes"] for p in r["phases"] if "peak_bytes" in p]
    if peaks:
        planned = max(p["total"] for p in r["plan"])
        lines += ["", f"Measured peak {mem(max(peaks))}, largest planned phase {mem(planned)}."]
    return "\n".join(lines)


def run_step(opts, scale: Scale, out: pathlib.Path) -> int:
    """benchmarks/accelerator.py: one GRPO step of the paper's per-device shapes."""
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "accelerator.py"), "--models", opts.step_model,
        "--out", str(out / "step"), "--grpo", scale.step, "--prompt-len", str(scale.step_prompt),
        "--accum", str(scale.step_accum), "--remat", "full", "--repeats", "0",
        "--batches", "1", "--new-tokens", "8", "--parity", "1x8",
    ]  # fmt: skip
    if opts.step_model == "tiny":
        cmd += ["--attention", "einsum"]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv=None) -> int:
    opts = parse_args(argv)
    import jax

    scale = SCALES[opts.scale or ("cpu" if jax.default_backend() == "cpu" else "accelerator")]
    out = pathlib.Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = set(opts.parts.split(","))
    if not parts or parts - {"loop", "step"}:
        raise SystemExit(f"--parts {opts.parts}: allowed: loop, step or loop,step")
    code = 0
    if "loop" in parts:
        result = run_loop(opts, scale, out)
        print((out / f"loop_{slug(result['device'])}.md").read_text())
        if result["rounds_finished"] != 2:
            code = 1
    if "step" in parts:
        code = run_step(opts, scale, out) or code
    return code


if __name__ == "__main__":
    sys.exit(main())
