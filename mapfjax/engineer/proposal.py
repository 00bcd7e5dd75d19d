"""Engineer answers -> config diffs: a strict parser (never eval, never import) and its projection.

`parse_proposal` and `apply_proposal` never raise on any text; what they drop is recorded with why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import ml_collections

from mapfjax.env.config import RATIO_FIELDS, ConfigError, key_size, project, size_key, validate

MAX_EDITS = 6  # more edits than this is a rewrite, not a local edit (docs/paper.md section 4)
MAX_CHARS = 200_000  # longer answers are cut here (endless generations)
MAX_SUMMARY_CHARS = 1_000

# Fences open and close at the start of a line, so inline ``` in prose is not a block.
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE
)
_BLOCK_LANGS = ("yaml", "yml", "json", "")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_BARE = re.compile(
    r"^[ \t]*(?:[-*][ \t]+)?[`'\"]?((?:env\.)?sizes\.[A-Za-z0-9_]+\.[A-Za-z_]+)[`'\"]?"
    r"[ \t]*[:=][ \t]*(\S+)[ \t]*,?[ \t]*$",
    re.MULTILINE,
)
# `Summary:`, also in bold (`**Summary:**`, `**Summary**:`), quoted or as a list item.
_SUMMARY = re.compile(
    r"^[ \t>*_#-]*summary[ \t]*(?:\*\*|__)?:(?:\*\*|__)?[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE
)


class _Scalar(str):
    """A YAML or bare-line value as written; only these strings may be read as numbers."""


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A parsed engineer answer.

    raw: the answer text. diff: canonical key ('sizes.s7.data_ratio') -> float, syntax-checked
    only (ranges are the projection's job). rejected: (item, reason) pairs that were dropped.
    summary: the `Summary:` paragraph. source: where the diff came from ('json block',
    'yaml block', 'bare lines' or 'none'). error: why nothing usable was found ('' if usable).
    """

    raw: str
    diff: dict[str, float]
    rejected: tuple[tuple[str, str], ...] = ()
    summary: str = ""
    source: str = "none"
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of one engineer step (everything the run directory records).

    config: the next round's config (validated). changes: what the projection did.
    kept_current: True when the config did not change; `reason` then says why.
    extra: engineer-specific facts (samples, scores, retries), JSON-serialisable.
    """

    engineer: str
    raw: str
    diff: dict[str, float]
    rejected: tuple[tuple[str, str], ...]
    changes: tuple[str, ...]
    config: ml_collections.ConfigDict
    kept_current: bool
    reason: str = ""
    summary: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["config"] = self.config.to_dict()
        d["rejected"] = [list(r) for r in self.rejected]
        d["changes"] = list(self.changes)
        return json.loads(json.dumps(d))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        return cls(
            engineer=d["engineer"],
            raw=d["raw"],
            diff={k: float(v) for k, v in d["diff"].items()},
            rejected=tuple((str(a), str(b)) for a, b in d["rejected"]),
            changes=tuple(d["changes"]),
            config=ml_collections.ConfigDict(d["config"]),
            kept_current=bool(d["kept_current"]),
            reason=d.get("reason", ""),
            summary=d.get("summary", ""),
            extra=dict(d.get("extra", {})),
        )


def format_diff(diff: Mapping[str, float], summary: str = "") -> str:
    """The answer format the prompt asks for; `parse_proposal(format_diff(d)).diff == d`."""
    body = "\n".join(f"{k}: {float(v)!r}" for k, v in diff.items())
    text = f"```yaml\n{body}\n```" if body else "```yaml\n```"
    return f"{text}\nSummary: {summary.strip()}" if summary.strip() else text


def canonical_key(key: str) -> str:
    """'env.sizes.7x7.data_ratio' -> 'sizes.s7.data_ratio'; ValueError says what is allowed."""
    k = key.strip().strip("`'\"").strip()
    if k.startswith("env."):
        k = k[4:]
    parts = k.split(".")
    allowed = f"sizes.s<N>.<field> with field in {list(RATIO_FIELDS)}"
    if len(parts) != 3 or parts[0] != "sizes" or parts[2] not in RATIO_FIELDS:
        raise ValueError(f"unknown key {key!r}; allowed: {allowed}")
    try:
        n = key_size(parts[1])
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return f"sizes.{size_key(n)}.{parts[2]}"


def _number(value: Any) -> float:
    """A finite number from a JSON value or a YAML scalar string; ValueError otherwise."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, int | float):
        v = float(value)
    elif isinstance(value, _Scalar) and _NUMBER.fullmatch(value.strip()):
        v = float(value.strip())
    else:
        raise ValueError(f"{str(value)[:40]!r} is not a number")
    if not math.isfinite(v):
        raise ValueError(f"{str(value)[:40]!r} is not a finite number")
    return v


class _Pairs(list):
    """A JSON object as its (key, value) pairs, so that repeated keys stay visible."""


