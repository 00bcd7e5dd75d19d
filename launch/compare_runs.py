"""Held-out rates of several runs from the same starting model on the same held-out puzzles
(e.g. GRPO at several learning rates against rejection-sampling fine-tuning), paired against
the start and against the first run, with the training rollouts' trend.

    python launch/compare_runs.py --runs runs/grpo_lr3e-4,runs/rft_lr3e-4 \
        [--labels "GRPO lr 3e-4,RFT lr 3e-4"] [--out results/grpo_effect/comparison.md]
"""

import pathlib
import sys

from absl import app, flags
from absl import logging as absl_logging

_RUNS = flags.DEFINE_list("runs", None, "run directories of launch/train.py, comma-separated")
_LABELS = flags.DEFINE_list("labels", None, "one label per run (default: directory names)")
_OUT = flags.DEFINE_string("out", None, "also write the table to this markdown file")
flags.mark_flag_as_required("runs")


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)  # JAX's backend probing is chatty
    from mapfjax import files
    from mapfjax.eval import report

    try:
        table = report.compare_runs([pathlib.Path(r) for r in _RUNS.value], _LABELS.value)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    if _OUT.value:
        files.atomic_write(pathlib.Path(_OUT.value), (table + "\n").encode())
    return 0


if __name__ == "__main__":
    app.run(main)
