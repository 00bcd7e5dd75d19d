"""The paper's comparison at laptop scale: every curriculum (engineer) in the same loop, five
seeds each, the same starting model, step budget and held-out set (docs/paper.md sections 5
and 9).

    python launch/sweep.py --config projects/curricula/configs/laptop_effect.py \
        --workdir runs/curricula
    python launch/sweep.py --config projects/curricula/configs/laptop_effect.py:think \
        --workdir runs/curricula_think

"" runs on the answer-only job's settings (projects/curricula/configs/train.py:curricula: 5
rounds of 15 updates from a random round-0 config per seed, 400 held-out puzzles) into
projects/curricula/results/answer_only/; `:previous` is the comparison as first run, on the
previous main job's settings (projects/curricula/results/previous/); `:wait_test` is the test of
the `wait` engineer against `fixed` written down before it ran
(projects/curricula/results/wait_test/README.md): round 0 drawn with waits ~ U[0, 0.3], fresh
seeds 5-9; `:think` is the comparison on the policy that thinks (the main job from a random
round 0) for the paper's six engineers, into projects/curricula/results/think/ (its PLAN.md was
written before it ran). Runs train one after another (finished runs are skipped: rerun the
command to continue, or split --config.seeds across machines); then the results directory gets
summary.md, summary.csv, one small JSON record per run and the plots.
`--config.train_arg=curricula_smoke` runs a two-round pass of the same grid in minutes.
"""

import ml_collections

from mapfjax import configfile

ABLATION = configfile.load_module(configfile.resolve("configs/sweep_ablation.py"))

# Baselines, the paper's engineer and `wait` (the training wait share from the held-out failures,
# added after the first six); `base` (the untrained checkpoint as engineer) can be added with
# --config.groups.curricula.engineers.
ENGINEERS = ("fixed", "random", "rule", "learnability", "bandit", "policy", "wait")
# The six the paper compares (the comparison on the policy that thinks runs these).
PAPER_ENGINEERS = ENGINEERS[:6]


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """ "" = the sweep; "previous" = the sweep on the previous main job's settings; "wait_test" =
    fixed against wait from a round 0 with few waits; "think" = the six engineers on the policy
    that thinks;
    "train,engineer=NAME,..." = one run's training config (as in configs/sweep_ablation.py)."""
    if arg.startswith("train"):
        return ABLATION.get_config(arg)
    if arg not in ("", "previous", "wait_test", "think"):
        raise ValueError(
            f"projects/curricula/configs/laptop_effect.py:{arg}: no such variant; allowed: "
            "'' (the sweep), "
            "'previous' (the sweep as first run), 'wait_test' (fixed against wait), 'think' "
            "(the sweep on the policy that thinks) or 'train,engineer=NAME,...' (one run)"
        )
    c = ABLATION.get_config("")
    c.train_config = "projects/curricula/configs/train.py"
    c.train_arg = "laptop" if arg == "previous" else "curricula"
    c.seeds = (0, 1, 2, 3, 4)
    c.groups = ml_collections.ConfigDict(
        {
            "curricula": {
                "engineers": ENGINEERS,
                "variants": ("V6",),
                "t_details": ("bookkeeping",),
            }
        }
    )
    # Where the small files that stay are written (relative to the working directory), and the
    # engineer every other one is compared with, paired by seed on the same puzzles.
    c.results = (
        "projects/curricula/results/previous"
        if arg == "previous"
        else "projects/curricula/results/answer_only"
    )
    c.reference = "fixed"
    if arg == "wait_test":
        c.train_arg = "curricula_few_waits"
        c.seeds = (5, 6, 7, 8, 9)  # not the five seeds whose runs suggested the test
        c.groups.curricula.engineers = ("fixed", "wait")
        c.results = "projects/curricula/results/wait_test"
    if arg == "think":  # projects/curricula/results/think/PLAN.md
        c.train_arg = "curricula_think"
        c.groups.curricula.engineers = PAPER_ENGINEERS
        c.results = "projects/curricula/results/think"
    return c