def _flatten_json(obj: Any, prefix: str, out: list, rejected: list) -> None:
    if isinstance(obj, _Pairs):
        for k, v in obj:
            _flatten_json(v, f"{prefix}{k}.", out, rejected)
    elif prefix:
        out.append((prefix[:-1], obj))
    else:
        rejected.append((str(obj)[:60], "the JSON block is not an object of key: value"))


def _parse_json(body: str) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    def no_constant(name):
        raise ValueError(f"{name} is not a finite number")

    items: list[tuple[str, Any]] = []
    rejected: list[tuple[str, str]] = []
    obj = json.loads(body, parse_constant=no_constant, object_pairs_hook=_Pairs)
    _flatten_json(obj, "", items, rejected)
    return items, rejected


def _parse_yaml(body: str) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """A strict YAML subset: `key: value` lines, nesting by indentation, `#` comments."""
    items: list[tuple[str, Any]] = []
    rejected: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    for line in body.splitlines():
        text = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        if not text.strip() or text.strip() in ("---", "..."):
            continue
        indent = len(text) - len(text.lstrip(" "))
        entry = text.strip()
        if entry.startswith("- "):
            entry = entry[2:].strip()
        key, sep, value = entry.partition(":")
        if not sep or not key.strip():
            rejected.append((entry[:80], "not a `key: value` line"))
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key.strip().strip("`'\"")])
        if value.strip():
            items.append((path, _Scalar(value.strip().rstrip(","))))
        else:
            stack.append((indent, key.strip().strip("`'\"")))
    return items, rejected


def _strip_thinking(text: str) -> tuple[str, str]:
    """The answer after the last `</think>`; an error when the answer ended inside thinking."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1], ""
    if "<think>" in text:
        return "", "the answer ended inside <think> (no </think>): no final answer"
    return text, ""


def _summary(text: str) -> str:
    matches = list(_SUMMARY.finditer(text))
    if not matches:
        return ""
    rest = text[matches[-1].start(1) :]
    paragraph = rest.split("\n\n", 1)[0]
    return " ".join(paragraph.replace("```", " ").split())[:MAX_SUMMARY_CHARS]


def parse_proposal(text: Any, max_edits: int = MAX_EDITS) -> Proposal:
    """Parse an engineer answer; never raises.

    Where the diff comes from: the part after the last `</think>` (an answer that ends inside
    `<think>` has none); the last closed fenced block tagged yaml, yml, json or untagged; if
    there is none, the fallback is every bare line of the form `sizes.s7.hole_ratio: 0.3`
    (also `- `, backticks, `=`) outside fenced blocks, so prose around them is ignored.
    Keys may carry an `env.` prefix and write the size as s7, 7 or 7x7. Values must be
    numbers. Dropped with a reason: unknown keys, non-numbers, keys given twice with different
    values. More than `max_edits` distinct keys rejects the whole diff (a rewrite).
    """
    try:
        return _parse(text, max_edits)
    except Exception as e:  # the contract is "never raises": record what happened instead
        raw = text if isinstance(text, str) else repr(text)[:MAX_CHARS]
        return Proposal(raw=raw, diff={}, error=f"unparseable answer ({type(e).__name__}: {e})")


def _parse(text: Any, max_edits: int) -> Proposal:
    if not isinstance(text, str):
        return Proposal(raw=repr(text)[:MAX_CHARS], diff={}, error="the answer is not text")
    raw = text
    rejected: list[tuple[str, str]] = []
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS]
        rejected.append(("<answer>", f"cut at {MAX_CHARS} characters"))
    answer, error = _strip_thinking(text)
    summary = _summary(answer)
    if error:
        return Proposal(raw=raw, diff={}, rejected=tuple(rejected), summary=summary, error=error)
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(answer)]
    usable = [(lang, body) for lang, body in blocks if lang in _BLOCK_LANGS]
    for lang, _ in blocks:
        if lang not in _BLOCK_LANGS:
            rejected.append((f"```{lang} block", "only yaml or json blocks are read"))
    if usable:
        lang, body = usable[-1]
        is_json = lang == "json" or (lang == "" and body.lstrip().startswith("{"))
        source = "json block" if is_json else "yaml block"
        try:
            items, bad = _parse_json(body) if is_json else _parse_yaml(body)
        except (ValueError, RecursionError) as e:
            items, bad = [], [(body.strip()[:80], f"invalid JSON: {str(e)[:120]}")]
        rejected += bad
    else:
        source = "bare lines"
        outside = _FENCE.sub("\n", answer)
        opened = re.search(r"^[ \t]*```", outside, re.MULTILINE)
        if opened:  # an unclosed fence: a cut-off answer; its lines are not trusted
            outside = outside[: opened.start()]
            rejected.append(("```", "a code block is not closed (cut-off answer?)"))
        items = [(m.group(1), _Scalar(m.group(2))) for m in _BARE.finditer(outside)]
        if not items:
            source = "none"
    diff, conflicts = {}, set()
    for key, value in items:
        try:
            k, v = canonical_key(str(key)), _number(value)
        except ValueError as e:
            rejected.append((f"{key}: {str(value)[:40]}", str(e)))
            continue
        if k in diff and diff[k] != v:
            conflicts.add(k)
        diff.setdefault(k, v)
    for k in sorted(conflicts):
        del diff[k]
        rejected.append((k, "given twice with different values"))
    if len(diff) > max_edits:
        rejected.append(("<diff>", f"{len(diff)} edits; allowed: at most {max_edits}"))
        return Proposal(
            raw=raw,
            diff={},
            rejected=tuple(rejected),
            summary=summary,
            source=source,
            error=f"too many edits ({len(diff)} > {max_edits}): make a few local edits",
        )
    error = "" if diff else _why_empty(source, rejected)
    return Proposal(raw, diff, tuple(rejected), summary, source, error)


def _why_empty(source: str, rejected: list) -> str:
    if source == "none":
        return "no ```yaml or ```json block and no `sizes.s<N>.<field>: <number>` lines"
    if rejected:
        return f"no usable edit in the {source}: " + "; ".join(r for _, r in rejected[:3])
    return f"the {source} is empty"


# ----------------------------------------------------------------------------- apply


def complete_data_ratios(
    diff: Mapping[str, float], current: ml_collections.ConfigDict
) -> tuple[dict[str, float], list[str]]:
    """Keep the data_ratio values the engineer set; scale the sizes it did not mention.

    When the edited data_ratio values sum to s <= 1 and other sizes exist, those sizes are
    scaled by (1 - s) / (their current sum), so `sizes.s7.data_ratio: 0.3` really gives 7x7
    30% of the data. With s > 1 (or nothing left to scale) the projection renormalises all.
    """
    edited = {k.split(".")[1]: v for k, v in diff.items() if k.endswith(".data_ratio")}
    rest = [s for s in current.sizes if s not in edited]
    used = sum(max(v, 0.0) for v in edited.values())
    rest_sum = sum(current.sizes[s].data_ratio for s in rest)
    if not edited or not rest or used > 1.0 or rest_sum <= 0:
        return dict(diff), []
    scale = (1.0 - used) / rest_sum
    if math.isclose(scale, 1.0, rel_tol=1e-9):
        return dict(diff), []
    out = dict(diff)
    for s in rest:
        out[f"sizes.{s}.data_ratio"] = current.sizes[s].data_ratio * scale
    note = f"data_ratio: sizes not in the diff scaled by {scale:.6g} so the total stays 1"
    return out, [note]


def _why(e: Exception) -> str:
    """The projection's message; other exceptions also name their type."""
    return str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"


