"""Rollouts for GRPO (problems -> prompts -> G samples each -> parse -> verify -> rewards ->
group advantages -> `SequenceBatch`) and greedy evaluation per map size (`greedy_eval`)."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from mapfjax import stats
from mapfjax.env import dynamics, forms, reward, text, trace, types
from mapfjax.env.types import Problem
from mapfjax.models import sampler
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import grpo
from mapfjax.rl.batch import GroupBatch, SequenceBatch, make_batch
from mapfjax.rl.data import chunks_by_length, encode_prompts
from mapfjax.rl.logprobs import completion_logprobs

log = logging.getLogger(__name__)


# What of a thinking response the GRPO loss trains (`trace_loss_masks`): every token; the
# trace's per-step lines and the answer (not the header); the closing tag and the answer only.
TRACE_LOSSES = ("all", "moves", "answer")
_LOSS_START = {"moves": trace.header_end, "answer": trace.answer_start}


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn and laid out for training. temperature 0 = greedy; it must
    equal the GRPO loss's temperature so old and new log-probs describe the same distribution.
    A truncation rate above `warn_truncation` triggers a warning (truncated answers score 0:
    no signal). bucket / completion_bucket: length rules (`sampler.BUCKETS`) for prompts and
    for the training batch's completion width (capped at max_new_tokens). shared_prefix:
    `make_batch`'s layout choice for the training batch (True, False or "auto"). trace_loss
    (`TRACE_LOSSES`): "all" trains every response token; "moves" leaves a thinking response's
    header (the map transcription and the agents' lines before step `t1`, a function of the
    prompt) out of the GRPO loss; "answer" leaves the whole trace out and trains `</think>` and
    the answer block, the only part the reward reads. greedy_member: each group's first
    completion is the policy's greedy answer (temperature 0) and the other group_size - 1 are
    sampled, so the group-relative advantage also scores the answer greedy evaluation reads:
    a greedy plan that fails beside valid samples is pushed down at the tokens where they part
    (the idea of self-critical sequence training's greedy baseline, kept inside GRPO's group).
    The greedy row is not drawn from the policy; its old log-probs are the trainer's at the
    sampling temperature, so its importance ratio starts at 1 like every other row's.
    logit_bias: ((token id, value), ...) added to those logits at every decode step
    (`sampler.generate(logit_bias=...)`): for evaluation diagnostics; training leaves it empty
    (the trainer's log-probs know nothing of it). steps_per_loop: decode steps per iteration
    of the sampler's loop (`sampler.generate(steps_per_loop=...)`): the same completions, the
    loop's exit test read back once per that many tokens (a per-token cost on a GPU)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    enable_thinking: bool = False
    bucket: str = "pow2_mid"
    warn_truncation: float = 0.2
    completion_bucket: str = "pow2"
    shared_prefix: bool | str = True
    trace_loss: str = "all"
    greedy_member: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    steps_per_loop: int = 1

    def __post_init__(self):
        if self.trace_loss not in TRACE_LOSSES:
            raise ValueError(
                f"trace_loss={self.trace_loss!r}; allowed: {', '.join(map(repr, TRACE_LOSSES))}"
            )


@dataclasses.dataclass(frozen=True)
class RolloutStats:
    """Host statistics of one rollout (B = problems x group_size responses).

    failures: response count per failure name ("none" = valid, then types.FAILURE_NAMES).
    mixed_groups: share of groups whose rewards differ (the only groups with a gradient).
    logprob_gap: mean |sampled - untruncated| log-prob (top-k/top-p cost, 0 without them).
    logprob_mismatch: mean |sampler - trainer recomputed| log-prob over response tokens, or
        None when not measured (`rollout(..., measure_mismatch=True)`).
    greedy_valid_rate: share of the groups whose greedy member is valid (None without
        `SamplingConfig.greedy_member`; the other rates count every row, the greedy ones too).
    valid, rewards: per response [B] (NumPy; not in `as_dict`), for per-size statistics and
        group selection.
    """

    reward_mean: float
    valid_rate: float
    optimal_rate: float
    failures: dict[str, int]
    response_len_mean: float
    response_len_max: int
    truncation_rate: float
    mixed_groups: float
    logprob_gap: float
    logprob_mismatch: float | None = None
    greedy_valid_rate: float | None = None
    valid: np.ndarray | None = dataclasses.field(default=None, repr=False)
    rewards: np.ndarray | None = dataclasses.field(default=None, repr=False)

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.pop("valid"), d.pop("rewards")
        d.update({f"fail_{k}": v for k, v in d.pop("failures").items()})
        return d


def policy_model(policy):
    """The nnx model to sample from: a `Trainer` (its `model()` view) or a model."""
    if isinstance(policy, nnx.Module):
        return policy
    if callable(getattr(policy, "model", None)):
        return policy.model()
    raise TypeError(f"expected an nnx model or a Trainer with .model(), got {type(policy)}")


class Samples(NamedTuple):
    """What `sample` returns, one row per (problem, repeat), `repeats` consecutive rows per
    problem: prompts (token ids), output (the sampler's `SampleOutput`), completions (token
    id lists, cut at the stop token) and texts (decoded completions)."""

    prompts: list[list[int]]
    output: sampler.SampleOutput
    completions: list[list[int]]
    texts: list[str]


def sample(model, tokenizer, problems, repeats, cfg: SamplingConfig, key, mesh=None) -> Samples:
    """Generate `repeats` completions per problem (consecutive rows) with the trainer's prompt
    and stop tokens (`Samples`). Evaluation uses the same function, so train-time and eval-time
    prompts never drift."""
    ids = tok_lib.special_ids(tokenizer)
    distinct = encode_prompts(tokenizer, problems, cfg.enable_thinking)
    # Each prompt is prefilled once; its `repeats` samples share its keys and values.
    out = sampler.generate(
        model,
        distinct,
        cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        stop_tokens=(ids.im_end, ids.pad),
        key=key,
        pad_id=ids.pad,
        bucket=cfg.bucket,
        mesh=mesh,
        num_samples=repeats,
        logit_bias=dict(cfg.logit_bias) or None,
        steps_per_loop=cfg.steps_per_loop,
    )
    prompts = [p for p in distinct for _ in range(repeats)]
    completions = sampler.to_lists(out)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=False)
    return Samples(prompts, out, completions, texts)


def score(problems, repeats: int, texts, reward_cfg: reward.RewardConfig):
    """Parse and verify responses (`repeats` consecutive rows per problem) ->
    (Verdict with [B] leaves, rewards f32 [B] as NumPy)."""
    rows = [p for p in problems for _ in range(repeats)]
    if len(rows) != len(texts):
        raise ValueError(f"{len(texts)} texts for {len(problems)} problems x {repeats}")
    instances = jax.tree.map(np.asarray, types.to_instances(rows))
    parsed = text.parse_answers(texts, [p.num_agents for p in rows])
    verdict = dynamics.verify(instances, parsed)
    share = reward.agent_success(instances, parsed) if reward_cfg.agent_credit else None
    return verdict, np.asarray(reward.rewards(verdict, reward_cfg, share))


def trace_loss_masks(tokenizer, completions, texts, trace_loss: str) -> list[list[bool]]:
    """Per completion, True on the tokens the loss trains under `trace_loss` (`TRACE_LOSSES`):
    tokens that end at or before the response's cut (`trace.header_end` for "moves",
    `trace.answer_start` for "answer") are False. "moves" trains a response without a step line
    whole; "answer" trains nothing of a trace that never closes. A completion whose tokens do
    not decode piecewise into its text is trained whole."""
    if trace_loss == "all":
        return [[True] * len(c) for c in completions]
    start = _LOSS_START[trace_loss]
    widths: dict[int, int] = {}  # token id -> decoded length, filled lazily (151k-token vocabs)
    masks = []
    for comp, response in zip(completions, texts, strict=True):
        end = start(response)
        comp = [int(t) for t in comp]
        for t in set(comp) - widths.keys():
            widths[t] = len(tokenizer.decode([t], skip_special_tokens=False))
        ends = np.cumsum([widths[t] for t in comp]) if comp else np.zeros(0, int)
        if (trace_loss == "moves" and end == 0) or not comp or ends[-1] != len(response):
            masks.append([True] * len(comp))
        else:
            masks.append((ends > end).tolist())
    return masks


def _failure_counts(failure: np.ndarray) -> dict[str, int]:
    """Responses per failure name; valid ones are counted under "none"."""
    names = (types.FAILURES[int(f)] or "none" for f in failure)
    return stats.count_labels(names, ("none", *types.FAILURE_NAMES))


def greedy_groups(model, tokenizer, problems, group_size: int, cfg: SamplingConfig, key) -> Samples:
    """`sample`'s rows for `problems` in groups of `group_size`: each group's greedy answer
    (temperature 0) first, then group_size - 1 completions drawn with `cfg`. The output's arrays
    are host NumPy in that order; a greedy row's `logprobs_full` is log_softmax(logits), the
    trainer's own log-prob at temperature 1 only (`rollout` recomputes them at another)."""
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: a greedy member needs a sampled row beside it")
    k, n = group_size - 1, len(problems)
    drawn = sample(model, tokenizer, problems, k, cfg, key)
    greedy = sample(model, tokenizer, problems, 1, dataclasses.replace(cfg, temperature=0.0), None)
    calls = (drawn, greedy)
    rows = [
        (1, i) if j == 0 else (0, i * k + j - 1) for i in range(n) for j in range(group_size)
    ]  # (call, its row) per merged row
    pad = tok_lib.special_ids(tokenizer).pad

    def merged(field: str) -> np.ndarray:
        parts = [sampler.to_host(getattr(s.output, field)) for s in calls]
        if parts[0].ndim == 2:  # [B, N] of two calls: N may differ; the tails are padding / 0
            width, fill = max(x.shape[1] for x in parts), pad if field == "tokens" else 0
            parts = [
                np.pad(x, [(0, 0), (0, width - x.shape[1])], constant_values=fill) for x in parts
            ]
        return np.stack([parts[c][r] for c, r in rows])

    fields = ("tokens", "lengths", "logprobs", "logprobs_full", "finished")
    steps = max(int(sampler.to_host(s.output.steps)) for s in calls)
    out = sampler.SampleOutput(**{f: merged(f) for f in fields}, steps=np.int32(steps))
    pick = lambda name: [getattr(calls[c], name)[r] for c, r in rows]  # noqa: E731
    return Samples(pick("prompts"), out, pick("completions"), pick("texts"))


