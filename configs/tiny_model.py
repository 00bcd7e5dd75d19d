"""The recipes that build the shipped tiny models (`launch/train_tiny.py`).

    python launch/train_tiny.py --config configs/tiny_model.py         # mapfjax/assets/tiny
    python launch/train_tiny.py --config configs/tiny_model.py:think   # mapfjax/assets/tiny_think
    python launch/train_tiny.py --config configs/tiny_model.py:quick   # a one-minute smoke run

"" builds the answer-only model: a BPE tokenizer, SFT on the oracle's answers in three
resumable stages of one cosine schedule (3,500, 5,000, then 10,000 updates of 32; about 4.5
hours on 2 CPU cores), 20 GRPO steps, export and greedy validation (VALIDATION.md).
"think" builds the policy that thinks on some samples in two named stages, each a recipe of its
own, the second starting from the first's export: `trace` (from scratch, 6,000 SFT updates of
16 on reasoning traces, about 3.6 hours on 2 cores) and `mix` (600 more, 60 % of the puzzles
answered after an empty think block); both keep the main job's held-out puzzles out of their
SFT data. "quick" and "think_quick" shrink every stage to a few steps and write under /tmp.
How each model was chosen: projects/tiny_models and projects/go_no_go.
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


# The training configs whose held-out puzzles no SFT example may hold: the main job's 400
# (`sft.exclude` takes instance files or such configs).
HELD_OUT = ("configs/tiny_cpu.py",)
# Every hole ratio in [0, 0.5] (the legal space), one share each.
BROAD_HOLES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
# The reasoning-trace policy's range: the main job's held-out set is 3x3-6x6.
TRACE_SIZES = {3: 0.25, 4: 0.25, 5: 0.25, 6: 0.25}
VARIANTS = ("", "quick", "think", "think_quick")


def continue_from(
    c, init: str, seed: int, wait_ratio: float, instances=16384, updates=1000, exclude=HELD_OUT
):
    """A trace policy (`init`: a model directory, or "stage:NAME", an earlier stage's export)
    continued by SFT on fresh 3x3-6x6 puzzles weighted toward larger maps (hole ratios 0.1-0.4;
    `wait_ratio` of them need a wait), the held-out puzzles `exclude` kept out, answer tokens
    weighing 10, at a quarter of the recipe's peak learning rate, no GRPO."""
    c.init = init
    c.sft.env = env_config({3: 0.1, 4: 0.2, 5: 0.3, 6: 0.4}, seed=seed, wait_ratio=wait_ratio)
    c.sft.hole_ratios = (0.1, 0.2, 0.3, 0.4)
    c.sft.instances = instances
    c.sft.exclude = exclude
    c.sft.answer_weight = 10.0
    c.sft.stages = (updates,)
    c.sft.optim.lr = 5e-4
    c.sft.optim.warmup_steps = 50
    c.rl.train.steps = 0


def recipe() -> ml_collections.ConfigDict:
    """The answer-only model's recipe: one run of `launch/train_tiny.py`."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    # True: the completion is a reasoning trace (think block), then the answer; the tokenizer
    # makes every "(r, c)" one token. The reward still reads only the answer.
    c.thinking = False
    # With thinking: the trace the completion writes before the answer (`mapfjax.env.forms`):
    # a registered form ("grid_relay", the shipped policy's) or "module:attribute" naming an
    # experiment's TraceForm (e.g. "projects.go_no_go.traces:steps"); "" without thinking.
    c.trace_form = ""
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
    # "module:attribute" naming a function (tokenizer, problems) -> SFT examples added beside
    # the puzzles' own (an experiment's, e.g. projects/go_no_go's loop lessons); "" for none.
    c.sft.extra_examples = ""
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

    return c


def trace(c: ml_collections.ConfigDict) -> None:
    """The reasoning-trace policy's settings (thinking on, 6 layers, 3x3-6x6, 640 tokens)."""
    c.thinking = True
    # The shipped trace (`mapfjax.env.forms.GRID_RELAY`): the map with every cell labelled (a
    # 6-layer model learns this transcription, 97.5 % of held-out maps exact after 750
    # header-only updates, where a list of the holes stays at 25 % after 1,000:
    # projects/trace_probe), then each agent's run in turn (`mapfjax.env.relay`): a run that
    # is cornered or loops ends the attempt, `retry` names the next order, and where every
    # order fails the trace ends on `no order left`.
    c.trace_form = "grid_relay"
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


def trace_stage() -> ml_collections.ConfigDict:
    """`think`'s first stage: the retrying relay trace from scratch (6 layers, 6,000 updates of
    16 in three resumable stages of one schedule), ending on `no order left` where every order
    of the agents fails, answer tokens weighing 10, the held-out puzzles kept out, no GRPO."""
    c = recipe()
    trace(c)
    c.sft.answer_weight = 10.0
    c.sft.exclude = HELD_OUT
    c.rl.train.steps = 0
    return c


def mix_stage() -> ml_collections.ConfigDict:
    """`think`'s second stage: the first stage's export continued for 600 updates with 60 % of
    its puzzles (by hash) answered after an empty think block: a policy that thinks on some
    samples, whatever the puzzle, so that what GRPO can reinforce is whether to think."""
    c = recipe()
    trace(c)
    continue_from(c, "stage:trace", 111, 0.5, 8192, 600)
    c.sft.answer_only = 0.6
    return c


def quick(c: ml_collections.ConfigDict) -> None:
    """Every stage shrunk to a few steps (a smoke run of the pipeline)."""
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


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """A recipe: one run (`""`, `quick`) or named stages run in order (`think`, `think_quick`:
    `stages` names them, `stage.NAME` holds each one's recipe, and an `init` of "stage:NAME"
    starts from that stage's export; `--config.stage.mix.sft.stages='(300,)'` overrides one)."""
    if arg not in VARIANTS:
        raise ValueError(f"configs/tiny_model.py: unknown variant {arg!r}; known: {VARIANTS}")
    if arg in ("", "quick"):
        c = recipe()
        if arg == "quick":  # never into the package: a smoke run must not replace the model
            quick(c)
            c.workdir = "/tmp/mapfjax_tiny_quick"
            c.out_dir = "/tmp/mapfjax_tiny_quick/export"
        return c
    c = ml_collections.ConfigDict()
    c.stages = ("trace", "mix")
    c.stage = ml_collections.ConfigDict({"trace": trace_stage(), "mix": mix_stage()})
    for s in c.stage.values():  # a stage's folders follow from the recipe's (recipe.stage_configs)
        del s["workdir"], s["out_dir"]
    c.workdir = "runs/tiny_think"  # each stage works in <workdir>/<stage>
    c.out_dir = "mapfjax/assets/tiny_think"  # the last stage's export; the others' stay in theirs
    if arg == "think_quick":
        for s in c.stage.values():
            quick(s)
            s.rl.train.steps = 0
            s.validation.per_size = 2
        c.stage.mix.sft.stages = (8,)
        c.workdir = "/tmp/mapfjax_tiny_think_quick"
        c.out_dir = "/tmp/mapfjax_tiny_think_quick/export"
    return c
