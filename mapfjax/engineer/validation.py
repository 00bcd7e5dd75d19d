"""The closed loop's held-out validation: the fixed puzzle set (generated once, then read
back), greedy and sampled answers on it, and its rates with 95 % intervals per size and pooled
(validation.json, validation.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import jax
import numpy as np

from mapfjax import configfile, files, stats
from mapfjax.engineer.rundir import read_instances, save_instances, write_json
from mapfjax.engineer.settings import ValidationSettings
from mapfjax.env import io, reward
from mapfjax.rl import rollout
from mapfjax.rl.data import generate_problems


def held_out_set(workdir: pathlib.Path, v: ValidationSettings) -> list:
    """The fixed held-out validation set (generated once, then read back): per_size puzzles
    per size, spread over `hole_ratios` when given (else `hole_ratio`), drawn with `v.seed`,
    then the same again from each of `v.extra_seeds` (ids prefixed `x<seed>_`; a puzzle
    already in the set is left out)."""
    path = workdir / "validation_set.jsonl"
    if path.exists():
        return read_instances(workdir, path)
    n = v.per_size * len(v.sizes)
    cfg, ratios = v.generator_config(), tuple(v.hole_ratios)
    probs = generate_problems(cfg, n, v.seed, 1, ratios)
    for seed in v.extra_seeds:
        drawn = generate_problems(cfg, n, seed, 1, ratios)
        drawn = [dataclasses.replace(p, id=f"x{seed}_{p.id}") for p in drawn]
        probs += io.held_out(drawn, {io.puzzle_hash(p) for p in probs})[0]
    save_instances(workdir, path, probs)
    return probs


def held_out_file(spec: str, root: pathlib.Path) -> pathlib.Path:
    """The held-out set of the training config `spec` (FILE.py or FILE.py:ARG) as an instance
    file under `root` (drawn as `held_out_set` draws it, in a folder keyed by the config's
    validation settings, so a changed config draws anew): what a tiny-model recipe keeps out
    of its SFT data (`sft.exclude`)."""
    path, _, arg = spec.partition(":")
    v = ValidationSettings.from_config(configfile.get_config(path, arg))
    key = json.dumps(dataclasses.asdict(v), sort_keys=True, default=list)
    where = root / hashlib.sha256(key.encode()).hexdigest()[:10]
    where.mkdir(parents=True, exist_ok=True)
    held_out_set(where, v)
    return where / "validation_set.jsonl"


def validate(trainer, tokenizer, problems, v: ValidationSettings, enable_thinking: bool,
             out_dir: pathlib.Path, key: jax.Array) -> list[dict]:  # fmt: skip
    """Greedy answers, and `v.samples` answers at temperature 1 drawn from `key`, on the
    held-out set; writes validation.json (one row per puzzle) and validation.md (rates with
    95 % intervals per size and pooled). Returns the rows."""
    greedy = rollout.greedy_eval(
        trainer,
        tokenizer,
        problems,
        max_new_tokens=v.max_new_tokens,
        batch_size=v.batch_size,
        enable_thinking=enable_thinking,
        bucket=v.bucket,
    )
    rows = [dict(r) for r in greedy.rows]
    k = int(v.samples)
    if k:
        hits = _sample_hits(trainer, tokenizer, problems, k, v, enable_thinking, key)
        for row, h in zip(rows, hits, strict=True):
            row["samples"], row["samples_valid"] = k, int(h)
    write_json(out_dir / "validation.json", {"rows": rows, **validation_summary(rows)})
    files.atomic_write(out_dir / "validation.md", (validation_table(rows) + "\n").encode())
    return rows


def _sample_hits(trainer, tokenizer, problems, k: int, v: ValidationSettings,
                 enable_thinking: bool, key: jax.Array) -> list[int]:  # fmt: skip
    """Valid answers among k samples at temperature 1, per problem."""
    cfg = rollout.SamplingConfig(
        max_new_tokens=v.max_new_tokens,
        temperature=1.0,
        enable_thinking=enable_thinking,
        bucket=v.bucket,
    )
    model = rollout.policy_model(trainer)
    per = max(1, v.batch_size // k)
    hits: list[int] = []
    for i in range(0, len(problems), per):
        chunk = problems[i : i + per]
        texts = rollout.sample(model, tokenizer, chunk, k, cfg, jax.random.fold_in(key, i)).texts
        verdict, _ = rollout.score(chunk, k, texts, reward.RewardConfig())
        hits += np.asarray(verdict.valid).reshape(-1, k).sum(1).tolist()
    return hits


def _estimates(rows) -> dict[str, stats.Estimate]:
    """Greedy valid (Wilson interval) and mean@k (bounded-mean interval) over `rows`."""
    out = {"greedy_valid": stats.proportion([r["valid"] for r in rows])}
    if rows and "samples" in rows[0]:
        out["mean_at_k"] = stats.bounded_mean([stats.sample_share(r) for r in rows])
    return out


def _by_size(rows) -> list[tuple[str, list]]:
    sizes = sorted({r["size"] for r in rows})
    return [(f"{n}x{n}", [r for r in rows if r["size"] == n]) for n in sizes]


def validation_summary(rows) -> dict:
    """JSON-ready estimates ({"value", "low", "high", "n"}), pooled and per size."""

    def as_dicts(rs):
        return {k: e.as_dict() for k, e in _estimates(rs).items()}

    return {"pooled": as_dicts(rows), "per_size": {n: as_dicts(rs) for n, rs in _by_size(rows)}}


def validation_table(rows) -> str:
    """Markdown: per size and pooled, n, greedy valid % and mean@k % with 95 % intervals."""

    sampled = bool(rows) and "samples" in rows[0]
    header = ["size", "n", "greedy valid %"]
    if sampled:
        header.append(f"mean@{rows[0]['samples']} %")
    table = []
    for name, rs in [*_by_size(rows), ("all", rows)]:
        e = _estimates(rs)
        line = [name, len(rs), stats.interval_text(e["greedy_valid"])]
        table.append(line + ([stats.interval_text(e["mean_at_k"])] if sampled else []))
    return stats.markdown_table(header, table)
