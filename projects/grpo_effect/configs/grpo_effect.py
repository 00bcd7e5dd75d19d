"""Does GRPO alone move held-out rates? One round with the fixed engineer, the start against
the end on the same 400 held-out puzzles, on the previous main job's settings
(projects/main_job/configs/main_job.py:previous).

    python launch/train.py --config projects/grpo_effect/configs/grpo_effect.py \
        --workdir runs/grpo_effect [--config.optim.lr=3e-4] [--config.train.objective=rft]
"""

import ml_collections

from mapfjax import configfile
from mapfjax.env.config import default_config

TINY_CPU = configfile.load_module("configs/tiny_cpu.py")
MAIN_JOB = configfile.load_module("projects/main_job/configs/main_job.py")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"projects/grpo_effect/configs/grpo_effect.py:{arg}: no such variant; "
                         "it takes none")  # fmt: skip
    c = MAIN_JOB.get_config("previous")
    c.rounds = 1
    c.engineer = TINY_CPU.engineer_settings("fixed", "V6")
    c.env = default_config(num_agents=2, sizes=range(3, 7), hole_ratio=0.2, wait_ratio=0.3)
    c.train.instances = 1200  # 150 updates of 8 groups x 8
    c.train.checkpoint_every = 10
    c.validation.sizes = tuple(range(3, 7))
    c.validation.per_size = 100  # 400 puzzles: paired intervals of about +-4 points
    c.validation.hole_ratios = (0.1, 0.2, 0.3)
    return c
