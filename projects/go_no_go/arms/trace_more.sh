#!/usr/bin/env bash
# More updates at arm F's step, as planned in projects/go_no_go/results/PLAN_more.md: a 3-update pilot
# fixes how many updates of F's flags without the KL term fit 30 minutes, then arm H on a new
# held-out draw, and its no-wait mismatched arm when H meets the gain, after building the start
# when it is not built yet (`build_start`). Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_more.sh            # about 1.5 hours on 2 CPU cores, once the start is built
set -euo pipefail
shopt -s inherit_errexit  # a failed pilot inside $(...) stops the script
# The pilot's mean leaves out its first update, whose compilations take about 2.5 minutes more.
BUDGET_S=${BUDGET_S:-1650}
source projects/go_no_go/arms/arms.sh

build_start
# H, then beside the shipped answer-only model on the same new draw
pilot_then_arm more NH 2 12350 "GRPO (H: F's settings without KL; seed 2)" \
  --groups 32 --lr 1e-4 --kl_coef 0
