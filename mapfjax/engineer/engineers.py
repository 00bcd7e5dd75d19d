"""Engineers: `propose(context, current, rng, records=()) -> Decision`, in the registry ENGINEERS.

fixed, random and rule are baselines; api asks an OpenAI-compatible endpoint; policy/base ask a
checkpoint through injected sampling (free text) or scoring (a choice among local edits).
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

from mapfjax import api_chat
from mapfjax.engineer.context import RoundRecord
from mapfjax.engineer.prompt import build_prompt
from mapfjax.engineer.proposal import (
    MAX_EDITS,
    Decision,
    Proposal,
    apply_proposal,
    format_diff,
    keep_current,
    parse_proposal,
)
from mapfjax.env.config import MAX_HOLE_RATIO, key_size

GenerateFn = Callable[[list[str], int], list[str]]  # (prompts, n) -> n samples per prompt
ScoreFn = Callable[[str, list[str]], list[float]]  # (prompt, continuations) -> total log-lik


class Engineer(Protocol):
    name: str

    def propose(
        self,
        context: str,
        current: ml_collections.ConfigDict,
        rng: Any,
        records: Sequence[RoundRecord] = (),
    ) -> Decision: ...


# ----------------------------------------------------------------------------- local edits


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One local edit: a diff and the sentence that explains it."""

    diff: dict[str, float]
    description: str

    def text(self) -> str:
        """The edit written in the engineer's answer format."""
        return format_diff(self.diff, self.description)


def _label(size_key: str) -> str:
    n = key_size(size_key)
    return f"{n}x{n}"


def candidate_edits(
    current: ml_collections.ConfigDict, steps: Sequence[float] = (0.05, 0.1)
) -> list[Candidate]:
    """Every local edit of `current`, in a fixed order (size, then field, then step).

    Per size: hole_ratio and wait_ratio up or down by each step (clipped to the legal range,
    no-ops dropped); between neighbouring sizes: move `step` of data share either way (only
    when the source has that much). Values are rounded to 4 decimals so their text is short.
    """
    sizes = sorted(current.sizes, key=key_size)
    out: list[Candidate] = []
    seen: set[tuple] = set()
    for s in sizes:
        for field, hi in (("hole_ratio", MAX_HOLE_RATIO), ("wait_ratio", 1.0)):
            cur = float(current.sizes[s][field])
            for step in steps:
                for sign in (1, -1):
                    new = round(min(max(cur + sign * step, 0.0), hi), 4)
                    key = f"sizes.{s}.{field}"
                    if math.isclose(new, cur, abs_tol=1e-9) or (key, new) in seen:
                        continue
                    seen.add((key, new))
                    verb = "raise" if new > cur else "lower"
                    out.append(
                        Candidate(
                            {key: new}, f"{verb} {field} of {_label(s)} from {cur:.3g} to {new:.3g}"
                        )
                    )
    for a, b in zip(sizes, sizes[1:]):
        for step in steps:
            for src, dst in ((a, b), (b, a)):
                have = float(current.sizes[src].data_ratio)
                get = float(current.sizes[dst].data_ratio)
                if have + 1e-9 < step:
                    continue
                diff = {
                    f"sizes.{src}.data_ratio": round(max(have - step, 0.0), 4),
                    f"sizes.{dst}.data_ratio": round(get + step, 4),
                }
                text = f"move {step:g} of the data share from {_label(src)} to {_label(dst)}"
                out.append(Candidate(diff, text))
    return out


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
    """Never changes the config: the fixed-environment baseline."""

    name: str = "fixed"

    def propose(self, context, current, rng, records=()) -> Decision:
        return keep_current(current, self.name, "the fixed engineer never changes the config")


@dataclasses.dataclass
class RandomEngineer:
    """`num_edits` local edits drawn uniformly from `candidate_edits` with the given rng.

    Edits touching a key already chosen are skipped, so every key is set once.
    """

    num_edits: int = 1
    steps: tuple[float, ...] = (0.05, 0.1)
    name: str = "random"

    def propose(self, context, current, rng, records=()) -> Decision:
        rng = np.random.default_rng(rng)
        candidates = candidate_edits(current, self.steps)
        diff: dict[str, float] = {}
        words = []
        for i in rng.permutation(len(candidates)):
            if len(words) == self.num_edits:
                break
            c = candidates[int(i)]
            if set(c.diff) & set(diff):
                continue
            diff.update(c.diff)
            words.append(c.description)
        text = format_diff(diff, "Random local edits: " + "; ".join(words) + ".")
        return apply_proposal(parse_proposal(text, max_edits=len(diff)), current, self.name)


