"""The text interface: render a Problem as the paper's prompt, parse model answers into padded
action arrays, and recover a Problem from a rendered (ours or the paper's) prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from flax import struct

from mapfjax.env.answer import parse_answer  # the answer syntax, pure Python
from mapfjax.env.types import (
    ACTION_NAMES,
    FROZEN,
    HOLE_CELL,
    WAIT,
    Problem,
    ProblemError,
    check_problem,
)

# Per-agent symbols of the paper, agents 0..4 (case matters).
START_SYMBOLS = ("S", "s", "A", "B", "C")
GOAL_SYMBOLS = ("G", "g", "a", "b", "c")

# --- exact prompt wording --------------------------------------------------------------------
PROMPT_HEADER = "Question:"
ROLE_LINE = "You are a multi-agent path planning expert."
MAP_LINE = "There is a {height}x{width} frozen lake map with {agents}:"  # agents: "3 agents"
LEGEND_HEADER = "Legend:"
LEGEND_FROZEN = "F: frozen, safe"
LEGEND_HOLE = "H: hole, never enter"
LEGEND_AGENT = "{start}, {goal}: start and goal of Agent {i}"
AGENT_LINE = "Agent {i} needs to go from ({sr}, {sc}) to ({gr}, {gc})"
RULES = (
    "Rules:",
    "- Positions are (row, col); (0, 0) is the top-left cell.",
    "- All agents act at the same time, one action per step: UP (row-1), DOWN (row+1), "
    "LEFT (col-1), RIGHT (col+1), WAIT (stay).",
    "- Stay on the map and never enter H.",
    "- Two agents may never be in the same cell at the same time, nor swap cells in one step.",
    "- An agent with no actions left stays where it is; every agent must end on its goal.",
    "- Use as few total steps as possible.",
)
ANSWER_INSTRUCTION = (
    "Answer inside <answer></answer> with one line per agent, Agent 0 first; an empty list "
    "means the agent stays. Example:"
)
ANSWER_EXAMPLE = "<answer>\nAgent 0: UP, RIGHT, WAIT\nAgent 1: LEFT\n</answer>"


def render_prompt(problem: Problem) -> str:
    """The prompt for one puzzle (paper's header/grid/legend/agent lines, then our rules).

    Raises ProblemError for a malformed problem or more than 5 agents (no symbols for them).
    Where one agent's start is another's goal, the start symbol is shown; the agent lines are
    authoritative.
    """
    check_problem(problem, where=f"problem {problem.id!r}")
    k = problem.num_agents
    if k > len(START_SYMBOLS):
        raise ProblemError(
            f"problem {problem.id!r} has {k} agents; the prompt has symbols for at most "
            f"{len(START_SYMBOLS)} agents"
        )
    cells = [list(row) for row in problem.grid]
    for i, (r, c) in enumerate(problem.goals):
        cells[r][c] = GOAL_SYMBOLS[i]
    for i, (r, c) in enumerate(problem.starts):  # starts drawn last: they win on shared cells
        cells[r][c] = START_SYMBOLS[i]
    used = {ch for row in cells for ch in row}
    lines = [
        PROMPT_HEADER,
        ROLE_LINE,
        MAP_LINE.format(
            height=problem.height, width=problem.width, agents=f"{k} agent" + "s" * (k != 1)
        ),
        *(" ".join(row) for row in cells),
        LEGEND_HEADER,
    ]
    if FROZEN in used:
        lines.append(LEGEND_FROZEN)
    if HOLE_CELL in used:
        lines.append(LEGEND_HOLE)
    lines += [
        LEGEND_AGENT.format(start=START_SYMBOLS[i], goal=GOAL_SYMBOLS[i], i=i) for i in range(k)
    ]
    lines += [
        AGENT_LINE.format(i=i, sr=s[0], sc=s[1], gr=g[0], gc=g[1])
        for i, (s, g) in enumerate(zip(problem.starts, problem.goals))
    ]
    lines += [*RULES, ANSWER_INSTRUCTION, ANSWER_EXAMPLE]
    return "\n".join(lines)


def render_answer(actions: Sequence[Sequence[int]]) -> str:
    """Canonical answer text, e.g. '<answer>\\nAgent 0: UP, WAIT\\nAgent 1:\\n</answer>'."""
    lines = []
    for i, plan in enumerate(actions):
        names = ", ".join(ACTION_NAMES[int(a)] for a in plan)
        lines.append(f"Agent {i}: {names}" if names else f"Agent {i}:")
    return "<answer>\n" + "\n".join(lines) + "\n</answer>"


@struct.dataclass
class ParsedAnswers:
    """A batch of parsed answers (NumPy leaves).

    plans:   int32 [B, N, T]  action codes, padded with WAIT; N = max agents in the batch,
                              T = longest plan rounded up to a multiple of 8 (at least 8).
    lengths: int32 [B, N]     number of actions each agent wrote (0 on a parse error).
    ok:      bool  [B]        False = parse_error (its plans are all WAIT).
    """

    plans: np.ndarray
    lengths: np.ndarray
    ok: np.ndarray


def _round_up(n: int, multiple: int = 8) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def parse_answers_with_reasons(
    texts: Sequence[str], num_agents: int | Sequence[int], max_steps: int = 256
) -> tuple[ParsedAnswers, list[str | None]]:
    """`parse_answers` plus the per-text failure reason (None where the text parsed)."""
    b = len(texts)
    counts = [int(num_agents)] * b if np.ndim(num_agents) == 0 else [int(k) for k in num_agents]
    if len(counts) != b:
        raise ValueError(f"num_agents has {len(counts)} entries for {b} texts")
    if any(k < 1 for k in counts):
        raise ValueError(f"num_agents must be >= 1, got {min(counts)}")
    results = [parse_answer(t, k, max_steps) for t, k in zip(texts, counts)]
    n = max(counts, default=1)
    longest = max((len(p) for plans, _ in results if plans for p in plans), default=0)
    t_pad = _round_up(longest)
    out = np.full((b, n, t_pad), WAIT, np.int32)
    lengths = np.zeros((b, n), np.int32)
    ok = np.zeros(b, bool)
    for i, (plans, _) in enumerate(results):
        if plans is None:
            continue
        ok[i] = True
        for j, p in enumerate(plans):
            out[i, j, : len(p)] = p
            lengths[i, j] = len(p)
    return ParsedAnswers(out, lengths, ok), [reason for _, reason in results]


def parse_answers(
    texts: Sequence[str], num_agents: int | Sequence[int], max_steps: int = 256
) -> ParsedAnswers:
    """Parse a batch of responses (see `parse_answer` for the accepted syntax); never raises on
    any text. `num_agents` is one count for all texts or one per text."""
    return parse_answers_with_reasons(texts, num_agents, max_steps)[0]


# --- prompt parsing --------------------------------------------------------------------------
_NUM = r"(\d{1,6})"
_MAP_RE = re.compile(
    rf"There is an?\s+{_NUM}\s*[x×X]\s*{_NUM}\s+frozen lake map with\s+{_NUM}\s+agents?",
    re.IGNORECASE,
)
_CELL = rf"\(\s*{_NUM}\s*,\s*{_NUM}\s*\)"
# An AGENT_LINE: groups agent, start row, start col, goal row, goal col.
AGENT_RE = re.compile(rf"Agent\s+{_NUM}\s+needs to go from\s*{_CELL}\s*to\s*{_CELL}", re.IGNORECASE)
_GRID_SYMBOLS = frozenset((FROZEN, HOLE_CELL, *START_SYMBOLS, *GOAL_SYMBOLS))


def _grid_row(line: str) -> list[str] | None:
    """The symbols of a grid row ('S F H' or 'SFH'), or None if the line is not one."""
    toks = line.split()
    if len(toks) == 1 and len(toks[0]) > 1:
        toks = list(toks[0])
    if toks and all(t in _GRID_SYMBOLS for t in toks):
        return toks
    return None


def parse_prompt(text: str, id: str = "") -> Problem:
    """Recover the puzzle from a rendered prompt (ours or the paper's published format).

    The agent lines give the coordinates (0-based agent numbering, or 1-based as a fallback);
    the grid gives the holes, any start/goal symbol being a frozen cell. Raises ProblemError
    naming what is missing or inconsistent.
    """
    header = _MAP_RE.search(text)
    if header is None:
        raise ProblemError("prompt has no 'There is a HxW frozen lake map with K agents' line")
    height, width, k = (int(header.group(j)) for j in (1, 2, 3))
    lines = text[header.end() :].splitlines()[1:]
    while lines and not lines[0].strip():
        lines.pop(0)
    rows = []
    for line in lines[:height]:
        row = _grid_row(line)
        if row is None:
            break
        rows.append(row)
    if len(rows) != height:
        raise ProblemError(
            f"prompt announces a {height}x{width} map but {len(rows)} grid row(s) follow the "
            "header (rows are space-separated symbols F H S s A B C G g a b c)"
        )
    for r, row in enumerate(rows):
        if len(row) != width:
            raise ProblemError(f"grid row {r} has {len(row)} cells, the header says {width}")
    found: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
    for m in AGENT_RE.finditer(text):
        i, sr, sc, gr, gc = (int(v) for v in m.groups())
        if i in found:
            raise ProblemError(f"prompt has two 'Agent {i} needs to go from' lines")
        found[i] = ((sr, sc), (gr, gc))
    ids = sorted(found)
    if ids not in (list(range(k)), list(range(1, k + 1))):
        raise ProblemError(
            f"prompt announces {k} agents but has agent lines for {ids}; expected Agent 0..{k - 1}"
        )
    starts = tuple(found[i][0] for i in ids)
    goals = tuple(found[i][1] for i in ids)
    grid = tuple("".join(HOLE_CELL if ch == HOLE_CELL else FROZEN for ch in row) for row in rows)
    problem = Problem(id=id, grid=grid, starts=starts, goals=goals)
    check_problem(problem, where="parsed prompt")
    if k <= len(START_SYMBOLS):  # more agents have no symbols in the grid to cross-check
        expected = {START_SYMBOLS[j]: starts[j] for j in range(k)}
        expected |= {GOAL_SYMBOLS[j]: goals[j] for j in range(k)}
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch in (FROZEN, HOLE_CELL):
                    continue
                if expected.get(ch) != (r, c):
                    raise ProblemError(
                        f"grid symbol {ch!r} at ({r}, {c}) disagrees with the agent lines "
                        f"(expected it at {expected.get(ch, 'no cell: no such agent')})"
                    )
    return problem
