#!/usr/bin/env bash
# A smaller step at 32 groups, as planned in projects/go_no_go/results/PLAN_step.md: after
# projects/go_no_go/arms/trace_lora.sh (the start, arms B, C, A, D and E; each step skipped once done), arm F
# (arm B at half its learning rate) and G (its placebo) on the fresh held-out draw, then F
# against G and F against B. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_step.sh            # hours on 2 CPU cores
set -euo pipefail
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results

bash projects/go_no_go/arms/trace_lora.sh

source $R/trace_bonus0_pilots.txt
check_counts $R/trace_bonus0_pilots.txt N32
STEP=(--groups 32 --lr 1e-4 --updates "$N32")

gate "${COMMON[@]}" "${STEP[@]}" --workdir runs/gng_step_F --out $R/trace_wait_step_g32_lr1e-4  # F
gate "${COMMON[@]}" "${STEP[@]}" --objective placebo --workdir runs/gng_step_G \
  --out $R/trace_wait_step_g32_lr1e-4_placebo                                                  # G
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_step_F/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait \
  --evals $R/trace_wait_step_g32_lr1e-4/$V,$R/trace_wait_step_g32_lr1e-4_placebo/$V,$R/trace_wait_bonus0_g32/$V \
  --labels "F (GRPO lr 1e-4),G (placebo lr 1e-4),B (GRPO lr 2e-4)" --out $R/trace_wait_step_F_G_B.md
