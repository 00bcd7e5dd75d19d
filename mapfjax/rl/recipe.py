"""The tiny-model recipe (`launch/train_tiny.py`, `configs/tiny_model.py`): its config check and
its data (tokenizer, SFT examples, validation set, GRPO pool), built once and cached in the
workdir. Above the SFT data (`data`) and the GRPO driver, which import nothing from here."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import pathlib
from collections.abc import Sequence

from mapfjax import configfile, files
from mapfjax.checks import is_finite_real, is_int, require, require_dtype, require_int
from mapfjax.env import config as env_config
from mapfjax.env import io, lookahead, text, trace
from mapfjax.env.types import Problem
from mapfjax.models import bpe, qwen3
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import driver
from mapfjax.rl.data import (
    Example,
    cached,
    generate_problems,
    load_examples,
    loop_lesson_examples,
    responses,
    save_examples,
    sft_examples,
)
from mapfjax.rl.optim import OptimConfig

log = logging.getLogger(__name__)


def _balanced(problems: Sequence[Problem], n: int, cells: int) -> list[Problem]:
    """n problems, an equal number from each (size, id prefix) cell where possible."""
    by_cell: dict[tuple, list[Problem]] = {}
    for p in problems:
        by_cell.setdefault((p.height, p.id.split("_")[0]), []).append(p)
    per = n // max(1, len(by_cell))
    out = [p for ps in by_cell.values() for p in ps[:per]]
    rest = [p for ps in by_cell.values() for p in ps[per:]]
    return (out + rest)[:n]


@dataclasses.dataclass(frozen=True)
class RunData:
    """Everything a tiny-model run reads: tokenizer, SFT examples, validation set, GRPO pool."""

    tokenizer: object
    sft: list[Example]
    validation: list[Problem]
    grpo_pool: list[Problem]


STAGE_PREFIX = "stage:"  # an `init` naming an earlier stage of the same recipe


def _is_config(spec: str) -> bool:
    try:
        return configfile.resolve(spec).is_file()
    except (FileNotFoundError, ValueError):
        return False


@dataclasses.dataclass(frozen=True)
class Stage:
    """One run of a recipe: its name ("" for a recipe of one run), its config with `workdir`,
    `out_dir` and an `init` of "stage:NAME" resolved, and that init's stage name (or "")."""

    name: str
    config: object
    after: str = ""


def stage_configs(cfg) -> list[Stage]:
    """A recipe's runs, in order. A recipe of one run is itself. A staged recipe names its
    stages in `stages` (run in that order) and holds each one's recipe in `stage.NAME`: stage
    NAME works in <workdir>/NAME and exports to <workdir>/NAME/export, the last one to
    `out_dir`; an `init` of "stage:OTHER" starts from OTHER's export, OTHER an earlier stage.
    Raises ValueError naming the key and what is allowed."""
    if "stages" not in cfg:
        return [Stage("", cfg)]
    names = tuple(cfg.stages)
    held = tuple(sorted(cfg.get("stage", {}).keys()))
    ok = len(names) > 0 and len(set(names)) == len(names) and sorted(names) == list(held)
    require("stages", names, ok, f"each of stage's recipes {held} once, in the order they run")
    work, out = pathlib.Path(cfg.workdir), pathlib.Path(cfg.out_dir)
    runs = []
    for k, name in enumerate(names):
        s = copy.deepcopy(cfg.stage[name])
        s.workdir = str(work / name)
        s.out_dir = str(out if k == len(names) - 1 else work / name / "export")
        init, after = str(s.get("init", "")), ""
        if init.startswith(STAGE_PREFIX):
            after = init[len(STAGE_PREFIX) :]
            require(f"stage.{name}.init", init, after in names[:k],
                    f"'stage:NAME' with NAME an earlier stage of {names[:k]}, a model "
                    "directory, or ''")  # fmt: skip
            s.init = str(work / after / "export")
        runs.append(Stage(name, s, after))
    return runs


