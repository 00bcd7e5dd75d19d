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


def test_relative_path_missing_under_the_root_is_looked_up_in_the_cwd(tmp_path, monkeypatch):
    # What a wheel install needs: configs/ lives in the checkout the command runs from.
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.py").write_text("def get_config(a):\n    return a * 2\n")
    monkeypatch.chdir(tmp_path)
    assert configfile.resolve("configs/mine.py") == tmp_path / "configs" / "mine.py"
    assert configfile.get_config("configs/mine.py", 3) == 6
    assert (
        configfile.resolve("configs/engineer/variants.py").parent.parent
        == configfile.ROOT / "configs"
    )
    with pytest.raises(FileNotFoundError, match="nope.py.*looked under .* and the cwd"):
        configfile.load_module("configs/nope.py")
