r"""The paper's ablations as a sweep: context variants V1..V6, base vs current engineer, full vs
bookkeeping T, the fixed-environment baseline, seeds (docs/paper.md sections 4-5).

    python launch/sweep.py --config configs/sweep_ablation.py --workdir runs/sweep [--dry_run]
    python launch/sweep.py --config configs/sweep_ablation.py --config.seeds='(0,1,2)' \
        --config.train_arg=smoke --config.overrides=rounds=2

With the argument "train,engineer=NAME" this file is also each run's training config: the base
training config (`train_config`, `train_arg`) with the engineer's settings swapped in (a
structural change `--config.*` overrides cannot make); variant, T detail and seed then come as
`--config.*` overrides on the command line, which launch/sweep.py writes.
"""

import ml_collections

from mapfjax import configfile
from mapfjax.presets import engineers

VARIANTS = ("V1", "V2", "V3", "V4", "V5", "V6")


def train_config(engineer: str, base: str, base_arg: str) -> ml_collections.ConfigDict:
    """The base training config with `engineer`'s settings (configs/engineer/engineers.py, which
    the package ships as mapfjax.presets.engineers)."""
    c = configfile.get_config(base, base_arg)
    c.engineer.settings = engineers.get_config(engineer)
    return c


def _parse_train_arg(arg: str) -> dict:
    fields = {"engineer": "policy", "base": "configs/tiny_cpu.py", "base_arg": ""}
    for part in arg.split(",")[1:]:
        key, sep, value = part.partition("=")
        if not sep or key not in fields:
            raise ValueError(
                f"configs/sweep_ablation.py: argument part {part!r} of {arg!r}; allowed: "
                f"train,engineer=NAME[,base=FILE][,base_arg=ARG]"
            )
        fields[key] = value
    return fields


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """ "" = the sweep definition; "train,engineer=NAME[,base=FILE][,base_arg=ARG]" = one run's
    training config."""
    if arg.startswith("train"):
        return train_config(**_parse_train_arg(arg))
    if arg:
        raise ValueError(
            f"configs/sweep_ablation.py:{arg}: no such variant; allowed: '' (the sweep) or "
            "'train,engineer=NAME,...' (one run)"
        )
    c = ml_collections.ConfigDict()
    c.train_config = "configs/tiny_cpu.py"  # relative to the repository root, or absolute
    c.train_arg = ""  # its get_config argument ("smoke" for a quick pass)
    c.seeds = (0,)
    c.python = "python"  # interpreter in the printed cluster commands
    # `--config.*` overrides for every run: "key=value,key=value", e.g. "rounds=2,train.epochs=2".
    c.overrides = ""
    # Groups of runs: each expands to engineers x variants x t_details x seeds; a run that two
    # groups share is run once. T detail matters only where the variant shows T.
    c.groups = ml_collections.ConfigDict(
        {
            "context": {
                "engineers": ("policy",),
                "variants": VARIANTS,
                "t_details": ("bookkeeping",),
            },
            "engineer": {
                "engineers": ("base",),
                "variants": ("V6",),
                "t_details": ("bookkeeping",),
            },
            "t_detail": {"engineers": ("policy",), "variants": ("V6",), "t_details": ("full",)},
            "baseline": {
                "engineers": ("fixed",),
                "variants": ("V6",),
                "t_details": ("bookkeeping",),
            },
        }
    )
    # After training, evaluate each run's final model on these instances (empty = skip).
    c.evaluate = ml_collections.ConfigDict(
        {"instances": "", "max_new_tokens": 64, "batch_size": 32, "enable_thinking": False}
    )
    return c
