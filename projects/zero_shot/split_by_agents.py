"""One instance file per agent count (`<stem>_<k>ag.jsonl` beside it), for paired comparisons
per agent count (`launch/compare_evals.py --subset`).

    python -m projects.zero_shot.split_by_agents projects/zero_shot/results/slice_345.jsonl
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from mapfjax.env import io


def split(path: pathlib.Path) -> dict[int, pathlib.Path]:
    """Writes the files; returns {agents: path}."""
    problems = io.require_instances(path)
    out = {}
    for k in sorted({p.num_agents for p in problems}):
        dest = path.with_name(f"{path.stem}_{k}ag.jsonl")
        io.save_instances(dest, [p for p in problems if p.num_agents == k])
        out[k] = dest
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instances", help="an instance JSONL (python -m mapfjax.env benchmark)")
    opts = ap.parse_args(argv)
    for k, dest in split(pathlib.Path(opts.instances)).items():
        print(f"{k} agents: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
