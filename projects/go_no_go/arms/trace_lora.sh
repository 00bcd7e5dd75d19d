#!/usr/bin/env bash
# GRPO on low-rank adapters from the trace policy, as planned in
# projects/go_no_go/results/PLAN_lora.md: after projects/go_no_go/arms/trace_bonus0.sh (the start, its check and arms
# B, C, A; each step skipped once done), a pilot that fixes the update count (30 minutes / mean
# seconds of an update after the first), then arms D (LoRA rank 8, lr 1e-3) and E (its
# placebo) on the fresh held-out draw, and D against E. Resumable: the same command goes on
# where it stood.
#
#   bash projects/go_no_go/arms/trace_lora.sh            # hours on 2 CPU cores
set -euo pipefail
shopt -s inherit_errexit  # a failed pilot inside $(...) stops the script
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results
BUDGET_S=${BUDGET_S:-1800}

bash projects/go_no_go/arms/trace_bonus0.sh

LORA=(--groups 8 --lora_rank 8 --lora_alpha 32 --lr 1e-3)
if [ ! -f $R/trace_lora_pilot.txt ]; then
  ND=$(pilot_updates trace_lora_pilot 5 "${LORA[@]}")
  printf 'ND=%s\n' "$ND" > $R/trace_lora_pilot.txt
fi
source $R/trace_lora_pilot.txt
check_counts $R/trace_lora_pilot.txt ND
echo "updates: $ND"

gate "${COMMON[@]}" "${LORA[@]}" --updates "$ND" --workdir runs/gng_lora_D \
  --out $R/trace_wait_lora_r8                                                         # D
gate "${COMMON[@]}" "${LORA[@]}" --updates "$ND" --objective placebo --workdir runs/gng_lora_E \
  --out $R/trace_wait_lora_r8_placebo                                                 # E
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_lora_D/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $R/trace_wait_lora_r8/$V,$R/trace_wait_lora_r8_placebo/$V \
  --labels "D (GRPO on LoRA),E (placebo on LoRA)" --out $R/trace_wait_lora_D_vs_E.md
