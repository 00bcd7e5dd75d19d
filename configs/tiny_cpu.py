"""The main job: the shipped tiny policy that thinks on some samples, 3 rounds of generate ->
GRPO -> validate -> the policy proposes the next generator config (V6 context) -> project.

    python launch/train.py --config configs/tiny_cpu.py --workdir runs/tiny [--config.seed=1]
    python launch/train.py --config configs/tiny_cpu.py:smoke --workdir runs/smoke

"" starts from mapfjax/assets/tiny_think (answers bare greedily, thinks on some samples): 32
groups of 8 at lr 1e-4, KL 0.1 to the start, 640 new tokens with the thinking prompt,
THINK_UPDATES updates a round, on 2 agents, 3x3-6x6, half the puzzles needing a wait;
held-out: 400 puzzles (100 per size), greedy. About 14 minutes on 2 CPU cores.
`:answer_only` is the same loop on the answer-only model (mapfjax/assets/tiny): 16 groups per
update at lr 2e-4, 3 rounds of 25 updates, validated on 1,200 puzzles (those 400 first).
`:smoke` is the one-minute loop on the answer-only model: 2 rounds of a few small updates, a
handful of held-out puzzles, the whole report (tests and a first look).
configs/paper_qwen3_4b.py is the paper's setting; the experiments' variants of this job live in
projects/ (projects/README.md).
"""

import ml_collections

from mapfjax import configfile
from mapfjax.env.config import default_config
from mapfjax.presets import engineers, variants


def engineer_settings(name: str = "policy", variant: str = "V6") -> ml_collections.ConfigDict:
    e = ml_collections.ConfigDict()
    e.settings = engineers.get_config(name)
    e.modules = variants.get_config(variant).modules
    e.variant = variant
    e.max_new_tokens = 128  # free-form proposal budget (tiny models then fall back to likelihood)
    e.temperature = 0.7
    return e


# The variants after the colon (`configs/tiny_cpu.py:smoke`); "" is the main job.
VARIANTS = ("", "answer_only", "smoke")