@nnx.jit(static_argnames="temperature")
def _recomputed_logprobs(model, batch, temperature: float):
    return completion_logprobs(model, batch, temperature)[0]


def rollout(
    policy,
    tokenizer,
    problems: Sequence[Problem],
    group_size: int,
    sampling: SamplingConfig,
    reward_cfg: reward.RewardConfig,
    key: jax.Array,
    *,
    grpo_cfg: grpo.GRPOConfig | None = None,
    measure_mismatch: bool = False,
) -> tuple[SequenceBatch | GroupBatch, RolloutStats]:
    """One GRPO rollout: `group_size` samples for each problem with the policy's current weights.

    policy: a `Trainer` or an nnx model. Returns a `GroupBatch` of len(problems) prompts x
    group_size completions (a `SequenceBatch` of consecutive groups when
    `sampling.shared_prefix` is False; NumPy leaves) whose loss mask covers each response
    up to and including its end-of-turn token, old_logprobs = the sampler's `logprobs_full`,
    advantages = `grpo.group_advantages` of the rewards (options from `grpo_cfg`), and host
    `RolloutStats`. measure_mismatch runs one extra forward pass to compare the sampler's log-
    probs with the trainer's recomputation (docs/paper.md section 8).
    """
    grpo_cfg = grpo.GRPOConfig(group_size=group_size) if grpo_cfg is None else grpo_cfg
    if grpo_cfg.group_size != group_size:
        raise ValueError(f"group_size={group_size} but grpo_cfg.group_size={grpo_cfg.group_size}")
    if sampling.temperature != grpo_cfg.temperature:
        raise ValueError(
            f"sampling.temperature={sampling.temperature} differs from the GRPO loss's "
            f"temperature={grpo_cfg.temperature}; the importance ratio would compare different "
            "distributions"
        )
    model = policy_model(policy)
    pad = tok_lib.special_ids(tokenizer).pad
    draw = greedy_groups if sampling.greedy_member else sample
    samples = draw(model, tokenizer, problems, group_size, sampling, key)
    completions, out = samples.completions, samples.output
    verdict, rew = score(problems, group_size, samples.texts, reward_cfg)
    adv = np.asarray(
        grpo.group_advantages(
            rew, group_size, grpo_cfg.scale_by_std, grpo_cfg.std_eps, grpo_cfg.std_ddof
        )
    )
    n = len(completions)
    masks = None
    if sampling.trace_loss != "all" and sampling.enable_thinking:
        masks = trace_loss_masks(tokenizer, completions, samples.texts, sampling.trace_loss)
    # Length-aware shapes: the completion width is the longest completion's bucket (not the
    # budget), so a batch of short answers trains on short rows; the prompt is run once per
    # group (`GroupBatch`).
    batch = make_batch(
        samples.prompts,
        completions,
        pad,
        prompt_bucket=sampling.bucket,
        completion_bucket=sampling.completion_bucket,
        old_logprobs=np.asarray(out.logprobs_full)[:n],
        advantages=adv,
        loss_masks=masks,
        group_size=group_size,
        shared_prefix=sampling.shared_prefix,
        max_completion_len=sampling.max_new_tokens,
    )
    if sampling.greedy_member and sampling.temperature != 1.0:  # greedy rows: log_softmax(logits)
        old = np.asarray(_recomputed_logprobs(model, batch, sampling.temperature))
        batch = batch.replace(old_logprobs=np.where(np.asarray(batch.loss_mask), old, 0.0))
    lengths = np.array([len(c) for c in completions])
    finished = np.asarray(out.finished)[:n]
    grouped = rew.reshape(-1, group_size)
    mismatch = None
    if measure_mismatch:
        recomputed = np.asarray(_recomputed_logprobs(model, batch, sampling.temperature))
        live = np.asarray(batch.loss_mask)
        mismatch = float(np.abs(recomputed - batch.old_logprobs)[live].mean())
    stats = RolloutStats(
        reward_mean=float(rew.mean()),
        valid_rate=float(np.mean(verdict.valid)),
        optimal_rate=float(np.mean(verdict.optimal)),
        failures=_failure_counts(np.asarray(verdict.failure)),
        response_len_mean=float(lengths.mean()),
        response_len_max=int(lengths.max()),
        truncation_rate=float(1.0 - finished.mean()),
        mixed_groups=float(np.mean(grouped.max(1) > grouped.min(1))),
        logprob_gap=sampler.logprob_gap(out),
        logprob_mismatch=mismatch,
        greedy_valid_rate=(
            float(np.asarray(verdict.valid)[::group_size].mean())
            if sampling.greedy_member
            else None
        ),
        valid=np.asarray(verdict.valid),
        rewards=rew,
    )
    if stats.truncation_rate > sampling.warn_truncation:
        msg = (
            f"rollout: {stats.truncation_rate:.0%} of responses hit max_new_tokens="
            f"{sampling.max_new_tokens} without an end-of-turn token; they score 0 and carry no "
            "learning signal: raise sampling.max_new_tokens"
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg)
    return batch, stats


