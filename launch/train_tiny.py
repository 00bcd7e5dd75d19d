r"""Build a tiny model by its recipe: BPE tokenizer, SFT on the oracle's answers (or reasoning
traces), optional GRPO, export and greedy validation (VALIDATION.md). A recipe of named stages
runs them in order, each from the one before (configs/tiny_model.py:think). Seeded; rerunning
the same command resumes from the workdir (a finished stage is skipped).

    python launch/train_tiny.py --config configs/tiny_model.py [--config.workdir=/tmp/tiny]
    python launch/train_tiny.py --config configs/tiny_model.py:think
"""

import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from mapfjax import hostalloc  # noqa: E402

if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # before JAX is imported: a restart costs only the lines above

import jax.numpy as jnp  # noqa: E402
import tqdm  # noqa: E402
from absl import app, logging  # noqa: E402
from flax import nnx  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from mapfjax import configfile, files, parallel  # noqa: E402
from mapfjax.models import bpe, hf, qwen3  # noqa: E402
from mapfjax.models import tokenizer as tok_lib  # noqa: E402
from mapfjax.rl import data, driver, recipe, rollout  # noqa: E402
from mapfjax.rl.sft import SFTConfig  # noqa: E402
from mapfjax.rl.trainer import OptimConfig, Trainer  # noqa: E402

CONFIG = config_flags.DEFINE_config_file(
    "config",
    "configs/tiny_model.py",
    "ml-collections config file of the tiny model's recipe, path[:variant]; override its keys "
    "with --config.KEY=VALUE",
)


def fit(trainer, ckpt, total, batches, every, log, name):  # resumes from ckpt; logs JSON
    if ckpt.exists() and any(p.name.isdigit() for p in ckpt.iterdir()):
        trainer.restore(ckpt)
    t0, start = time.time(), int(trainer.state.step)
    if start >= total:  # a stage finished before
        return
    # A bar with the rate and time left (every 30 s when the output is a log file). It prints
    # only from update() here: tqdm's monitor thread would refresh it after maxinterval, also
    # while a checkpoint write sends stderr to the checkpoint's errors.log.
    bar = tqdm.tqdm(total=total, initial=start, desc=name, dynamic_ncols=True,
                    mininterval=0.5 if sys.stderr.isatty() else 30,
                    maxinterval=float("inf"))  # fmt: skip
    for step, (batch, extra) in zip(range(start, total), batches(start)):
        m = trainer.step(batch) | extra
        log.write(json.dumps({"phase": name, "s": round(time.time() - t0, 1)} | m) + "\n")
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
        if (step + 1) % every == 0 or step + 1 == total:
            trainer.save(ckpt, wait=True)
            bar.write(f"{name} {step + 1}/{total} loss {m['loss']:.4f} {time.time() - t0:.0f}s")
    bar.close()


def resolve_excludes(c, work: pathlib.Path) -> None:
    """`sft.exclude` entries that name a training config (FILE.py[:ARG]) become the file of
    that config's held-out set, written under `work` (`validation.held_out_file`)."""
    from mapfjax.engineer import validation

    c.sft.exclude = tuple(
        str(validation.held_out_file(e, work / "held_out"))
        if str(e).partition(":")[0].endswith(".py")
        else e
        for e in c.sft.get("exclude", ())
    )


