#!/usr/bin/env bash
# How many GRPO groups each candidate start would give a lesson its greedy answer can use: on
# the 200 puzzles of J's check (projects/go_no_go/results/top_p_check), each start's greedy answers and
# 8 samples per puzzle at temperature 1, the mixed groups counted by the greedy verdict
# (projects/go_no_go/mixed_groups.py). Resumable: a start already measured is skipped.
#
#   bash projects/go_no_go/arms/start_candidates.sh       # about 7 minutes per start on 2 CPU cores
set -euo pipefail
R=projects/go_no_go/results
C=$R/start_candidates
mkdir -p $C
[ -f $C/puzzles.jsonl ] || python -m projects.go_no_go.mixed_groups repeat \
  --instances runs/gng_optim/matched/validation_set.jsonl --k 1 --every 2 --out $C/puzzles.jsonl
for name in trace_grid6000:runs/tiny_trace_grid/export_aw10_6000 trace_long:runs/tiny_trace_long/export; do
  label=${name%%:*} ckpt=${name#*:}
  for kind in greedy sampled; do
    out=$C/$label/$kind
    [ -f $out/verdicts.jsonl ] && continue
    if [ $kind = greedy ]; then
      args=(--instances $C/puzzles.jsonl)
    else
      args=(--instances $R/top_p_check/puzzles.jsonl --temperature 1 --seed 0)
    fi
    rm -rf runs/start_candidates_${label}_$kind
    python launch/evaluate.py --checkpoint $ckpt --enable_thinking --max_new_tokens 640 \
      --batch_size 200 "${args[@]}" --out_dir runs/start_candidates_${label}_$kind
    mkdir -p $out
    cp runs/start_candidates_${label}_$kind/{results.md,verdicts.jsonl} $out/
  done
  python -m projects.go_no_go.mixed_groups count --greedy $C/$label/greedy --evals $C/$label/sampled \
    --labels "$label" --out $C/$label/groups.md
done
