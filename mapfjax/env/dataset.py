"""MAPF-FrozenLake as a procedural dataset for other trainers: Reasoning Gym entries, and rows
with the columns of verl's RL recipes (Parquet or JSONL, or a Hugging Face `datasets.Dataset`).

Generation uses the JAX generator and the oracle; scoring is score.py's, pure Python.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import ml_collections

from mapfjax import configfile
from mapfjax.checks import is_int
from mapfjax.env import config as env_config
from mapfjax.env import io, score, text
from mapfjax.env.score import DATA_SOURCE, DEFAULT_REWARD, RewardConfig
from mapfjax.env.types import Problem

log = logging.getLogger(__name__)

ABILITY = "planning"  # verl's `ability` column
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")  # verl's RL columns
FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}


def entry(index: int, problem: Problem, actions) -> dict:
    """The Reasoning Gym entry of a labelled problem and its oracle-optimal per-agent actions:
    {question: the prompt, answer: the answer text, metadata: the puzzle as JSON data}."""
    holes = sum(row.count("H") for row in problem.grid)
    metadata = {
        "source_dataset": DATA_SOURCE,
        "source_index": index,
        **io.problem_to_row(problem),
        "size": problem.height,
        "num_agents": problem.num_agents,
        "hole_ratio": holes / (problem.height * problem.width),
    }
    return {
        "question": text.render_prompt(problem),
        "answer": text.render_answer(actions),
        "metadata": metadata,
    }


def row(item: Mapping, split: str = "train") -> dict:
    """verl's RL row of a dataset entry: data_source, prompt (chat messages), ability,
    reward_model {style: rule, ground_truth: the metadata as a JSON string}, extra_info."""
    meta = item["metadata"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": item["question"]}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(meta, sort_keys=True)},
        "extra_info": {
            "split": split,
            "index": meta["source_index"],
            "id": meta["id"],
            "answer": item["answer"],
            "size": meta["size"],
            "num_agents": meta["num_agents"],
            "optimal_soc": meta["optimal_soc"],
            "needs_wait": meta["needs_wait"],
        },
    }


class Written(NamedTuple):
    """What `write_rows` wrote: the file, its format ('parquet' or 'jsonl'), the row count and
    why the format is not the one asked for ('' when it is)."""

    path: pathlib.Path
    format: str
    rows: int
    note: str = ""


def _format(path: pathlib.Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; allowed: {sorted(FORMATS)}")
    return fmt


# The most entries a dataset generates, as a round of training does (`driver.MAX_INSTANCES`):
# more take hours of oracle time before the first row is written.
MAX_SIZE = 1_000_000


def output_path(path, overwrite: bool = False) -> tuple[pathlib.Path, str]:
    """(the file `write_rows` writes for `path`, why it is not `path` or ''): a .parquet path
    without pyarrow becomes the .jsonl of the same name. FileExistsError when that file exists
    and `overwrite` is False; ValueError for a file type that is neither."""
    path, note = pathlib.Path(path), ""
    if _format(path) == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            note = f"pyarrow is not installed: JSONL instead of {path.name}"
            path = path.with_suffix(".jsonl")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{path} exists; refusing to overwrite it (choose another --out, or pass --overwrite)"
        )
    return path, note


def write_rows(path, rows: list[dict], overwrite: bool = False) -> Written:
    """Write rows as Parquet (a .parquet path; needs pyarrow) or JSONL (.jsonl, .json), to a
    temporary name then renamed (a crash leaves no half file). Without pyarrow a .parquet
    request writes JSONL beside it (same name, .jsonl) and logs a warning. An existing file is
    kept (FileExistsError) unless `overwrite`."""
    path, note = output_path(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    if note:
        log.warning("%s; writing %s", note, path)
    if _format(path) == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return Written(path, "parquet", len(rows))
    io.save_jsonl(path, rows)
    return Written(path, "jsonl", len(rows), note)


def read_rows(path) -> list[dict]:
    """The rows of a file `write_rows` wrote (Parquet needs pyarrow)."""
    path = pathlib.Path(path)
    if _format(path) == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [r for _, r in io._iter_jsonl(path)]


def generator_config(source) -> ml_collections.ConfigDict:
    """The generator config in `source`: a ConfigDict or mapping, a JSON file (an engineer
    round's `round_N/config.json`, or a run's `run_config.json`), or a Python config file
    `path.py[:arg]` (its get_config(arg)). A run config gives its `env` section. Raises
    ConfigError naming the key and value that the generator does not accept."""
    where = "config"
    if isinstance(source, (str, pathlib.Path)):
        head, py, arg = str(source).partition(".py:")  # configs/x.py:arg
        where = head + py[:-1] if py else str(source)
        path = configfile.resolve(where)
        if path.suffix == ".py":
            source = configfile.get_config(path, arg) if arg else configfile.get_config(path)
        else:
            try:
                source = json.loads(io.read_bytes(path))
            except ValueError as e:
                raise env_config.ConfigError(f"{path}: not a JSON config ({e})") from None
    if isinstance(source, Mapping) and not isinstance(source, ml_collections.ConfigDict):
        source = ml_collections.ConfigDict(dict(source))
    if not isinstance(source, ml_collections.ConfigDict):
        raise env_config.ConfigError(f"{where}: a {type(source).__name__}, not a config")
    if "env" in source and "sizes" not in source:
        source, where = source.env, f"{where}: env"
    env_config.validate_at(source, where)
    return source


class MapfDataset:
    """`size` labelled puzzles drawn by the generator from `config` (deterministic in `seed`;
    default `config.seed`), each with an oracle-optimal answer.

    Reasoning Gym's shape: `len`, indexing and iteration give dicts {question, answer,
    metadata}; `score_answer(answer, entry)` is the reward under `reward` (`score.score`).
    `rows`, `write` and `to_hf_dataset` export verl's RL columns (`COLUMNS`).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        size: int,
        seed: int | None = None,
        reward: RewardConfig = DEFAULT_REWARD,
    ):
        import jax

        from mapfjax.env import generator, oracle

        if not is_int(size) or not 1 <= size <= MAX_SIZE:
            raise ValueError(
                f"size = {size!r}; allowed: an integer in [1, {MAX_SIZE:,}] (entries to generate)"
            )
        config = generator_config(config)
        seed = config.seed if seed is None else seed
        if not is_int(seed) or seed < 0:
            raise ValueError(f"seed = {seed!r}; allowed: an integer >= 0")
        self.config, self.size, self.seed, self.reward = config, int(size), int(seed), reward
        problems = generator.generate(jax.random.key(self.seed), config, self.size).problems
        processes = 1 if len(problems) < generator.SPAWN_MIN else config.oracle.processes or None
        solutions = oracle.solve_many(
            problems, config.oracle.max_nodes, config.oracle.time_limit, processes=processes
        )
        self._entries = []
        for i, (p, sol) in enumerate(zip(problems, solutions, strict=True)):
            if sol.soc != p.optimal_soc:  # the generator labelled it with the same budgets
                raise RuntimeError(f"oracle: {p.id} is {sol.status} on a second solve; retry")
            self._entries.append(entry(i, p, oracle.answer_actions(sol)))

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> dict:
        return self._entries[index]

    def __iter__(self) -> Iterator[dict]:
        return iter(self._entries)

    def score_answer(self, answer: Any, entry: Mapping) -> float:
        """The reward of `answer` for `entry` (never raises on the answer; see `score.score`)."""
        return score.score(answer, entry, self.reward).reward

    def rows(self, split: str = "train") -> list[dict]:
        """verl's RL rows (see `row`), one per entry."""
        return [row(item, split) for item in self._entries]

    def write(self, path, split: str = "train", overwrite: bool = False) -> Written:
        """Write `rows(split)` as Parquet or JSONL (see `write_rows`)."""
        return write_rows(path, self.rows(split), overwrite)

    def to_hf_dataset(self, split: str = "train"):
        """`rows(split)` as a Hugging Face `datasets.Dataset` (needs the `datasets` package)."""
        try:
            import datasets
        except ImportError:
            raise ImportError(
                "MapfDataset.to_hf_dataset needs the 'datasets' package (pip install datasets); "
                "MapfDataset.write(path) writes Parquet or JSONL without it"
            ) from None
        return datasets.Dataset.from_list(self.rows(split))

    def __repr__(self) -> str:
        return f"MapfDataset(size={self.size}, seed={self.seed}, agents={self.config.num_agents})"


__all__ = [
    "ABILITY",
    "COLUMNS",
    "MapfDataset",
    "Written",
    "entry",
    "generator_config",
    "output_path",
    "read_rows",
    "row",
    "write_rows",
]
