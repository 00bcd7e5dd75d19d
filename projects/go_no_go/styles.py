"""The three ways a trace transcribed the map before its moves (projects/trace_probe measured
which a small model learns; the shipped trace writes `grid`, `mapfjax.env.trace.map_lines`):

    holes  `H: (0, 2) (1, 1)`: every hole as a cell, row-major (`H: none` without holes);
    rows   `r1: F H F | (1, 1)`: each row copied with one token per cell, then its holes;
    grid   `r1: (1, 0) F (1, 1) H (1, 2) F`: each row, every cell labelled by its coordinate.

Every style then writes one line per agent (start and goal) and the same move lines.
"""

from __future__ import annotations

import re

from mapfjax.env import trace
from mapfjax.env.types import HOLE_CELL, Problem

STYLES = ("holes", "rows", "grid")
NONE = "none"
_STEP = re.compile(r"^t(\d{1,4})$")
_CELL = re.compile(r"\((\d{1,2}), (\d{1,2})\)")


def check_style(style: str) -> None:
    """A ValueError naming `style` unless it is one of STYLES."""
    if style not in STYLES:
        raise ValueError(f"trace style {style!r}: allowed {STYLES}")


def map_lines(problem: Problem, style: str) -> list[str]:
    """The map's lines in `style` (see the module docstring)."""
    check_style(style)
    if style == "grid":
        return trace.map_lines(problem)
    holes = trace.hole_cells(problem)
    if style == "holes":
        return [f"{HOLE_CELL}: " + (" ".join(trace.cell(rc) for rc in holes) if holes else NONE)]
    marks = trace.symbols(problem)
    lines = []
    for r in range(problem.height):
        in_row = [trace.cell(rc) for rc in holes if rc[0] == r]
        copy = " ".join(marks.get((r, c), "F") for c in range(problem.width))
        lines.append(f"r{r}: {copy} | " + (" ".join(in_row) if in_row else NONE))
    return lines


def render_header(problem: Problem, style: str = "holes") -> list[str]:
    """The lines before the first move line: the map in `style`, then each agent's start and
    goal with the grid's symbols."""
    return map_lines(problem, style) + trace.agent_lines(problem)


def detect_style(text: str) -> str:
    """The style a trace's first line is written in ("holes" when it is none of them)."""
    first = text.lstrip("\n").split("\n", 1)[0]
    if not first.startswith("r0:"):
        return "holes"
    return "grid" if first.startswith("r0: (0, 0)") else "rows"


def read_holes(text: str) -> set[tuple[int, int]] | None:
    """The hole cells a trace's map lines name, in any style (None without map lines): what
    a policy believes the map holds, to compare with the truth cell by cell."""
    style, out, lines = detect_style(text), set(), text.strip("\n").splitlines()
    found = False
    for line in lines:
        line = line.strip()
        if _STEP.match(line) or line.startswith("A"):
            break
        cells = [(int(r), int(c)) for r, c in _CELL.findall(line)]
        if style == "holes" and line.startswith(f"{HOLE_CELL}:"):
            out.update(cells)
        elif style == "rows" and "|" in line:
            out.update((int(r), int(c)) for r, c in _CELL.findall(line.split("|", 1)[1]))
        elif style == "grid" and cells:
            marks = line.split(") ")[1:]  # each cell's symbol follows its ") "
            out.update(rc for rc, m in zip(cells, marks, strict=False) if m[:1] == HOLE_CELL)
        else:
            continue
        found = True
    return out if found else None
