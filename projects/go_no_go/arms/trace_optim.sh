#!/usr/bin/env bash
# Arm I, as planned in projects/go_no_go/results/PLAN_optim.md, only when arm H (projects/go_no_go/arms/trace_more.sh)
# did not pass: H's flags with the momentum optimiser (Adam without its second moment) at about
# twice H's step, on a new held-out draw; its no-wait mismatched arm when it meets the gain.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_optim.sh            # about 1.5 hours on 2 CPU cores, after trace_more.sh
set -euo pipefail
shopt -s inherit_errexit  # a failed step inside $(...) stops the script
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results
H=$R/trace_wait_more
[ -f $H/verdict_no_wait.md ] || {
  echo "error: no $H/verdict_no_wait.md: arm I runs after arm H (bash projects/go_no_go/arms/trace_more.sh)" >&2
  exit 2
}
if head -n 1 $H/verdict_no_wait.md | grep -q '^\*\*GO\*\*'; then
  echo "arm H passed the gate ($H/verdict_no_wait.md): arm I is not run"
  exit 0
fi
source $R/trace_more_pilot.txt
check_counts $R/trace_more_pilot.txt NH

# The step, fixed by H before I runs (`momentum_lr` in arms.sh)
LR=$(momentum_lr $H/matched)
printf 'LR=%s\n' "$LR" > $R/trace_optim_lr.txt
gate "${TRACE_WAIT[@]}" --groups 32 --kl_coef 0 --optimizer momentum --lr "$LR" --updates "$NH" \
  --seed 3 --held_out_seed 12351 --mismatched no_wait --mismatched_when gain \
  --workdir runs/gng_optim --out $R/trace_wait_optim
vs_shipped $R/trace_wait_optim runs/gng_optim "GRPO (I: H's flags with momentum; seed 3)"
