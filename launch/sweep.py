r"""Run a sweep: every run of `launch/train.py` one after another here (finished runs skipped),
or with --dry_run the list of commands for a cluster; then a summary table, and for sweeps
that name `results` the comparison files under that directory (with --results_only only these,
from the runs finished here and the run records already there).

    python launch/sweep.py --config configs/sweep_ablation.py --workdir runs/sweep --dry_run
    python launch/sweep.py --config configs/sweep_ablation.py --workdir runs/sweep
    python launch/sweep.py --config projects/curricula/configs/laptop_effect.py:think \
        --workdir runs/curricula_think [--results_only]
"""

import os
import pathlib
import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from mapfjax import configfile, hostalloc

_CONFIG = config_flags.DEFINE_config_file("config", None, "sweep definition (ml-collections)")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sweep", "one subdirectory per run")
_DRY = flags.DEFINE_bool("dry_run", False, "print the commands instead of running them")
_RESULTS_ONLY = flags.DEFINE_bool(
    "results_only",
    False,
    "train nothing: rewrite the sweep's results directory (summary, CSV, plots) from the runs "
    "finished here and, for the others, the run records already under its runs/ (committed)",
)
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    # Imported after flag parsing: --help and flag errors answer without loading JAX.
    from mapfjax import files
    from mapfjax.eval import sweep as sw

    # "FILE" or "FILE:ARG" (a variant of the sweep, e.g. configs/sweep_ablation.py:train,...).
    spec = config_flags.get_config_filename(flags.FLAGS["config"])
    sweep_file = spec.partition(":")[0]
    module = configfile.load_module(pathlib.Path(sweep_file).absolute())
    workdir = pathlib.Path(_WORKDIR.value).absolute()
    try:
        files.check_dir(workdir, "--workdir")
        runs = sw.expand(_CONFIG.value, workdir, module.get_config)
    except NotADirectoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {sweep_file}: {e}", file=sys.stderr)
        return 2
    sweep_file = str(pathlib.Path(sweep_file).absolute())
    if _DRY.value:
        for argv_ in sw.plan(runs, _CONFIG.value, sweep_file, _CONFIG.value.python):
            print(shlex.join(argv_))
        return 0
    if _RESULTS_ONLY.value and not _CONFIG.value.get("results"):
        msg = "--results_only needs a sweep that names `results`"
        print(f"error: {sweep_file}: {msg}", file=sys.stderr)
        return 2
    failed = {}
    if not _RESULTS_ONLY.value:
        failed = sw.run_local(runs, _CONFIG.value, sweep_file, sys.executable)
        print(sw.write_summary(runs, workdir, failed).read_text())
    if _CONFIG.value.get("results"):  # the small files that stay (results/<experiment>/)
        try:
            rel = lambda p: os.path.relpath(p) if str(p).startswith(os.getcwd()) else p
            command = f"python launch/sweep.py --config {rel(spec)} --workdir {rel(workdir)}"
            print(f"results: {sw.write_results(runs, _CONFIG.value, command)}")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    app.run(main, flags_parser=configfile.parse_flags)