def check_recipe(cfg, made_before: bool = False) -> None:
    """Check a tiny-model recipe config (configs/tiny_model.py) before any data is generated or
    any model built: a bad value found after hours of SFT would cost them. Raises ValueError
    naming the key, its value and what is allowed. made_before: `init` is the export of an
    earlier stage of the same recipe (not there yet)."""

    def at_least(key: str, least: int) -> None:
        node, last = configfile.key_path(cfg, key)
        require_int(key, node[last], least)

    for key, least in (("seed", 0), ("processes", 0), ("sft.instances", 1),
                       ("sft.checkpoint_every", 1), ("sft.log_every", 1),
                       ("sft.completion_multiple", 1),
                       ("validation.per_size", 1), ("validation.max_new_tokens", 1),
                       ("validation.batch_size", 1), ("rl.train.steps", 0)):  # fmt: skip
        at_least(key, least)
    require_dtype("dtype", cfg.dtype)
    if made_before:  # an earlier stage's export: `stage_configs` checked that it runs first
        pass
    elif cfg.get("init"):
        init = pathlib.Path(cfg.init)
        require("init", cfg.init, (init / "config.json").is_file(), "a model directory or ''")
    else:  # a model from scratch, with a tokenizer of its own
        at_least("tokenizer.instances", 1)
        bpe.check_vocab_size(cfg.tokenizer.vocab_size, "tokenizer.vocab_size")
        try:
            qwen3.Qwen3Config(vocab_size=cfg.tokenizer.vocab_size, **cfg.model)
        except (TypeError, ValueError) as e:
            raise ValueError(f"model.{e}") from None
    b = cfg.sft.batch_size
    ok = is_int(b) and 1 <= b <= cfg.sft.instances
    require("sft.batch_size", b, ok, f"an integer in [1, sft.instances={cfg.sft.instances}]")
    stages = tuple(cfg.sft.stages)
    ok = len(stages) > 0 and all(is_int(s) and s >= 1 for s in stages)
    ok = ok and all(a < b for a, b in zip(stages, stages[1:], strict=False))
    require("sft.stages", stages, ok, "update counts >= 1, increasing (each stage extends)")
    for steps in stages:
        OptimConfig(**cfg.sft.optim, total_steps=steps).validate()
    weight = cfg.sft.get("answer_weight", 1.0)
    ok = is_finite_real(weight) and weight > 0 and (weight == 1 or cfg.get("thinking", False))
    require("sft.answer_weight", weight, ok, "a number > 0; other than 1 only with thinking=True")
    if not isinstance(cfg.sft.get("coordinate_targets", False), bool):
        require("sft.coordinate_targets", cfg.sft.coordinate_targets, False, "True or False")
    if not isinstance(cfg.get("thinking", False), bool):
        require("thinking", cfg.thinking, False, "True or False")
    style = cfg.get("trace_style", "holes")
    require("trace_style", style, style in trace.STYLES, f"one of {trace.STYLES}")
    ahead = cfg.get("trace_lookahead", "")
    ok = ahead == "" or (ahead in lookahead.LOOKAHEADS and cfg.get("thinking", False))
    allowed = " or ".join(repr(k) for k in lookahead.LOOKAHEADS)
    require("trace_lookahead", ahead, ok, f"'' (none), or {allowed} with thinking=True")
    share = cfg.sft.get("loop_lessons", 0.0)
    retrying = ahead.startswith("relay_retry")
    ok = is_finite_real(share) and 0 <= share <= 1 and (share == 0 or retrying)
    require("sft.loop_lessons", share, ok, "a share in [0, 1]; above 0 only with the "
            "trace_lookahead 'relay_retry' or 'relay_retry_end'")  # fmt: skip
    share = cfg.sft.get("answer_only", 0.0)
    ok = is_finite_real(share) and 0 <= share <= 1 and (share == 0 or cfg.get("thinking", False))
    require("sft.answer_only", share, ok, "a share in [0, 1]; above 0 only with thinking=True")
    if cfg.get("thinking", False) and not cfg.rl.train.get("enable_thinking", False):
        require("rl.train.enable_thinking", False, False, "True when thinking=True")
    for where in ("sft.env", "rl.env", "validation.env"):
        node, last = configfile.key_path(cfg, where)
        env_config.validate_at(node[last], where)
    for where in ("sft.hole_ratios", "validation.hole_ratios"):
        part, key = where.split(".")
        env_config.check_hole_ratios(cfg[part].get(key, ()), where)
    for path in cfg.sft.get("exclude", ()):
        spec = str(path).partition(":")[0]
        ok = isinstance(path, str) and (
            pathlib.Path(path).is_file() or (spec.endswith(".py") and _is_config(spec))
        )
        allowed = (
            "instance files (JSONL) whose puzzles SFT never sees, or training configs "
            "(FILE.py[:ARG]) whose held-out puzzles it never sees"
        )
        require("sft.exclude", path, ok, allowed)
    spare = cfg.validation.get("spare", 0.0)
    require("validation.spare", spare, is_finite_real(spare) and spare >= 0, "a number >= 0")
    rl = copy.deepcopy(cfg.rl)
    rl.train.steps = max(1, rl.train.steps)  # 0 (no GRPO): the rest must still be right
    settings = driver.GRPOSettings.from_config(rl)
    driver.optim_config(rl, settings.steps, 1).validate()


