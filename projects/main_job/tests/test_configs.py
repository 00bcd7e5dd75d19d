"""The main job's earlier settings give what their committed runs recorded, key for key."""

import json
from pathlib import Path

from mapfjax import configfile
from tests.test_configfile import assert_matches_record


def test_held_out_400_is_the_run_its_record_holds():
    """The 400-puzzle runs of the answer-only job (projects/main_job/results/tiny)."""
    record = configfile.ROOT / "projects" / "main_job" / "results" / "tiny" / "run_config.json"
    recorded = json.loads(record.read_text())
    config = configfile.get_config("projects/main_job/configs/main_job.py", "held_out_400")
    config = json.loads(json.dumps(config.to_dict()))
    assert_matches_record(config, recorded)
    assert config["engineer"]["settings"] == recorded["engineer"]["settings"]
    assert Path(config["model"]["path"]).name == Path(recorded["model"]["path"]).name
