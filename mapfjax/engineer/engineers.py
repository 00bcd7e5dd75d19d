"""Engineers: `propose(context, current, rng, records=()) -> Decision`, in the registry ENGINEERS.

fixed, random, rule, learnability and bandit are curriculum baselines (docs/paper.md section 9);
wait [ours] sets the training wait share from where the held-out failures sit;
api asks an OpenAI-compatible endpoint; policy/base ask a checkpoint through injected sampling
(free text) or scoring (a choice among candidate edits).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import ml_collections
import numpy as np

from mapfjax import api_chat, checks
from mapfjax.engineer.context import (
    WAIT_LABELS,
    RoundRecord,
    SizeSignal,
    failure_shares,
    size_signals,
)
from mapfjax.engineer.prompt import build_prompt
from mapfjax.engineer.proposal import (
    MAX_CHARS,
    MAX_EDITS,
    Decision,
    Diff,
    Edit,
    Proposal,
    apply_proposal,
    format_diff,
    keep_current,
    parse_proposal,
)
from mapfjax.env.config import MAX_HOLE_RATIO, key_size

GenerateFn = Callable[[list[str], int], list[str]]  # (prompts, n) -> n samples per prompt
ScoreFn = Callable[[str, list[str]], list[float]]  # (prompt, continuations) -> total log-lik
DEFAULT_FLOOR = 0.03  # least data share of a size under learnability-proportional sampling


class Engineer(Protocol):
    name: str

    def propose(
        self,
        context: str,
        current: ml_collections.ConfigDict,
        rng: Any,
        records: Sequence[RoundRecord] = (),
    ) -> Decision: ...


# ----------------------------------------------------------------------------- helpers


def _label(size_key: str) -> str:
    n = key_size(size_key)
    return f"{n}x{n}"


def _labels(keys: Sequence[str]) -> str:
    return " and ".join(_label(k) for k in keys)


def _sizes(current: ml_collections.ConfigDict) -> list[str]:
    return sorted(current.sizes, key=key_size)


def _check(engineer: str, key: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"engineer ({engineer}).{key} = {value!r}; allowed: {allowed}")


def _check_band(engineer: str, low: float, high: float) -> None:
    ok = 0 <= low <= high <= 1
    _check(engineer, "low", low, ok, f"0 <= low <= high={high!r} <= 1")


def _signals(records: Sequence[RoundRecord], current, min_rows: int) -> dict[str, SizeSignal]:
    """The last record's per-size signals for the current sizes with at least min_rows."""
    if not records:
        return {}
    found = size_signals(records[-1])
    return {k: v for k, v in found.items() if k in current.sizes and v.n >= min_rows}


def _ratio(current, key: str, field: str, value: float) -> Diff:
    """One hole/wait edit (rounded to 4 decimals), or () when it changes nothing."""
    value = round(float(value), 4)
    if math.isclose(value, float(current.sizes[key][field]), abs_tol=1e-9):
        return ()
    return (Edit(key_size(key), field, value),)


def _shift(current, key: str, fields: Sequence[str], delta: float) -> Diff:
    """hole/wait ratios of one size moved by `delta`, clipped to their legal ranges; () when
    nothing moves."""
    out: Diff = ()
    for field in fields:
        hi = MAX_HOLE_RATIO if field == "hole_ratio" else 1.0
        out += _ratio(current, key, field, min(max(current.sizes[key][field] + delta, 0.0), hi))
    return out


def data_vector(
    current: ml_collections.ConfigDict, shares: Mapping[str, float], digits: int | None = None
) -> Diff:
    """A whole new data distribution (every current size's data_ratio, one edit by the
    MAX_EDITS rule), or () when it equals the current one. `digits` rounds for short text."""
    sizes = _sizes(current)
    total = sum(max(float(shares.get(s, 0.0)), 0.0) for s in sizes)
    new = {s: max(float(shares.get(s, 0.0)), 0.0) / total for s in sizes} if total > 0 else {}
    tol = 1e-9
    if digits is not None:
        new = {s: round(v, digits) for s, v in new.items()}
        tol = 0.5 * 10.0**-digits  # a rounded copy of the current share is no change
    if not new or all(
        math.isclose(new[s], current.sizes[s].data_ratio, abs_tol=tol) for s in sizes
    ):
        return ()
    return tuple(Edit(key_size(s), "data_ratio", new[s]) for s in sizes)