# --------------------------------------------------------------------------- greedy evaluation


@dataclasses.dataclass(frozen=True)
class SizeResult:
    """Greedy evaluation of one (map size, agent count) cell."""

    size: int
    num_agents: int
    n: int
    valid_rate: float
    optimal_rate: float
    failures: dict[str, int]
    response_len_mean: float


@dataclasses.dataclass(frozen=True)
class Validation:
    """Per-(size, agents) results of `greedy_eval`, sorted by agents then size, and their
    unweighted mean."""

    cells: tuple[SizeResult, ...]
    # Per instance: {"id", "size", "num_agents", "needs_wait" (the puzzle's label, None when
    # unlabelled), "valid", "optimal", "failure", "response_tokens", "truncated"} (what the
    # engineer's failure breakdown and wait split read).
    rows: tuple[dict, ...] = ()

    @property
    def mean_valid(self) -> float:
        return stats.cell_mean(c.valid_rate for c in self.cells)

    @property
    def mean_optimal(self) -> float:
        return stats.cell_mean(c.optimal_rate for c in self.cells)

    def table(self) -> str:
        """A Markdown table: agents, size, n, valid %, optimal %, failure counts."""
        names = list(types.FAILURE_NAMES)
        rows = [
            [c.num_agents, f"{c.size}x{c.size}", c.n, stats.percent(c.valid_rate)]
            + [stats.percent(c.optimal_rate), *(c.failures.get(f, 0) for f in names)]
            for c in self.cells
        ]
        means = [stats.percent(self.mean_valid), stats.percent(self.mean_optimal)]
        rows.append(["mean", "", "", *means, *[""] * len(names)])
        return stats.markdown_table(["agents", "size", "n", "valid %", "optimal %", *names], rows)


