"""Config files loaded by path: relative to the repository root, fresh modules, clear errors."""

import pytest

from mapfjax import configfile


def test_relative_path_resolves_against_the_repository_root():
    cfg = configfile.get_config("configs/engineer/variants.py", "V2")
    assert sorted(cfg.modules.keys()) == sorted(
        configfile.get_config(configfile.ROOT / "configs/engineer/variants.py", "V2").modules
    )
    # Each load is a fresh module: edits to one do not leak into the next.
    a = configfile.load_module("configs/engineer/variants.py")
    a.get_config = None
    assert configfile.load_module("configs/engineer/variants.py").get_config is not None


def test_missing_file_and_missing_get_config_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        configfile.load_module(tmp_path / "nope.py")
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    with pytest.raises(ValueError, match="cfg.yaml.*a .py file"):
        configfile.load_module(tmp_path / "cfg.yaml")
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(AttributeError, match="empty.py.*get_config"):
        configfile.get_config(tmp_path / "empty.py")