def run(c) -> None:
    """One run of a recipe (a stage): data, SFT, GRPO, export, validation."""
    work, out = pathlib.Path(c.workdir), pathlib.Path(c.out_dir)
    work.mkdir(parents=True, exist_ok=True)
    resolve_excludes(c, work)
    d = recipe.prepare(c, work)
    tok, pad, dtype = d.tokenizer, tok_lib.special_ids(d.tokenizer).pad, jnp.dtype(c.dtype)
    if c.get("init"):  # continue from a checkpoint (its architecture and tokenizer)
        model = hf.from_pretrained(c.init, dtype=dtype)
    else:
        model_cfg = qwen3.Qwen3Config(vocab_size=len(tok), **c.model)
        model = qwen3.Qwen3(model_cfg, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(c.seed))
    log = open(work / "log.jsonl", "a", buffering=1)  # line-buffered: tail -f works
    b = c.sft.batch_size
    targets = data.coordinate_targets(tok, d.sft) if c.sft.coordinate_targets else None
    pad_to = c.sft.completion_multiple  # fewer compiled shapes on an accelerator
    batches = lambda s: data.sft_batches(
        d.sft, b, pad, c.seed, None, s, targets=targets, completion_multiple=pad_to
    )
    sft_batches = lambda s: ((x, {}) for x in batches(s))
    thinking = bool(c.get("thinking", False))
    sft_cfg = SFTConfig(  # the answer after a trace may weigh more than the trace's tokens
        answer_weight=c.sft.get("answer_weight", 1.0),
        think_close_id=tok_lib.special_ids(tok).end_think if thinking else -1,
    )
    for steps in c.sft.stages:  # each stage: a longer cosine schedule from where it stands
        optim = OptimConfig(**c.sft.optim, total_steps=steps)
        sft = Trainer(model, optim, "sft", loss_cfg=sft_cfg, seed=c.seed)
        fit(sft, work / "sft_ckpt", steps, sft_batches, c.sft.checkpoint_every, log, "sft")
        model = sft.model()  # the next stage's trainer reuses this one's compiled updates
    if c.rl.train.steps:  # 0: export the SFT model as it is
        settings = driver.GRPOSettings.from_config(c.rl)
        loss_name, loss_cfg = settings.trainer_loss()
        rl = Trainer(model, driver.optim_config(c.rl, settings.steps, 1), loss_name,
                     loss_cfg=loss_cfg, seed=c.seed)  # fmt: skip
        ckpt = (work / f"grpo_ckpt_after_sft{steps}").absolute()  # a longer SFT: a fresh GRPO
        driver.run_phase(
            rl, tok, d.grpo_pool, settings, seed=[c.seed, 0], position={"phase": "grpo"},
            out_dir=work / "grpo", ckpt_dir=ckpt,
            start_step=driver.restore(rl, ckpt).get("step", 0),
        )  # fmt: skip
        model = rl.model()
    # The export says how it is meant to be decoded: its prompt mode and response budget.
    generation = hf.GenerationSettings(
        enable_thinking=thinking, max_new_tokens=int(c.validation.max_new_tokens)
    )
    bpe.attach_tokenizer(hf.save_pretrained(model, out, generation=generation), tok)
    shipped = hf.from_pretrained(out, dtype=jnp.float32)  # validate exactly what users load
    v = rollout.greedy_eval(
        shipped, tok_lib.load_tokenizer(out), d.validation, c.validation.max_new_tokens,
        enable_thinking=thinking,
    )  # fmt: skip
    mode = "thinking on (reasoning trace)" if thinking else "thinking off"
    grpo = f"{c.rl.train.steps} GRPO steps" if c.rl.train.steps else "no GRPO"
    notes = [
        f"Greedy decoding, {mode}, seed {c.seed}; SFT {c.sft.stages[-1]} updates, {grpo}; "
        "made by launch/train_tiny.py."
    ]
    report = rollout.validation_report(v, "Tiny model", notes, d.validation)
    files.atomic_write(out / "VALIDATION.md", report.encode())
    print(report)


def main(_):
    c = CONFIG.value
    try:  # every stage, before hours of data generation and SFT
        stages = recipe.stage_configs(c)
        for check in (
            lambda st: recipe.check_recipe(st.config, made_before=bool(st.after)),
            lambda st: recipe.check_resume(st.config, st.config.workdir),  # then the workdirs
        ):
            for stage in stages:
                try:
                    check(stage)
                except ValueError as e:
                    raise ValueError(f"stage.{stage.name}: {e}" if stage.name else str(e)) from None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    parallel.enable_compilation_cache()  # a rerun or resume skips recompiling
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint write at INFO
    for k, stage in enumerate(stages):
        out = pathlib.Path(stage.config.out_dir)
        if stage.name and k < len(stages) - 1 and (out / "VALIDATION.md").is_file():
            print(f"stage {stage.name} ({k + 1}/{len(stages)}): done, {out}", file=sys.stderr)
            continue
        if stage.name:
            print(f"stage {stage.name} ({k + 1}/{len(stages)}) -> {out}", file=sys.stderr)
        run(stage.config)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=configfile.parse_flags)
