"""The curriculum comparison's sweeps expand to the designs their plans wrote down before they
ran, and each run's training config is the job it names."""

from mapfjax import configfile
from mapfjax.eval import sweep as sw
from tests.eval.test_sweep import _parse_train_argv

LAPTOP = "projects/curricula/configs/laptop_effect.py"


def test_the_wait_test_expands_to_its_written_design(tmp_path):
    """laptop_effect.py:wait_test (projects/curricula/results/wait_test/README.md, fixed
    before the runs):
    fixed and wait, seeds 5-9, the curriculum loop with round 0's waits ~ U[0, 0.3]."""
    laptop = configfile.load_module(LAPTOP)
    sweep = laptop.get_config("wait_test")
    assert sweep.results == "projects/curricula/results/wait_test" and sweep.reference == "fixed"
    runs = sw.expand(sweep, tmp_path, laptop.get_config)
    assert sorted(r.name for r in runs) == sorted(
        [f"fixed_s{s}" for s in range(5, 10)] + [f"wait_V6_Tbookkeeping_s{s}" for s in range(5, 10)]
    )
    for run, argv in zip(runs, sw.plan(runs, sweep, LAPTOP), strict=True):
        cfg, _ = _parse_train_argv(argv)
        assert cfg.env_start == "random" and cfg.env_start_max_wait == 0.3 and cfg.rounds == 5
        assert cfg.engineer.settings.name == run.engineer and cfg.seed == run.seed


def test_the_comparison_on_the_thinking_policy_is_the_main_job_from_a_random_round_0(tmp_path):
    """laptop_effect.py:think (projects/curricula/results/think/PLAN.md, fixed before the
    runs):
    the paper's six engineers, seeds 0-4, each run the main job's training and held-out set
    from mapfjax/assets/tiny_think with round 0 on a random config drawn from the seed."""
    laptop = configfile.load_module(LAPTOP)
    sweep = laptop.get_config("think")
    assert sweep.results == "projects/curricula/results/think" and sweep.reference == "fixed"
    runs = sw.expand(sweep, tmp_path, laptop.get_config)
    engineers = ("fixed", "random", "rule", "learnability", "bandit", "policy")
    assert sorted({r.engineer for r in runs}) == sorted(engineers) and len(runs) == 30
    main = configfile.get_config("configs/tiny_cpu.py", "").to_dict()
    for run, argv in zip(runs, sw.plan(runs, sweep, LAPTOP), strict=True):
        cfg, _ = _parse_train_argv(argv)
        assert cfg.env_start == "random" and cfg.seed == run.seed
        assert cfg.engineer.settings.name == run.engineer
        got = cfg.to_dict()
        for block in ("model", "train", "grpo", "optim", "reward", "validation", "env"):
            assert got[block] == main[block], block
        assert got["rounds"] == main["rounds"] == 3
