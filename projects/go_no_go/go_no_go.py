r"""Go / no-go for a starting policy: GRPO with the fixed engineer on the held-out distribution
(2 agents, 3x3-6x6) and, with the same budget, on a mismatched one (3x3 maps only, or with
`--mismatched no_wait` no puzzle that needs a wait); both validated on the same 400
held-out puzzles (projects/grpo_effect/configs/grpo_effect.py). Writes <out>/verdict.md
(criteria in projects/go_no_go/gate.py; verdict_no_wait.md against the no-wait arm) and the
runs' small files; exit status 0 on GO, 1 on NO-GO, 2 on an error.
Rerunning the command resumes both runs; rerunning it with more --rounds extends them (the
gate then reads the last round).

    python -m projects.go_no_go.go_no_go --policy runs/tiny_trace_grid/export --thinking \
        --updates 60 \
        --out projects/go_no_go/results/trace \
        [--reference projects/grpo_effect/results/grpo_lr1e-4]
"""

import pathlib
import sys

from absl import app, flags
from absl import logging as absl_logging

from mapfjax import hostalloc

if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # before JAX is imported: a restart costs only the lines above

from mapfjax.rl.driver import FINE_BUCKET_BUDGET, OBJECTIVES, drawn_per_step  # noqa: E402
from mapfjax.rl.optim import OPTIMIZERS  # noqa: E402
from mapfjax.rl.rollout import TRACE_LOSSES  # noqa: E402
from projects.go_no_go import hooks as hooks_lib  # noqa: E402

# Groups (of 8 samples) per micro-batch of a thinking update: parts of 4 groups of traces
# (640-token budget) ran at 4.5-5.8 GB resident on the CPU, 16 peaked at 20 GB (32-group arms).
MICRO_GROUPS = 4
# Pieces per part of a thinking update: each group's 8 traces, sorted by length, in pieces of
# 4 (--group_split 2) and the parts made of 4 pieces by length (16 parts of a 32-group update)
# ran the update 1.5x faster than 2 parts of whole groups, where a trace that runs to the
# budget pads its whole group (the same gradient; projects/go_no_go/results/README.md).
PART_PIECES = 4

