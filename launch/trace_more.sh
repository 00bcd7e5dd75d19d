#!/usr/bin/env bash
# More updates at arm F's step, as planned in results/go_no_go/PLAN_more.md: a 3-update pilot
# fixes how many updates of F's flags without the KL term fit 30 minutes, then arm H on a new
# held-out draw, and its no-wait mismatched arm when H meets the gain, after building the start
# when it is not built yet (`build_start`). Resumable: the same command goes on where it stood.
#
#   bash launch/trace_more.sh            # about 1.5 hours on 2 CPU cores, once the start is built
set -euo pipefail
shopt -s inherit_errexit  # a failed pilot inside $(...) stops the script
# The pilot's mean leaves out its first update, whose compilations take about 2.5 minutes more.
BUDGET_S=${BUDGET_S:-1650}
source launch/arms.sh
R=results/go_no_go

build_start
MORE=(--groups 32 --lr 1e-4 --kl_coef 0)
if [ ! -f $R/trace_more_pilot.txt ]; then
  NH=$(pilot_updates trace_more_pilot 3 "${MORE[@]}")
  printf 'NH=%s\n' "$NH" > $R/trace_more_pilot.txt
fi
source $R/trace_more_pilot.txt
check_counts $R/trace_more_pilot.txt NH

gate "${TRACE_WAIT[@]}" "${MORE[@]}" --updates "$NH" --seed 2 --held_out_seed 12350 \
  --mismatched no_wait --mismatched_when gain --workdir runs/gng_more --out $R/trace_wait_more
# where H ends against the shipped answer-only model, on the same new draw
vs_shipped $R/trace_wait_more runs/gng_more "GRPO (H: F's settings without KL; seed 2)"
