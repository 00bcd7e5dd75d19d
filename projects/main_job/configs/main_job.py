"""The main job's earlier settings, as their committed runs ran them (projects/main_job).

    python launch/train.py --config projects/main_job/configs/main_job.py:held_out_400 \
        --workdir runs/main_400
    python launch/train.py --config projects/main_job/configs/main_job.py:previous \
        --workdir runs/main_previous

`:held_out_400` is the answer-only model's job (configs/tiny_cpu.py:answer_only) validated on
the 400 held-out puzzles alone with mean@2 (projects/main_job/results/tiny*); `:previous` is that
job as it ran before the bonus-off, wait-share settings (3x3..10x10, the reward's optimal bonus,
8 groups at lr 1e-4): what projects/grpo_effect and the curriculum comparison's first run
(projects/curricula/results/previous) were measured with.
"""

import ml_collections

from mapfjax import configfile
from mapfjax.env.config import default_config

TINY_CPU = configfile.load_module("configs/tiny_cpu.py")
VARIANTS = ("held_out_400", "previous")


def answer_only_400() -> ml_collections.ConfigDict:
    """The answer-only job validated on the 400 held-out puzzles alone."""
    c = TINY_CPU.get_config("answer_only")
    c.validation.extra_seeds = ()
    return c


def previous_main_job(c: ml_collections.ConfigDict) -> None:
    """The main job's settings until the bonus-off, wait-share setting replaced them (3x3..10x10,
    wait share 0.3, 8 groups per update at lr 1e-4, a 0.5 bonus for optimal plans, held-out 50
    per size over hole ratios 0-0.5)."""
    c.env = default_config(num_agents=2, hole_ratio=0.2, wait_ratio=0.3, seed=0)
    c.train.instances = 128
    c.train.problems_per_step = 8
    c.train.checkpoint_every = 4
    c.optim.lr = 1e-4
    c.reward.optimal_bonus = 0.5
    c.validation.sizes = tuple(range(3, 11))
    c.validation.per_size = 50
    c.validation.hole_ratios = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    c.validation.samples = 4


def get_config(arg: str = "held_out_400") -> ml_collections.ConfigDict:
    if arg not in VARIANTS:
        known = ", ".join(repr(v) for v in VARIANTS)
        raise ValueError(f"projects/main_job/configs/main_job.py:{arg}: no such variant; "
                         f"allowed: {known}")  # fmt: skip
    c = answer_only_400()
    if arg == "held_out_400":
        c.validation.samples = 2
    if arg == "previous":
        previous_main_job(c)
    return c
