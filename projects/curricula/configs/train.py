"""Each run of the curriculum comparison (projects/curricula/configs/laptop_effect.py): the
training config its engineer's runs share.

`curricula` is the answer-only job's settings and budget (75 updates of 16 groups) in 5 rounds
of 15 updates, so that an engineer decides 4 times, round 0 on a random config drawn from the
seed (the paper's; the same for every engineer of a seed), greedy held-out only;
`curricula_few_waits` draws that round 0 with waits ~ U[0, 0.3] (the wait test);
`curricula_think` is the main job (the policy that thinks) with round 0 on a random config;
`laptop` is the comparison as first run, on the previous main job's settings over 3x3-8x8; the
`_smoke` variants run the same grids in minutes.
"""

import ml_collections

from mapfjax import configfile
from mapfjax.env.config import default_config

TINY_CPU = configfile.load_module("configs/tiny_cpu.py")
MAIN_JOB = configfile.load_module("projects/main_job/configs/main_job.py")
VARIANTS = (
    *("curricula", "curricula_smoke", "curricula_few_waits", "curricula_think"),
    *("laptop", "laptop_smoke"),
)


def get_config(arg: str = "curricula") -> ml_collections.ConfigDict:
    if arg not in VARIANTS:
        known = ", ".join(repr(v) for v in VARIANTS)
        raise ValueError(
            f"projects/curricula/configs/train.py:{arg}: no such variant; allowed: {known}"
        )
    if arg == "curricula_think":  # projects/curricula/results/think/PLAN.md
        # The main job with round 0 on a random config drawn from the seed: 3 rounds of
        # THINK_UPDATES, 2 engineer decisions.
        c = TINY_CPU.get_config("")
        c.env_start = "random"
        return c
    c = MAIN_JOB.answer_only_400()
    if arg.startswith("laptop"):
        MAIN_JOB.previous_main_job(c)
        # Sizes 3x3-8x8, where the frontier map shows flips (greedy fails, a sample solves);
        # the engineer chooses among them. 20 updates per round, held-out 50 per size.
        c.env = default_config(num_agents=2, sizes=range(3, 9), hole_ratio=0.2, wait_ratio=0.3)
        c.train.instances = 160
        c.validation.sizes = tuple(range(3, 9))
    else:
        c.rounds = 5
        c.env_start = "random"
        c.train.instances = 240
        c.validation.samples = 0
    if arg == "curricula_few_waits":
        c.env_start_max_wait = 0.3
    if arg == "curricula_smoke":  # the same grid, 2 rounds of 1 update, 6 puzzles per size
        c.rounds = 2
        c.train.instances = 16
        c.validation.per_size = 6
        c.validation.hole_ratios = (0.2,)
    if arg == "laptop_smoke":  # the same grid, 2 rounds of 2 updates, 6 puzzles per size
        c.rounds = 2
        c.train.instances = 16
        c.validation.per_size = 6
        c.validation.samples = 2
    return c