def greedy_eval(
    model,
    tokenizer,
    problems: Sequence[Problem],
    max_new_tokens: int = 64,
    batch_size: int = 64,
    enable_thinking: bool = False,
    reward_cfg: reward.RewardConfig | None = None,
    bucket: str = SamplingConfig.bucket,
) -> Validation:
    """Greedy decoding on `problems` (labelled, so optimality is known); valid and optimal
    rates and failure counts per (map size, agent count). `model` may be a `Trainer`.

    Prompts are answered `batch_size` at a time in order of length (rows come back in the
    given order), so a chunk pads its prompts to its own longest under `bucket`: with a fine
    rule ("x8") prefill, most of a short answer's cost, computes little padding."""
    model = policy_model(model)
    reward_cfg = reward.RewardConfig() if reward_cfg is None else reward_cfg
    cfg = SamplingConfig(max_new_tokens, 0.0, enable_thinking=enable_thinking, bucket=bucket)
    problems = list(problems)
    prompts = encode_prompts(tokenizer, problems, enable_thinking)
    done: dict[int, tuple] = {}  # position in `problems` -> (valid, optimal, failure, ...)
    for at in chunks_by_length(prompts, batch_size):
        chunk = [problems[j] for j in at]
        samples = sample(model, tokenizer, chunk, 1, cfg, None)
        finished = np.asarray(samples.output.finished)[: len(chunk)]
        verdict, _ = score(chunk, 1, samples.texts, reward_cfg)
        for n, (j, p, t) in enumerate(zip(at, chunk, samples.texts, strict=True)):
            checked = None
            if enable_thinking:  # which look-up went wrong first; does the answer copy the trace
                checked = (TRACE_FORM.check(p, t)[1], *TRACE_FORM.plan_outcome(p, t),
                           trace.thinking_text(t) == "")  # fmt: skip
            verdicts = (verdict.valid[n], verdict.optimal[n], verdict.failure[n])
            done[j] = (*verdicts, len(samples.completions[n]), finished[n], checked)
    columns = list(zip(*(done[j] for j in range(len(problems))), strict=True))
    valid, optimal, failure, length, finished, traces = columns or [()] * 6
    rows = tuple(
        {
            "id": p.id,
            "size": max(p.height, p.width),
            "num_agents": p.num_agents,
            "needs_wait": p.needs_wait,
            "valid": bool(valid[j]),
            "optimal": bool(optimal[j]),
            "failure": types.FAILURES[int(failure[j])],
            "response_tokens": int(length[j]),
            "truncated": not bool(finished[j]),
        }
        | (dict(zip(TRACE_FIELDS, traces[j], strict=True)) if enable_thinking else {})
        for j, p in enumerate(problems)
    )
    counts = stats.tally(
        rows,
        ("num_agents", "size"),
        flags=("valid", "optimal"),
        labels={"failures": ("failure", types.FAILURE_NAMES)},
        sums={"tokens": "response_tokens"},
    )
    cells = tuple(
        SizeResult(
            size=size,
            num_agents=k,
            n=c["n"],
            valid_rate=stats.rate(c, "valid"),
            optimal_rate=stats.rate(c, "optimal"),
            failures={"none": c["valid"], **c["failures"]},
            response_len_mean=c["tokens"] / c["tokens_n"],
        )
        for (k, size), c in counts.items()
    )
    return Validation(cells, rows)


