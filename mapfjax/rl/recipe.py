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
from mapfjax.env import forms, io, text
from mapfjax.env.types import Problem
from mapfjax.models import bpe, qwen3
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import driver
from mapfjax.rl.data import (
    Example,
    cached,
    generate_problems,
    load_examples,
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
        s.unlock()  # a config read from flags is locked; a stage gets its own folders
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


def trace_form(cfg):
    """The recipe's trace form (`env.forms`) with thinking, from its key `trace_form`; None
    without thinking."""
    return forms.get(cfg.trace_form, "trace_form") if cfg.get("thinking", False) else None


def check_trace_form(cfg) -> None:
    """`trace_form`: with thinking=True a form `forms.get` resolves (a registered name or
    "module:attribute" naming an experiment's TraceForm), '' without thinking. Raises
    ValueError naming the key, value and what is allowed."""
    spec = cfg.get("trace_form", "")
    if cfg.get("thinking", False):
        forms.get(spec, "trace_form")
    else:
        require("trace_form", spec, spec == "", "'' without thinking (a form with thinking=True)")


def sft_mix(cfg) -> list[tuple[str, object]]:
    """The recipe's `sft.mix` parts in name order: (name, {env, instances, hole_ratios,
    answer_only}), each more SFT puzzles drawn from its own generator config (e.g. other agent
    counts), answered without a trace on `answer_only` of them when given (else on
    sft.answer_only's share); [] when the recipe has none. ValueError when the section is not a
    group of such parts."""
    mix = cfg.sft.get("mix")
    if not mix:
        return []
    if not hasattr(mix, "items") or not all(hasattr(v, "get") for v in mix.values()):
        raise ValueError(f"sft.mix = {mix!r:.60}; allowed: named parts, each with env and "
                         "instances (and hole_ratios)")  # fmt: skip
    return sorted(mix.items())


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
    check_trace_form(cfg)
    spec = cfg.sft.get("extra_examples", "")
    if spec:
        try:
            extra = configfile.load_object(spec, "sft.extra_examples")
        except ValueError as e:
            raise ValueError(f"{e} (a function (tokenizer, problems) -> SFT examples)") from None
        require("sft.extra_examples", spec, callable(extra),
                "'' or 'module:attribute' naming a function (tokenizer, problems) -> SFT "
                "examples")  # fmt: skip
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
    cap = cfg.sft.get("max_completion_tokens", 0)
    require("sft.max_completion_tokens", cap, is_int(cap) and cap >= 0,
            "0 (no cap) or the most tokens an SFT completion may have")  # fmt: skip
    for name, part in sft_mix(cfg):  # more puzzles in the SFT data, from other generator configs
        where = f"sft.mix.{name}"
        keys = {"env", "instances", "hole_ratios", "answer_only"}
        unknown = sorted(set(part.keys()) - keys)
        require(f"{where}: unknown key(s)", unknown, not unknown,
                "env, instances, hole_ratios, answer_only")  # fmt: skip
        if "answer_only" in part:  # this part's own share, in place of sft.answer_only
            own = part.answer_only
            ok = is_finite_real(own) and 0 <= own <= 1 and (own == 0 or cfg.get("thinking", False))
            require(f"{where}.answer_only", own, ok,
                    "a share in [0, 1]; above 0 only with thinking=True")  # fmt: skip
        env_config.validate_at(part.env, f"{where}.env")
        require_int(f"{where}.instances", part.get("instances"), 1)
        env_config.check_hole_ratios(part.get("hole_ratios", ()), f"{where}.hole_ratios")
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


# What a resumed recipe may change: how long it trains (later SFT stages extend a run, GRPO
# steps), how often it saves and logs, where it exports, its oracle processes, the batches'
# padding (speed only) and the validation after the export. Anything else (seed, tokenizer,
# architecture, data, trace form, optimiser) would restore checkpoints under a tokenizer, an
# architecture or data they were not trained with.
RESUMABLE = ("sft.stages", "rl.train.steps", "sft.checkpoint_every", "sft.log_every",
             "rl.train.checkpoint_every", "out_dir", "workdir", "processes",
             "sft.completion_multiple")  # fmt: skip
RECORD = "recipe.json"  # the recipe a workdir trains, written on first use


def check_resume(cfg, workdir) -> None:
    """Record the recipe `workdir` trains on first use; later, refuse another one (a resume
    would restore its checkpoints into a model they do not fit), naming the keys that differ
    and what to do. Keys in RESUMABLE and under `validation.` may change."""
    work = pathlib.Path(workdir)
    now = env_config.flatten(json.loads(cfg.to_json_best_effort()))
    path = work / RECORD
    if not path.is_file():
        work.mkdir(parents=True, exist_ok=True)
        files.atomic_write(path, json.dumps(now, indent=1, sort_keys=True) + "\n")
        return
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable ({e}); restore it, or use another workdir") from None
    differ = sorted(
        k
        for k in set(before) | set(now)
        if before.get(k) != now.get(k) and k not in RESUMABLE and not k.startswith("validation.")
    )
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in differ[:6])
        raise ValueError(
            f"{work} holds a run of another recipe ({len(differ)} key(s) differ: {shown}); its "
            "checkpoints would not fit: use another --config.workdir, or the same recipe"
        )


