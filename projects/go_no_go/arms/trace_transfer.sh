#!/usr/bin/env bash
# PLAN_transfer.md (projects/go_no_go/results): no training. The start, X, C and Y answer 608 fresh
# puzzles of their training config (Z1), and the start and Y the 1,216 puzzles Y trained on
# (Z2), greedily; each set compared paired. Resumable: finished evaluations are kept.
#
#   bash projects/go_no_go/arms/trace_transfer.sh   # about 20 minutes on 2 CPU cores
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_end_scratch/export
T=$R/trace_end_transfer
mkdir -p $T/evals
if [ ! -f $T/fresh_puzzles.jsonl ]; then
  python -m mapfjax.env generate --out $T/fresh_puzzles.jsonl --n 608 --agents 2 --sizes 3-6 \
    --hole_ratio 0.2 --wait_ratio 0.5 --seed 12366 \
    --exclude runs/gng_greedy/matched/round_0/train_set.jsonl \
    --exclude runs/gng_fresh/matched/round_0/train_set.jsonl \
    --exclude runs/gng_greedy/matched/validation_set.jsonl
fi
cp runs/gng_fresh/matched/round_0/train_set.jsonl $T/y_puzzles.jsonl

evaluate() {  # SET NAME CHECKPOINT: greedy_verdicts of CHECKPOINT on $T/SET.jsonl
  greedy_verdicts "$3" $T/$1.jsonl $T/evals/$1_$2 runs/transfer_$1_$2
}
X=runs/gng_greedy/matched/round_0/model
C=runs/gng_greedy_control/matched/round_0/model
Y=runs/gng_fresh/matched/round_0/model
for m in start:$START x:$X c:$C y:$Y; do evaluate fresh_puzzles "${m%%:*}" "${m#*:}"; done
for m in start:$START y:$Y; do evaluate y_puzzles "${m%%:*}" "${m#*:}"; done

python launch/compare_evals.py --instances $T/fresh_puzzles.jsonl --split_wait --sizes 3-6 \
  --evals $T/evals/fresh_puzzles_start,$T/evals/fresh_puzzles_x,$T/evals/fresh_puzzles_c,$T/evals/fresh_puzzles_y \
  --labels "start (ending 6000),X (greedy member),C (GRPO alone),Y (each puzzle once)" \
  --out $T/z1_fresh_puzzles.md
python launch/compare_evals.py --instances $T/y_puzzles.jsonl --split_wait --sizes 3-6 \
  --evals $T/evals/y_puzzles_start,$T/evals/y_puzzles_y \
  --labels "start (ending 6000),Y (each puzzle once)" --out $T/z2_y_puzzles.md
