"""The experiment's configs give what its committed runs recorded, key for key (keys added to
the config since a run are not in its record and are skipped)."""

import json

from mapfjax import configfile
from tests.test_configfile import assert_matches_record

RESULTS = configfile.ROOT / "projects" / "grpo_effect" / "results"


def test_grpo_effect_is_the_run_its_record_holds():
    recorded = json.loads((RESULTS / "grpo_lr1e-4" / "run_config.json").read_text())
    config = configfile.get_config("projects/grpo_effect/configs/grpo_effect.py").to_dict()
    assert_matches_record(json.loads(json.dumps(config)), recorded)
    main = configfile.get_config("configs/tiny_cpu.py", "")
    assert main.reward.optimal_bonus != recorded["reward"]["optimal_bonus"]  # it did move


def test_the_previous_main_job_is_the_run_its_record_holds():
    """main_job_bonus0 ran `:previous` with --config.reward.optimal_bonus=0."""
    recorded = json.loads((RESULTS / "main_job_bonus0" / "run_config.json").read_text())
    previous = configfile.get_config("projects/main_job/configs/main_job.py", "previous")
    previous.reward.optimal_bonus = 0.0
    config = json.loads(json.dumps(previous.to_dict()))
    assert_matches_record(config, recorded)
    # (the engineer block records the guideline's absolute path, which differs per checkout)
    assert config["engineer"]["settings"] == recorded["engineer"]["settings"]
