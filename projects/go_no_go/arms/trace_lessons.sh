#!/usr/bin/env bash
# Arm O, as planned in projects/go_no_go/results/PLAN_lessons.md: the recipe's first stage with F's flags
# at 4x the groups per update (128) and lr 2e-4, the updates that fit 30 minutes at 4x M's
# logged pace, on a new held-out draw, its no-wait mismatched arm on a gain, and beside the
# shipped model. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_lessons.sh            # about 1 hour on 2 CPU cores, once built
set -euo pipefail
BUDGET_S=${BUDGET_S:-1650}
source projects/go_no_go/arms/arms.sh

build_start
kept_count $R/trace_lessons_count.txt NO updates_that_fit $R/trace_grid6000_fstep/matched 4
gate "${TRACE_WAIT[@]}" --policy runs/tiny_trace_grid/export_aw10_6000 --groups 128 --lr 2e-4 \
  --updates "$NO" --seed 9 --held_out_seed 12357 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_lessons --out $R/trace_grid6000_lessons
vs_shipped $R/trace_grid6000_lessons runs/gng_lessons "GRPO (O: 128 groups per update; seed 9)" \
  "grid trace 6000"
