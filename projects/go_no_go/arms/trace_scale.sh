#!/usr/bin/env bash
# Arm P of projects/go_no_go/results/PLAN_gpu.md, run on the CPU as its amendment says: the recipe's
# first stage with F's flags at 128 groups per update, 10 updates a round, validated on draw
# 12356 after each round; ROUNDS (default 1) rounds, each call resuming and extending the last.
#
#   bash projects/go_no_go/arms/trace_scale.sh            # about 1 hour per round on 2 CPU cores, once built
#   ROUNDS=4 bash projects/go_no_go/arms/trace_scale.sh   # the plan's 4 rounds (40 updates)
set -euo pipefail
source projects/go_no_go/arms/arms.sh

build_start
gate "${TRACE_WAIT[@]}" --policy runs/tiny_trace_grid/export_aw10_6000 --groups 128 --lr 1e-4 \
  --updates 10 --rounds "${ROUNDS:-1}" --seed 8 --held_out_seed 12356 --mismatched no_wait \
  --mismatched_when gain --workdir runs/gng_scale --out $R/trace_grid6000_scale
vs_shipped $R/trace_grid6000_scale runs/gng_scale "GRPO (P: 128 groups per update; seed 8)" \
  "grid trace 6000"
