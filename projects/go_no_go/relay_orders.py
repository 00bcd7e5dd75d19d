r"""What a relay trace that retries would reach: per puzzle, how the relay plan
(`mapfjax.env.relay`'s rule) ends with the agents in index order (valid, a run cornered, looping or
at its horizon, or a plan the simulator rejects) and whether another order has a valid plan,
split by whether the puzzle needs a wait (`relay_checks.orders_table`).

    python -m projects.go_no_go.relay_orders \
        --instances projects/go_no_go/results/held_out_400.jsonl \
        --out projects/go_no_go/results/relay/orders.md
"""

from absl import app, flags
from absl import logging as absl_logging

_INSTANCES = flags.DEFINE_string("instances", None, "instance JSONL with needs_wait labels")
_OUT = flags.DEFINE_string("out", None, "also write the table here")
flags.mark_flags_as_required(["instances"])


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    from mapfjax import files
    from mapfjax.env import io
    from projects.go_no_go import relay_checks

    return files.report_command(
        lambda: relay_checks.orders_table(io.load_instances(_INSTANCES.value)), _OUT.value
    )


if __name__ == "__main__":
    app.run(main)
