#!/usr/bin/env bash
# PLAN_end.md (projects/go_no_go/results): the retrying relay from scratch, its trace also ending on
# `no order left` where every order fails (projects/go_no_go/configs/tiny_model.py:trace_end_scratch), its greedy
# answers on the gate's 400 puzzles against trace_wait's, checked line by line and counted for
# traces that never close, then arm U (F's flags) from it on a new held-out draw with its no-wait
# mismatched arm, and beside the shipped model; then (the plan's amendment) arm V, U's flags for
# the gate's whole half hour on another draw.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_end.sh   # SFT about 3.6 h on 2 CPU cores (resumable), then about 1.7 h
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_end_scratch/export
EVAL=runs/trace_end_scratch_eval

read_start projects/go_no_go/configs/tiny_model.py:trace_end_scratch $START $EVAL $R/trace_end \
  "trace_end_scratch (6000 from scratch)" relay_retry_end
python -m projects.go_no_go.loop_count --answers $EVAL/answers.jsonl --labels trace_end_scratch \
  --out $R/trace_end/loops.md
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates 7 --seed 14 \
  --held_out_seed 12362 --mismatched no_wait --mismatched_when always --workdir runs/gng_end \
  --out $R/trace_end_fstep
vs_shipped $R/trace_end_fstep runs/gng_end "GRPO (U: F's flags; seed 14)" "ending 6000"

# the amendment: V, the updates that fit 27 minutes at U's mean seconds per update after the first
BUDGET_S=1620  # 27 minutes at the mean: the first update compiles (2 min) and steps vary
kept_count $R/trace_end_v_count.txt V_UPDATES updates_that_fit runs/gng_end/matched
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$V_UPDATES" --seed 15 \
  --held_out_seed 12363 --mismatched_when gain --workdir runs/gng_end_v --out $R/trace_end_v
vs_shipped $R/trace_end_v runs/gng_end_v "GRPO (V: U's flags; $V_UPDATES updates; seed 15)" "ending 6000"
