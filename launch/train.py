r"""The closed training loop: rounds of generate -> GRPO -> validate -> engineer -> project.

    python launch/train.py --config configs/tiny_cpu.py --workdir runs/tiny
    python launch/train.py --config configs/paper_qwen3_4b.py --workdir gs://BUCKET/run \
        --config.model.path=/models/Qwen3-4B    # accelerators: docs/launching.md

Rerun the same command after a crash or a kill: it continues where it stopped. A remote
--workdir (any fsspec URL: gs://, s3://, ...) is written through a local copy (--staging_dir)
that is uploaded every --sync_every seconds and at the end; a rerun on any machine continues
from the last upload. On accelerators the run's memory plan is checked against the devices
before any work (launch/memory_plan.py prints it).
"""

import contextlib
import logging
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from mapfjax import configfile, hostalloc

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "run directory (created; reused to resume): a local path or a URL "
    "(gs://BUCKET/run, s3://..., any fsspec protocol), written through a local copy",
)  # fmt: skip
_STAGING = flags.DEFINE_string(
    "staging_dir", None, "with a URL --workdir: the local copy the run writes (default: "
    "$MAPFJAX_STAGING or ~/.cache/mapfjax/staging, a folder per URL)",
)  # fmt: skip
_SYNC_EVERY = flags.DEFINE_float(
    "sync_every", 300.0, "with a URL --workdir: seconds between uploads of what changed"
)
_STRICT = flags.DEFINE_bool(
    "strict_engineer", False, "stop when the engineer fails (default: warn, keep the config)"
)
_CHECK_MEMORY = flags.DEFINE_bool(
    "check_memory", True, "on devices that report their memory (accelerators): refuse, before "
    "any work, a config one of whose phases does not fit (launch/memory_plan.py prints them)",
)  # fmt: skip
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax is chatty at INFO
    from mapfjax import files

    try:
        url = files.remote_url(_WORKDIR.value)  # a malformed URL: one line, nothing made
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from mapfjax import parallel

    parallel.initialize_distributed()  # no-op on one process
    parallel.enable_compilation_cache()  # a rerun or resume skips recompiling
    from mapfjax.engineer import loop
    from mapfjax.eval import report

    try:
        loop.check_config(_CONFIG.value)  # a bad value: one line, before any download
        mirror = _mirror(url) if url else None
        workdir = mirror.local if mirror else _WORKDIR.value
        with mirror.syncing(_SYNC_EVERY.value) if mirror else contextlib.nullcontext():
            loop.run(
                _CONFIG.value, workdir, strict_engineer=_STRICT.value,
                check_memory_plan=_CHECK_MEMORY.value,
            )  # fmt: skip
            path = report.write_report(workdir, title=url)
    except (OSError, ValueError, loop.EngineerError) as e:  # RunDirError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = f"{url.rstrip('/')}/report.md" if url else path
    print(f"report: {shown}")
    return 0


def _mirror(url: str):
    """The remote work directory's local copy, brought up to the remote's last upload after
    a check that the location is writable (one line for missing credentials)."""
    import jax

    from mapfjax import files

    if jax.process_count() > 1:
        raise files.RemoteError(
            f"--workdir {url}: a URL work directory is written by one process; a job of "
            f"{jax.process_count()} processes needs a directory they share (a gcsfuse or NFS "
            "mount: docs/launching.md)"
        )
    mirror = files.RemoteMirror(url, _STAGING.value or files.default_staging(url))
    mirror.check_writable()
    got = mirror.pull()
    logging.info("%s: local copy in %s (%d file(s) downloaded)", url, mirror.local, got)
    return mirror


if __name__ == "__main__":
    hostalloc.use_tcmalloc()  # tcmalloc when installed: XLA:CPU's buffers
    app.run(main, flags_parser=configfile.parse_flags)