def learnability_shares(
    sizes: Sequence[str], scores: Mapping[str, float], floor: float = DEFAULT_FLOOR
) -> dict[str, float]:
    """Data shares floor + (1 - K floor) x score / sum(scores) over the K sizes.

    Every size keeps at least `floor` (exploration: no size starves); a size without a score
    gets the highest measured one (optimism for the unmeasured). Uniform when no score is
    positive or K x floor >= 1.
    """
    top = max(scores.values(), default=0.0)
    raw = {s: max(float(scores.get(s, top)), 0.0) for s in sizes}
    free = 1.0 - len(sizes) * floor
    total = sum(raw.values())
    if free <= 0 or total <= 0:
        return {s: 1.0 / len(sizes) for s in sizes}
    return {s: floor + free * raw[s] / total for s in sizes}


def softmax_shares(values: Mapping[str, float], temperature: float) -> dict[str, float]:
    """Boltzmann shares exp(v / temperature) / sum, computed stably."""
    top = max(values.values())
    w = {k: math.exp((v - top) / temperature) for k, v in values.items()}
    total = sum(w.values())
    return {k: x / total for k, x in w.items()}


def engineer_failed(current, name: str, reason: str, **kw) -> Decision:
    """The engineer could not run (unreachable endpoint, missing key or package, a sampling or
    scoring error): the config is kept, and extra["failure"] says why, so the loop can warn
    (or stop) rather than silently run the fixed baseline."""
    extra = {**kw.pop("extra", {}), "failure": reason}
    return keep_current(current, name, reason, extra=extra, **kw)


def failure(decision: Decision) -> str:
    """Why the engineer failed to run, or "" when it ran (a kept config may be its choice)."""
    return str(decision.extra.get("failure", ""))


def _decide(name: str, diff: Diff, notes: Sequence[str], current, **extra) -> Decision:
    """A baseline's edits as a Decision through the same projection as any answer."""
    summary = "; ".join(notes) + "." if notes else ""
    error = "" if diff else f"no rule changes the config ({summary or 'no evidence'})"
    proposal = Proposal(format_diff(diff, summary), diff, (), summary, name, error)
    return apply_proposal(proposal, current, name, **extra)


# ----------------------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate edit: a diff and the sentence that explains it."""

    diff: Diff
    description: str

    def text(self) -> str:
        """The edit written in the engineer's answer format."""
        return format_diff(self.diff, self.description)


def local_edits(
    current: ml_collections.ConfigDict, steps: Sequence[float] = (0.05, 0.1)
) -> list[Candidate]:
    """Every local edit of `current`, in a fixed order (size, then field, then step).

    Per size: hole_ratio and wait_ratio up or down by each step (clipped to the legal range,
    no-ops dropped); between neighbouring sizes: move `step` of data share either way (only
    when the source has that much). Values are rounded to 4 decimals so their text is short.
    """
    sizes = _sizes(current)
    out: list[Candidate] = []
    seen: set[Diff] = set()
    for s in sizes:
        for field in ("hole_ratio", "wait_ratio"):
            cur = float(current.sizes[s][field])
            for step in steps:
                for sign in (1, -1):
                    diff = _shift(current, s, (field,), sign * step)
                    if not diff or diff in seen:
                        continue
                    seen.add(diff)
                    new = diff[0].value
                    verb = "raise" if new > cur else "lower"
                    text = f"{verb} {field} of {_label(s)} from {cur:.3g} to {new:.3g}"
                    out.append(Candidate(diff, text))
    for a, b in zip(sizes, sizes[1:]):
        for step in steps:
            for src, dst in ((a, b), (b, a)):
                have = float(current.sizes[src].data_ratio)
                get = float(current.sizes[dst].data_ratio)
                if have + 1e-9 < step:
                    continue
                diff = (
                    Edit(key_size(src), "data_ratio", round(max(have - step, 0.0), 4)),
                    Edit(key_size(dst), "data_ratio", round(get + step, 4)),
                )
                text = f"move {step:g} of the data share from {_label(src)} to {_label(dst)}"
                out.append(Candidate(diff, text))
    return out


