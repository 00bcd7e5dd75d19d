"""The answer syntax in pure Python (no JAX): a model's response -> per-agent action lists.

The same syntax as `text.parse_answer` (tests check that they agree on fuzzed text), importable
by a scorer that runs beside another trainer without this package's JAX stack.
"""

from __future__ import annotations

import re

# Action codes and names as in `types` (a test checks they agree): 0 WAIT, 1 UP, 2 DOWN,
# 3 LEFT, 4 RIGHT.
ACTION_NAMES = ("WAIT", "UP", "DOWN", "LEFT", "RIGHT")
WAIT = 0
MAX_STEPS = 256  # longest plan per agent that parses (as in `text.parse_answer`)

_TOKEN_CODES = {name: code for code, name in enumerate(ACTION_NAMES)} | {"STAY": WAIT}
_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
# Optional markdown bullets / quote marks before "Agent <i>:"; '*' and '`' are removed first.
# The answer's syntax is ASCII, as the prompt writes it: agent numbers in the digits 0-9 (not
# a fullwidth or Arabic-Indic digit) and action names in ASCII letters, any case (not `rıght`
# with a dotless i, which str.upper() would turn into RIGHT).
_AGENT_LINE = re.compile(r"^[\s\-•>]*agent\s*([0-9]+)\s*:(.*)$", re.IGNORECASE)
_AGENT_START = re.compile(r"^[\s\-•>]*agent\b", re.IGNORECASE)
_LIST_JUNK = re.compile(r"[\[\](){}'\"“”‘’]")
_SEPARATORS = re.compile(r"[\s,]+")
_MAX_INDEX_DIGITS = 6  # int() of a huge digit string raises; no real answer needs more


def _visible_text(text: str) -> tuple[str, bool]:
    """Text outside Qwen3 think blocks, and whether an unterminated <think> swallowed the end.

    A '</think>' with no open block means the prompt opened the block (as Qwen3 chat templates
    do), so everything before it is thinking too.
    """
    pieces, pos, inside = [], 0, False
    for m in _THINK_TAG.finditer(text):
        closing = bool(m.group(1))
        if not inside and not closing:
            pieces.append(text[pos : m.start()])
            inside = True
        elif inside and closing:
            inside, pos = False, m.end()
        elif not inside and closing:
            pieces, pos = [], m.end()
    if not inside:
        pieces.append(text[pos:])
    return "".join(pieces), inside


def _last_answer_block(text: str) -> str | None:
    """Content of the last '<answer>...</answer>' block (innermost on nesting), else None."""
    block, open_end = None, None
    for m in _ANSWER_TAG.finditer(text):
        if not m.group(1):
            open_end = m.end()
        elif open_end is not None:
            block, open_end = text[open_end : m.start()], None
    return block


def parse_answer(
    text: str, num_agents: int, max_steps: int = MAX_STEPS
) -> tuple[list[list[int]] | None, str | None]:
    """Parse one model response into per-agent action-code lists.

    Returns (plans, None) on success, (None, reason) on a parse error; never raises on any text.
    Think blocks are ignored and the LAST '<answer>...</answer>' block is used, so a model may
    draft answers while reasoning. Inside the block, lines not starting with 'Agent' are ignored;
    'Agent <i>: <list>' lines give the plans (any case, commas and/or spaces, optional brackets
    or quotes, STAY = WAIT, empty list = stay).
    """
    visible, unterminated = _visible_text(text)
    block = _last_answer_block(visible)
    if block is None:
        if unterminated:
            return None, "unterminated <think> block: no answer after the thinking"
        return None, "no <answer>...</answer> block"
    plans: dict[int, list[int]] = {}
    for line in block.splitlines():
        line = line.replace("*", "").replace("`", "")
        m = _AGENT_LINE.match(line)
        if m is None:
            if _AGENT_START.match(line):
                bad = line.strip()[:60]
                return None, f"malformed agent line {bad!r}; expected 'Agent <i>: ...'"
            continue  # prose inside the block
        digits, rest = m.group(1), m.group(2)
        if len(digits) > _MAX_INDEX_DIGITS or int(digits) >= num_agents:
            return None, f"agent index {digits[:12]} out of range (0..{num_agents - 1})"
        idx = int(digits)
        if idx in plans:
            return None, f"duplicate line for Agent {idx}"
        rest = _LIST_JUNK.sub(" ", rest).strip().rstrip(".").strip()
        codes = []
        for tok in _SEPARATORS.split(rest):
            if not tok:
                continue
            code = _TOKEN_CODES.get(tok.upper()) if tok.isascii() else None
            if code is None:
                return None, (
                    f"Agent {idx}: unknown action {tok[:20]!r}; allowed: UP, DOWN, LEFT, RIGHT, "
                    "WAIT, STAY"
                )
            codes.append(code)
            if len(codes) > max_steps:
                return None, f"Agent {idx}: plan longer than max_steps={max_steps}"
        plans[idx] = codes
    missing = [i for i in range(num_agents) if i not in plans]
    if missing:
        return None, f"missing line(s) for Agent {', '.join(map(str, missing))}"
    return [plans[i] for i in range(num_agents)], None
