#!/usr/bin/env bash
# PLAN_retry.md (projects/go_no_go/results): the relay that retries, from scratch by the trace recipe
# (projects/go_no_go/configs/tiny_model.py:trace_retry_scratch), its greedy answers on the gate's 400 puzzles
# against trace_wait's and checked line by line, then arm R (F's flags) from it on a new
# held-out draw, its no-wait mismatched arm on a gain, and beside the shipped model; then (the
# plan's amendments) R's no-wait arm run anyway, R2 (a second training seed on a new draw) and
# S (R's flags at 14 updates on another draw).
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_retry.sh   # SFT about 3.6 h on 2 CPU cores (resumable), then about 2 h
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_retry_scratch/export

read_start projects/go_no_go/configs/tiny_model.py:trace_retry_scratch $START runs/trace_retry_scratch_eval \
  $R/trace_retry "trace_retry_scratch (6000 from scratch)"
# every arm from it takes F's flags; R and R2 with the no-wait mismatch, run always (the plan's
# amendment ran R's after R was read)
RETRY=("${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4)
gate "${RETRY[@]}" --updates 7 --seed 10 --held_out_seed 12358 --mismatched no_wait \
  --mismatched_when always --workdir runs/gng_retry --out $R/trace_retry_fstep
vs_shipped $R/trace_retry_fstep runs/gng_retry "GRPO (R: F's flags; seed 10)" "retry 6000"
gate "${RETRY[@]}" --updates 7 --seed 11 --held_out_seed 12359 --mismatched no_wait \
  --mismatched_when always --workdir runs/gng_retry2 --out $R/trace_retry_fstep2
vs_shipped $R/trace_retry_fstep2 runs/gng_retry2 "GRPO (R2: F's flags; seed 11)" "retry 6000"

# the second amendment: arm S, R's flags for the gate's whole budget on a new draw, with the
# gate's own mismatch (3x3) on a gain
gate "${RETRY[@]}" --updates 14 --seed 12 --held_out_seed 12360 --mismatched_when gain \
  --workdir runs/gng_retry_s --out $R/trace_retry_s
vs_shipped $R/trace_retry_s runs/gng_retry_s "GRPO (S: 14 updates; seed 12)" "retry 6000"
