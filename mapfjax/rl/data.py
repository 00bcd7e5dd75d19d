"""SFT data: generated instances -> chat prompts + canonical oracle answers (with a trace form,
the think block of `env.forms` before each) -> shuffled `SequenceBatch`es, deterministic given
a seed."""

from __future__ import annotations

import bisect
import dataclasses
import json
import pathlib
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from mapfjax import files
from mapfjax.env import forms, generator, io, oracle, text, trace
from mapfjax.env.types import Problem
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl.batch import SequenceBatch, make_batch


@dataclasses.dataclass(frozen=True)
class Example:
    """One SFT example: `prompt` token ids (chat template, generation prompt with the empty
    think block) and `completion` ids (the canonical answer, then `<|im_end|>`), trained from
    `loss_from` on (all of it by default)."""

    problem_id: str
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    puzzle: str = ""  # io.puzzle_hash of the problem (held-out sets are deduplicated on it)
    # The completion positions before this one are not in the loss (context an example shows
    # but does not teach, e.g. a wrong line before the line that catches it); 0: all trained.
    loss_from: int = 0


def oracle_answers(problems: Sequence[Problem], processes: int = 1, **budget) -> list:
    """Optimal per-agent action lists (`oracle.answer_actions`) for each problem.

    Raises ValueError naming the first problem the oracle could not solve within `budget`.
    """
    sols = oracle.solve_many(problems, processes=processes, **budget)
    out = []
    for p, s in zip(problems, sols, strict=True):
        if not s.optimal:
            raise ValueError(f"problem {p.id!r}: oracle status {s.status!r}, no optimal answer")
        out.append(oracle.answer_actions(s))
    return out


def encode_prompts(tokenizer, problems: Sequence[Problem], enable_thinking: bool = False):
    """Chat-template token ids of each problem's rendered prompt."""
    prompts = [text.render_prompt(p) for p in problems]
    return tok_lib.encode_chat(tokenizer, prompts, enable_thinking=enable_thinking)


def response(problem: Problem, actions, form=None) -> str:
    """The text a policy is trained to write for `actions` (None: the oracle's): the answer
    block, after the think block of `form` (`env.forms`: a TraceForm or the name of one; None
    writes the answer alone). A form that finds its own plan writes that one, not `actions`;
    a ValueError names the problem when it has no trace for it."""
    turn = responses([problem], None if actions is None else [actions], form)[0]
    if turn is None:
        name = forms.get(form, "form").name
        raise ValueError(f"problem {problem.id!r}: the {name} trace form finds no plan")
    return turn


def responses(problems: Sequence[Problem], answers=None, form=None) -> list[str | None]:
    """Each problem's `response`; `answers` (per-problem action lists) default to the oracle's,
    which a form calls only where it needs them (`TraceForm.response`): a puzzle the form has
    no trace for gets None (callers leave it out and count it)."""
    if form is None:
        answers = oracle_answers(problems) if answers is None else answers
        return [text.render_answer(a) for a in answers]
    form = forms.get(form, "form")
    given = [None] * len(problems) if answers is None else answers
    return [form.response(p, a) for p, a in zip(problems, given, strict=True)]


def sft_turns(
    problems: Sequence[Problem], answers=None, form=None, answer_only: float = 0.0
) -> list[str | None]:
    """The completion text of each problem's SFT example (`sft_examples`; None: no example):
    its `response`, or for about `answer_only` of the puzzles (with a form; chosen by puzzle
    hash, `skips_trace`) the same answer after an empty think block (`bare_answer`)."""
    if not (0 <= answer_only <= 1) or (answer_only and form is None):
        raise ValueError(f"answer_only {answer_only!r}: a share in [0, 1], above 0 only with "
                         "a trace form")  # fmt: skip
    turns = responses(problems, answers, form)
    return [
        bare_answer(t) if t is not None and skips_trace(p, answer_only) else t
        for p, t in zip(problems, turns, strict=True)
    ]


def sft_examples(
    tokenizer,
    problems: Sequence[Problem],
    answers=None,
    form=None,
    answer_only: float = 0.0,
) -> list[Example]:
    """Examples for `problems`; `answers` (per-problem action lists) default to the oracle's.
    form (`env.forms`, with thinking): the prompt opens the assistant turn without the empty
    think block and the completion is the form's think block, then the answer (`response`);
    a puzzle the form has no trace for has no example. answer_only (with a form): about this
    share of the puzzles, chosen by puzzle hash, get the same answer after an empty think
    block (`<think>\n\n</think>`, Qwen3's form without thinking) instead of their trace, so
    that the policy thinks on some samples and answers at once on others, whatever the
    puzzle (`sft_turns`)."""
    turns = sft_turns(problems, answers, form, answer_only)
    im_end = tok_lib.special_ids(tokenizer).im_end
    kept = [(p, t) for p, t in zip(problems, turns, strict=True) if t is not None]
    prompts = encode_prompts(tokenizer, [p for p, _ in kept], enable_thinking=form is not None)
    out = []
    for (p, turn), ids in zip(kept, prompts, strict=True):
        ans = tokenizer(turn, add_special_tokens=False)["input_ids"]
        out.append(Example(p.id, tuple(ids), (*ans, im_end), io.puzzle_hash(p)))
    return out