def _doubled(cur: Mapping[str, float], chosen: Sequence[str]) -> dict[str, float]:
    """`chosen` sizes get twice their share, the others what is left in proportion."""
    w = sum(cur[s] for s in chosen)
    rest = 1.0 - w
    scale = max(1.0 - 2 * w, 0.0) / rest if rest > 0 else 0.0
    return {s: 2 * cur[s] if s in chosen else cur[s] * scale for s in cur}


def large_moves(
    current: ml_collections.ConfigDict,
    records: Sequence[RoundRecord] = (),
    floor: float = DEFAULT_FLOOR,
) -> list[Candidate]:
    """Wholesale moves of the data distribution (each one edit), no-ops and repeats dropped.

    Uniform data over all sizes; and, from the last record's rollouts (or its validation
    rates when it has none): shift half of the data to the two sizes of highest learnability
    p(1 - p); double the share of the two sizes with the lowest valid rate; data
    proportional to learnability with at least `floor` per size.
    """
    sizes = _sizes(current)
    cur = {s: float(current.sizes[s].data_ratio) for s in sizes}
    moves = [("uniform data over all sizes", dict.fromkeys(sizes, 1.0))]
    signals = _signals(records, current, 1)
    if signals:
        learn = {k: v.learnability for k, v in signals.items()}
        top = sorted(signals, key=lambda k: (-learn[k], key_size(k)))[:2]
        half = {s: cur[s] / 2 + (0.5 / len(top) if s in top else 0.0) for s in sizes}
        worst = sorted(signals, key=lambda k: (signals[k].valid_rate, key_size(k)))[:2]
        moves += [
            (f"shift half of the data to {_labels(top)}, the highest learnability p(1-p)", half),
            (
                f"double the data share of {_labels(worst)}, the lowest valid rates",
                _doubled(cur, worst),
            ),
            (
                f"data proportional to learnability p(1-p), at least {floor:g} per size",
                learnability_shares(sizes, learn, floor),
            ),
        ]
    out, seen = [], set()
    for text, shares in moves:
        diff = data_vector(current, shares, digits=4)
        if diff and diff not in seen:
            seen.add(diff)
            out.append(Candidate(diff, text))
    return out


def candidate_edits(
    current: ml_collections.ConfigDict,
    steps: Sequence[float] = (0.05, 0.1),
    records: Sequence[RoundRecord] = (),
    floor: float = DEFAULT_FLOOR,
) -> list[Candidate]:
    """What a small model chooses among: `local_edits`, then `large_moves`."""
    return local_edits(current, steps) + large_moves(current, records, floor)


def choose_by_likelihood(
    score_fn: ScoreFn, prompt: str, candidates: Sequence[Candidate]
) -> tuple[int, list[float]]:
    """Index of the candidate whose text the model finds most likely, and all scores.

    Ties (and NaN scores, which count as -inf) go to the earliest candidate.
    """
    if not candidates:
        raise ValueError("choose_by_likelihood: no candidates")
    scores = [float(s) for s in score_fn(prompt, [c.text() for c in candidates])]
    if len(scores) != len(candidates):
        raise ValueError(
            f"score_fn returned {len(scores)} scores for {len(candidates)} continuations"
        )
    clean = [s if not math.isnan(s) else -math.inf for s in scores]
    return int(np.argmax(clean)), scores


# ----------------------------------------------------------------------------- baselines


@dataclasses.dataclass
class FixedEngineer:
    """Never changes the config: every round trains on the round-0 config."""

    name: str = "fixed"

    def propose(self, context, current, rng, records=()) -> Decision:
        return keep_current(current, self.name, "the fixed engineer never changes the config")