@dataclasses.dataclass
class RuleEngineer:
    """A threshold curriculum on each size's latest valid rate v (records[-1].validation).

    v < low (collapsed): hole_ratio and wait_ratio down by `step`, data weight x (1 - shift).
    low <= v <= high (learnable): data weight x (1 + shift).
    v > high (mastered): wait_ratio up by `step`, data weight x (1 - shift).
    Sizes with fewer than `min_rows` validation rows keep their weight; the weights are then
    renormalised into data_ratio. Values are clipped to the legal ranges.
    """

    low: float = 0.3
    high: float = 0.8
    step: float = 0.05
    shift: float = 0.25
    min_rows: int = 1
    name: str = "rule"

    def propose(self, context, current, rng, records=()) -> Decision:
        if not records or not records[-1].validation:
            return keep_current(current, self.name, "no validation results to act on")
        val = records[-1].validation
        sizes = sorted(current.sizes, key=key_size)
        weights = {s: float(current.sizes[s].data_ratio) for s in sizes}
        diff: dict[str, float] = {}
        notes = []
        for s in sizes:
            e = val.get(s)
            if not e or e["n"] < self.min_rows:
                continue
            v = e["valid"] / e["n"]
            cfg = current.sizes[s]
            if v < self.low:
                diff[f"sizes.{s}.hole_ratio"] = max(cfg.hole_ratio - self.step, 0.0)
                diff[f"sizes.{s}.wait_ratio"] = max(cfg.wait_ratio - self.step, 0.0)
                weights[s] *= 1 - self.shift
                notes.append(f"{_label(s)} valid {v:.0%} < {self.low:.0%}: easier, less data")
            elif v <= self.high:
                weights[s] *= 1 + self.shift
                notes.append(f"{_label(s)} valid {v:.0%} is learnable: more data")
            else:
                diff[f"sizes.{s}.wait_ratio"] = min(cfg.wait_ratio + self.step, 1.0)
                weights[s] *= 1 - self.shift
                notes.append(f"{_label(s)} valid {v:.0%} > {self.high:.0%}: more waits, less data")
        total = sum(weights.values())
        for s in sizes:
            share = weights[s] / total if total > 0 else 1.0 / len(sizes)
            if not math.isclose(share, current.sizes[s].data_ratio, rel_tol=1e-12):
                diff[f"sizes.{s}.data_ratio"] = share
        diff = {
            k: v
            for k, v in diff.items()
            if not math.isclose(v, current.sizes[k.split(".")[1]][k.split(".")[2]], abs_tol=1e-12)
        }
        summary = "; ".join(notes) + "." if notes else "No size has validation rows."
        error = "" if diff else f"no rule changes the config ({summary})"
        proposal = Proposal(
            raw=format_diff(diff, summary), diff=diff, summary=summary, source="rule", error=error
        )
        return apply_proposal(proposal, current, self.name)


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
            return keep_current(current, self.name, "the openai package is not installed")
        if not model:
            return keep_current(current, self.name, "no model: set engineer.model or OPENAI_MODEL")
        if not key:
            return keep_current(
                current, self.name, "no API key: set engineer.api_key or OPENAI_API_KEY"
            )
        prompt = build_prompt(context, current, self.max_edits)
        try:
            text, errors = self.chat(self.client(), prompt)
        except api_chat.ChatError as e:
            extra["errors"] = e.errors
            return keep_current(current, self.name, str(e), extra=extra)
        extra.update(errors=errors, attempts=len(errors) + 1)
        return apply_proposal(parse_proposal(text, self.max_edits), current, self.name, **extra)


# ----------------------------------------------------------------------------- policy


@dataclasses.dataclass
class PolicyEngineer:
    """A checkpoint as the engineer, through injected functions.

    mode "free": `generate_fn([prompt], num_samples)` samples answers; the choice rule takes the
    first sample, in sampling order, whose diff parses and changes the config.
    mode "constrained": `score_fn(prompt, texts)` scores every `candidate_edits` answer text
    by total log-likelihood; the most likely one wins (ties: earliest), always well-formed.
    mode "free_then_constrained": free, and constrained when no sample changes the config.
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
            decision = step(self, prompt, current)
            if not decision.kept_current:
                return decision
            reasons.append(decision.reason)
        return dataclasses.replace(decision, reason=" | ".join(reasons))

    def _free(self, prompt: str, current) -> Decision:
        if self.generate_fn is None:
            return keep_current(current, self.name, "free mode needs a generate_fn")
        try:
            texts = list(self.generate_fn([prompt], self.num_samples))
        except Exception as e:  # a sampling failure keeps the config, says why
            return keep_current(current, self.name, f"generate_fn failed: {type(e).__name__}: {e}")
        samples = []
        for i, text in enumerate(texts):
            d = apply_proposal(parse_proposal(text, self.max_edits), current, self.name)
            samples.append(
                {"index": i, "changed": not d.kept_current, "reason": d.reason, "text": text}
            )
            if not d.kept_current:
                return dataclasses.replace(
                    d, extra={"mode": "free", "chosen": i, "samples": samples}
                )
        why = "; ".join(f"sample {s['index']}: {s['reason']}" for s in samples) or "no samples"
        return keep_current(
            current,
            self.name,
            f"no sample changed the config ({why})",
            raw=texts[0] if texts else "",
            extra={"mode": "free", "chosen": None, "samples": samples},
        )

    def _constrained(self, prompt: str, current) -> Decision:
        if self.score_fn is None:
            return keep_current(current, self.name, "constrained mode needs a score_fn")
        candidates = candidate_edits(current, self.steps)
        if not candidates:
            return keep_current(current, self.name, "no local edit is possible")
        try:
            best, scores = choose_by_likelihood(self.score_fn, prompt, candidates)
        except Exception as e:  # a scoring failure keeps the config, says why
            return keep_current(current, self.name, f"score_fn failed: {type(e).__name__}: {e}")
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
        raise ValueError(f"engineer ({name}): unknown key(s) {unknown}; allowed: {sorted(fields)}")
    for k in ("steps",):
        if k in d:
            d[k] = tuple(d[k])
    return factory(**d, **inject)
