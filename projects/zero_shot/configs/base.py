"""The base policy for the zero-shot test (projects/zero_shot/PLAN.md): the shipped policy that
thinks on some samples (mapfjax/assets/tiny_think) continued on SFT data that shows every agent
symbol of the benchmark, as a pretrained model would have read them: its own 2-agent mix
(60 % of the puzzles answered after an empty think block) and a smaller share of 3-, 4- and
5-agent puzzles that need no wait (each agent's shortest path is the plan: the symbols, the
format and the trace for k agents, but no coordination).

    python launch/train_tiny.py --config projects/zero_shot/configs/base.py

`:quick` is the same recipe shrunk to a few updates (a smoke run, under /tmp). `:v2` is
PLAN.md's amendment 1: the 3-, 4- and 5-agent puzzles doubled and every one of them answered
after a trace (the 2-agent mix keeps its 60 % answered after an empty think block), so that
the reasoning format GRPO favours is one the data shows for k agents; `:v2_quick` its smoke
run. The evaluation puzzles (the main job's 400 and the zero-shot slice) are kept out of the
SFT data.
"""

import ml_collections

from mapfjax import configfile
from mapfjax.env.config import default_config

TINY = configfile.load_module("configs/tiny_model.py")
SLICE = "projects/zero_shot/results/slice_345.jsonl"
# Puzzles per agent count beside the 2-agent mix's 8,192: 3 agents on 3x3-6x6, 4 on 4x4-6x6,
# 5 on 5x5-6x6 (a map needs room for 2k starts and goals), none needing a wait.
MORE_AGENTS = {3: (1536, (3, 4, 5, 6)), 4: (1024, (4, 5, 6)), 5: (768, (5, 6))}
VARIANTS = ("", "quick", "v2", "v2_quick")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in VARIANTS:
        raise ValueError(
            f"projects/zero_shot/configs/base.py:{arg}: no such variant; allowed: {VARIANTS}"
        )
    c = TINY.recipe()
    TINY.trace(c)
    TINY.continue_from(
        c, str(configfile.ROOT / "mapfjax" / "assets" / "tiny_think"), 121, 0.5, 8192, 1000,
        exclude=(*TINY.HELD_OUT, SLICE),
    )  # fmt: skip
    c.trace_form = "grid_relay"
    c.sft.answer_only = 0.6
    # A 5-agent trace that retries many orders runs to thousands of tokens (up to 15,000 here):
    # such examples are left out, as a rollout would cut them at its budget (800 on the slice).
    c.sft.max_completion_tokens = 800
    c.sft.mix = ml_collections.ConfigDict()
    for k, (n, sizes) in MORE_AGENTS.items():
        env = default_config(k, sizes=sizes, hole_ratio=0.2, wait_ratio=0.0, seed=130 + k)
        c.sft.mix[f"agents{k}"] = {"env": env, "instances": n, "hole_ratios": (0.1, 0.2, 0.3)}
    c.workdir = "runs/zero_shot_base"
    c.out_dir = "runs/zero_shot_base/export"
    if arg.startswith("v2"):
        for part in c.sft.mix.values():
            part.instances *= 2
            part.answer_only = 0.0  # a trace on every 3-5-agent puzzle
        c.workdir = "runs/zero_shot_base_v2"
        c.out_dir = "runs/zero_shot_base_v2/export"
    if arg.endswith("quick"):
        TINY.quick(c)
        c.rl.train.steps = 0
        c.sft.stages = (8,)
        for part in c.sft.mix.values():
            part.instances = 16
        c.workdir = f"/tmp/mapfjax_zero_shot_base_{arg}"
        c.out_dir = f"/tmp/mapfjax_zero_shot_base_{arg}/export"
    return c
