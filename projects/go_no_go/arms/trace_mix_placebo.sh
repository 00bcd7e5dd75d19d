#!/usr/bin/env bash
# PLAN_mix.md's amendment (projects/go_no_go/results): the matched arm of projects/go_no_go/arms/trace_mix.sh (seed 18,
# draw 12368) with each group's advantages shuffled (--objective placebo), then paired with
# the matched arm on the same 400 puzzles. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_mix_placebo.sh   # about 25 minutes on 2 CPU cores (after trace_mix.sh)
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_mix/export
M=$R/trace_mix
[ -f $M/matched/round_0/validation.json ] || {
  echo "error: $M/matched has no round_0; run projects/go_no_go/arms/trace_mix.sh first" >&2
  exit 2
}
source $R/trace_greedy_pilot.txt  # X_UPDATES: C's update count
check_counts $R/trace_greedy_pilot.txt X_UPDATES
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 18 \
  --held_out_seed 12368 --objective placebo --mismatched 3x3 --mismatched_when gain \
  --workdir runs/gng_mix_placebo --out $R/trace_mix_placebo
python launch/compare_evals.py --instances runs/gng_mix_18/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals \
  $M/matched/start/validation.json,$M/matched/round_0/validation.json,$R/trace_mix_placebo/matched/round_0/validation.json \
  --labels "start (trace_mix),GRPO (19 updates),placebo (19 updates)" \
  --out $R/trace_mix_placebo/vs_grpo.md
bare_answers $R/trace_mix_placebo/matched/round_0/validation.json \
  > $R/trace_mix_placebo/bare_answers.md
