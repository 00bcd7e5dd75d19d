"""Per-puzzle outcome rows, read and checked where they enter: an evaluation's verdicts.jsonl
and a run's validation.json. Ids are unique non-empty strings, "valid" and "optimal" real
booleans, labels of the right type; where a row or its run records the puzzle it answered
(its content hash), `check_puzzles` holds it to the instance file it is compared on. A
violation is one ValueError naming the file, the line or row, the field and what is allowed."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence

from mapfjax.env import io
from mapfjax.env.types import Problem

# Fields a row may carry, and what each must be when it is there ("id" and "valid" always are).
_BOOLEANS = ("valid", "optimal", "truncated")
_OPTIONAL_BOOLEANS = ("needs_wait",)  # None: no label
VALIDATION_SET = "validation_set.jsonl"  # a run's held-out puzzles, beside its rounds


def check_row(row, where: str) -> dict:
    """`row` itself when it is a well-formed outcome row; else ValueError naming `where`."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: a {type(row).__name__}; allowed: a JSON object per puzzle")
    rid = row.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError(f"{where}: field 'id' = {rid!r:.60}; allowed: a non-empty string")
    if "valid" not in row:
        raise ValueError(f"{where} (id {rid!r}): field 'valid' is missing")
    for field in _BOOLEANS + _OPTIONAL_BOOLEANS:
        value = row.get(field)
        if field in row and not (isinstance(value, bool) or (value is None and field != "valid")):
            allowed = "true or false" + (" or null" if field != "valid" else "")
            raise ValueError(f"{where} (id {rid!r}): field {field!r} = {value!r:.40}; allowed: "
                             f"{allowed}")  # fmt: skip
    failure = row.get("failure")
    if failure is not None and not isinstance(failure, str):
        raise ValueError(f"{where} (id {rid!r}): field 'failure' = {failure!r:.40}; allowed: "
                         "a failure name or null")  # fmt: skip
    puzzle = row.get("puzzle")
    if puzzle is not None and not isinstance(puzzle, str):
        raise ValueError(f"{where} (id {rid!r}): field 'puzzle' = {puzzle!r:.40}; allowed: "
                         "the puzzle's content hash")  # fmt: skip
    return dict(row)


def _by_id(rows: Sequence[tuple[str, dict]], path) -> dict[str, dict]:
    """Rows by id; ValueError naming both places of an id given twice (a later row would
    silently replace the first: a verdict could turn)."""
    out, first = {}, {}
    for where, row in rows:
        rid = row["id"]
        if rid in out:
            raise ValueError(f"{where}: id {rid!r} again (first at {first[rid]}); allowed: "
                             f"one row per puzzle in {path}")  # fmt: skip
        out[rid], first[rid] = row, where
    return out


def read_verdicts(out_dir) -> dict[str, dict]:
    """An evaluation's verdict rows (`out_dir/verdicts.jsonl`) by puzzle id, each line checked
    (`check_row`); ids unique."""
    path = pathlib.Path(out_dir) / "verdicts.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{path}: not readable as an evaluation's verdicts ({e})") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        rows.append((f"{path}:{n}", check_row(row, f"{path}:{n}")))
    return _by_id(rows, path)


def read_validation(path) -> list[dict]:
    """The per-puzzle rows of a run's validation.json, each checked (`check_row`), ids
    unique; a ValueError naming the file, the row and what is wrong otherwise."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not JSON ({e!s:.80})") from None
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: not a validation.json with a 'rows' list of objects with an "
                         "'id' and 'valid'")  # fmt: skip
    checked = [(f"{path} row {k}", check_row(r, f"{path} row {k}")) for k, r in enumerate(rows)]
    _by_id(checked, path)
    return [r for _, r in checked]


def read_outcomes(path) -> dict[str, dict]:
    """Per-puzzle rows by id from an evaluation's --out_dir (`read_verdicts`) or a run's
    validation.json (`read_validation`)."""
    path = pathlib.Path(path)
    if path.is_dir():
        return read_verdicts(path)
    return {r["id"]: r for r in read_validation(path)}


def recorded_puzzles(path) -> dict[str, str] | None:
    """id -> the content hash of the puzzle each row answered, as the outcomes record it: the
    rows' own "puzzle" field (evaluations), or the run's `validation_set.jsonl` beside a
    round's validation.json; None when they record none (older evaluations)."""
    path = pathlib.Path(path)
    rows = read_outcomes(path)
    if rows and all("puzzle" in r for r in rows.values()):
        return {i: r["puzzle"] for i, r in rows.items()}
    held = path.parent.parent / VALIDATION_SET if path.is_file() else None
    if held is not None and held.is_file():
        return {p.id: io.puzzle_hash(p) for p in io.load_instances(held)}
    return None


def check_puzzles(path, problems: Sequence[Problem]) -> bool:
    """Whether `path`'s outcomes record the puzzles they answered (see `recorded_puzzles`);
    when they do, ValueError naming the first id whose puzzle differs from `problems`' (the
    same ids on other maps, starts or goals: another instance set)."""
    recorded = recorded_puzzles(path)
    if recorded is None:
        return False
    for p in problems:
        if p.id in recorded and recorded[p.id] != io.puzzle_hash(p):
            raise ValueError(
                f"{path}: puzzle {p.id!r} is not the instance file's (another map, start or "
                "goal under the same id); compare evaluations of one instance set"
            )
    return True
