#!/usr/bin/env bash
# Arm J, as planned in projects/go_no_go/results/PLAN_top_p.md: a check of the start's sampled groups
# at top_p 1 and 0.95 on arm I's draw, then (when the check holds) H's flags with rollouts in
# the 0.95 nucleus on a new held-out draw, its no-wait mismatched arm when J meets the gain,
# and J beside the shipped model. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_top_p.sh            # about 1.5 hours on 2 CPU cores, after trace_optim.sh
set -euo pipefail
shopt -s inherit_errexit  # a failed step inside $(...) stops the script
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results
P=$R/top_p_check
START=runs/tiny_trace_wait/export
mkdir -p $P
[ -f $P/puzzles.jsonl ] || python -m projects.go_no_go.mixed_groups repeat \
  --instances runs/gng_optim/matched/validation_set.jsonl --k 8 --every 2 --out $P/puzzles.jsonl
for TP in 1 0.95; do
  if [ ! -f $P/top_p$TP/verdicts.jsonl ]; then
    rm -rf runs/top_p_check_$TP
    t0=$(date +%s)
    python launch/evaluate.py --checkpoint $START --enable_thinking --max_new_tokens 640 \
      --batch_size 200 --instances $P/puzzles.jsonl --temperature 1 --top_p $TP --seed 0 \
      --out_dir runs/top_p_check_$TP
    echo $(( $(date +%s) - t0 )) > runs/top_p_check_$TP/seconds.txt
    mkdir -p $P/top_p$TP
    cp runs/top_p_check_$TP/{results.md,verdicts.jsonl,seconds.txt} $P/top_p$TP/
  fi
done
python -m projects.go_no_go.mixed_groups count --greedy $R/trace_wait_optim/matched/start/validation.json \
  --evals $P/top_p1,$P/top_p0.95 --labels "top_p 1,top_p 0.95" \
  --seconds "$(cat $P/top_p1/seconds.txt),$(cat $P/top_p0.95/seconds.txt)" --out $P/groups.md
# The plan's rule: J runs when the groups greedy fails keep half their count and their share
# of the mixed groups grows 1.5x; its updates: 18 scaled by the decode's time ratio
python - $R $P > $R/trace_top_p_count.txt <<'PY'
import math, sys
from projects.go_no_go import groups
r, p = sys.argv[1:]
greedy = groups.read_valid(f"{r}/trace_wait_optim/matched/start/validation.json")
a, b = (groups.group_counts(greedy, groups.read_valid(f"{p}/top_p{t}")) for t in ("1", "0.95"))
ratio = float(open(f"{p}/top_p0.95/seconds.txt").read()) / float(open(f"{p}/top_p1/seconds.txt").read())
holds = b.mixed_greedy_fails >= a.mixed_greedy_fails / 2 and b.fails_share >= 1.5 * a.fails_share
print(f"RUN={int(holds)}")
print(f"NJ={min(18, math.floor(18 / (1 + 0.6 * max(ratio - 1, 0))))}")
PY
source $R/trace_top_p_count.txt
if [ "$RUN" != 1 ]; then
  echo "the check does not hold ($P/groups.md): arm J is not run (PLAN_top_p.md)"
  exit 0
fi
check_counts $R/trace_top_p_count.txt NJ
gate "${TRACE_WAIT[@]}" --groups 32 --lr 1e-4 --kl_coef 0 --top_p 0.95 --updates "$NJ" \
  --seed 4 --held_out_seed 12352 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_top_p --out $R/trace_wait_top_p
vs_shipped $R/trace_wait_top_p runs/gng_top_p "GRPO (J: H's flags with top_p 0.95; seed 4)"
