#!/usr/bin/env bash
# PLAN_transfer.md's amendments (projects/go_no_go/results): C (PLAN_greedy.md) continued for more
# rounds of 19 updates on new puzzles, from a copy of its run directory, each round validated
# on the same held-out draw and on Z1's fresh puzzles. Resumable: the same command goes on where
# it stood; ROUNDS=k extends the run to k rounds (default 2: C2; 3: C3).
#
#   bash projects/go_no_go/arms/trace_rounds.sh            # about 35 minutes on 2 CPU cores
#   ROUNDS=3 bash projects/go_no_go/arms/trace_rounds.sh   # about 35 minutes more
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_end_scratch/export
T=$R/trace_end_transfer
[ -d runs/gng_c_rounds ] || cp -r runs/gng_greedy_control runs/gng_c_rounds
source $R/trace_greedy_pilot.txt  # X_UPDATES: C's update count
check_counts $R/trace_greedy_pilot.txt X_UPDATES
ROUNDS=${ROUNDS:-2}
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 17 \
  --held_out_seed 12365 --rounds "$ROUNDS" --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_c_rounds --out $R/trace_end_c_rounds
E=$T/evals/fresh_puzzles
V=validation.json
M=$R/trace_end_c_rounds/matched
evals=${E}_start,${E}_c held=$M/start/$V,$M/round_0/$V
labels="start (ending 6000),C ($X_UPDATES updates)"
for k in $(seq 2 "$ROUNDS"); do
  greedy_verdicts runs/gng_c_rounds/matched/round_$((k - 1))/model $T/fresh_puzzles.jsonl \
    ${E}_c$k runs/transfer_fresh_puzzles_c$k
  evals=$evals,${E}_c$k held=$held,$M/round_$((k - 1))/$V
  labels="$labels,C$k ($((X_UPDATES * k)) updates)"
done
python launch/compare_evals.py --instances $T/fresh_puzzles.jsonl --split_wait --sizes 3-6 \
  --evals "$evals" --labels "$labels" --out $T/z1_c_rounds.md
python launch/compare_evals.py --instances runs/gng_c_rounds/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals "$held" --labels "$labels" --out $R/trace_end_c_rounds/held_out_rounds.md
