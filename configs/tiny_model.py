"""The shipped tiny MAPF-FrozenLake model: BPE tokenizer, SFT on oracle answers, short GRPO.

python launch/train_tiny.py --config configs/tiny_model.py --config.workdir=/tmp/tiny
"""

import ml_collections

from mapfjax.env.config import default_config

# Share of SFT instances per map size: mostly 3x3..5x5, where the model is meant to be good.
SFT_SIZES = {3: 0.3, 4: 0.3, 5: 0.25, 6: 0.07, 7: 0.02, 8: 0.02, 9: 0.02, 10: 0.02}


def env_config(ratios: dict[int, float], seed: int, hole_ratio=0.2, wait_ratio=0.3):
    """A 2-agent generator config with the given per-size data ratios."""
    c = default_config(2, sizes=tuple(ratios), hole_ratio=hole_ratio, wait_ratio=wait_ratio)
    for n, r in ratios.items():
        c.sizes[f"s{n}"].data_ratio = r
    c.seed = seed
    return c


def continue_from(
    c, init: str, name: str, seed: int, wait_ratio: float, instances=16384, updates=1000
):
    """A trace policy (`init`) continued by SFT on fresh 3x3-6x6 puzzles weighted toward larger
    maps (hole ratios 0.1-0.4; `wait_ratio` of them need a wait), the gate's puzzles kept out,
    answer tokens weighing 10, at a quarter of the recipe's peak learning rate, no GRPO; into
    runs/tiny_<name>."""
    c.init = init
    c.workdir = f"runs/tiny_{name}"
    c.out_dir = f"runs/tiny_{name}/export"
    c.sft.env = env_config({3: 0.1, 4: 0.2, 5: 0.3, 6: 0.4}, seed=seed, wait_ratio=wait_ratio)
    c.sft.hole_ratios = (0.1, 0.2, 0.3, 0.4)
    c.sft.instances = instances
    c.sft.exclude = ("results/go_no_go/held_out_400.jsonl",)
    c.sft.answer_weight = 10.0
    c.sft.stages = (updates,)
    c.sft.optim.lr = 5e-4
    c.sft.optim.warmup_steps = 50
    c.rl.train.steps = 0


# The whole legal space the engineer may choose from: every hole ratio in [0, 0.5] (one
# share each), half of the instances needing a wait; sizes weighted toward small maps.
BROAD_SIZES = {3: 0.2, 4: 0.2, 5: 0.2, 6: 0.1, 7: 0.1, 8: 0.07, 9: 0.07, 10: 0.06}
BROAD_HOLES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