@dataclasses.dataclass
class RandomEngineer:
    """Domain randomisation: a fresh legal config over the current sizes every round.

    data ratios ~ Dirichlet(alpha, ..., alpha), hole_ratio ~ U[0, 0.5], wait_ratio ~ U[0,
    max_wait] per size (hole and wait rounded to 4 decimals), all drawn from `rng` (a seed or a
    numpy Generator): the same rng gives the same config. Reads nothing else.
    """

    alpha: float = 1.0
    max_wait: float = 1.0
    name: str = "random"

    def __post_init__(self):
        _check(self.name, "alpha", self.alpha, self.alpha > 0, "a number > 0")
        ok = checks.is_real(self.max_wait) and 0 < self.max_wait <= 1
        _check(self.name, "max_wait", self.max_wait, ok, "a number in (0, 1]")

    def propose(self, context, current, rng, records=()) -> Decision:
        rng = np.random.default_rng(rng)
        sizes = _sizes(current)
        data = rng.dirichlet([self.alpha] * len(sizes))
        holes = rng.uniform(0.0, MAX_HOLE_RATIO, len(sizes))
        waits = rng.uniform(0.0, self.max_wait, len(sizes))
        diff = data_vector(current, dict(zip(sizes, data.tolist())))
        for s, h, w in zip(sizes, holes, waits):
            diff += _ratio(current, s, "hole_ratio", h) + _ratio(current, s, "wait_ratio", w)
        note = f"domain randomisation: data ~ Dirichlet({self.alpha:g}), holes ~ U[0, "
        note += f"{MAX_HOLE_RATIO:g}], waits ~ U[0, {self.max_wait:g}]"
        return _decide(self.name, diff, [note], current)


@dataclasses.dataclass
class RuleEngineer:
    """A per-size ladder on the last round's valid rate v (Reasoning Gym's rule).

    v is the size's training-rollout valid rate, or its validation rate for records without
    rollouts. v > high (mastered): one rung harder, hole_ratio and wait_ratio up by `step`
    (clipped); a size already at the hardest rung gets data weight x (1 - shift) instead.
    v < low (collapsed): one rung easier, both down by `step`; a size already at the easiest
    rung gets data weight x (1 + shift) instead. Otherwise, or with fewer than `min_rows`
    samples, the size is left alone. Weights are renormalised into data_ratio.
    """

    low: float = 0.3
    high: float = 0.7
    step: float = 0.05
    shift: float = 0.25
    min_rows: int = 1
    name: str = "rule"

    def __post_init__(self):
        _check_band(self.name, self.low, self.high)
        _check(self.name, "step", self.step, self.step >= 0, "a number >= 0")
        _check(self.name, "shift", self.shift, 0 <= self.shift < 1, "a number in [0, 1)")

    def propose(self, context, current, rng, records=()) -> Decision:
        signals = _signals(records, current, self.min_rows)
        if not signals:
            return keep_current(current, self.name, "no rollouts or validation results to act on")
        weights = {s: float(current.sizes[s].data_ratio) for s in _sizes(current)}
        diff: Diff = ()
        notes = []
        for s, sig in signals.items():
            if sig.valid_rate > self.high:
                sign, factor, words = (
                    1,
                    1 - self.shift,
                    ("harder", "at the hardest rung: less data"),
                )
            elif sig.valid_rate < self.low:
                sign, factor, words = (
                    -1,
                    1 + self.shift,
                    ("easier", "at the easiest rung: more data"),
                )
            else:
                continue
            rung = _shift(current, s, ("hole_ratio", "wait_ratio"), sign * self.step)
            if not rung:
                weights[s] *= factor
            diff += rung
            notes.append(
                f"{_label(s)} valid {sig.valid_rate:.0%} ({sig.source}): {words[not rung]}"
            )
        diff = data_vector(current, weights) + diff
        return _decide(self.name, diff, notes, current)