def prepare(cfg, workdir) -> RunData:
    """Build (first run) or load (later runs) a run's data under `workdir`, from the config
    fields tokenizer.{instances, vocab_size}, sft.{env, instances, hole_ratios, exclude (instance
    files whose puzzles are dropped from the SFT data: `resolve_excludes` turns a training
    config named there into its held-out set's file)}, validation.{env,
    per_size}, rl.env, rl.train.{steps, problems_per_step, oversample}, seed and processes
    (configs/tiny_model.py).
    Each part has its own seed offset, so changing one size does not change the others."""
    work = pathlib.Path(workdir)

    def name(stem: str, ext: str, *parts) -> pathlib.Path:
        """A cache path keyed by the config parts it depends on (a config change rebuilds)."""
        key = json.dumps([p.to_dict() if hasattr(p, "to_dict") else p for p in parts])
        return work / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}{ext}"

    def problems(env, n, offset, hole_ratios=()):
        return generate_problems(env, n, cfg.seed + offset, cfg.processes, tuple(hole_ratios))

    thinking = bool(cfg.get("thinking", False))
    style = cfg.get("trace_style", "holes")
    ahead = cfg.get("trace_lookahead", "") if thinking else ""
    # In the cache keys of what thinking changes ("holes", the first style, kept its old keys).
    mode = (("thinking",) + ((style,) if style != "holes" else ())) if thinking else ()
    mode += (f"lookahead-{ahead}",) if ahead else ()

    def unplanned(what: str, asked: int, kept: int) -> None:
        if kept < asked:
            log.warning("%s: the %s look-ahead finds no plan for %d puzzles; dropped", what,
                        ahead, asked - kept)  # fmt: skip

    def tokenizer():
        ps = problems(cfg.sft.env, cfg.tokenizer.instances, 100)
        turns = responses(ps, thinking=thinking, style=style, lookahead=ahead)
        pairs = [(text.render_prompt(p), t) for p, t in zip(ps, turns, strict=True) if t]
        unplanned("tokenizer", len(ps), len(pairs))
        texts = bpe.corpus([q for q, _ in pairs], [t for _, t in pairs], thinking)
        # A trace's look-ups match cells: each "(r, c)" is one token.
        return bpe.build_tokenizer(texts, cfg.tokenizer.vocab_size, coordinates=thinking)

    init = cfg.get("init", "")
    if init:  # continue from a checkpoint: its tokenizer, unchanged
        tok_dir = pathlib.Path(init)
        tok = tok_lib.load_tokenizer(tok_dir)
    else:
        tok_dir = name("tokenizer", "", cfg.seed, cfg.sft.env, cfg.tokenizer, *mode)
        tok = cached(tok_dir, tokenizer, bpe.save_tokenizer, tok_lib.load_tokenizer)
    sft_holes = tuple(cfg.sft.get("hole_ratios", ()))
    val_holes = tuple(cfg.validation.get("hole_ratios", ()))
    # Held-out sets kept out of the SFT data (e.g. a gate's puzzles); in the cache key by content.
    exclude = tuple(pathlib.Path(f) for f in cfg.sft.get("exclude", ()))
    exclude_key = [files.sha256(f)[:16] for f in exclude]

    def sft():
        drawn = problems(cfg.sft.env, cfg.sft.instances, 1, sft_holes)
        if exclude:
            drawn, dropped = io.held_out(drawn, io.puzzle_hashes(exclude))
            log.warning("sft: %d of the drawn puzzles are in sft.exclude; dropped", dropped)
        examples = sft_examples(tok, drawn, thinking=thinking, style=style, lookahead=ahead,
                                answer_only=bare)  # fmt: skip
        unplanned("sft", len(drawn), len(examples))
        if lessons:  # beside the puzzles' own examples (`data.loop_lesson_examples`)
            extra = loop_lesson_examples(tok, drawn, lessons, style)
            log.warning("sft: %d loop lessons added (share %s)", len(extra), lessons)
            examples += extra
        return examples

    lessons = cfg.sft.get("loop_lessons", 0.0) if ahead.startswith("relay_retry") else 0.0
    parts = (tok_dir.name, cfg.sft.env, cfg.sft.instances, sft_holes, *mode)
    parts += (f"loop-lessons-{lessons}",) if lessons else ()
    bare = cfg.sft.get("answer_only", 0.0) if thinking else 0.0
    parts += (f"answer-only-{bare}",) if bare else ()
    sft_data = cached(
        name("sft", ".jsonl", *parts, *([exclude_key] if exclude else [])),
        sft,
        save_examples,
        load_examples,
    )

    def val():
        n = len(cfg.validation.env.sizes) * cfg.validation.per_size
        # Draw a few more than needed: puzzles the SFT data holds are dropped.
        extra = 1 + cfg.validation.get("spare", 0.0)
        drawn = problems(cfg.validation.env, int(n * extra), 2, val_holes)
        kept, dropped = io.held_out(drawn, {e.puzzle for e in sft_data})
        if len(kept) < n:
            raise ValueError(
                f"validation: {dropped} of {len(drawn)} drawn puzzles are in the SFT data, "
                f"{len(kept)} left for the {n} asked: raise validation.spare"
            )
        # Keep the per-cell balance: an equal count per (size, hole ratio) part.
        return _balanced(kept, n, len(cfg.validation.env.sizes) * max(1, len(val_holes)))

    rl = cfg.rl.train

    def pool():
        drawn = int(-(-rl.problems_per_step * rl.get("oversample", 1.0) // 1))
        return problems(cfg.rl.env, rl.steps * drawn, 3)

    return RunData(
        tok,
        sft_data,
        cached(
            name("validation", ".jsonl", cfg.seed, cfg.validation),
            val,
            io.save_instances,
            io.load_instances,
        ),
        cached(
            name("grpo", ".jsonl", cfg.seed, cfg.rl.env, rl.steps, rl.problems_per_step),
            pool,
            io.save_instances,
            io.load_instances,
        ),
    )
