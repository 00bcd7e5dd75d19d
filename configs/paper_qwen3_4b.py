r"""The paper's setting: Qwen3-4B thinking, 3 rounds x 4,000 two-agent puzzles x 2 epochs of
GRPO, round 0 on a random configuration over 3x3-10x10, validation per map size, the policy as
its own engineer with the V6 context, and after the last round the paper-style benchmark (3, 4
and 5 agents) with the paper's section-5 table.

    huggingface-cli download Qwen/Qwen3-4B --local-dir /models/Qwen3-4B
    python launch/memory_plan.py --config configs/paper_qwen3_4b.py --target h100x8
    python launch/train.py --config configs/paper_qwen3_4b.py --workdir /path/to/run \
        --config.model.path=/models/Qwen3-4B

Every value is either a fact of the paper or a choice of ours: docs/paper.md section 10 tags
each key (tests/test_paper_config.py holds this file to that table). The defaults fit one
node of 8 x H100 80 GB by the memory plan (docs/launching.md); every worker of a TPU pod or
SLURM job runs the same command (launch/tpu_pod.sh, launch/slurm.sbatch).
"""

import ml_collections

from mapfjax.env.config import PAPER_SIZES, default_config
from mapfjax.presets import engineers, variants


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"configs/paper_qwen3_4b.py:{arg}: no such variant; it takes none")
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.rounds = 3
    c.export_every_round = True
    c.model = ml_collections.ConfigDict(
        {
            "path": "Qwen/Qwen3-4B",  # a local directory or, with network, a hub id
            "dtype": "bfloat16",
            # The reference attention until the fast paths are measured where this runs:
            # "fused" (cuDNN's flash kernel) is the one to try on GPU, "splash" on TPU.
            "attention_impl": "einsum",
        }
    )
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tp": 1})
    # Two agents on 3x3-10x10; round 0 trains on a configuration drawn at random over these
    # sizes (env_start "random": data ~ Dirichlet(1), holes ~ U[0, 0.5], waits ~ U[0, 1]),
    # so the per-size ratios below are replaced by the draw.
    c.env = default_config(num_agents=2, sizes=PAPER_SIZES, hole_ratio=0.2, wait_ratio=0.3)
    c.env_start = "random"
    c.env_start_max_wait = 1.0
    c.train = ml_collections.ConfigDict()
    c.train.instances = 4000
    c.train.epochs = 2
    c.train.problems_per_step = 48  # x group 8 = 384 responses per update
    c.train.group_size = 8
    c.train.oversample = 1.0  # plain GRPO: every sampled group is trained on
    c.train.objective = "grpo"
    c.train.num_iterations = 1
    c.train.max_new_tokens = 4096
    c.train.temperature = 1.0
    c.train.top_p = 1.0
    c.train.enable_thinking = True
    c.train.trace_loss = "all"
    c.train.checkpoint_every = 10
    # Few shapes: a compile of the 4B model costs minutes.
    c.train.bucket = "pow2_mid"
    c.train.completion_bucket = "pow2"
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
            "lr": 1e-6,
            "schedule": "constant",
            "warmup_steps": 10,
            "end_lr_ratio": 1.0,
            "weight_decay": 0.0,
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-8,
            "grad_clip": 1.0,
            # micro-batches of 8 puzzles x 8 completions: one puzzle's group per device of 8
            "accum_steps": 6,
            "length_split": 1,
            "group_split": 1,
            "remat": "full",  # each layer keeps its input only; the backward recomputes the rest
            "max_bad_steps": 5,
            "lora_rank": 0,
            "lora_alpha": 32.0,
        }
    )
    c.reward = ml_collections.ConfigDict(
        {
            "valid_reward": 1.0,
            "optimal_bonus": 0.0,
            "invalid_reward": 0.0,
            "format_penalty": 0.0,
            "agent_credit": 0.0,
        }
    )
    c.validation = ml_collections.ConfigDict(
        {
            "num_agents": 2,
            "sizes": PAPER_SIZES,
            "per_size": 50,
            "hole_ratio": 0.2,
            "hole_ratios": (0.1, 0.2, 0.3),
            "wait_ratio": 0.5,
            "samples": 0,
            "seed": 12345,
            "extra_seeds": (),
            "max_new_tokens": 4096,
            "batch_size": 256,
            "bucket": "pow2_mid",
        }
    )
    c.engineer = ml_collections.ConfigDict(
        {
            "settings": engineers.get_config("policy"),
            "modules": variants.get_config("V6").modules,
            "variant": "V6",
            "max_new_tokens": 4096,
            "temperature": 0.7,
        }
    )
    c.benchmark = ml_collections.ConfigDict(
        {
            "agents": (3, 4, 5),
            "sizes": PAPER_SIZES,
            "wait_ratios": (0.25, 0.5, 0.75),
            "per_cell": 50,
            "hole_ratio": 0.1,
            "seed": 0,
            "max_new_tokens": 4096,
            "batch_size": 256,
            "bucket": "pow2_mid",
        }
    )
    return c
