#!/usr/bin/env bash
# PLAN_wide.md (projects/go_no_go/results): the ending start made twice as wide by a function-preserving
# growth and continued for 1,000 SFT updates (projects/go_no_go/configs/tiny_model.py:trace_end_wide), its greedy
# answers on the gate's 400 puzzles paired with the ending start's and checked line by line;
# then arm W: U's flags for the gate's half hour (the update count from a 3-update pilot) on a
# new held-out draw, its no-wait mismatched arm on a gain, and beside the shipped model.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_wide.sh   # SFT about 1.3 h on 2 CPU cores (resumable), then about 1.3 h
set -euo pipefail
source projects/go_no_go/arms/arms.sh
NARROW=runs/tiny_trace_end_scratch/export
INIT=runs/tiny_trace_end_wide_init
START=runs/tiny_trace_end_wide/export
EVAL=runs/trace_end_wide_eval

[ -f $INIT/model.safetensors ] || python -m projects.go_no_go.grow $NARROW $INIT --width 2
read_start projects/go_no_go/configs/tiny_model.py:trace_end_wide $START $EVAL $R/trace_end_wide \
  "trace_end_wide (2x wide + 1000)" relay_retry_end
held_out_answers $NARROW runs/trace_end_scratch_eval
python launch/compare_evals.py --instances $R/held_out_400.jsonl --sizes 3-6 --split_wait \
  --evals runs/trace_end_scratch_eval,$EVAL --labels "ending start (width 128),wide (width 256)" \
  --out $R/trace_end_wide/vs_ending.md
python -m projects.go_no_go.loop_count --answers $EVAL/answers.jsonl --labels trace_end_wide \
  --out $R/trace_end_wide/loops.md

BUDGET_S=1620  # 27 minutes at the pilot's mean: the first update compiles and steps vary
kept_count $R/trace_wide_pilot.txt W_UPDATES pilot_updates trace_wide_pilot 3 --policy $START \
  --groups 32 --lr 1e-4 --seed 16
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$W_UPDATES" --seed 16 \
  --held_out_seed 12364 --mismatched no_wait --mismatched_when gain --workdir runs/gng_wide \
  --out $R/trace_end_wide_w
vs_shipped $R/trace_end_wide_w runs/gng_wide "GRPO (W: wide; $W_UPDATES updates; seed 16)" \
  "wide ending"