# The reasoning-trace policy's range: the go/no-go held-out set is 3x3-6x6.
TRACE_SIZES = {3: 0.25, 4: 0.25, 5: 0.25, 6: 0.25}
VARIANTS = (
    *("", "quick", "broad", "trace", "trace_quick"),
    *("trace_long", "trace_wait", "trace_ahead", "trace_relay", "trace_relay_where"),
    *("trace_relay_scratch", "trace_relay_next_scratch", "trace_retry_scratch"),
    "trace_retry_lessons",
    "trace_end_scratch",
    "trace_end_wide",
    "trace_mix",
    "trace_mix_scratch",
)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """arg "quick" shrinks every stage to a few steps (a smoke run of the pipeline); "broad"
    continues the shipped model on SFT data from the whole legal generator space (every size,
    hole ratio 0..0.5, half the instances needing a wait), validated on a held-out set from the
    same space that shares no puzzle with the SFT data. "trace" trains a policy that thinks
    before it answers (`mapfjax.env.trace`) from scratch on 3x3-6x6 ("trace_quick": its smoke
    run); "trace_long" continues it on puzzles with longer plans; "trace_wait" continues that on
    puzzles most of which need a wait; "trace_ahead" continues that with a look-ahead block
    (prioritised planning) written before the moves; "trace_relay" continues trace_wait on
    traces that plan the agents one after another (`mapfjax.env.relay`); "trace_relay_where"
    continues trace_relay with each later agent's lines also writing where the earlier ones
    stand; "trace_relay_scratch" trains the relay layout from scratch with the trace recipe,
    "trace_relay_next_scratch" the same with the earlier agents' cells written after their key,
    "trace_retry_scratch" the same with a relay that starts in index order and, when a run is
    cornered or loops, writes so and starts again in the next order; "trace_retry_lessons"
    continues trace_retry_scratch with loop lessons (a wrong move back, in the prompt, then the
    loop line that ends it) beside its own examples; "trace_end_scratch" trains the retrying
    relay from scratch, its trace also ending on `no order left` where every order fails;
    "trace_mix" continues trace_end_scratch with 60 % of its puzzles answered without a trace
    (`sft.answer_only`); "trace_mix_scratch" trains that mix from scratch, in the first stage
    of trace_end_scratch's recipe."""
    if arg not in VARIANTS:
        raise ValueError(f"configs/tiny_model.py: unknown variant {arg!r}; known: {VARIANTS}")
    c = ml_collections.ConfigDict()
    c.seed = 0
    # True: the completion is a reasoning trace (think block), then the answer; the tokenizer
    # makes every "(r, c)" one token. The reward still reads only the answer.
    c.thinking = False
    # How the trace transcribes the map before the moves (`mapfjax.env.trace.STYLES`).
    c.trace_style = "holes"
    # With thinking: how the plan is found, written before the moves (`mapfjax.env.lookahead`:
    # "search" or "priority"; "relay": each agent's plan in turn by the move lines' rule, no
    # block, "relay_where" / "relay_next" the same with where earlier agents stand written on
    # later agents' lines, "relay_retry" index order first and another order after a failed
    # run, "relay_retry_end" the same ending on `no order left` where every order fails; the
    # plan is the one found that way; "" = the oracle's, no block).
    c.trace_lookahead = ""
    c.init = ""  # a checkpoint directory to continue from (its tokenizer too); "" = from scratch
    c.workdir = "/tmp/mapfjax_tiny"  # tokenizer, data cache, checkpoints, logs
    c.out_dir = "mapfjax/assets/tiny"  # exported model + tokenizer + VALIDATION.md
    c.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.processes = 2  # oracle worker processes for data generation

    c.tokenizer = ml_collections.ConfigDict(dict(vocab_size=1024, instances=2000))
    # Qwen3 architecture; vocab_size is the tokenizer's size.
    c.model = ml_collections.ConfigDict(
        dict(
            hidden_size=128,
            intermediate_size=384,
            num_layers=12,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            rope_theta=10000.0,
            max_position_embeddings=1024,
        )
    )

    c.sft = ml_collections.ConfigDict()
    c.sft.instances = 49152
    c.sft.env = env_config(SFT_SIZES, seed=1)
    c.sft.batch_size = 32
    # Instance files (JSONL) whose puzzles the SFT data must not hold: a held-out set drawn
    # elsewhere (small maps repeat: 23 of the gate's 102 3x3 puzzles were in the trace SFT data).
    c.sft.exclude = ()
    # True: also train on the start/goal coordinates the prompt states (each is fixed by where
    # the agent's letter stands in the map), an auxiliary target teaching cell -> (row, col).
    # Off for the shipped model: with it an 8-layer, 6,000-update run reached 52/36/24 % on
    # 3x3/4x4/5x5 against 58/40/30 % without.
    c.sft.coordinate_targets = False
    # With thinking=True: the weight of each answer token (after the trace's </think>) in the
    # SFT loss against 1 for a trace token. The answer is a few percent of a trace policy's
    # completion; at weight 1 a 1,000-update grid-trace run wrote traces whose plans were
    # valid on half the puzzles and answers that copied them on 6 of 78 (results/trace_grid).
    c.sft.answer_weight = 1.0
    # With trace_lookahead "relay_retry": the share of SFT puzzles that also give a loop lesson
    # (`mapfjax.rl.data.loop_lesson_examples`: a wrong move back as prompt, then the loop line).
    c.sft.loop_lessons = 0.0
    # With thinking=True: the share of SFT puzzles (by puzzle hash) whose example is the answer
    # alone after an empty think block (`mapfjax.rl.data.sft_examples`): a policy that thinks
    # on some samples and answers at once on others, whatever the puzzle.
    c.sft.answer_only = 0.0
    # Update counts at which SFT stages end. Each later stage resumes the previous one's
    # weights and optimiser state on a longer cosine schedule (the learning rate jumps back up
    # to where the longer schedule stands, then decays to its end), so a finished run can be
    # extended. The shipped model: 3,500, then 5,000, then 10,000 updates of 32 (~4.5 hours on
    # 2 cores).
    c.sft.stages = (3500, 5000, 10000)
    c.sft.optim = ml_collections.ConfigDict(
        dict(
            lr=2e-3,
            warmup_steps=100,
            end_lr_ratio=0.05,
            weight_decay=0.01,
            b1=0.9,
            b2=0.98,
            eps=1e-8,
            grad_clip=1.0,
            accum_steps=1,
            max_bad_steps=5,
            remat=False,
        )
    )
    c.sft.checkpoint_every = 100
    c.sft.log_every = 10
    # Each SFT batch pads its completions to a multiple of this many tokens, so few shapes
    # compile (18 for the trace recipe at 64). On a GPU, where one compile (~10 s on an H200)
    # costs hundreds of a tiny model's updates (~15 ms each), a multiple no shorter than the
    # longest completion (1152 for the trace recipe) compiles one shape per prompt length.
    c.sft.completion_multiple = 64

    # GRPO after SFT, in the closed loop's schema (train / grpo / optim / reward, read by
    # mapfjax.rl.driver) plus the generator config of its puzzle pool.
    c.rl = ml_collections.ConfigDict()
    c.rl.env = env_config({3: 0.3, 4: 0.3, 5: 0.3, 6: 0.1}, seed=2)
    c.rl.train = ml_collections.ConfigDict(
        dict(
            steps=20,  # 0: export the SFT model without GRPO
            problems_per_step=8,
            group_size=8,
            num_iterations=1,
            max_new_tokens=64,
            temperature=1.0,
            top_p=1.0,
            enable_thinking=False,
            checkpoint_every=10,
            oversample=1.0,
            objective="grpo",
        )
    )
    c.rl.grpo = ml_collections.ConfigDict(
        dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, aggregation="token_mean", scale_by_std=True)
    )
    c.rl.optim = c.sft.optim.copy_and_resolve_references()
    c.rl.optim.lr = 1e-4
    c.rl.optim.warmup_steps = 3
    c.rl.optim.schedule = "constant"
    c.rl.reward = ml_collections.ConfigDict(
        dict(valid_reward=1.0, optimal_bonus=0.5, invalid_reward=0.0, format_penalty=0.0)
    )

    # Fixed validation set: 2 agents, 50 per size 3x3..10x10, its own seed.
    c.validation = ml_collections.ConfigDict()
    c.validation.per_size = 50
    c.validation.env = env_config({n: 1 / 8 for n in range(3, 11)}, seed=12345)
    c.validation.max_new_tokens = 80
    c.validation.batch_size = 100

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
        c.thinking = True
        # Each row written with every cell labelled: a 6-layer model learns this transcription
        # (97.5 % of held-out maps exact after 750 header-only updates) where a list of the
        # holes stays at 25 % after 1,000 (results/trace_probe).
        c.trace_style = "grid"
        c.workdir = "runs/tiny_trace_grid"
        c.out_dir = "runs/tiny_trace_grid/export"
        c.tokenizer.vocab_size = 1024
        # 6 layers: a trace's look-ups are short (match a cell token, copy what follows), and
        # completions are ~10x longer than an answer alone, so depth is traded for updates.
        c.model.num_layers = 6
        c.sft.env = env_config(TRACE_SIZES, seed=21, wait_ratio=0.5)
        c.sft.hole_ratios = BROAD_HOLES
        c.sft.instances = 32768
        c.sft.batch_size = 16
        c.sft.stages = (1500, 3000, 6000)
        c.rl.env = env_config(TRACE_SIZES, seed=22, wait_ratio=0.3)
        c.rl.train.enable_thinking = True
        # The oracle's traces of the SFT data (tokens with the answer, 8,190 per size): 3x3 mean
        # 158 (max 304), 4x4 216 (608), 5x5 267 (967), 6x6 322 (99th percentile 597, 3.4 %
        # over 512, 0.5 % over 640). 640 fits all but the longest; a cut trace is a parse error.
        c.rl.train.max_new_tokens = 640
        c.validation.env = env_config(TRACE_SIZES, seed=23456, wait_ratio=0.3)
        c.validation.hole_ratios = (0.1, 0.2, 0.3)
        c.validation.per_size = 30  # 10 per (size, hole ratio)
        c.validation.spare = 0.25
        c.validation.max_new_tokens = 640
        c.validation.batch_size = 60
    if arg == "trace_long":
        # The grid-trace policy (6,000 updates, aw10) continued on puzzles with longer plans:
        # every one of its 23 parse errors on the gate's puzzles writes more than 10 steps and
        # loses count of them, and 1.4 % of its SFT plans are over 10 steps (3.7 % in this mix;
        # results/go_no_go/parse_errors_6000, trace_long).
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
        # (results/go_no_go, "What the trace's own lines decide") follow from written lines.
        # About 80 more tokens on puzzles that need a wait (results/go_no_go/lookahead).
        continue_from(c, "runs/tiny_trace_wait/export", "trace_ahead", 51, 0.7, 24576, 1500)
        c.trace_lookahead = "priority"
    if arg == "trace_relay":
        # trace_wait continued on traces that write each agent's whole plan in turn, a later
        # agent's lines marking `taken` where an earlier one stands at that step: every action
        # follows from its own line by one rule (`mapfjax.env.relay`), where the step layout
        # decides the plan on 13.8 % of the puzzles that need a wait. The rule's plan is valid
        # on all the gate's puzzles that need no wait and 84 % of those that need one (the others
        # are left out of the SFT data); traces as long as today's (results/go_no_go/relay).
        continue_from(c, "runs/tiny_trace_wait/export", "trace_relay", 61, 0.7, 24576, 2000)
        c.trace_lookahead = "relay"
    if arg == "trace_relay_where":
        # trace_relay continued with a later agent's lines also writing each earlier agent's
        # cell at that step (copied from that agent's line for the step), so that its `taken`
        # marks compare cells on the same line instead of a line up to 15 lines above.
        continue_from(c, "runs/tiny_trace_relay/export", "trace_relay_where", 71, 0.7, 16384, 1000)
        c.trace_lookahead = "relay_where"
    if arg in ("trace_relay_scratch", "trace_relay_next_scratch", "trace_retry_scratch",
               "trace_end_scratch", "trace_mix_scratch"):  # fmt: skip
        # The relay layout from scratch: the trace recipe (6 layers, 6,000 updates of 16 in three
        # resumable stages), answer tokens weighing 10, the gate's puzzles kept out; about 2.5
        # hours on 2 cores. Continuing a step-layout policy on it lost 9.5 points (trace_relay).
        c.trace_lookahead = "relay"
        c.workdir = "runs/tiny_trace_relay_scratch"
        c.out_dir = "runs/tiny_trace_relay_scratch/export"
        c.sft.answer_weight = 10.0
        c.sft.exclude = ("results/go_no_go/held_out_400.jsonl",)
        c.rl.train.steps = 0
    if arg == "trace_relay_next_scratch":
        # The same from scratch, a later agent's step-K line also writing `t<K+1> A<j> (r, c)`:
        # where each earlier agent starts step K+1, the cell that follows the same key at the
        # start of that agent's own line. `relay_where` wrote that cell without the key and the
        # policy copied the cell before the step (184 of its 233 field errors).
        c.trace_lookahead = "relay_next"
        c.workdir = "runs/tiny_trace_relay_next_scratch"
        c.out_dir = "runs/tiny_trace_relay_next_scratch/export"
    if arg == "trace_retry_scratch":
        # The same from scratch, the first agent a check instead of a choice: index order
        # first; a run that is cornered (`= cornered`) or comes back to a cell once the earlier
        # agents rest (`= loop tJ`) ends the attempt, `retry A1 A0` names the next order
        # (`mapfjax.env.relay.retry`). The relay policy lost 31 of the gate's puzzles on its
        # first agent alone; the retry reaches a plan on 84 % of those that need a wait
        # (results/go_no_go/relay/orders.md).
        c.trace_lookahead = "relay_retry"
        c.workdir = "runs/tiny_trace_retry_scratch"
        c.out_dir = "runs/tiny_trace_retry_scratch/export"
    if arg == "trace_end_scratch":
        # trace_retry_scratch's recipe, the trace also ending where every order fails on a
        # line: the last failed run, then `no order left`, then the oracle's answer
        # (`lookahead.relay_retry_end_form`). The retry data left those puzzles out (6.5 % of
        # the SFT draw, 31 of the gate's 400), and on them the retry policy often never closed
        # its trace: 10 of the 18 traces the lesson policy left open (results/go_no_go/PLAN_end.md).
        c.trace_lookahead = "relay_retry_end"
        c.workdir = "runs/tiny_trace_end_scratch"
        c.out_dir = "runs/tiny_trace_end_scratch/export"
    if arg == "trace_end_wide":
        # The ending start made twice as wide by a function-preserving growth (`python -m
        # mapfjax.models.grow runs/tiny_trace_end_scratch/export runs/tiny_trace_end_wide_init
        # --width 2`: hidden 256, 8 heads, 768 MLP units, 4.9M parameters against 1.3M),
        # continued for 1,000 updates: capacity, the one axis of the recipe GRPO from the trace
        # policy has not been tried on (results/go_no_go/PLAN_wide.md). About 5 s an update on
        # 2 cores (1.7 s at width 128).
        continue_from(c, "runs/tiny_trace_end_wide_init", "trace_end_wide", 101, 0.5, 24576, 1000)
        c.trace_lookahead = "relay_retry_end"
    if arg == "trace_mix":
        # trace_end_scratch continued for 600 updates with 60 % of its puzzles (by hash) giving
        # the answer alone after an empty think block: a start that thinks on about 40 % of its
        # samples, whatever the puzzle, so that what GRPO can reinforce is whether to think, a
        # choice the same on every puzzle (results/go_no_go/PLAN_mix.md).
        continue_from(c, "runs/tiny_trace_end_scratch/export", "trace_mix", 111, 0.5, 8192, 600)
        c.trace_lookahead = "relay_retry_end"
        c.sft.answer_only = 0.6
    if arg == "trace_mix_scratch":
        # trace_mix's mix (60 % of the puzzles answered after an empty think block) from the
        # first update, in the first stage of trace_end_scratch's recipe (1,500 updates on its
        # own cosine schedule): a start that thinks on some samples built in about an hour on 2
        # cores, where trace_end_scratch then trace_mix take 5-7 (results/go_no_go/PLAN_reach.md).
        c.trace_lookahead = "relay_retry_end"
        c.workdir = "runs/tiny_trace_mix_scratch"
        c.out_dir = "runs/tiny_trace_mix_scratch/export"
        c.sft.answer_only = 0.6
        c.sft.stages = c.sft.stages[:1]
    if arg == "trace_retry_lessons":
        # trace_retry_scratch continued for 1,000 updates, a quarter of the puzzles also giving
        # a loop lesson (`mapfjax.rl.data.loop_lesson_examples`): its trace up to a wrong move
        # back to the cell it came from is prompt, the loss starts at the line `= loop tJ` that
        # ends the run. 18 of the 19 traces the retry start never closes on the gate's puzzles
        # go back and forth between cells without that line; the rule's own loops (an agent
        # that cannot reach its goal) look different (results/go_no_go/PLAN_loop.md).
        continue_from(c, "runs/tiny_trace_retry_scratch/export", "trace_retry_lessons", 91, 0.5)
        c.trace_lookahead = "relay_retry"
        c.sft.loop_lessons = 0.25
    if arg == "trace_quick":
        c.workdir = "/tmp/mapfjax_tiny_trace_quick"
        c.out_dir = "/tmp/mapfjax_tiny_trace_quick/export"
    if arg == "quick":  # never into the package: a smoke run must not replace the shipped model
        c.workdir = "/tmp/mapfjax_tiny_quick"
        c.out_dir = "/tmp/mapfjax_tiny_quick/export"
    if arg.endswith("quick"):
        c.tokenizer.instances = 200
        c.sft.instances = 256
        c.sft.batch_size = 16
        c.sft.stages = (8, 16)
        c.sft.coordinate_targets = True  # the smoke run exercises the auxiliary target too
        c.sft.checkpoint_every = 8
        c.sft.optim.warmup_steps = 2
        c.rl.train.steps = 4
        c.rl.optim.warmup_steps = 1
        c.rl.train.checkpoint_every = 2
        c.rl.train.problems_per_step = 2
        c.rl.train.group_size = 4
        c.validation.per_size = 4
    return c
