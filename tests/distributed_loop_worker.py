"""One process of a multi-process closed loop (run by tests/test_distributed_loop.py, never
imported by pytest): joins through jax.distributed, runs one round of the smoke loop (with a
small final benchmark) on the tiny model over every process's CPU devices in a shared work
directory, and prints what it finished with as JSON."""

import json
import os
import sys


def main():
    pid, nproc, port, local, model, workdir = sys.argv[1:7]
    pid, nproc, port, local = int(pid), int(nproc), int(port), int(local)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from mapfjax import configfile, parallel

    if nproc > 1:
        parallel.initialize_distributed(f"127.0.0.1:{port}", nproc, pid)
    import ml_collections

    from mapfjax.engineer import loop

    c = configfile.get_config("configs/tiny_cpu.py", "smoke")
    c.model.path = model
    c.rounds = 1
    c.benchmark = ml_collections.ConfigDict(
        {"agents": (2,), "sizes": (3,), "wait_ratios": (0.5,), "per_cell": 3,
         "max_new_tokens": 16, "batch_size": 2}
    )  # fmt: skip
    records = loop.run(c, workdir, progress=False)
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "processes": jax.process_count(),
                "devices": jax.device_count(),
                "records": [r.to_dict() for r in records],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
