#!/usr/bin/env bash
# PLAN_transfer.md's amendment (results/go_no_go): C (PLAN_greedy.md) continued for a second
# round of 19 updates on new puzzles, from a copy of its run directory, validated on the same
# held-out draw and on Z1's fresh puzzles. Resumable: the same command goes on where it stood.
#
#   bash launch/trace_rounds.sh   # about 35 minutes on 2 CPU cores
set -euo pipefail
source launch/arms.sh
START=runs/tiny_trace_end_scratch/export
T=$R/trace_end_transfer
[ -d runs/gng_c_rounds ] || cp -r runs/gng_greedy_control runs/gng_c_rounds
source $R/trace_greedy_pilot.txt  # X_UPDATES: C's update count
check_counts $R/trace_greedy_pilot.txt X_UPDATES
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" --seed 17 \
  --held_out_seed 12365 --rounds 2 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_c_rounds --out $R/trace_end_c_rounds
C2=runs/gng_c_rounds/matched/round_1/model
if [ ! -f $T/evals/fresh_puzzles_c2/verdicts.jsonl ]; then
  python launch/evaluate.py --checkpoint $C2 --enable_thinking --max_new_tokens 640 \
    --batch_size 100 --instances $T/fresh_puzzles.jsonl --out_dir runs/transfer_fresh_puzzles_c2
  mkdir -p $T/evals/fresh_puzzles_c2
  cp runs/transfer_fresh_puzzles_c2/verdicts.jsonl $T/evals/fresh_puzzles_c2/
fi
E=$T/evals/fresh_puzzles
python launch/compare_evals.py --instances $T/fresh_puzzles.jsonl --split_wait --sizes 3-6 \
  --evals ${E}_start,${E}_c,${E}_c2 --labels "start (ending 6000),C (19 updates),C2 (38 updates)" \
  --out $T/z1_c_rounds.md
V=validation.json
python launch/compare_evals.py --instances runs/gng_c_rounds/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --labels "start (ending 6000),C (19 updates),C2 (38 updates)" \
  --evals $R/trace_end_c_rounds/matched/start/$V,$R/trace_end_c_rounds/matched/round_0/$V,$R/trace_end_c_rounds/matched/round_1/$V \
  --out $R/trace_end_c_rounds/held_out_rounds.md
