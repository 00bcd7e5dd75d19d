"""The closed training loop: rounds of generate -> GRPO -> validate -> engineer -> project.

    python launch/train.py --config configs/tiny_cpu.py --workdir runs/tiny
    python launch/train.py --config configs/paper_qwen3_4b.py --workdir gs://... (accelerators)

Rerun the same command after a crash or a kill: it continues where it stopped.
"""

import logging
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from mapfjax import configfile, hostalloc

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (created; reused to resume)")
_STRICT = flags.DEFINE_bool(
    "strict_engineer", False, "stop when the engineer fails (default: warn, keep the config)"
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax is chatty at INFO
    from mapfjax import parallel

    parallel.initialize_distributed()  # no-op on one process
    parallel.enable_compilation_cache()  # a rerun or resume skips recompiling
    from mapfjax.engineer import loop
    from mapfjax.eval import report

    try:
        loop.run(_CONFIG.value, _WORKDIR.value, strict_engineer=_STRICT.value)
        path = report.write_report(_WORKDIR.value)
    except (OSError, ValueError, loop.EngineerError) as e:  # RunDirError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    app.run(main, flags_parser=configfile.parse_flags)