def skips_trace(problem: Problem, share: float) -> bool:
    """Whether `sft_examples(answer_only=share)` gives `problem` the answer alone: a
    deterministic draw from the puzzle's hash (its second 12 hex digits, so that it does not
    follow a draw an experiment makes from the first)."""
    return int(io.puzzle_hash(problem)[12:24], 16) % 10_000 < share * 10_000


def bare_answer(turn: str) -> str:
    """A thinking turn (`response`) with its trace left out: an empty think block, then the
    same answer block."""
    return f"{trace.THINK_OPEN}\n\n{turn[trace.answer_start(turn) :]}"


def chunks_by_length(prompts: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Positions of `prompts` in order of length (stable), cut into chunks of `size`: each
    chunk then pads its prompts to its own longest."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[i : i + size] for i in range(0, len(order), size)]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def to_batch(
    examples: Sequence[Example],
    pad_id: int,
    prompt_bucket="x64",
    completion_multiple: int = 64,
    targets: Sequence[Sequence[int]] | None = None,
) -> SequenceBatch:
    """One SFT `SequenceBatch` (NumPy leaves): every completion token is in the loss, but
    those before an example's `loss_from`.

    targets: per example, prompt positions also in the loss (e.g. `coordinate_targets`); the
    batch then cuts each row at its first target, so the completion columns hold the prompt's
    tail + the answer and the loss mask selects the targets + the answer. Rows see the same
    tokens at the same positions either way. The completion length T is rounded up to
    `completion_multiple` so few shapes compile: each compiled train step holds hundreds of
    memory maps on CPU, and at 16 the trace recipe's completions (100-1,100 tokens) made 55
    shapes per stage, recompiled at each stage, and a 6,000-update run died on the kernel's
    map limit (`vm.max_map_count`, 65,530: "LLVM ERROR: Unable to allocate section memory");
    64 makes 18 at 4.5 % more tokens per row.
    """
    cuts = [len(e.prompt) for e in examples]
    masks = None
    if targets is not None:
        cuts = [min(t, default=len(e.prompt)) for e, t in zip(examples, targets, strict=True)]
    if targets is not None or any(e.loss_from for e in examples):
        masks = [
            [j in t for j in range(c, len(e.prompt))]
            + [j >= e.loss_from for j in range(len(e.completion))]
            for e, t, c in zip(
                examples, map(set, targets or [()] * len(examples)), cuts, strict=True
            )  # fmt: skip
        ]
    prompts = [list(e.prompt[:c]) for e, c in zip(examples, cuts, strict=True)]
    completions = [list(e.prompt[c:] + e.completion) for e, c in zip(examples, cuts, strict=True)]
    return make_batch(
        prompts,
        completions,
        pad_id,
        prompt_bucket=prompt_bucket,
        completion_bucket=_round_up(max(map(len, completions)), completion_multiple),
        loss_masks=masks,
    )


def coordinate_targets(tokenizer, examples: Sequence[Example]) -> list[tuple[int, ...]]:
    """Per example, the prompt positions of the tokens that spell the agents' start and goal
    coordinates ("Agent i needs to go from (r, c) to (r, c)").

    An auxiliary SFT target (`to_batch(targets=...)`): each number is fixed by where the
    agent's S/G letter stands in the map above it, so predicting it teaches the model to turn
    a map cell into its (row, col), the lookup every planned move needs.
    """
    pieces: dict[int, str] = {}
    out = []
    for e in examples:
        for i in set(e.prompt) - pieces.keys():
            pieces[i] = tokenizer.decode([i])
        ends = np.cumsum([len(pieces[i]) for i in e.prompt]).tolist()
        prompt = "".join(pieces[i] for i in e.prompt)
        found = set()
        for m in text.AGENT_RE.finditer(prompt):
            for g in range(2, 6):  # tokens overlapping each coordinate's characters
                first = bisect.bisect_right(ends, m.start(g))
                found.update(range(first, bisect.bisect_left(ends, m.end(g)) + 1))
        out.append(tuple(sorted(found)))
    return out


