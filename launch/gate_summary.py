r"""Every go / no-go arm under a results folder in one table and one picture: the starting
policy, what the arm changed (learning rate, KL, trace_loss, training wait ratio), greedy valid
before and after GRPO and the paired change with its 95 % interval (`mapfjax.eval.gate.arms`).
Reads only the committed small files (<results>/<name>/<arm>/run_config.json, start/ and
round_*/validation.json); writes <results>/arms.md and <results>/arms.png.

    python launch/gate_summary.py --results results/go_no_go
"""

import pathlib
import sys

from absl import app, flags

_RESULTS = flags.DEFINE_string("results", "results/go_no_go", "folder of go_no_go.py outputs")


def main(argv):
    del argv
    from mapfjax import files
    from mapfjax.eval import gate

    results = pathlib.Path(_RESULTS.value)
    try:
        found = gate.arms(results)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = gate.arms_markdown(found)
    files.atomic_write(results / "arms.md", text.encode())
    gate.plot_arms(found, results / "arms.png")
    print(text)
    return 0


if __name__ == "__main__":
    app.run(main)
