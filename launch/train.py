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

from mapfjax import configfile

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (created; reused to resume)")
_STRICT = flags.DEFINE_bool(
    "strict_engineer", False, "stop when the engineer fails (default: warn, keep the config)"
)
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
    """`configfile.parse_flags`, after loading the --config file once so that its own refusal
    (an unknown variant after the colon) is one line, not absl's traceback."""
    args = argv[1:]
    specs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    specs += [b for a, b in zip(args, args[1:], strict=False) if a == "--config"]
    for spec in specs[-1:]:
        path, _, arg = spec.partition(":")
        try:
            configfile.get_config(path, arg)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except Exception:  # noqa: BLE001  a broken file: absl's own message says so
            pass
    return configfile.parse_flags(argv)


def main(argv):
    del argv
    from mapfjax import parallel

    parallel.initialize_distributed()  # no-op on one process
    parallel.enable_compilation_cache()  # a rerun or resume skips recompiling
    from mapfjax.engineer import loop
    from mapfjax.eval import report

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax is chatty at INFO
    try:
        loop.run(_CONFIG.value, _WORKDIR.value, strict_engineer=_STRICT.value)
        path = report.write_report(_WORKDIR.value)
    except (OSError, ValueError, loop.EngineerError) as e:  # RunDirError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
