"""The reasoning-trace policies the go / no-go gate tried, and the answer-only model continued
on the whole legal space ("broad", projects/tiny_models), as recipes of
`launch/train_tiny.py` built on configs/tiny_model.py. Each continues an earlier one from its
export under runs/ (the order arms/arms.sh builds them in); the shipped policy that thinks is
configs/tiny_model.py:think, whose two stages are `trace_end_scratch` then `trace_mix` here.

    python launch/train_tiny.py --config projects/go_no_go/configs/tiny_model.py:trace_mix
"""

import ml_collections

from mapfjax import configfile

TINY = configfile.load_module("configs/tiny_model.py")
env_config, TRACE_SIZES, BROAD_HOLES = TINY.env_config, TINY.TRACE_SIZES, TINY.BROAD_HOLES
# The gate's 400 held-out puzzles (the main job's), kept out of every trace policy's SFT data.
GATE = ("projects/go_no_go/results/held_out_400.jsonl",)
# The trace forms the gate tried (projects/go_no_go/traces.py), by "module:attribute".
TRACES = "projects.go_no_go.traces"
# The whole legal space the engineer may choose from, sizes weighted toward small maps.
BROAD_SIZES = {3: 0.2, 4: 0.2, 5: 0.2, 6: 0.1, 7: 0.1, 8: 0.07, 9: 0.07, 10: 0.06}
VARIANTS = (
    *("broad", "trace", "trace_quick"),
    *("trace_long", "trace_wait", "trace_ahead", "trace_relay", "trace_relay_where"),
    *("trace_relay_scratch", "trace_relay_next_scratch", "trace_retry_scratch"),
    "trace_retry_lessons",
    "trace_end_scratch",
    "trace_end_wide",
    "trace_mix",
    "trace_mix_scratch",
)


def continue_from(
    c, init: str, name: str, seed: int, wait_ratio: float, instances=16384, updates=1000
):
    """configs/tiny_model.py's `continue_from` with the gate's puzzles kept out, into
    runs/tiny_<name>."""
    TINY.continue_from(c, init, seed, wait_ratio, instances, updates, exclude=GATE)
    c.workdir = f"runs/tiny_{name}"
    c.out_dir = f"runs/tiny_{name}/export"