@dataclasses.dataclass
class LearnabilityEngineer:
    """Sampling for learnability: data where the policy sometimes succeeds.

    Reads the last record's rollouts (else its validation rates). data_ratio is proportional
    to each size's learnability p(1 - p), with at least `floor` per size
    (`learnability_shares`); a size whose valid rate p is above target + band gets
    hole_ratio + hole_step, below target - band hole_ratio - hole_step, so pass rates drift
    towards `target`. Sizes with fewer than `min_rows` samples count as unmeasured.
    """

    floor: float = DEFAULT_FLOOR
    target: float = 0.5
    band: float = 0.15
    hole_step: float = 0.05
    min_rows: int = 1
    name: str = "learnability"

    def __post_init__(self):
        _check(self.name, "floor", self.floor, 0 <= self.floor < 1, "a number in [0, 1)")
        _check(self.name, "target", self.target, 0 < self.target < 1, "a number in (0, 1)")
        _check(self.name, "band", self.band, self.band >= 0, "a number >= 0")
        _check(self.name, "hole_step", self.hole_step, self.hole_step >= 0, "a number >= 0")

    def propose(self, context, current, rng, records=()) -> Decision:
        signals = _signals(records, current, self.min_rows)
        if not signals:
            return keep_current(current, self.name, "no rollouts or validation results to act on")
        scores = {k: v.learnability for k, v in signals.items()}
        diff = data_vector(current, learnability_shares(_sizes(current), scores, self.floor))
        notes = [
            "data proportional to p(1-p) ("
            + ", ".join(f"{_label(k)} {v:.3f}" for k, v in scores.items())
            + f"; {next(iter(signals.values())).source}), at least {self.floor:g} per size"
        ]
        for s, sig in signals.items():
            off = sig.valid_rate - self.target
            if abs(off) > self.band:
                nudge = _shift(current, s, ("hole_ratio",), math.copysign(self.hole_step, off))
                diff += nudge
                if nudge:
                    more = "more" if off > 0 else "fewer"
                    notes.append(f"{_label(s)} valid {sig.valid_rate:.0%}: {more} holes")
        return _decide(self.name, diff, notes, current, learnability=scores)


def bandit_values(
    records: Sequence[RoundRecord],
    sizes: Sequence[str],
    step: float,
    initial: float = 0.0,
    min_rows: int = 1,
) -> dict[str, float]:
    """Arm values after TD(0) over the records in order: Q <- Q + step (r - Q), r = the size's
    mean |A| in that round (`SizeSignal.mean_abs_advantage`); an arm without a signal that
    round keeps its value. A pure function of the records, so a resumed run recovers it."""
    q = dict.fromkeys(sizes, float(initial))
    for record in records:
        for k, sig in size_signals(record).items():
            if k in q and sig.n >= min_rows:
                q[k] += step * (sig.mean_abs_advantage - q[k])
    return q


@dataclasses.dataclass
class BanditEngineer:
    """Self-Evolving Curriculum: one arm per size, data_ratio = softmax(Q / temperature).

    Q is `bandit_values` of all records (rollouts' mean |A|, else 2 sqrt(p(1 - p)) from the
    validation rate); rebuilt from the records on every call, so the engineer holds no state.
    Changes only data_ratio.
    """

    step: float = 0.5
    temperature: float = 0.25
    initial: float = 0.0
    min_rows: int = 1
    name: str = "bandit"

    def __post_init__(self):
        _check(self.name, "step", self.step, 0 < self.step <= 1, "a number in (0, 1]")
        ok = self.temperature > 0
        _check(self.name, "temperature", self.temperature, ok, "a number > 0")

    def propose(self, context, current, rng, records=()) -> Decision:
        if not records:
            return keep_current(current, self.name, "no rollouts or validation results to act on")
        sizes = _sizes(current)
        q = bandit_values(records, sizes, self.step, self.initial, self.min_rows)
        diff = data_vector(current, softmax_shares(q, self.temperature))
        values = ", ".join(f"{_label(k)} {v:.3f}" for k, v in q.items())
        note = f"data = softmax(Q / {self.temperature:g}) over the arm values Q ({values})"
        return _decide(self.name, diff, [note], current, values=q)


