"""Files: instance and answer JSONL, the paper's published benchmark rows, and the MovingAI
.map/.scen formats. Every reader names the file, line and field of a bad input; writers are atomic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mapfjax import files
from mapfjax.checks import is_int
from mapfjax.env.text import parse_prompt
from mapfjax.env.types import FROZEN, HOLE_CELL, Problem, ProblemError, check_problem


class JsonlError(ValueError):
    """A bad line in a data file: carries `path`, 1-based `line` and `field` (None = whole line)."""

    def __init__(self, path, line: int, field: str | None, message: str):
        self.path, self.line, self.field = str(path), line, field
        where = f"{path}:{line}: " + (f"field '{field}': " if field else "")
        super().__init__(where + message)


def save_jsonl(path, rows: Iterable[dict]) -> None:
    """Write one JSON object per line, atomically."""
    lines = [json.dumps(row, ensure_ascii=False, separators=(", ", ": ")) for row in rows]
    files.atomic_write(path, "".join(line + "\n" for line in lines))


# --- reading JSON rows with line numbers -----------------------------------------------------


def read_bytes(path) -> bytes:
    """A file's bytes; a missing file or a directory raises an OSError naming the path."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; expected a file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    return path.read_bytes()


def _read_text(path) -> str:
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise JsonlError(path, line, None, f"not valid UTF-8 ({e.reason})") from None


