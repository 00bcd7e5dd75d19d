r"""The paper's setting: Qwen3-4B, 3 rounds x 4,000 two-agent instances x 2 epochs, V6 context.

    python launch/train.py --config configs/paper_qwen3_4b.py --workdir /path/to/run \
        --config.model.path=/path/to/Qwen3-4B

Every worker of a TPU pod or SLURM job runs the same command (launch/tpu_pod.sh,
launch/slurm.sbatch). GRPO hyper-parameters the paper does not publish follow docs/paper.md
section 6 [ours]: group 8, lr 1e-6, temperature 1.0, KL off, clip 0.2.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_cpu  # noqa: E402


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"configs/paper_qwen3_4b.py:{arg}: no such variant; it takes none")
    c = tiny_cpu.get_config("answer_only")  # the answer-only job's keys, set below
    c.model.path = "Qwen/Qwen3-4B"  # a local directory or, with network, a hub id
    c.model.dtype = "bfloat16"
    # The reference attention, kept until the fast paths are measured on the accelerators this
    # runs on: "fused" (cuDNN's flash kernel) is the one to try on GPU, "splash" on TPU (off
    # TPU it is Pallas's interpreter, far too slow to train with). docs/accelerators.md.
    c.model.attention_impl = "einsum"
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tp": 1})
    c.export_every_round = True
    c.train.instances = 4000
    c.train.epochs = 2
    c.train.problems_per_step = 64  # x group 8 = 512 responses per update
    c.train.group_size = 8
    c.train.max_new_tokens = 4096  # thinking takes thousands of tokens (docs/paper.md section 8)
    c.train.checkpoint_every = 10
    c.train.enable_thinking = True
    # Few shapes on an accelerator, where a compile of the 4B model costs minutes (the CPU
    # config pads to multiples of 8).
    c.train.bucket = c.validation.bucket = "pow2_mid"
    c.train.completion_bucket = "pow2"
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.optim.end_lr_ratio = 1.0  # constant after warmup
    c.optim.b2 = 0.999
    c.validation.per_size = 50
    c.validation.extra_seeds = ()
    c.validation.samples = 2
    c.validation.max_new_tokens = 4096
    c.validation.batch_size = 256
    c.engineer.max_new_tokens = 4096
    c.engineer.settings.num_samples = 4
    return c