@dataclasses.dataclass
class WaitEngineer:
    """Training puzzles that need a wait in the share the held-out failures do.

    Reads the last record's `wait_split` (the validation counted separately on the puzzles
    that need a wait and on the others). Every size's wait_ratio becomes the share of the
    failed held-out puzzles that need a wait, clipped to [low, high] and rounded to 2 decimals;
    data and hole ratios stay. Without a split covering `min_rows` labelled puzzles, or with no
    failure, the config is kept.
    """

    low: float = 0.1
    high: float = 0.9
    min_rows: int = 20
    name: str = "wait"

    def __post_init__(self):
        _check_band(self.name, self.low, self.high)
        ok = isinstance(self.min_rows, int) and self.min_rows >= 1
        _check(self.name, "min_rows", self.min_rows, ok, "an integer >= 1")

    def propose(self, context, current, rng, records=()) -> Decision:
        split = records[-1].wait_split if records else {}
        n = sum(e["n"] for e in split.values())
        shares = failure_shares(split)
        if n < self.min_rows or not shares:
            why = f"{n} labelled held-out puzzles (at least {self.min_rows} needed)"
            if n >= self.min_rows:
                why = "no held-out failure"
            return keep_current(current, self.name, f"no wait split to act on: {why}")
        share = shares.get("needs_wait", 0.0)
        wait = round(min(max(share, self.low), self.high), 2)
        diff: Diff = ()
        for s in _sizes(current):
            diff += _ratio(current, s, "wait_ratio", wait)
        rates = ", ".join(f"{WAIT_LABELS[h]} {e['valid']}/{e['n']} valid" for h, e in split.items())
        note = f"{share:.0%} of the held-out failures need a wait ({rates}): wait_ratio {wait:g}"
        return _decide(self.name, diff, [note], current, failure_share=share)


# ----------------------------------------------------------------------------- api


@dataclasses.dataclass
class ApiEngineer(api_chat.Endpoint):
    """An OpenAI-compatible chat endpoint through the `openai` client (settings and retry
    policy: `api_chat.Endpoint`). A request that still fails after its retries, or any other
    failure, keeps the current config and says why."""

    max_edits: int = MAX_EDITS
    name: str = "api"

    def propose(self, context, current, rng, records=()) -> Decision:
        base_url, model, key = self.settings()
        extra: dict[str, Any] = {"base_url": base_url or "(openai default)", "model": model}
        if importlib.util.find_spec("openai") is None:
            return engineer_failed(current, self.name, "the openai package is not installed")
        if not model:
            why = "no model: set engineer.model or OPENAI_MODEL"
            return engineer_failed(current, self.name, why)
        if not key:
            return engineer_failed(
                current, self.name, "no API key: set engineer.api_key or OPENAI_API_KEY"
            )
        prompt = build_prompt(context, current, self.max_edits)
        try:
            text, errors = self.chat(self.client(), prompt)
        except api_chat.ChatError as e:
            extra["errors"] = e.errors
            return engineer_failed(current, self.name, str(e), extra=extra, prompt=prompt)
        extra.update(errors=errors, attempts=len(errors) + 1)
        if isinstance(text, str):
            extra["reply_chars"] = len(text)  # the stored reply is cut to what the parser reads
        proposal = parse_proposal(text, self.max_edits)
        return apply_proposal(proposal, current, self.name, prompt=prompt, **extra)


# ----------------------------------------------------------------------------- policy