def keep_current(
    current: ml_collections.ConfigDict, engineer: str, reason: str, raw: str = "", **kw
) -> Decision:
    """A Decision that keeps the current config and says why."""
    return Decision(
        engineer=engineer,
        raw=raw,
        diff=kw.pop("diff", {}),
        rejected=kw.pop("rejected", ()),
        changes=(),
        config=ml_collections.ConfigDict(current.to_dict()),
        kept_current=True,
        reason=reason,
        **kw,
    )


def apply_proposal(
    proposal: Proposal, current: ml_collections.ConfigDict, engineer: str = "", **extra
) -> Decision:
    """Project the proposal's diff onto the legal space around `current`.

    Each edit is first checked alone with `project` (an illegal size, e.g. too small for the
    agents, is dropped with the projection's message); the rest go through
    `complete_data_ratios` and then one `project` call, whose config and changes are recorded.
    A diff that cannot be projected as a whole keeps the current config and says why. Raises
    only if `current` itself is invalid (ConfigError).
    """
    validate(current)
    rejected = list(proposal.rejected)
    accepted: dict[str, float] = {}
    for k, v in proposal.diff.items():
        try:
            project({k: v}, current)
        except Exception as e:  # any edit the projection cannot take is dropped
            rejected.append((f"{k}: {v!r:.60}", _why(e)))
            continue
        accepted[k] = v
    common = dict(engineer=engineer, raw=proposal.raw, summary=proposal.summary, extra=extra)
    if not accepted:
        reason = proposal.error or "; ".join(r for _, r in rejected[-3:]) or "empty diff"
        rejected_t = tuple(rejected)
        return keep_current(current, reason=reason, diff=accepted, rejected=rejected_t, **common)
    try:
        full, notes = complete_data_ratios(accepted, current)
        config, changes = project(full, current)
    except Exception as e:  # e.g. edits legal alone but not together
        reason = f"the diff cannot be projected onto the legal space: {_why(e)}"
        rejected.append(("<diff>", reason))
        return keep_current(
            current, reason=reason, diff=accepted, rejected=tuple(rejected), **common
        )
    same = config.to_dict() == current.to_dict()
    return Decision(
        diff=accepted,
        rejected=tuple(rejected),
        changes=tuple(notes + changes),
        config=config,
        kept_current=same,
        reason="the diff leaves the config unchanged" if same else "",
        **common,
    )
