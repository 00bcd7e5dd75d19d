"""Round records: what round n's `RoundRecord` holds (its config, validation failures, the
engineer's previous summary, training facts, rollout statistics), and a finished round's
record and decision read back, or the record recomputed from the round's files."""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib

from mapfjax import stats
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer.proposal import Decision
from mapfjax.engineer.rundir import (
    Position,
    RunDirError,
    check_digest,
    read_json,
    redo_advice,
    write_json,
)
from mapfjax.engineer.settings import RunSettings
from mapfjax.rl import driver

log = logging.getLogger(__name__)

# A finished round's files that its successors and the report trust (record.json is derived
# from them and recomputed when unreadable).
ROUND_FILES = ("config.json", "validation.json", "decision.json")


def training_info(s: RunSettings, n: int) -> dict:
    """The T module's facts about round n's training (part of its record)."""
    return s.training.as_dict(n)


def rollouts(out_dir: pathlib.Path, s: RunSettings) -> dict:
    """The round's per-size training-rollout statistics (`RoundRecord.rollouts`)."""
    per_size = driver.phase_size_stats(out_dir / "metrics.jsonl", s.grpo.group_size)
    return driver.size_summary(per_size)


def previous_summary(workdir: pathlib.Path, n: int, position: Position) -> str:
    """S: the engineer's rationale for choosing C_n, written at the end of round n - 1."""
    prev = workdir / f"round_{n - 1}" / "decision.json"
    if n == 0 or not prev.exists():
        return ""
    return read_json(prev, redo_advice(workdir, n - 1, position)).get("summary", "")


def validation_counts(rows) -> tuple[dict, dict]:
    """What a round record keeps of its validation rows: `context.failure_breakdown` and
    `context.wait_breakdown`; ValueError (or KeyError, TypeError) on malformed rows."""
    return ctx_lib.failure_breakdown(rows), ctx_lib.wait_breakdown(rows)


def round_record(
    workdir, n: int, s: RunSettings, config: dict, counts: tuple[dict, dict], position: Position
):
    """Round n's `RoundRecord` from its config (a dict), its validation counts
    (`validation_counts`), the previous decision and its metrics.jsonl."""
    validation, wait_split = counts
    return ctx_lib.RoundRecord(
        round=n,
        config=config,
        validation=validation,
        wait_split=wait_split,
        summary=previous_summary(workdir, n, position),
        training=training_info(s, n),
        rollouts=rollouts(workdir / f"round_{n}", s),
    )


def finished_round(workdir: pathlib.Path, n: int, s: RunSettings, position: Position):
    """(record, decision or None) of a round with a DONE file.

    A missing or unreadable record.json is recomputed from the round's config.json and
    validation.json (and the previous decision's summary) and written back, with a warning;
    any other unreadable file raises RunDirError naming it and what to delete.
    """
    out = workdir / f"round_{n}"
    advice = redo_advice(workdir, n, position)
    path = out / "record.json"
    try:
        record = ctx_lib.RoundRecord.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        config = read_json(out / "config.json", f"{path} cannot be recomputed: {advice}")
        val = read_json(out / "validation.json", f"{path} cannot be recomputed: {advice}")
        try:
            counts = validation_counts(val["rows"])
        except (KeyError, TypeError, ValueError) as bad:
            raise RunDirError(
                f"{out / 'validation.json'}: no usable 'rows' ({bad!r}); {path} cannot be "
                f"recomputed: {advice}"
            ) from bad
        record = round_record(workdir, n, s, config, counts, position)
        write_json(path, record.to_dict())
        log.warning("%s: unreadable (%s); recomputed from config.json and validation.json", path, e)
    decision = None
    if (out / "decision.json").exists():
        d = read_json(out / "decision.json", advice)
        try:
            decision = Decision.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise RunDirError(f"{out / 'decision.json'}: not a decision ({e!r}); {advice}") from e
    # The report reads the rows: a torn file is named here, not in a traceback later.
    read_json(out / "validation.json", advice)
    for name in ROUND_FILES:
        if (out / name).exists():
            check_digest(workdir, out / name)
    return record, decision


def records_summary(records) -> list[dict]:
    """Per round: mean valid/optimal over sizes (for logs and tests)."""
    return [
        dataclasses.asdict(r) | {"mean_valid": stats.mean_rate(r.validation.values(), "valid")}
        for r in records
    ]