# With thinking, what a validation row says of the response's trace, read as the shipped form
# writes it (TRACE_FORM): the first wrong line (`TraceForm.check`), the answer against the
# trace's plan (`TraceForm.plan_outcome`), and whether the think block is empty (the answer
# written without a trace).
TRACE_FORM = forms.GRID_RELAY
TRACE_FIELDS = ("trace_error", "trace_plan", "trace_plan_valid", "bare_answer")


def validation_report(
    v: Validation, title: str, notes: Sequence[str] = (), problems: Sequence[Problem] = ()
) -> str:
    """Markdown: a title, note lines, the validation table, and greedy valid rates per hole
    ratio when the evaluated `problems` carry one in their meta (`data.generate_problems`)."""
    lines = [f"# {title}", "", *notes, "", v.table(), ""]
    holes = [(p.meta or {}).get("hole_ratio") for p in problems]
    if any(h is not None for h in holes):
        lines += ["## Per hole ratio", "", rates_by(v.rows, holes, "hole ratio"), ""]
    if v.rows and "trace_error" in v.rows[0]:
        lines += ["## Reasoning traces: the first wrong line", "", trace_table(v.rows), ""]
    if v.rows and "trace_plan" in v.rows[0]:
        lines += ["## Reasoning traces: the answer against the trace's plan", "",
                  plan_table(v.rows), ""]  # fmt: skip
    if bare := sum(bool(r.get("bare_answer")) for r in v.rows):
        valid = sum(bool(r["valid"]) for r in v.rows if r.get("bare_answer"))
        lines += [f"Answers written without a trace (an empty think block): {bare} of "
                  f"{len(v.rows)}, {valid} of them valid.", ""]  # fmt: skip
    return "\n".join(lines)


