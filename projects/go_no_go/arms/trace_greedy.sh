#!/usr/bin/env bash
# PLAN_greedy.md (projects/go_no_go/results): arm X, V's flags with each group's greedy answer as its
# first member (--greedy_member), from the ending start: the update count from a 3-update
# pilot, a new held-out draw, its no-wait mismatched arm on a gain, beside the shipped model;
# then the control C, the same arm without the greedy member, on the same draw and seed.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_greedy.sh   # about 1.3 h on 2 CPU cores (more with the arm on a gain)
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_end_scratch/export
built $START || {
  echo "error: $START is not built; run projects/go_no_go/arms/trace_end.sh first (its SFT, about 3.6 h)" >&2
  exit 2
}

BUDGET_S=1620  # 27 minutes at the pilot's mean: the first update compiles and steps vary
kept_count $R/trace_greedy_pilot.txt X_UPDATES pilot_updates trace_greedy_pilot 3 \
  --policy $START --groups 32 --lr 1e-4 --seed 17 --greedy_member
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 17 \
  --held_out_seed 12365 --greedy_member --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_greedy --out $R/trace_end_greedy
vs_shipped $R/trace_end_greedy runs/gng_greedy "GRPO (X: greedy member; $X_UPDATES updates)" \
  "ending 6000"
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 17 \
  --held_out_seed 12365 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_greedy_control --out $R/trace_end_greedy_control
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_greedy/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $R/trace_end_greedy/$V,$R/trace_end_greedy_control/$V \
  --labels "X (greedy member),C (GRPO alone)" --out $R/trace_end_greedy_X_vs_C.md
S0=$R/trace_end_greedy/matched/start/validation.json
python launch/compare_evals.py --instances runs/gng_greedy/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $S0,$R/trace_end_greedy/$V,$R/trace_end_greedy_control/$V \
  --labels "start (ending 6000),X (greedy member),C (GRPO alone)" \
  --out $R/trace_end_greedy/x_c_vs_start.md

# The amendment: the start, X and C greedily on the 608 puzzles X trained on (C drew the same)
T=$R/trace_end_greedy/trained_puzzles
mkdir -p $T/evals
cp runs/gng_greedy/matched/round_0/train_set.jsonl $T/puzzles.jsonl
for m in start:$START x:runs/gng_greedy/matched/round_0/model \
  c:runs/gng_greedy_control/matched/round_0/model; do
  greedy_verdicts "${m#*:}" $T/puzzles.jsonl $T/evals/${m%%:*} runs/greedy_trained_${m%%:*}
done
python launch/compare_evals.py --instances $T/puzzles.jsonl --split_wait --sizes 3-6 \
  --evals $T/evals/start,$T/evals/x,$T/evals/c \
  --labels "start (ending 6000),X (greedy member),C (GRPO alone)" \
  --out $R/trace_end_greedy/trained_puzzles.md
