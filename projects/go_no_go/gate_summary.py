r"""Every go / no-go arm under a results folder in one table and one picture: the starting
policy, what the arm changed (learning rate, KL, trace_loss, training wait ratio), greedy valid
before and after GRPO and the paired change with its 95 % interval (`projects.go_no_go.gate.arms`).
Reads only the committed small files (<results>/<name>/<arm>/run_config.json, start/ and
round_*/validation.json); writes <results>/arms.md and <results>/arms.png. With --pool, the
paired change pooled over the named arms' puzzles instead (`gate.pooled_change`), written to
<results>/pooled.md.

    python -m projects.go_no_go.gate_summary --results projects/go_no_go/results
    python -m projects.go_no_go.gate_summary --results projects/go_no_go/results \
        --pool "rebuilt=trace_wait_more/matched,trace_wait_optim/matched"
"""

import pathlib

from absl import app, flags

_RESULTS = flags.DEFINE_string(
    "results", "projects/go_no_go/results", "folder of go_no_go.py outputs"
)
_POOL = flags.DEFINE_multi_string(
    "pool",
    [],
    "NAME=ARM,ARM,...: pool these arms' paired changes (ARM as arms.md names it, "
    "<name>/<arm>; arms on different held-out draws); repeat for more pools",
)


def main(argv):
    del argv
    from mapfjax import files
    from projects.go_no_go import gate

    results = pathlib.Path(_RESULTS.value)
    if _POOL.value:
        return files.report_command(
            lambda: gate.pooled_markdown(gate.parse_pools(_POOL.value, results)).rstrip("\n"),
            results / "pooled.md",
        )

    def build():
        found = gate.arms(results)
        gate.plot_arms(found, results / "arms.png")
        return gate.arms_markdown(found).rstrip("\n")

    return files.report_command(build, results / "arms.md")


if __name__ == "__main__":
    app.run(main)
