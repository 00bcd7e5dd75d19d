"""Engineer answers -> typed config diffs (`Edit`s): a strict parser (never eval, never import)
and its projection. `parse_proposal` and `apply_proposal` never raise on any text; what they
drop is recorded with why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ml_collections

from mapfjax.env.config import (
    RATIO_FIELDS,
    ConfigError,
    key_size,
    project_edits,
    ratio_key,
    size_key,
    validate,
)

# More edits than this is a rewrite, not a local edit (docs/paper.md section 4); all data_ratio
# values of one diff together count as one edit (a new data distribution), see `count_edits`.
MAX_EDITS = 6
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
class Edit:
    """One typed config edit: set `sizes.s<size>.<field>` to `value` (field in RATIO_FIELDS).

    Parsed once from text (`parse_key`, `edits_from_dict`); ranges are the projection's job.
    """

    size: int
    field: str
    value: float

    @property
    def key(self) -> str:
        """The dotted key the engineer writes, e.g. 'sizes.s7.data_ratio'."""
        return f"sizes.{size_key(self.size)}.{self.field}"

    def text(self) -> str:
        """One `key: value` line of the answer format."""
        return f"{self.key}: {float(self.value)!r}"


Diff = tuple[Edit, ...]


def diff_dict(diff: Iterable[Edit]) -> dict[str, float]:
    """The diff as {dotted key: value}, the form decision.json stores."""
    return {e.key: e.value for e in diff}


def edits_from_dict(mapping: Mapping[str, Any]) -> Diff:
    """Inverse of `diff_dict`; ValueError names a bad key or value and what is allowed."""
    return tuple(Edit(*parse_key(k), _number(v)) for k, v in mapping.items())


def count_edits(diff: Iterable[Edit]) -> int:
    """Edits as the MAX_EDITS rule counts them: each hole_ratio or wait_ratio value is one;
    all data_ratio values together are one (a wholesale new data distribution)."""
    fields = [e.field for e in diff]
    return sum(f != "data_ratio" for f in fields) + ("data_ratio" in fields)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A parsed engineer answer.

    raw: the answer text. diff: the edits in answer order, one per key, syntax-checked only
    (ranges are the projection's job). rejected: (item, reason) pairs that were dropped.
    summary: the `Summary:` paragraph. source: where the diff came from ('json block',
    'yaml block', 'bare lines' or 'none'). error: why nothing usable was found ('' if usable).
    """

    raw: str
    diff: Diff
    rejected: tuple[tuple[str, str], ...] = ()
    summary: str = ""
    source: str = "none"
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of one engineer step (everything the run directory records).

    diff: the accepted edits. config: the next round's config (validated). changes: what the
    projection did. kept_current: True when the config did not change; `reason` then says why.
    extra: engineer-specific facts (samples, scores, retries), JSON-serialisable.
    prompt: the exact prompt the engineer sent ('' for engineers that send none).
    """

    engineer: str
    raw: str
    diff: Diff
    rejected: tuple[tuple[str, str], ...]
    changes: tuple[str, ...]
    config: ml_collections.ConfigDict
    kept_current: bool
    reason: str = ""
    summary: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    prompt: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the diff as {dotted key: value} (decision.json)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["diff"] = diff_dict(self.diff)
        d["config"] = self.config.to_dict()
        d["rejected"] = [list(r) for r in self.rejected]
        d["changes"] = list(self.changes)
        return json.loads(json.dumps(d))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """Inverse of `to_dict`; files written before `prompt` existed load with prompt ''."""
        return cls(
            engineer=d["engineer"],
            raw=d["raw"],
            diff=edits_from_dict(d["diff"]),
            rejected=tuple((str(a), str(b)) for a, b in d["rejected"]),
            changes=tuple(d["changes"]),
            config=ml_collections.ConfigDict(d["config"]),
            kept_current=bool(d["kept_current"]),
            reason=d.get("reason", ""),
            summary=d.get("summary", ""),
            extra=dict(d.get("extra", {})),
            prompt=str(d.get("prompt", "")),
        )


def format_diff(diff: Sequence[Edit], summary: str = "") -> str:
    """The answer format the prompt asks for; `parse_proposal(format_diff(d)).diff == d`."""
    body = "\n".join(e.text() for e in diff)
    text = f"```yaml\n{body}\n```" if body else "```yaml\n```"
    return f"{text}\nSummary: {summary.strip()}" if summary.strip() else text


def parse_key(key: str) -> tuple[int, str]:
    """'env.sizes.7x7.data_ratio' -> (7, 'data_ratio'); ValueError says what is allowed."""
    k = str(key).strip().strip("`'\"").strip()
    if k.startswith("env."):
        k = k[4:]
    try:
        parsed = ratio_key(k)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    if parsed is None:
        allowed = f"sizes.s<N>.<field> with field in {list(RATIO_FIELDS)}"
        raise ValueError(f"unknown key {key!r}; allowed: {allowed}")
    return parsed


def _number(value: Any) -> float:
    """A finite number from a JSON value or a YAML scalar string; ValueError otherwise."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, int | float):
        try:
            v = float(value)
        except OverflowError:
            raise ValueError(f"{str(value)[:40]!r} does not fit a float") from None
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
    values. More than `max_edits` edits (as `count_edits` counts them: all data_ratio values
    together are one) rejects the whole diff (a rewrite).
    """
    try:
        return _parse(text, max_edits)
    except Exception as e:  # the contract is "never raises": record what happened instead
        raw = (text if isinstance(text, str) else repr(text))[:MAX_CHARS]
        return Proposal(raw=raw, diff=(), error=f"unparseable answer ({type(e).__name__}: {e})")


def _parse(text: Any, max_edits: int) -> Proposal:
    if not isinstance(text, str):
        return Proposal(raw=repr(text)[:MAX_CHARS], diff=(), error="the answer is not text")
    rejected: list[tuple[str, str]] = []
    if len(text) > MAX_CHARS:  # what is stored is what is read: a 10 MB reply is not kept
        rejected.append(("<answer>", f"cut at {MAX_CHARS} of its {len(text)} characters"))
        text = text[:MAX_CHARS]
    raw = text
    answer, error = _strip_thinking(text)
    summary = _summary(answer)
    if error:
        return Proposal(raw=raw, diff=(), rejected=tuple(rejected), summary=summary, error=error)
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
    values: dict[tuple[int, str], float] = {}
    conflicts = set()
    for key, value in items:
        try:
            k, v = parse_key(str(key)), _number(value)
        except ValueError as e:
            rejected.append((f"{key}: {str(value)[:40]}", str(e)))
            continue
        if k in values and values[k] != v:
            conflicts.add(k)
        values.setdefault(k, v)
    for k in sorted(conflicts):
        del values[k]
        rejected.append((Edit(*k, 0.0).key, "given twice with different values"))
    diff = tuple(Edit(n, field, v) for (n, field), v in values.items())
    count = count_edits(diff)
    if count > max_edits:
        why = f"{count} edits; allowed: at most {max_edits} (all data_ratio values count as one)"
        rejected.append(("<diff>", why))
        return Proposal(
            raw=raw,
            diff=(),
            rejected=tuple(rejected),
            summary=summary,
            source=source,
            error=f"too many edits ({count} > {max_edits}): make a few local edits",
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


def complete_data_ratios(diff: Diff, current: ml_collections.ConfigDict) -> tuple[Diff, list[str]]:
    """Keep the data_ratio values the engineer set; scale the sizes it did not mention.

    When the edited data_ratio values sum to s <= 1 and other sizes exist, those sizes are
    scaled by (1 - s) / (their current sum), so `sizes.s7.data_ratio: 0.3` really gives 7x7
    30% of the data. With s > 1 (or nothing left to scale) the projection renormalises all.
    """
    edited = {size_key(e.size): e.value for e in diff if e.field == "data_ratio"}
    rest = [s for s in current.sizes if s not in edited]
    used = sum(max(v, 0.0) for v in edited.values())
    rest_sum = sum(current.sizes[s].data_ratio for s in rest)
    if not edited or not rest or used > 1.0 or rest_sum <= 0:
        return tuple(diff), []
    scale = (1.0 - used) / rest_sum
    if math.isclose(scale, 1.0, rel_tol=1e-9):
        return tuple(diff), []
    scaled = [Edit(key_size(s), "data_ratio", current.sizes[s].data_ratio * scale) for s in rest]
    note = f"data_ratio: sizes not in the diff scaled by {scale:.6g} so the total stays 1"
    return (*diff, *scaled), [note]


def _why(e: Exception) -> str:
    """The projection's message; other exceptions also name their type."""
    return str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"