def trace_table(rows: Sequence[dict]) -> str:
    """Markdown: per answer outcome (valid or not), how many traces were right throughout and
    what kind of look-up went wrong first in the others (`env.trace.ERROR_KINDS`)."""
    kinds = ("none", *trace.ERROR_KINDS)
    table = []
    for label, want in (("valid", True), ("invalid", False)):
        sel = [r["trace_error"] or "none" for r in rows if r["valid"] == want]
        table.append([label, len(sel), *(sel.count(k) for k in kinds)])
    return stats.markdown_table(["answer", "n", "trace right", *kinds[1:]], table)


def plan_table(rows: Sequence[dict]) -> str:
    """Markdown: how many answers copy the plan their trace chose (`env.trace.PLAN_OUTCOMES`),
    how many of those trace plans are valid, and the valid rate a faithful copy would give
    against the answers' own (95 % intervals): the gap is lost between trace and answer."""
    n = len(rows)
    table = []
    for outcome in trace.PLAN_OUTCOMES:
        sel = [r for r in rows if r["trace_plan"] == outcome]
        plan_ok = sum(bool(r["trace_plan_valid"]) for r in sel)
        answer_ok = sum(bool(r["valid"]) for r in sel)
        table.append([outcome, len(sel), "-" if outcome == "no_plan" else plan_ok, answer_ok])
    header = ["answer vs trace plan", "n", "trace plan valid", "answer valid"]
    plans = stats.interval_text(stats.proportion([bool(r["trace_plan_valid"]) for r in rows]))
    answers = stats.interval_text(stats.proportion([r["valid"] for r in rows]))
    return (
        f"{stats.markdown_table(header, table)}\n\nValid % of all {n} if every answer copied "
        f"its trace's plan: {plans}; the answers as written: {answers}."
    )


def rates_by(rows: Sequence[dict], labels: Sequence, name: str) -> str:
    """Markdown: greedy valid % with its 95 % interval per label (rows and labels in the same
    order, e.g. each validation puzzle's hole ratio); rows whose label is None are left out."""
    table = []
    for label in sorted({x for x in labels if x is not None}):
        hits = [r["valid"] for r, x in zip(rows, labels, strict=True) if x == label]
        table.append([f"{label:g}", len(hits), stats.interval_text(stats.proportion(hits))])
    return stats.markdown_table([name, "n", "greedy valid %"], table)
