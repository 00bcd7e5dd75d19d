"""configs/paper_qwen3_4b.py against docs/paper.md section 10: every row of that table names a
key the config sets to the value it gives, every key the config sets is in a row, and each
row says whether the value is the paper's or ours. The facts are read from the doc, never
written here a second time."""

import ast
import re

import ml_collections
import pytest

from mapfjax import configfile
from mapfjax.engineer.settings import RunSettings
from mapfjax.env import config as env_config

DOC = configfile.ROOT / "docs" / "paper.md"
SECTION = "## 10. The paper configuration, key by key"
NO_VALUE = object()  # a row whose value is a description, not a literal


def table_rows(text: str) -> dict[str, tuple[object, str]]:
    """key -> (value, source) of the section's table; the value is the cell's Python literal
    when the cell is one backticked literal, else NO_VALUE."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        m = re.fullmatch(r"\| `([^`]+)` \| (.+?) \| (.+) \|", line.strip())
        if not m:
            continue
        key, cell, source = m.groups()
        literal = re.fullmatch(r"`([^`]+)`", cell)
        value = ast.literal_eval(literal.group(1)) if literal else NO_VALUE
        assert key not in rows, f"{key} is in two rows"
        rows[key] = (value, source)
    return rows


@pytest.fixture(scope="module")
def config():
    return configfile.get_config("configs/paper_qwen3_4b.py", "")


@pytest.fixture(scope="module")
def rows():
    return table_rows(DOC.read_text())


def lookup(c: ml_collections.ConfigDict, key: str):
    node = c
    for part in key.split("."):
        assert part in node, f"docs/paper.md names {key}, which the config does not set"
        node = node[part]
    return node


def comparable(value):
    """A config value as the table writes it: mappings as dicts, the per-size section of a
    generator config as the list of its sizes."""
    if isinstance(value, ml_collections.ConfigDict):
        value = value.to_dict()
    if isinstance(value, dict) and value and all(re.fullmatch(r"s\d+", k) for k in value):
        return sorted(int(k[1:]) for k in value)
    return value


def test_the_table_is_read(rows):
    assert len(rows) > 60
    assert rows["train.instances"][0] == 4000  # the reader works; the number is the doc's


def test_every_row_holds_in_the_config(config, rows):
    for key, (value, _) in rows.items():
        have = comparable(lookup(config, key))
        if value is not NO_VALUE:
            assert have == value, f"{key}: the config has {have!r}, docs/paper.md {value!r}"


def test_every_config_key_is_in_a_row(config, rows):
    leaves = env_config.flatten(config.to_dict())
    untagged = [k for k in leaves if not any(k == r or k.startswith(r + ".") for r in rows)]
    assert not untagged, f"keys of the config not in docs/paper.md section 10: {untagged}"


def test_every_row_is_the_papers_or_ours(rows):
    for key, (_, source) in rows.items():
        assert source.startswith(("**(paper)**", "**(ours)**")), (key, source)
        assert len(source.split("**", 2)[2].strip()) > 5, f"{key}: say why"


def test_the_papers_facts_are_tagged_as_the_papers(rows):
    """The facts section 1 lists (the loop's counts, round 0, the engineer, thinking) carry
    the paper's tag, whatever their values."""
    facts = ("rounds", "train.instances", "train.epochs", "env_start", "env.num_agents",
             "validation.sizes", "engineer.settings.name", "engineer.variant",
             "train.enable_thinking", "benchmark.agents")  # fmt: skip
    for key in facts:
        assert rows[key][1].startswith("**(paper)**"), key


def test_the_config_is_a_valid_run(config):
    """It checks as a run (V6's modules match its variant, the benchmark section is whole)
    and stands on its own: no other config file is read."""
    s = RunSettings.from_config(config)
    assert s.benchmark is not None and s.engineer.variant == "V6"
    source = (configfile.ROOT / "configs" / "paper_qwen3_4b.py").read_text()
    assert "tiny_cpu" not in source and "sys.path" not in source
