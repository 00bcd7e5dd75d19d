#!/usr/bin/env bash
# Arm N, as planned in projects/go_no_go/results/PLAN_first_stage.md: arm M's flags and start (the
# recipe's first stage, 6,000 grid-trace SFT updates) with the updates that fit 30 minutes at
# M's logged pace, on a new held-out draw, its no-wait mismatched arm on a gain, and beside the
# shipped model. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_first_stage.sh            # about 1 hour on 2 CPU cores, once built
set -euo pipefail
BUDGET_S=${BUDGET_S:-1650}
source projects/go_no_go/arms/arms.sh

build_start
kept_count $R/trace_first_stage_count.txt NN updates_that_fit $R/trace_grid6000_fstep/matched
gate "${TRACE_WAIT[@]}" --policy runs/tiny_trace_grid/export_aw10_6000 --groups 32 --lr 1e-4 \
  --updates "$NN" --seed 7 --held_out_seed 12355 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_first --out $R/trace_grid6000_more
vs_shipped $R/trace_grid6000_more runs/gng_first "GRPO (N: M's flags for 30 minutes; seed 7)" \
  "grid trace 6000"
