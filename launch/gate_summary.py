r"""Every go / no-go arm under a results folder in one table and one picture: the starting
policy, what the arm changed (learning rate, KL, trace_loss, training wait ratio), greedy valid
before and after GRPO and the paired change with its 95 % interval (`mapfjax.eval.gate.arms`).
Reads only the committed small files (<results>/<name>/<arm>/run_config.json, start/ and
round_*/validation.json); writes <results>/arms.md and <results>/arms.png.

    python launch/gate_summary.py --results results/go_no_go
"""

import pathlib

from absl import app, flags

_RESULTS = flags.DEFINE_string("results", "results/go_no_go", "folder of go_no_go.py outputs")


def main(argv):
    del argv
    from mapfjax import files
    from mapfjax.eval import gate

    results = pathlib.Path(_RESULTS.value)

    def build():
        found = gate.arms(results)
        gate.plot_arms(found, results / "arms.png")
        return gate.arms_markdown(found).rstrip("\n")

    return files.report_command(build, results / "arms.md")


if __name__ == "__main__":
    app.run(main)