def _project(diff: Diff, current: ml_collections.ConfigDict):
    return project_edits([(e.size, e.field, e.value) for e in diff], current)


def keep_current(
    current: ml_collections.ConfigDict, engineer: str, reason: str, raw: str = "", **kw
) -> Decision:
    """A Decision that keeps the current config and says why."""
    return Decision(
        engineer=engineer,
        raw=raw,
        diff=tuple(kw.pop("diff", ())),
        rejected=kw.pop("rejected", ()),
        changes=(),
        config=ml_collections.ConfigDict(current.to_dict()),
        kept_current=True,
        reason=reason,
        **kw,
    )


def apply_proposal(
    proposal: Proposal,
    current: ml_collections.ConfigDict,
    engineer: str = "",
    prompt: str = "",
    **extra,
) -> Decision:
    """Project the proposal's diff onto the legal space around `current`.

    Each edit is first checked alone with the projection (an illegal size, e.g. too small for
    the agents, is dropped with the projection's message); the rest go through
    `complete_data_ratios` and then one `project_edits` call, whose config and changes are
    recorded. A diff that cannot be projected as a whole keeps the current config and says
    why. `prompt` (what the engineer sent) and `extra` are recorded as they are. Raises only if
    `current` itself is invalid (ConfigError).
    """
    validate(current)
    rejected = list(proposal.rejected)
    accepted: list[Edit] = []
    for e in proposal.diff:
        try:
            _project((e,), current)
        except Exception as err:  # any edit the projection cannot take is dropped
            rejected.append((f"{e.key}: {e.value!r:.60}", _why(err)))
            continue
        accepted.append(e)
    common = dict(
        engineer=engineer, raw=proposal.raw, summary=proposal.summary, extra=extra, prompt=prompt
    )
    diff = tuple(accepted)
    if not diff:
        reason = proposal.error or "; ".join(r for _, r in rejected[-3:]) or "empty diff"
        return keep_current(current, reason=reason, diff=diff, rejected=tuple(rejected), **common)
    try:
        full, notes = complete_data_ratios(diff, current)
        config, changes = _project(full, current)
    except Exception as err:  # e.g. edits legal alone but not together
        reason = f"the diff cannot be projected onto the legal space: {_why(err)}"
        rejected.append(("<diff>", reason))
        return keep_current(current, reason=reason, diff=diff, rejected=tuple(rejected), **common)
    same = config.to_dict() == current.to_dict()
    return Decision(
        diff=diff,
        rejected=tuple(rejected),
        changes=tuple(notes + changes),
        config=config,
        kept_current=same,
        reason="the diff leaves the config unchanged" if same else "",
        **common,
    )
