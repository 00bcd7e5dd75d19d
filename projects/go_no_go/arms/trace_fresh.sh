#!/usr/bin/env bash
# PLAN_fresh.md (projects/go_no_go/results): arm Y, C's command (PLAN_greedy.md) with every training
# puzzle drawn once (--fresh_puzzles), on C's held-out draw, then Y against C paired.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_fresh.sh   # about 35 minutes on 2 CPU cores (more with the arm on a gain)
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_end_scratch/export
source $R/trace_greedy_pilot.txt  # X_UPDATES: C's update count
check_counts $R/trace_greedy_pilot.txt X_UPDATES
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 17 \
  --held_out_seed 12365 --fresh_puzzles --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_fresh --out $R/trace_end_fresh
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_fresh/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $R/trace_end_greedy_control/$V,$R/trace_end_fresh/$V \
  --labels "C (each puzzle about twice),Y (each puzzle once)" --out $R/trace_end_fresh_Y_vs_C.md
