#!/usr/bin/env bash
# Arm K, as planned in projects/go_no_go/results/PLAN_screen.md: H's flags with each update's groups
# drawn from the puzzles the current greedy answer fails first (--screen 2); a 3-update pilot
# fixes how many updates fit 30 minutes, then K on a new held-out draw, its no-wait mismatched
# arm when K meets the gain, and K beside the shipped model. Resumable: the same command goes
# on where it stood.
#
#   bash projects/go_no_go/arms/trace_screen.sh            # about 1.5 hours on 2 CPU cores
set -euo pipefail
shopt -s inherit_errexit  # a failed pilot inside $(...) stops the script
# The pilot's mean leaves out its first update, whose compilations take about 2.5 minutes more.
BUDGET_S=${BUDGET_S:-1650}
source projects/go_no_go/arms/arms.sh

pilot_then_arm screen NK 5 12353 "GRPO (K: H's flags with screen 2; seed 5)" \
  --groups 32 --lr 1e-4 --kl_coef 0 --screen 2