# The main job's GRPO updates per round (projects/main_job/results/PLAN_think.md): the largest
# count that keeps the job within 14 minutes on 2 CPU cores (13.6 minutes at 3).
THINK_UPDATES = 3


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in VARIANTS:  # a typo would otherwise start the full job
        known = ", ".join(repr(v) for v in VARIANTS)
        raise ValueError(f"configs/tiny_cpu.py:{arg}: no such variant; allowed: {known}")
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.rounds = 3  # R0 (default config) + 2 engineered rounds [paper]
    c.export_every_round = False
    c.model = ml_collections.ConfigDict(
        {
            "path": str(configfile.ROOT / "mapfjax" / "assets" / "tiny"),
            "dtype": "float32",
            # Prefill and training attention (hf.ModelOptions): "einsum", the reference and the
            # fastest on CPU; "fused" (cuDNN on GPU) and "splash" (TPU) are accelerator paths.
            "attention_impl": "einsum",
        }
    )
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tp": 1})
    # Round-0 generator config: uniform over 3x3..6x6, half the puzzles needing a wait (as in
    # the held-out set) [ours; the paper uses a random config over 3x3..10x10].
    c.env = default_config(num_agents=2, sizes=range(3, 7), hole_ratio=0.2, wait_ratio=0.5, seed=0)
    # "config": round 0 trains on c.env; "random": on a random config over c.env's sizes drawn
    # from the seed (the paper's round 0; loop.start_config).
    c.env_start = "config"
    c.train = ml_collections.ConfigDict(
        {
            "instances": 400,  # per round: 25 updates (the paper: 4,000 instances)
            "epochs": 1,  # the paper: 2
            "problems_per_step": 16,
            "group_size": 8,
            # Dynamic sampling: sample 2 x 16 problems per step, train on 16 groups, those whose
            # rewards differ first (a group whose G rewards are equal has no gradient).
            "oversample": 2.0,
            # "rft": rejection-sampling fine-tuning on the same rollouts (cross-entropy on the
            # valid samples) instead of the GRPO update, for comparison.
            "objective": "grpo",
            "num_iterations": 1,
            "max_new_tokens": 64,
            "temperature": 1.0,
            "top_p": 1.0,
            "enable_thinking": False,  # the tiny model answers directly
            # What of a thinking response GRPO trains (rollout.TRACE_LOSSES): "all" every token;
            # "moves" all but the map transcription (the trace header, a function of the
            # prompt); "answer" only </think> and the answer block.
            "trace_loss": "all",
            "checkpoint_every": 5,
            # Padding rules (sampler.BUCKETS) for prompts (135-165 tokens) and the training
            # batch's completions: multiples of 8, not the accelerator default of few shapes
            # (192 and 64): a new shape costs ~15 s of compiling once (then the compilation
            # cache holds it), padding is paid on every step. Speed only; the math is the same.
            "bucket": "x8",
            "completion_bucket": "x8",
        }
    )
    c.grpo = ml_collections.ConfigDict(
        {
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.0,
            "aggregation": "token_mean",
            "scale_by_std": True,
        }
    )
    c.optim = ml_collections.ConfigDict(
        {
            "lr": 2e-4,
            # Every round restarts the schedule: 2 warmup updates, then constant (no update
            # runs at lr 0; "cosine" spans all rounds instead).
            "schedule": "constant",
            "warmup_steps": 2,
            "end_lr_ratio": 1.0,
            "weight_decay": 0.0,
            "b1": 0.9,
            "b2": 0.99,
            "eps": 1e-8,
            "grad_clip": 1.0,
            "accum_steps": 1,
            "length_split": 1,  # 2+: the update in parts by completion length (traces)
            "group_split": 1,  # 2+: with length_split, parts of pieces of groups (traces)
            "max_bad_steps": 5,
            # r > 0: the weights stay frozen and rank-r adapters train, scaled by alpha / r
            # (mapfjax.rl.lora; docs/training.md)
            "lora_rank": 0,
            "lora_alpha": 32.0,
        }
    )
    c.reward = ml_collections.ConfigDict(
        {
            "valid_reward": 1.0,
            # Validity alone: with a bonus for optimal plans GRPO lowered held-out valid rates
            # on the tiny model (projects/grpo_effect/results/README.md).
            "optimal_bonus": 0.0,
            "invalid_reward": 0.0,
            "format_penalty": 0.0,
            "agent_credit": 0.0,  # shaped reward (partial credit per agent), off
        }
    )
    # Held-out validation: 1,200 puzzles, answered greedily, rates with 95 % intervals. The
    # first 400 (100 per size, hole ratios 0.1-0.3, half needing a wait) are every job's; two
    # more draws of the same kind (extra_seeds) narrow a paired interval from about +-4 points
    # to about +-2.3 (`:answer_only`; the other jobs keep the 400).
    c.validation = ml_collections.ConfigDict(
        {
            "num_agents": 2,
            "sizes": tuple(range(3, 7)),
            "per_size": 100,
            "hole_ratio": 0.2,
            "hole_ratios": (0.1, 0.2, 0.3),
            "wait_ratio": 0.5,
            "samples": 0,
            "seed": 12345,
            "extra_seeds": (12346, 12347),
            "max_new_tokens": 64,
            "batch_size": 128,
            "bucket": "x8",  # prompts answered in order of length, each chunk padded to x8
        }
    )
    c.engineer = engineer_settings("policy", "V6")
    if arg != "answer_only":  # the other jobs validate on the gate's 400 alone
        c.validation.extra_seeds = ()
    if arg == "":  # the main job
        think(c)
    if arg == "smoke":  # the one-minute loop: 2 rounds, a handful of steps
        c.rounds = 2
        c.train.instances = 16
        c.train.group_size = 4
        c.train.problems_per_step = 4
        c.validation.per_size = 2
        c.validation.sizes = (3, 4, 5)
        c.validation.hole_ratios = (0.2,)
        c.validation.samples = 2
        c.train.oversample = 1.5
        c.engineer.settings.num_samples = 1
        c.engineer.max_new_tokens = 16
        c.train.max_new_tokens = 32
        c.validation.max_new_tokens = 32
    return c


def think(c: ml_collections.ConfigDict) -> None:
    """The main job from the policy that thinks on some samples (mapfjax/assets/tiny_think):
    the settings that passed the go/no-go gate (projects/go_no_go: 32 groups at lr 1e-4, KL 0.1
    to the start, 640 new tokens with the thinking prompt, the update in 16 parts by length of
    half groups) in the loop's 3 rounds, THINK_UPDATES updates each; validated greedily on the
    400 held-out puzzles at 640 tokens."""
    c.model.path = str(configfile.ROOT / "mapfjax" / "assets" / "tiny_think")
    c.train.problems_per_step = 32
    c.train.instances = THINK_UPDATES * c.train.problems_per_step
    c.train.enable_thinking = True
    c.train.max_new_tokens = c.validation.max_new_tokens = 640
    c.train.completion_bucket = "pow2"  # a trace's 100-640 tokens: few widths
    c.train.checkpoint_every = 10
    c.optim.lr = 1e-4
    c.optim.length_split = 16
    c.optim.group_split = 2
    c.grpo.kl_coef = 0.1
    c.validation.samples = 0
