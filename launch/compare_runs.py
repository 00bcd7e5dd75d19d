r"""Held-out rates of several runs from the same starting model on the same held-out puzzles
(e.g. GRPO at several learning rates against rejection-sampling fine-tuning), paired against
the start and against the first run, with the training rollouts' trend.

    python launch/compare_runs.py --runs runs/grpo_lr3e-4,runs/rft_lr3e-4 \
        [--labels "GRPO lr 3e-4,RFT lr 3e-4"] [--export projects/grpo_effect/results]

--export DIR copies each run's small files (validations, records, reports, plots, gzipped
metrics; no checkpoints) to DIR/<run directory name>/ and writes DIR/comparison.md from those
copies, so `--runs DIR/a,DIR/b` regenerates the table without the run directories.
"""

import pathlib

from absl import app, flags

from mapfjax import configfile

_RUNS = flags.DEFINE_list("runs", None, "run directories of launch/train.py, comma-separated")
_LABELS = flags.DEFINE_list("labels", None, "one label per run (default: directory names)")
_EXPORT = flags.DEFINE_string("export", None, "copy the runs' small files here + comparison.md")
flags.mark_flag_as_required("runs")


def main(argv):
    del argv
    from mapfjax import files
    from mapfjax.eval import report

    runs = [pathlib.Path(r) for r in _RUNS.value]

    def build():
        table = report.compare_runs(runs, _LABELS.value)  # checks before anything is copied
        if _EXPORT.value:
            dest = pathlib.Path(_EXPORT.value)
            if len({r.name for r in runs}) != len(runs):
                raise ValueError(f"--export needs distinct run directory names: {_RUNS.value}")
            exported = [report.export_run(r, dest / r.name) for r in runs]
            table = report.compare_runs(exported, _LABELS.value)
            files.atomic_write(dest / "comparison.md", (table + "\n").encode())
        return table

    return files.report_command(build)


if __name__ == "__main__":
    configfile.quiet_backend_probe()
    app.run(main)