@dataclasses.dataclass
class PolicyEngineer:
    """A checkpoint as the engineer, through injected functions.

    mode "free": `generate_fn([prompt], num_samples)` samples answers; the choice rule takes the
    first sample, in sampling order, whose diff parses and changes the config.
    mode "constrained": `score_fn(prompt, texts)` scores every `candidate_edits` answer text
    (local edits and wholesale data moves from the records) by total log-likelihood; the most
    likely one wins (ties: earliest), always well-formed.
    mode "free_then_constrained": free, and constrained when no sample changes the config.
    Every Decision carries the prompt (`Decision.prompt`).
    """

    generate_fn: GenerateFn | None = None
    score_fn: ScoreFn | None = None
    mode: str = "free_then_constrained"
    num_samples: int = 4
    max_edits: int = MAX_EDITS
    steps: tuple[float, ...] = (0.05, 0.1)
    name: str = "policy"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"engineer.mode = {self.mode!r}; allowed: {sorted(MODES)}")
        if self.num_samples < 1:
            raise ValueError(f"engineer.num_samples = {self.num_samples!r}; allowed: >= 1")

    def propose(self, context, current, rng, records=()) -> Decision:
        prompt = build_prompt(context, current, self.max_edits)
        reasons = []
        decision = None
        for step in MODES[self.mode]:
            decision = step(self, prompt, current, records)
            if not decision.kept_current:
                return dataclasses.replace(decision, prompt=prompt)
            reasons.append(decision.reason)
        return dataclasses.replace(decision, reason=" | ".join(reasons), prompt=prompt)

    def _free(self, prompt: str, current, records) -> Decision:
        if self.generate_fn is None:
            return keep_current(current, self.name, "free mode needs a generate_fn")
        try:
            texts = list(self.generate_fn([prompt], self.num_samples))
        except Exception as e:  # a sampling failure keeps the config, says why
            why = f"generate_fn failed: {type(e).__name__}: {e}"
            return engineer_failed(current, self.name, why)
        samples = []
        for i, text in enumerate(texts):
            d = apply_proposal(parse_proposal(text, self.max_edits), current, self.name)
            kept = text[:MAX_CHARS] if isinstance(text, str) else repr(text)[:MAX_CHARS]
            samples.append(
                {"index": i, "changed": not d.kept_current, "reason": d.reason, "text": kept,
                 "chars": len(text) if isinstance(text, str) else len(kept)}
            )  # fmt: skip
            if not d.kept_current:
                return dataclasses.replace(
                    d, extra={"mode": "free", "chosen": i, "samples": samples}
                )
        why = "; ".join(f"sample {s['index']}: {s['reason']}" for s in samples) or "no samples"
        return keep_current(
            current,
            self.name,
            f"no sample changed the config ({why})",
            raw=samples[0]["text"] if samples else "",
            extra={"mode": "free", "chosen": None, "samples": samples},
        )

    def _constrained(self, prompt: str, current, records) -> Decision:
        if self.score_fn is None:
            return keep_current(current, self.name, "constrained mode needs a score_fn")
        candidates = candidate_edits(current, self.steps, records)
        if not candidates:
            return keep_current(current, self.name, "no candidate edit is possible")
        try:
            best, scores = choose_by_likelihood(self.score_fn, prompt, candidates)
        except Exception as e:  # a scoring failure keeps the config, says why
            return engineer_failed(current, self.name, f"score_fn failed: {type(e).__name__}: {e}")
        extra = {
            "mode": "constrained",
            "chosen": best,
            "scores": scores,
            "candidates": [c.description for c in candidates],
        }
        return apply_proposal(
            parse_proposal(candidates[best].text(), self.max_edits), current, self.name, **extra
        )


MODES: dict[str, tuple[Callable, ...]] = {
    "free": (PolicyEngineer._free,),
    "constrained": (PolicyEngineer._constrained,),
    "free_then_constrained": (PolicyEngineer._free, PolicyEngineer._constrained),
}

ENGINEERS: dict[str, Callable[..., Engineer]] = {
    "fixed": FixedEngineer,
    "random": RandomEngineer,
    "rule": RuleEngineer,
    "learnability": LearnabilityEngineer,
    "bandit": BanditEngineer,
    "wait": WaitEngineer,
    "api": ApiEngineer,
    "policy": PolicyEngineer,
    "base": functools.partial(PolicyEngineer, name="base"),
}


def make_engineer(config: ml_collections.ConfigDict | Mapping[str, Any], **inject) -> Engineer:
    """Build `ENGINEERS[config.name]` from the other config keys plus injected functions.

    `inject` carries what configs cannot hold (generate_fn, score_fn, sleep).
    """
    d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    name = d.pop("name", None)
    if name not in ENGINEERS:
        raise ValueError(f"engineer.name = {name!r}; allowed: {sorted(ENGINEERS)}")
    factory = ENGINEERS[name]
    cls = factory.func if isinstance(factory, functools.partial) else factory
    fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
    unknown = sorted(k for k in set(d) | set(inject) if k not in fields)
    if unknown:
        raise ValueError(
            f"engineer ({name}): unknown key(s) {unknown}; allowed: {sorted(fields)}"
            + checks.did_you_mean(unknown, fields)
        )
    for k in ("steps",):
        if k in d:
            d[k] = tuple(d[k])
    return factory(**d, **inject)