def _iter_jsonl(path) -> Iterator[tuple[int, dict]]:
    """(1-based line, object) for every non-blank line; malformed lines raise JsonlError."""
    for n, line in enumerate(_read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        row = _json_line(path, n, line)
        if not isinstance(row, dict):
            raise JsonlError(path, n, None, f"expected a JSON object, got {type(row).__name__}")
        yield n, row


def _json_line(path, n: int, line: str):
    """json.loads of one line; every failure (syntax, nesting too deep, a number too long to
    read) is a JsonlError naming the file and line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise JsonlError(path, n, None, f"malformed JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise JsonlError(path, n, None, "malformed JSON (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise JsonlError(path, n, None, f"malformed JSON ({e})") from None


def _iter_json_array(path, raw: str) -> Iterator[tuple[int, dict]]:
    """(line where the element starts, object) for each element of a top-level JSON list."""
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(raw, raw.index("[") + 1).end()
    line_of = lambda p: raw.count("\n", 0, p) + 1
    if raw.startswith("]", pos):
        return
    while True:
        try:
            row, end = dec.raw_decode(raw, pos)
        except json.JSONDecodeError as e:
            raise JsonlError(path, e.lineno, None, f"malformed JSON ({e.msg})") from None
        except (RecursionError, ValueError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise JsonlError(path, line_of(pos), None, f"malformed JSON ({why})") from None
        if not isinstance(row, dict):
            raise JsonlError(path, line_of(pos), None, f"expected a JSON object, got {row!r:.40}")
        yield line_of(pos), row
        pos = ws.match(raw, end).end()
        if raw.startswith("]", pos):
            rest = ws.match(raw, pos + 1).end()
            if rest != len(raw):
                raise JsonlError(path, line_of(rest), None, "unexpected text after the JSON list")
            return
        if not raw.startswith(",", pos):
            raise JsonlError(path, line_of(pos), None, "expected ',' or ']' between list items")
        pos = ws.match(raw, pos + 1).end()


# --- instance JSONL --------------------------------------------------------------------------


def _is_cells(v) -> bool:
    return isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 2 and all(is_int(x) for x in c) for c in v
    )


def _is_label(v) -> bool:
    return v is None or (is_int(v) and v >= 0)


# field -> (required, type check, what is allowed); a registry rather than an if/elif chain.
INSTANCE_FIELDS: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "id": (True, lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "grid": (
        True,
        lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(r, str) for r in v),
        "a non-empty list of row strings of 'F' (frozen) / 'H' (hole)",
    ),
    "starts": (True, _is_cells, "a list of [row, col] integer pairs, one per agent"),
    "goals": (True, _is_cells, "a list of [row, col] integer pairs, one per agent"),
    "optimal_soc": (False, _is_label, "a non-negative integer or null"),
    "optimal_makespan": (False, _is_label, "a non-negative integer or null"),
    "needs_wait": (False, lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "meta": (
        False,
        lambda v: v is None or isinstance(v, dict),
        "a JSON object (what the set's builder knew, e.g. the benchmark cell) or null",
    ),
}
_FIELD_IN_MESSAGE = re.compile(r"'(grid|starts|goals)'")


def _check_fields(path, line: int, row: dict, fields: dict, allow_extra: bool) -> None:
    for name, (required, ok, allowed) in fields.items():
        if name not in row:
            if required:
                raise JsonlError(path, line, name, f"missing; expected {allowed}")
        elif not ok(row[name]):
            raise JsonlError(path, line, name, f"{row[name]!r:.80} is not {allowed}")
    unknown = sorted(set(row) - set(fields))
    if unknown and not allow_extra:
        raise JsonlError(
            path, line, unknown[0], f"unknown field; allowed fields: {', '.join(fields)}"
        )


def problem_from_row(row: dict, path="<row>", line: int = 1) -> Problem:
    """Validate one instance object (the JSONL schema) and build its Problem."""
    _check_fields(path, line, row, INSTANCE_FIELDS, allow_extra=False)
    problem = Problem(
        id=row["id"],
        grid=tuple(row["grid"]),
        starts=tuple(tuple(c) for c in row["starts"]),
        goals=tuple(tuple(c) for c in row["goals"]),
        meta=row.get("meta"),
    ).with_labels(row.get("optimal_soc"), row.get("optimal_makespan"), row.get("needs_wait"))
    try:
        check_problem(problem)
    except ProblemError as e:
        m = _FIELD_IN_MESSAGE.search(str(e))
        raise JsonlError(path, line, m.group(1) if m else "grid", str(e)) from None
    return problem


def problem_to_row(p: Problem) -> dict:
    """The JSONL object of a Problem; labels are written only when known."""
    row = {
        "id": p.id,
        "grid": list(p.grid),
        "starts": [list(c) for c in p.starts],
        "goals": [list(c) for c in p.goals],
    }
    for name in ("optimal_soc", "optimal_makespan", "needs_wait", "meta"):
        if getattr(p, name) is not None:
            row[name] = getattr(p, name)
    return row


def puzzle_hash(p: Problem) -> str:
    """16 hex digits of the SHA-256 of the puzzle itself (grid, starts, goals; not the id or
    labels): stored with each answer, so an answer is never scored against another puzzle
    that happens to share its id."""
    body = json.dumps(
        [list(p.grid), [list(c) for c in p.starts], [list(c) for c in p.goals]],
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def puzzle_hashes(paths: Iterable) -> set[str]:
    """The `puzzle_hash` of every instance in the instance files `paths` (a set to leave out
    with `held_out`)."""
    return {puzzle_hash(p) for path in paths for p in load_instances(path)}


def held_out(problems: Sequence[Problem], seen: set[str]) -> tuple[list[Problem], int]:
    """The problems whose puzzle (`puzzle_hash`) is not in `seen`, and how many were dropped:
    a validation set that shares no puzzle with the training data."""
    kept = [p for p in problems if puzzle_hash(p) not in seen]
    return kept, len(problems) - len(kept)


def load_instances(path) -> list[Problem]:
    """Read an instance JSONL file; raises JsonlError naming file, line and field."""
    problems, first_line = [], {}
    for n, row in _iter_jsonl(path):
        p = problem_from_row(row, path, n)
        if p.id in first_line:
            raise JsonlError(
                path, n, "id", f"duplicate id {p.id!r} (first on line {first_line[p.id]})"
            )
        first_line[p.id] = n
        problems.append(p)
    return problems


def require_instances(path) -> list[Problem]:
    """`load_instances` for commands that work on the problems: a file with none (empty, or
    blank lines only) raises ValueError naming it, instead of a run that scores nothing."""
    problems = load_instances(path)
    if not problems:
        raise ValueError(f"{path}: no instances (the file is empty); give an instance JSONL file")
    return problems


def save_instances(path, problems: Sequence[Problem]) -> None:
    """Write problems as instance JSONL (atomically) after validating them."""
    seen = set()
    for p in problems:
        check_problem(p, where=f"problem {p.id!r}")
        if p.id in seen:
            raise ProblemError(f"duplicate problem id {p.id!r}; ids must be unique in one file")
        seen.add(p.id)
    save_jsonl(path, (problem_to_row(p) for p in problems))


ANSWER_FIELDS = {
    "id": (True, lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "text": (
        True,
        lambda v: v is None or isinstance(v, str),
        "a string (the model's response, or the oracle's plan from `solve`) or null (no answer: "
        "`solve` found no plan in its budget)",
    ),
    "puzzle_hash": (
        False,
        lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v) is not None,
        "16 lowercase hex digits (io.puzzle_hash of the instance answered)",
    ),
}


@dataclasses.dataclass(frozen=True)
class Answer:
    """One answer line: its 1-based line in the file (blank lines counted), the instance id,
    the raw text and the hash of the puzzle it answers (None when the file has none)."""

    line: int
    id: str
    text: str
    puzzle_hash: str | None = None


def read_answer_lines(path) -> list[Answer]:
    """Every `{"id", "text"[, "puzzle_hash"]}` line of an answer file, in file order. Extra
    fields are ignored (`solve` writes its status, soc and makespan beside the plan) and an id
    may repeat (several samples per instance). A line whose text is null is no answer (`solve`
    found no plan): it is checked like the others and left out, so its instance counts as
    unanswered."""
    out = []
    for n, row in _iter_jsonl(path):
        _check_fields(path, n, row, ANSWER_FIELDS, allow_extra=True)
        if row["text"] is not None:
            out.append(Answer(n, row["id"], row["text"], row.get("puzzle_hash")))
    return out


# What to do with an id answered on several lines: refuse (the default: which one counts would
# otherwise be a silent choice), keep its first or last answer, or keep them all (samples).
DUPLICATES = ("error", "first", "last", "all")


def one_answer_per_id(path, answers: Sequence[Answer], duplicates: str = "error") -> list[Answer]:
    """`answers` (of the file `path`) with one per id, in first-appearance order. An id on
    several lines raises JsonlError listing the ids and their lines unless `duplicates` is
    "first" or "last" ("all" returns `answers` as they are: several samples per id)."""
    if duplicates not in DUPLICATES:
        raise ValueError(f"duplicates = {duplicates!r}; allowed: {', '.join(DUPLICATES)}")
    if duplicates == "all":
        return list(answers)
    lines: dict[str, list[int]] = {}
    for a in answers:
        lines.setdefault(a.id, []).append(a.line)
    repeated = {i: ls for i, ls in lines.items() if len(ls) > 1}
    if repeated and duplicates == "error":
        shown = "; ".join(f"{i!r} on lines {ls}" for i, ls in list(repeated.items())[:5])
        first = min(ls[1] for ls in repeated.values())
        raise JsonlError(
            path, first, "id",
            f"{len(repeated)} id(s) answered more than once ({shown}"
            f"{' ...' if len(repeated) > 5 else ''}); keep one answer per id, or choose one "
            "with --duplicates=first or --duplicates=last",
        )  # fmt: skip
    keep: dict[str, Answer] = {}
    for a in answers:
        if duplicates == "last" or a.id not in keep:
            keep[a.id] = a
    return list(keep.values())


def load_answers(path) -> list[tuple[str, str]]:
    """(id, text) pairs of an answer file, in file order (see `read_answer_lines`)."""
    return [(a.id, a.text) for a in read_answer_lines(path)]


def check_answers_match(path, answers: Sequence[Answer], problems: dict[str, Problem]) -> None:
    """Refuse answers written for another puzzle with the same id: an answer whose
    `puzzle_hash` differs from its instance's raises ValueError naming the file, the lines and
    the ids. Ids not among `problems` and answers without a hash are left to the caller."""
    bad = [
        a
        for a in answers
        if a.puzzle_hash is not None
        and a.id in problems
        and a.puzzle_hash != puzzle_hash(problems[a.id])
    ]
    if bad:
        shown = ", ".join(f"line {a.line} {a.id!r}" for a in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(
            f"{path}: field 'puzzle_hash': {len(bad)} answer(s) were written for another puzzle "
            f"with the same id ({shown}{more}); use the answers of this instance file or "
            "another answers file"
        )


# --- the paper's published rows --------------------------------------------------------------

PAPER_FIELDS = {
    "sample_id": (True, lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "num_agents": (True, lambda v: is_int(v) and v >= 1, "a positive integer"),
    "text": (True, lambda v: isinstance(v, str), "the prompt string"),
}


def import_paper_rows(path) -> list[Problem]:
    """Problems from the paper's benchmark rows (a JSON list or JSONL of objects with
    `sample_id`, `num_agents`, `text`; other fields ignored). id = sample_id."""
    raw = _read_text(path)
    rows = _iter_json_array(path, raw) if raw.lstrip().startswith("[") else _iter_jsonl(path)
    problems, first_line = [], {}
    for n, row in rows:
        _check_fields(path, n, row, PAPER_FIELDS, allow_extra=True)
        sid = row["sample_id"]
        if sid in first_line:
            raise JsonlError(
                path, n, "sample_id", f"duplicate {sid!r} (first on line {first_line[sid]})"
            )
        first_line[sid] = n
        try:
            p = parse_prompt(row["text"], id=sid)
        except ProblemError as e:
            raise JsonlError(path, n, "text", f"cannot read the prompt: {e}") from None
        if p.num_agents != row["num_agents"]:
            raise JsonlError(
                path,
                n,
                "num_agents",
                f"{row['num_agents']} but the prompt has {p.num_agents} agents",
            )
        problems.append(p)
    return problems


# --- MovingAI .map / .scen -------------------------------------------------------------------
# MovingAI coordinates are (x, y) = (column, row), origin top-left; ours are (row, col).

MOVINGAI_PASSABLE = frozenset(".GS")
MOVINGAI_BLOCKED = frozenset("@OTW")


class MovingAIError(ValueError):
    """A bad .map/.scen file; the message names the file and 1-based line."""


def _bfs_length(grid: Sequence[str], start, goal) -> int:
    """4-connected shortest path length avoiding holes, -1 when unreachable."""
    h, w = len(grid), len(grid[0])
    dist = {tuple(start): 0}
    todo = deque([tuple(start)])
    while todo:
        r, c = todo.popleft()
        if (r, c) == tuple(goal):
            return dist[(r, c)]
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < h and 0 <= nc < w and grid[nr][nc] == FROZEN and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                todo.append((nr, nc))
    return -1


def write_movingai(problem: Problem, map_path, scen_path) -> None:
    """Write the map ('.' frozen, '@' hole) and a scen with one line per agent, atomically.

    Scen columns: bucket, map file name, width, height, start_x, start_y, goal_x, goal_y,
    optimal_length (x = column, y = row; length = the agent's own 4-connected shortest path,
    -1 if unreachable; bucket = length // 4). Labels of the Problem are not stored.
    """
    check_problem(problem, where=f"problem {problem.id!r}")
    h, w = problem.height, problem.width
    rows = ["".join("@" if ch == HOLE_CELL else "." for ch in row) for row in problem.grid]
    files.atomic_write(
        map_path, f"type octile\nheight {h}\nwidth {w}\nmap\n" + "\n".join(rows) + "\n"
    )
    lines = ["version 1"]
    for (sr, sc), (gr, gc) in zip(problem.starts, problem.goals):
        d = _bfs_length(problem.grid, (sr, sc), (gr, gc))
        fields = (max(d, 0) // 4, Path(map_path).name, w, h, sc, sr, gc, gr, f"{float(d):.8f}")
        lines.append("\t".join(map(str, fields)))
    files.atomic_write(scen_path, "\n".join(lines) + "\n")


def _read_map(path) -> tuple[str, ...]:
    lines = _read_text(path).splitlines()
    header: dict[str, str] = {}
    n = 0
    while n < len(lines) and lines[n].strip().lower() != "map":
        parts = lines[n].split()
        if len(parts) != 2 or parts[0].lower() not in ("type", "height", "width"):
            raise MovingAIError(
                f"{path}:{n + 1}: expected a header line 'type <t>', 'height <H>', 'width <W>' "
                f"or 'map', got {lines[n]!r:.60}"
            )
        header[parts[0].lower()] = parts[1]
        n += 1
    for key in ("type", "height", "width"):
        if key not in header:
            raise MovingAIError(f"{path}: header line '{key} ...' missing before 'map'")
    try:
        h, w = int(header["height"]), int(header["width"])
    except ValueError:
        raise MovingAIError(f"{path}: height/width must be integers, got {header}") from None
    body = lines[n + 1 : n + 1 + h]
    if len(body) != h:
        raise MovingAIError(f"{path}: header says height {h} but {len(body)} map rows follow")
    grid = []
    for r, row in enumerate(body):
        line = n + 2 + r
        if len(row) != w:
            raise MovingAIError(f"{path}:{line}: map row has {len(row)} cells, width is {w}")
        bad = sorted(set(row) - MOVINGAI_PASSABLE - MOVINGAI_BLOCKED)
        if bad:
            raise MovingAIError(
                f"{path}:{line}: unknown map symbol(s) {bad}; allowed: passable "
                f"{sorted(MOVINGAI_PASSABLE)}, blocked {sorted(MOVINGAI_BLOCKED)}"
            )
        grid.append("".join(FROZEN if ch in MOVINGAI_PASSABLE else HOLE_CELL for ch in row))
    return tuple(grid)


def read_movingai(
    map_path, scen_path, num_agents: int | None = None, id: str | None = None
) -> Problem:
    """A Problem from a MovingAI map and the first `num_agents` scen lines (all when None).

    Scen x is the column and y the row. The id defaults to the scen file's stem.
    """
    grid = _read_map(map_path)
    h, w = len(grid), len(grid[0]) if grid else 0
    lines = _read_text(scen_path).splitlines()
    if not lines or not re.fullmatch(r"version\s+\d+(\.\d+)?", lines[0].strip()):
        raise MovingAIError(f"{scen_path}:1: expected 'version 1' as the first line")
    starts, goals, seen = [], [], {}
    for n, line in enumerate(lines[1:], 2):
        if num_agents is not None and len(starts) == num_agents:
            break
        if not line.strip():
            continue
        parts = line.split("\t") if line.count("\t") == 8 else line.split()
        if len(parts) != 9:
            raise MovingAIError(
                f"{scen_path}:{n}: expected 9 tab-separated fields (bucket map width height "
                f"start_x start_y goal_x goal_y optimal_length), got {len(parts)}"
            )
        try:
            sw, sh, sx, sy, gx, gy = (int(v) for v in parts[2:8])
        except ValueError:
            raise MovingAIError(f"{scen_path}:{n}: width..goal_y must be integers") from None
        if (sw, sh) != (w, h):
            raise MovingAIError(
                f"{scen_path}:{n}: scen says {sw}x{sh} (width x height), the map is {w}x{h}"
            )
        for kind, (x, y) in (("start", (sx, sy)), ("goal", (gx, gy))):
            if not (0 <= x < w and 0 <= y < h):
                raise MovingAIError(
                    f"{scen_path}:{n}: {kind} (x={x}, y={y}) lies outside the {w}x{h} map "
                    f"(x = column 0..{w - 1}, y = row 0..{h - 1})"
                )
            if grid[y][x] == HOLE_CELL:
                raise MovingAIError(f"{scen_path}:{n}: {kind} (x={x}, y={y}) is a blocked cell")
            if (kind, y, x) in seen:
                raise MovingAIError(
                    f"{scen_path}:{n}: {kind} (x={x}, y={y}) repeats line {seen[(kind, y, x)]}"
                )
            seen[(kind, y, x)] = n
        starts.append((sy, sx))
        goals.append((gy, gx))
    if num_agents is not None and len(starts) < num_agents:
        raise MovingAIError(f"{scen_path}: asked for {num_agents} agents, file has {len(starts)}")
    problem = Problem(
        id=Path(scen_path).stem if id is None else id,
        grid=grid,
        starts=tuple(starts),
        goals=tuple(goals),
    )
    try:
        check_problem(problem)
    except ProblemError as e:
        raise MovingAIError(f"{map_path} + {scen_path}: {e}") from None
    return problem