def prepare(cfg, workdir) -> RunData:
    """Build (first run) or load (later runs) a run's data under `workdir`, from the config
    fields tokenizer.{instances, vocab_size}, sft.{env, instances, hole_ratios, mix (more
    puzzles from other generator configs, `sft_mix`), exclude (instance files whose puzzles are
    dropped from the SFT data: `resolve_excludes` turns a training config named there into its
    held-out set's file)}, validation.{env,
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
    form = trace_form(cfg)
    # In the cache keys of what thinking changes (a form's `cache_key`: the shipped form kept
    # the words of the settings it replaced).
    mode = ("thinking", *form.cache_key) if thinking else ()

    def unplanned(what: str, asked: int, kept: int) -> None:
        if kept < asked:
            log.warning("%s: the %s trace form has no trace for %d puzzles; dropped", what,
                        form.name, asked - kept)  # fmt: skip

    def tokenizer():
        ps = problems(cfg.sft.env, cfg.tokenizer.instances, 100)
        turns = responses(ps, form=form)
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
        # (puzzles, their answer-only share): the main draw, then each mix part's (each part
        # its own seed offset, 1000 k); parts without their own share are drawn with sft's.
        groups = [(problems(cfg.sft.env, cfg.sft.instances, 1, sft_holes), bare)]
        for k, (_, part) in enumerate(mix, 1):
            drawn = problems(part.env, part.instances, 1000 * k, part.get("hole_ratios", ()))
            share = part.get("answer_only", bare) if thinking else 0.0
            if share == groups[-1][1]:
                groups[-1] = (groups[-1][0] + drawn, share)
            else:
                groups.append((drawn, share))
        held = io.puzzle_hashes(exclude) if exclude else set()
        kept, examples, dropped = [], [], 0
        for drawn, share in groups:
            if exclude:
                drawn, out = io.held_out(drawn, held)
                dropped += out
            examples += sft_examples(tok, drawn, form=form, answer_only=share)
            kept += drawn
        if exclude:
            log.warning("sft: %d of the drawn puzzles are in sft.exclude; dropped", dropped)
        unplanned("sft", len(kept), len(examples))
        if extra_spec:  # beside the puzzles' own examples, e.g. an experiment's lessons
            extra = configfile.load_object(extra_spec, "sft.extra_examples")(tok, kept)
            log.warning("sft: %d extra examples added (%s)", len(extra), extra_spec)
            examples += extra
        return examples

    extra_spec = cfg.sft.get("extra_examples", "")
    mix = sft_mix(cfg)
    parts = (tok_dir.name, cfg.sft.env, cfg.sft.instances, sft_holes, *mode)
    parts += tuple(p for name, part in mix for p in (f"mix-{name}", part))
    parts += (f"extra-{extra_spec}",) if extra_spec else ()
    bare = cfg.sft.get("answer_only", 0.0) if thinking else 0.0
    parts += (f"answer-only-{bare}",) if bare else ()
    sft_data = cached(
        name("sft", ".jsonl", *parts, *([exclude_key] if exclude else [])),
        sft,
        save_examples,
        load_examples,
    )
    cap = cfg.sft.get("max_completion_tokens", 0)
    if cap:  # a batch pads to its longest: one endless trace would make every update slow
        kept = [e for e in sft_data if len(e.completion) <= cap]
        log.warning("sft: %d of %d examples longer than sft.max_completion_tokens=%d; dropped",
                    len(sft_data) - len(kept), len(sft_data), cap)  # fmt: skip
        sft_data = kept

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
