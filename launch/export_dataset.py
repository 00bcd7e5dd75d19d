r"""Write a MAPF-FrozenLake dataset for another trainer (verl's RL columns) from a generator
config: an engineer round's `round_N/config.json`, a run's `run_config.json`, or a config file.

    python launch/export_dataset.py --config runs/tiny/round_2/config.json --size 4000 \
        --out data/round_2.parquet [--seed 7] [--split train]
    python launch/export_dataset.py --config configs/tiny_cpu.py --size 256 --out data/r0.jsonl

A .parquet file needs pyarrow; without it the rows go to a .jsonl file of the same name. An
existing file is never replaced unless --overwrite says so. See
docs/other_trainers.md for the reward functions that score them (verl, TRL, Reasoning Gym).
"""

import sys

from absl import app, flags

from mapfjax import configfile

_CONFIG = flags.DEFINE_string("config", None, "round_N/config.json, run_config.json or x.py[:arg]")
_SIZE = flags.DEFINE_integer("size", None, "puzzles to generate")
_OUT = flags.DEFINE_string("out", None, "output file: .parquet (needs pyarrow) or .jsonl")
_SEED = flags.DEFINE_integer("seed", None, "generator seed (default: the config's seed)")
_SPLIT = flags.DEFINE_string("split", "train", "extra_info.split of every row")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace --out when it exists (else refused)")
flags.mark_flags_as_required(["config", "size", "out"])


def main(argv):
    del argv
    from mapfjax.env import dataset

    try:
        dataset.output_path(_OUT.value, _OVERWRITE.value)  # before minutes of generation
        config = dataset.generator_config(_CONFIG.value)
        data = dataset.MapfDataset(config, _SIZE.value, seed=_SEED.value)
        written = data.write(_OUT.value, split=_SPLIT.value, overwrite=_OVERWRITE.value)
    except (ValueError, OSError, RuntimeError) as e:  # ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    note = f" ({written.note})" if written.note else ""
    print(
        f"wrote {written.rows} rows as {written.format}{note} to {written.path}, seed {data.seed}"
    )
    return 0


if __name__ == "__main__":
    configfile.quiet_backend_probe()
    app.run(main)