def epoch_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, window: int = 16):
    """Row indices of one epoch's batches, int [num_batches, batch_size].

    A permutation from (seed, epoch), cut into windows of `window` batches; rows within a
    window are sorted by length before being cut into batches (so a batch's rows have similar
    lengths and little padding), and the batches are then shuffled. window=1 is a plain shuffle.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    n = (len(order) // batch_size) * batch_size  # drop the partial last batch
    lengths = np.asarray(lengths)
    span = batch_size * window
    chunks = [order[i : i + span] for i in range(0, n, span)]
    chunks = [c[: (len(c) // batch_size) * batch_size] for c in chunks]
    rows = np.concatenate([c[np.argsort(lengths[c], kind="stable")] for c in chunks])
    batches = rows[:n].reshape(-1, batch_size)
    return batches[rng.permutation(len(batches))]


def sft_batches(
    examples: Sequence[Example],
    batch_size: int,
    pad_id: int,
    seed: int = 0,
    epochs: int | None = 1,
    start_step: int = 0,
    window: int = 16,
    targets: Sequence[Sequence[int]] | None = None,
    **batch_kw,
) -> Iterator[SequenceBatch]:
    """Batches of `batch_size` examples, epoch after epoch (None = forever), in the order of
    `epoch_order` (similar lengths per batch; `window` 1 = a plain shuffle). targets: per
    example, extra prompt positions in the loss (`to_batch`).

    A partial last batch is dropped so every batch has the same number of rows. `start_step`
    skips that many batches (resuming after a restart yields the same stream as an
    uninterrupted run).
    """
    if batch_size < 1 or batch_size > len(examples):
        raise ValueError(
            f"batch_size={batch_size}: allowed 1..{len(examples)} (the number of examples)"
        )
    if targets is not None and len(targets) != len(examples):
        raise ValueError(
            f"targets has {len(targets)} entries for {len(examples)} examples: allowed one per "
            "example (`coordinate_targets(tokenizer, examples)`)"
        )
    lengths = [len(e.prompt) + len(e.completion) for e in examples]
    per_epoch = len(examples) // batch_size
    epoch, step = divmod(start_step, per_epoch)
    while epochs is None or epoch < epochs:
        order = epoch_order(lengths, batch_size, seed, epoch, window)
        for rows in order[step:]:
            rows_targets = None if targets is None else [targets[j] for j in rows]
            yield to_batch([examples[j] for j in rows], pad_id, targets=rows_targets, **batch_kw)
        epoch, step = epoch + 1, 0


def generate_problems(
    env_cfg, n: int, seed: int, processes: int = 1, hole_ratios: Sequence[float] = ()
) -> list[Problem]:
    """`n` labelled instances from the generator config `env_cfg`, deterministic in `seed`.

    hole_ratios: when given, an equal share of the instances (the first ones get the
    remainder) is drawn at each hole ratio, set for every size of `env_cfg`: a training or
    held-out set spread over the hole-ratio range instead of one value per size."""
    cfg = env_cfg.copy_and_resolve_references()
    cfg.oracle.processes = processes
    if not hole_ratios:
        return generator.generate(jax.random.key(seed), cfg, n).problems
    out = []
    for j, h in enumerate(hole_ratios):
        part = n // len(hole_ratios) + (j < n % len(hole_ratios))
        for size in cfg.sizes.values():
            size.hole_ratio = float(h)
        key = jax.random.fold_in(jax.random.key(seed), j)
        drawn = generator.generate(key, cfg, part, id_prefix=f"h{h:g}_").problems
        out += [dataclasses.replace(p, meta={**(p.meta or {}), "hole_ratio": h}) for p in drawn]
    return out


def save_examples(path, examples: Sequence[Example]) -> None:
    """Write examples as JSON lines (atomically)."""
    lines = (json.dumps(dataclasses.asdict(e)) for e in examples)
    files.atomic_write(path, ("\n".join(lines) + "\n").encode())


def load_examples(path) -> list[Example]:
    """Read examples written by `save_examples`; errors name the file and line."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            try:
                d = json.loads(line)
                ex = Example(
                    str(d["problem_id"]),
                    tuple(d["prompt"]),
                    tuple(d["completion"]),
                    str(d.get("puzzle", "")),
                    int(d.get("loss_from", 0)),
                )
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: not an SFT example ({e!r})") from e
            out.append(ex)
    return out


def cached(path, build, save, load):
    """`load(path)`, after `save(path, build())` when `path` does not exist yet (a pipeline
    stage whose output survives restarts)."""
    path = pathlib.Path(path)
    if not path.exists():
        save(path, build())
    return load(path)