def get_config(arg: str = "trace") -> ml_collections.ConfigDict:
    """ "broad"
    continues the shipped model on SFT data from the whole legal generator space (every size,
    hole ratio 0..0.5, half the instances needing a wait), validated on a held-out set from the
    same space that shares no puzzle with the SFT data. "trace" trains a policy that thinks
    before it answers (the oracle's plan in step blocks, `traces.steps`) from scratch on 3x3-6x6
    ("trace_quick": its smoke run); "trace_long" continues it on puzzles with longer plans;
    "trace_wait" continues that on puzzles most of which need a wait; "trace_ahead" continues
    that with a look-ahead block (prioritised planning) written before the moves; "trace_relay"
    continues trace_wait on traces that plan the agents one after another (`traces.relay`);
    "trace_relay_where" continues trace_relay with each later agent's lines also writing where
    the earlier ones stand; "trace_relay_scratch" trains the relay layout from scratch with the
    trace recipe, "trace_relay_next_scratch" the same with the earlier agents' cells written
    after their key, "trace_retry_scratch" the same with a relay that starts in index order and,
    when a run is cornered or loops, writes so and starts again in the next order;
    "trace_retry_lessons" continues trace_retry_scratch with loop lessons (a wrong move back, in
    the prompt, then the loop line that ends it) beside its own examples; "trace_end_scratch"
    trains the retrying relay from scratch, its trace also ending on `no order left` where every
    order fails; "trace_mix" continues trace_end_scratch with 60 % of its puzzles answered
    without a trace (`sft.answer_only`); "trace_mix_scratch" trains that mix from scratch, in
    the first stage of trace_end_scratch's recipe."""
    if arg not in VARIANTS:
        raise ValueError(
            f"projects/go_no_go/configs/tiny_model.py: unknown variant {arg!r}; known: {VARIANTS}"
        )
    c = TINY.recipe()
    if arg == "broad":
        c.init = "mapfjax/assets/tiny"
        c.workdir = "runs/tiny_broad"
        c.out_dir = "runs/tiny_broad/export"
        c.sft.instances = 61440
        c.sft.env = env_config(BROAD_SIZES, seed=11, wait_ratio=0.5)
        c.sft.hole_ratios = BROAD_HOLES
        c.sft.stages = (900,)
        c.sft.optim.lr = 1e-3
        c.rl.env = env_config({n: 1 / 8 for n in range(3, 11)}, seed=12, wait_ratio=0.5)
        c.validation.env = env_config({n: 1 / 8 for n in range(3, 11)}, seed=54321, wait_ratio=0.5)
        c.validation.hole_ratios = BROAD_HOLES
        c.validation.per_size = 60  # 10 per (size, hole ratio)
        c.validation.spare = 0.25
    if arg.startswith("trace"):
        TINY.trace(c)
        c.trace_form = f"{TRACES}:steps"
        c.workdir = "runs/tiny_trace_grid"
        c.out_dir = "runs/tiny_trace_grid/export"
    if arg == "trace_long":
        # The grid-trace policy (6,000 updates, aw10) continued on puzzles with longer plans:
        # every one of its 23 parse errors on the gate's puzzles writes more than 10 steps and
        # loses count of them, and 1.4 % of its SFT plans are over 10 steps (3.7 % in this mix;
        # projects/go_no_go/results/parse_errors_6000, trace_long).
        continue_from(c, "runs/tiny_trace_grid/export_aw10_6000", "trace_long", 31, 0.7)
    if arg == "trace_wait":
        # trace_long continued for 1,000 more updates on fresh puzzles, 90 % of them needing a
        # wait: the half of the gate's puzzles where trace_long still fails (61.7 % valid there
        # against 94.6 % on the rest), the failures in its trace's plan (a vertex conflict or a
        # hole), the part of the puzzle its trace's local look-ups do not decide.
        continue_from(c, "runs/tiny_trace_long/export", "trace_wait", 41, 0.9)
    if arg == "trace_ahead":
        # trace_wait continued on traces that first write how the plan is found: each agent's
        # path alone, their first conflict, each re-planned around the other's written path,
        # the cheaper (`lookahead.priority`): the waits and detours no move line decides
        # (projects/go_no_go/results, "What the trace's own lines decide") follow from written
        # lines.
        # About 80 more tokens on puzzles that need a wait (projects/go_no_go/results/lookahead).
        continue_from(c, "runs/tiny_trace_wait/export", "trace_ahead", 51, 0.7, 24576, 1500)
        c.trace_form = f"{TRACES}:priority"
    if arg == "trace_relay":
        # trace_wait continued on traces that write each agent's whole plan in turn, a later
        # agent's lines marking `taken` where an earlier one stands at that step: every action
        # follows from its own line by one rule (`mapfjax.env.relay`), where the step layout
        # decides the plan on 13.8 % of the puzzles that need a wait. The rule's plan is valid
        # on all the gate's puzzles that need no wait and 84 % of those that need one (the others
        # are left out of the SFT data); traces as long as today's
        # (projects/go_no_go/results/relay).
        continue_from(c, "runs/tiny_trace_wait/export", "trace_relay", 61, 0.7, 24576, 2000)
        c.trace_form = f"{TRACES}:relay"
    if arg == "trace_relay_where":
        # trace_relay continued with a later agent's lines also writing each earlier agent's
        # cell at that step (copied from that agent's line for the step), so that its `taken`
        # marks compare cells on the same line instead of a line up to 15 lines above.
        continue_from(c, "runs/tiny_trace_relay/export", "trace_relay_where", 71, 0.7, 16384, 1000)
        c.trace_form = f"{TRACES}:relay_where"
    if arg in ("trace_relay_scratch", "trace_relay_next_scratch", "trace_retry_scratch",
               "trace_end_scratch", "trace_mix_scratch"):  # fmt: skip
        # The relay layout from scratch: the trace recipe (6 layers, 6,000 updates of 16 in three
        # resumable stages), answer tokens weighing 10, the gate's puzzles kept out; about 2.5
        # hours on 2 cores. Continuing a step-layout policy on it lost 9.5 points (trace_relay).
        c.trace_form = f"{TRACES}:relay"
        c.workdir = "runs/tiny_trace_relay_scratch"
        c.out_dir = "runs/tiny_trace_relay_scratch/export"
        c.sft.answer_weight = 10.0
        c.sft.exclude = GATE
        c.rl.train.steps = 0
    if arg == "trace_relay_next_scratch":
        # The same from scratch, a later agent's step-K line also writing `t<K+1> A<j> (r, c)`:
        # where each earlier agent starts step K+1, the cell that follows the same key at the
        # start of that agent's own line. `relay_where` wrote that cell without the key and the
        # policy copied the cell before the step (184 of its 233 field errors).
        c.trace_form = f"{TRACES}:relay_next"
        c.workdir = "runs/tiny_trace_relay_next_scratch"
        c.out_dir = "runs/tiny_trace_relay_next_scratch/export"
    if arg == "trace_retry_scratch":
        # The same from scratch, the first agent a check instead of a choice: index order
        # first; a run that is cornered (`= cornered`) or comes back to a cell once the earlier
        # agents rest (`= loop tJ`) ends the attempt, `retry A1 A0` names the next order
        # (`mapfjax.env.relay.retry`). The relay policy lost 31 of the gate's puzzles on its
        # first agent alone; the retry reaches a plan on 84 % of those that need a wait
        # (projects/go_no_go/results/relay/orders.md).
        c.trace_form = f"{TRACES}:relay_retry"
        c.workdir = "runs/tiny_trace_retry_scratch"
        c.out_dir = "runs/tiny_trace_retry_scratch/export"
    if arg == "trace_end_scratch":
        # trace_retry_scratch's recipe, the trace also ending where every order fails on a
        # line: the last failed run, then `no order left`, then the oracle's answer
        # (`mapfjax.env.forms.GRID_RELAY`, the shipped form). The retry data left those
        # puzzles out (6.5 % of the SFT draw, 31 of the gate's 400), and on them the retry
        # policy often never closed its trace: 10 of the 18 traces the lesson policy left open
        # (projects/go_no_go/results/PLAN_end.md).
        c.trace_form = "grid_relay"
        c.workdir = "runs/tiny_trace_end_scratch"
        c.out_dir = "runs/tiny_trace_end_scratch/export"
    if arg == "trace_end_wide":
        # The ending start made twice as wide by a function-preserving growth (`python -m
        # projects.go_no_go.grow runs/tiny_trace_end_scratch/export runs/tiny_trace_end_wide_init
        # --width 2`: hidden 256, 8 heads, 768 MLP units, 4.9M parameters against 1.3M),
        # continued for 1,000 updates: capacity, the one axis of the recipe GRPO from the trace
        # policy has not been tried on (projects/go_no_go/results/PLAN_wide.md). About 5 s an update
        # on
        # 2 cores (1.7 s at width 128).
        continue_from(c, "runs/tiny_trace_end_wide_init", "trace_end_wide", 101, 0.5, 24576, 1000)
        c.trace_form = "grid_relay"
    if arg == "trace_mix":
        # trace_end_scratch continued for 600 updates with 60 % of its puzzles (by hash) giving
        # the answer alone after an empty think block: a start that thinks on about 40 % of its
        # samples, whatever the puzzle, so that what GRPO can reinforce is whether to think, a
        # choice the same on every puzzle (projects/go_no_go/results/PLAN_mix.md).
        continue_from(c, "runs/tiny_trace_end_scratch/export", "trace_mix", 111, 0.5, 8192, 600)
        c.trace_form = "grid_relay"
        c.sft.answer_only = 0.6
    if arg == "trace_mix_scratch":
        # trace_mix's mix (60 % of the puzzles answered after an empty think block) from the
        # first update, in the first stage of trace_end_scratch's recipe (1,500 updates on its
        # own cosine schedule): a start that thinks on some samples built in about an hour on 2
        # cores, where trace_end_scratch then trace_mix take 5-7
        # (projects/go_no_go/results/PLAN_reach.md).
        c.trace_form = "grid_relay"
        c.workdir = "runs/tiny_trace_mix_scratch"
        c.out_dir = "runs/tiny_trace_mix_scratch/export"
        c.sft.answer_only = 0.6
        c.sft.stages = c.sft.stages[:1]
    if arg == "trace_retry_lessons":
        # trace_retry_scratch continued for 1,000 updates, a quarter of the puzzles also giving a
        # loop lesson (`projects.go_no_go.lessons`, by `sft.extra_examples`): its trace up to a
        # wrong move back to the cell it came from is prompt, the loss starts at the line `= loop
        # tJ` that ends the run. 18 of the 19 traces the retry start never closes on the gate's
        # puzzles go back and forth between cells without that line; the rule's own loops (an
        # agent that cannot reach its goal) look different
        # (projects/go_no_go/results/PLAN_loop.md).
        continue_from(c, "runs/tiny_trace_retry_scratch/export", "trace_retry_lessons", 91, 0.5)
        c.trace_form = f"{TRACES}:relay_retry"
        c.sft.extra_examples = "projects.go_no_go.lessons:quarter"
    if arg == "trace_quick":
        c.workdir = "/tmp/mapfjax_tiny_trace_quick"
        c.out_dir = "/tmp/mapfjax_tiny_trace_quick/export"
        TINY.quick(c)
    return c