_POLICY = flags.DEFINE_string("policy", None, "model directory (HF files) to start from")
_THINKING = flags.DEFINE_bool("thinking", False, "the policy writes a reasoning trace first")
_UPDATES = flags.DEFINE_integer("updates", 150, "GRPO updates per round (--groups x 8 each)")
_BUDGET = flags.DEFINE_float(
    "budget_minutes",
    30.0,
    "the gate's budget: the matched arm's logged GRPO minutes (every round) must not pass it, "
    "a criterion of the verdict (0: left out of it)",
)
_MINUTES = flags.DEFINE_float(
    "minutes",
    0.0,
    "a time budget per round (0: none): the round ends after the update past which one more "
    "as long would exceed it, at most --updates (train.max_minutes; <run>/round_N/"
    "time_budget.json says where it ended; phase_hooks.max_minutes, `hooks.py`)",
)
_GROUPS = flags.DEFINE_integer(
    "groups",
    8,
    "puzzle groups (of 8 samples) per GRPO update; twice as many are sampled and the mixed "
    "ones trained first (more groups: a gradient with less noise, each update slower)",
    lower_bound=1,
)
_ROUNDS = flags.DEFINE_integer(
    "rounds",
    1,
    "rounds per run, each on fresh training puzzles and validated after it; a "
    "finished run given more rounds continues (a budget counted in updates)",
    lower_bound=1,
)
_LR = flags.DEFINE_float("lr", 1e-4, "GRPO learning rate")
_OPTIMIZER = flags.DEFINE_enum(
    "optimizer", "adamw", list(OPTIMIZERS),
    "adamw, or momentum: Adam without its second moment, each weight moved in proportion to "
    "its gradient (optim.optimizer; its --lr is on another scale: compare train_update_norm)",
)  # fmt: skip
_TOKENS = flags.DEFINE_integer("max_new_tokens", 0, "completion budget (0: 64, or 640 thinking)")
_PER_SIZE = flags.DEFINE_integer("per_size", 100, "held-out puzzles per map size (4 sizes)")
_SAMPLES = flags.DEFINE_integer(
    "samples", 4, "held-out samples at temperature 1 per puzzle (mean@k; 0: greedy only)"
)
_WAIT = flags.DEFINE_float(
    "wait_ratio", 0.3, "share of the training puzzles that need a wait (held-out set unchanged)"
)
_KL = flags.DEFINE_float("kl_coef", 0.0, "k3 KL weight to the starting policy (0: none)")
_LORA = flags.DEFINE_integer(
    "lora_rank", 0, "0: train every weight; r > 0: only low-rank adapters of rank r"
)
_LORA_ALPHA = flags.DEFINE_float("lora_alpha", 32.0, "the adapters' scale is lora_alpha / rank")
_TEMPERATURE = flags.DEFINE_float(
    "temperature",
    1.0,
    "sampling temperature of the training rollouts (held-out validation stays greedy); below 1 "
    "the samples' mistakes are nearer the greedy answer's",
)
_TOP_P = flags.DEFINE_float(
    "top_p",
    1.0,
    "nucleus of the training rollouts: a token is drawn only while the probability mass above it "
    "is under top_p (1: every token; held-out validation stays greedy)",
)
_SCREEN = flags.DEFINE_float(
    "screen",
    0.0,
    "0: off; s >= 1: each update decodes s x the sampled puzzles greedily with the current "
    "weights and samples the groups on those whose greedy plan fails first (phase_hooks.screen)",
)
_GREEDY = flags.DEFINE_bool(
    "greedy_member",
    False,
    "each group's first member is the policy's greedy answer, the other 7 sampled "
    "(phase_hooks.greedy_member): the group's advantages then also score the answer the held-out "
    "validation reads",
)
_FRESH = flags.DEFINE_bool(
    "fresh_puzzles",
    False,
    "draw every training puzzle once: --updates x the puzzles sampled per update (2 x --groups) "
    "training puzzles, where the default, --updates x --groups, draws each about twice",
)
_OBJECTIVE = flags.DEFINE_enum(
    "objective",
    "grpo",
    [*OBJECTIVES, "placebo"],
    "what the arms optimise on their rollouts: grpo; rft (cross-entropy on the policy's own "
    "valid samples); placebo (GRPO with each group's advantages shuffled: a control with "
    "GRPO's update size and noise but no reward information; phase_hooks.placebo)",
)
_BONUS = flags.DEFINE_float(
    "optimal_bonus",
    None,
    "reward on top of 1 for a valid plan that is also optimal; unset: the training config's "
    "(configs/tiny_cpu.py, reward.optimal_bonus). 0: the reward is validity alone, what the "
    "gate measures; a bonus also rewards dropping waits a puzzle did not need",
    lower_bound=0.0,
)
# The mismatched arm's training distribution: 3x3 maps only (the held-out set's wait share),
# or every held-out size with no puzzle that needs a wait (the half of held-out where GRPO's
# gains from the shipped model fall; projects/go_no_go/results, "The shipped model").
HELD_OUT_SIZES = range(3, 7)
# The mismatched arm's training puzzles (sizes, wait ratio; None: --wait_ratio). "large" is out of
# the held-out range and out of the trace policies' SFT data (3x3-6x6), inside the engineer's
# legal space (projects/go_no_go/results/PLAN_reach.md).
MISMATCHES = {
    "3x3": ((3,), None),
    "no_wait": (HELD_OUT_SIZES, 0.0),
    "large": (range(7, 11), None),
}
_MISMATCHED = flags.DEFINE_enum(
    "mismatched",
    "3x3",
    list(MISMATCHES),
    "the mismatched arm's training puzzles: 3x3 maps only (wait ratio as --wait_ratio), "
    "3x3-6x6 with none that needs a wait, or 7x7-10x10 maps (wait ratio as --wait_ratio; "
    "sizes the held-out set and the trace policies' SFT data leave out) (arm "
    "mismatched_<name>)",
)
_MISMATCHED_WHEN = flags.DEFINE_enum(
    "mismatched_when",
    "always",
    ["always", "gain"],
    "always: run the mismatched arm after the matched one; gain: only when the matched arm "
    "meets the gate's first two criteria (the start parses, the gain is large enough with its "
    "interval above 0), else the verdict says it was not run (saves its budget on a NO-GO)",
)
_LENGTH_SPLIT = flags.DEFINE_integer(
    "length_split", 0,
    "the update in this many parts by completion length (optim.length_split; 0: with "
    f"--thinking, whose traces vary most in length, parts of {PART_PIECES} pieces (see "
    "--group_split), else 1)",
    lower_bound=0,
)  # fmt: skip
_GROUP_SPLIT = flags.DEFINE_enum(
    "group_split", "0", ["0", "1", "2", "4", "8"],
    "cut each group's 8 completions, sorted by length, into this many pieces before the parts "
    "of --length_split are made (optim.group_split; the same gradient); 0: 2 with --thinking, "
    "else 1",
)  # fmt: skip
_ACCUM = flags.DEFINE_integer(
    "accum_steps", 0,
    "micro-batches per part of an update (optim.accum_steps): the same gradient, a 1/n share "
    "of the backward pass's peak memory; 0: with --thinking, micro-batches of at most "
    f"{MICRO_GROUPS} groups' traces (a 640-token update of 16 groups in one piece peaks near "
    "20 GB on the CPU), else 1",
    lower_bound=0,
)  # fmt: skip
SPLIT_FLAGS = ("accum_steps", "groups", "group_split", "length_split", "thinking")
_TRACE_LOSS = flags.DEFINE_enum(
    "trace_loss", "all", list(TRACE_LOSSES), "what of a thinking response GRPO trains"
)
_SEED = flags.DEFINE_integer(
    "seed",
    None,
    "training seed (the training puzzles drawn, rollout sampling; the held-out puzzles stay "
    "the same); unset: the training config's",
    lower_bound=0,
)
_HELD_OUT_SEED = flags.DEFINE_integer(
    "held_out_seed",
    None,
    "seed of the held-out draw; unset: the training config's, which draws the gate's 400 "
    "puzzles (projects/go_no_go/results/held_out_400.jsonl), on which every setting so far was "
    "chosen; "
    "another seed draws fresh puzzles of the same kind, for a claim (then leave out "
    "--reference, whose start was validated on the gate's puzzles)",
    lower_bound=0,
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/go_no_go", "run directories (checkpoints)")
_OUT = flags.DEFINE_string("out", None, "where verdict.md and the runs' small files go")
_REFERENCE = flags.DEFINE_string("reference", None, "a run whose start is the reference model")
flags.mark_flags_as_required(["policy", "out"])
flags.register_multi_flags_validator(
    ["kl_coef", "objective"],
    lambda v: v["kl_coef"] == 0 or v["objective"] != "rft",
    "--kl_coef: a KL term is part of the GRPO loss; --objective rft takes none",
)
flags.register_multi_flags_validator(
    list(SPLIT_FLAGS),
    lambda v: not v["accum_steps"] or _part_units(v)[0] % v["accum_steps"] == 0,
    "--accum_steps: must divide the pieces of each part of the update (--groups x "
    "--group_split / --length_split when that divides, else --groups)",
)
flags.register_validator("lora_rank", lambda v: v >= 0, "--lora_rank: an int >= 0 (0: none)")
flags.register_validator("lora_alpha", lambda v: v > 0, "--lora_alpha: a number > 0")
flags.register_validator(
    "wait_ratio", lambda v: 0 <= v <= 1, "--wait_ratio: a share of the puzzles, in [0, 1]"
)
flags.register_validator(
    "temperature", lambda v: 0 < v <= 2, "--temperature: a sampling temperature, in (0, 2]"
)
flags.register_validator("top_p", lambda v: 0 < v <= 1, "--top_p: a probability mass, in (0, 1]")
flags.register_validator("screen", lambda v: v == 0 or v >= 1, "--screen: 0 (off) or a number >= 1")


def verdict_name(mismatched: str) -> str:
    """The verdict's file: verdict.md against the default 3x3 arm, verdict_<name>.md against
    another, so that two mismatched arms of one matched run write into one directory."""
    return "verdict.md" if mismatched == "3x3" else f"verdict_{mismatched}.md"


def _group_split(v) -> int:
    """optim.group_split from the flags' values: --group_split, or 2 with --thinking."""
    return int(v["group_split"]) or (2 if v["thinking"] else 1)


def _length_split(v) -> int:
    """optim.length_split from the flags' values: --length_split, or with --thinking parts of
    PART_PIECES pieces (2 parts where the pieces do not divide into them)."""
    if v["length_split"] or not v["thinking"]:
        return v["length_split"] or 1
    pieces = v["groups"] * _group_split(v)
    return pieces // PART_PIECES if pieces % PART_PIECES == 0 and pieces > PART_PIECES else 2


def _part_units(v) -> tuple[int, int]:
    """(pieces in each part of an update, the most pieces a micro-batch takes): pieces of
    groups when the update is cut (`step.split_by_length` uses the batch whole, of whole
    groups, when its pieces do not divide into the parts)."""
    groups, parts, k = v["groups"], _length_split(v), _group_split(v)
    if parts > 1 and groups * k % parts == 0:
        return groups * k // parts, MICRO_GROUPS * k
    return groups, MICRO_GROUPS


def micro_batches(part_groups: int, most: int = MICRO_GROUPS) -> int:
    """The fewest micro-batches that divide `part_groups` into pieces of at most `most`."""
    return next(
        n for n in range(1, part_groups + 1) if part_groups % n == 0 and part_groups // n <= most
    )


def arm_config(sizes, wait_ratio: float | None = None):
    """The GRPO run config of one arm: training puzzles of these map sizes, `wait_ratio` of
    them needing a wait (None: --wait_ratio)."""
    import ml_collections

    from mapfjax import configfile
    from mapfjax.env.config import default_config

    c = configfile.get_config("projects/grpo_effect/configs/grpo_effect.py")
    c.model.path = str(pathlib.Path(_POLICY.value).resolve())
    wait = _WAIT.value if wait_ratio is None else wait_ratio
    c.env = default_config(num_agents=2, sizes=sizes, hole_ratio=0.2, wait_ratio=wait)
    c.rounds = _ROUNDS.value
    c.train.problems_per_step = _GROUPS.value
    c.train.instances = _UPDATES.value * c.train.problems_per_step
    if _FRESH.value:  # else the config as every earlier arm ran it
        c.train.steps = _UPDATES.value
        c.train.instances = _UPDATES.value * drawn_per_step(c.train.oversample, _GROUPS.value)
    c.optim.lr = _LR.value
    if _OPTIMIZER.value != "adamw":  # else the config as every earlier arm ran it
        c.optim.optimizer = _OPTIMIZER.value
    c.grpo.kl_coef = _KL.value
    if _LORA.value:
        c.optim.lora_rank, c.optim.lora_alpha = _LORA.value, _LORA_ALPHA.value
    c.train.temperature = _TEMPERATURE.value
    if _TOP_P.value != 1.0:  # else the config as every earlier arm ran it
        c.train.top_p = _TOP_P.value
    c.train.objective = "grpo" if _OBJECTIVE.value == "placebo" else _OBJECTIVE.value
    # What the arm changes in the phase (hooks.py); none: the config as every earlier arm ran
    hooks = {"screen": _SCREEN.value, "greedy_member": _GREEDY.value,
             "placebo": _OBJECTIVE.value == "placebo", "max_minutes": _MINUTES.value}  # fmt: skip
    if any(hooks.values()):
        c.phase_hooks = ml_collections.ConfigDict({"factory": hooks_lib.FACTORY, **hooks})
    if _SEED.value is not None:
        c.seed = _SEED.value
    if _BONUS.value is not None:  # else the config's own reward
        c.reward.optimal_bonus = _BONUS.value
    c.train.trace_loss = _TRACE_LOSS.value
    c.validation.per_size = _PER_SIZE.value
    c.validation.samples = _SAMPLES.value  # the gate reads greedy rates only
    if _HELD_OUT_SEED.value is not None:
        c.validation.seed = _HELD_OUT_SEED.value
    tokens = _TOKENS.value or (640 if _THINKING.value else 64)
    c.train.enable_thinking = _THINKING.value
    c.train.max_new_tokens = c.validation.max_new_tokens = tokens
    if tokens > FINE_BUCKET_BUDGET:  # a trace's 100-640 tokens: power-of-two widths, as measured
        c.train.completion_bucket = "pow2"
    v = {k: flags.FLAGS[k].value for k in SPLIT_FLAGS}
    c.optim.length_split, c.optim.group_split = _length_split(v), _group_split(v)
    c.optim.accum_steps = _ACCUM.value or (micro_batches(*_part_units(v)) if _THINKING.value else 1)
    return c


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    from mapfjax import files
    from mapfjax.engineer import loop
    from mapfjax.eval import report
    from projects.go_no_go import gate

    work, out = pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value)
    try:
        runs = []
        other = f"mismatched_{_MISMATCHED.value}"
        arms = [("matched", HELD_OUT_SIZES, None), (other, *MISMATCHES[_MISMATCHED.value])]
        for name, sizes, wait in arms:
            if runs and _MISMATCHED_WHEN.value == "gain":
                first_two = gate.evaluate(runs[0], None)[0][:2]
                if not all(c.passed for c in first_two):
                    runs.append(None)
                    break
            loop.run(arm_config(sizes, wait), work / name)
            report.write_report(work / name)
            runs.append(report.export_run(work / name, out / name))
        budget = _BUDGET.value or None
        criteria, rows, notes = gate.evaluate(
            *runs, reference=_REFERENCE.value, budget_minutes=budget
        )
        n = len(report.validation_rows(runs[0])[0][1])
        text = gate.markdown(criteria, rows, notes, n)
        files.atomic_write(out / verdict_name(_MISMATCHED.value), text.encode())
    except (OSError, ValueError, loop.EngineerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if all(c.passed for c in criteria) else 1


if __name__ == "__main__":
    app.run(main)
