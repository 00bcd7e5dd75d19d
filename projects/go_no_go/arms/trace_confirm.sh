#!/usr/bin/env bash
# Arm F again with a second training seed, on a held-out draw that chose no setting, as planned
# in projects/go_no_go/results/PLAN_confirm.md (its matched arm, then its mismatched arm when the
# matched one gains), after building the start when it is not built yet (`build_start`).
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_confirm.sh            # about an hour on 2 CPU cores, once the start is built
set -euo pipefail
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results
build_start
source $R/trace_bonus0_pilots.txt
check_counts $R/trace_bonus0_pilots.txt N32

C=$R/trace_wait_step_confirm
F=("${TRACE_WAIT[@]}" --groups 32 --lr 1e-4 --updates "$N32" --seed 1 --held_out_seed 12349
  --workdir runs/gng_confirm)
gate "${F[@]}" --mismatched_when gain --out $C  # the gate: 3x3 mismatch
# the amendment's second mismatch beside it (the matched arm above is reused, not rerun;
# its verdict goes to verdict_no_wait.md)
gate "${F[@]}" --mismatched no_wait --mismatched_when always --out $C

# the shipped answer-only model on the same new draw, and the three side by side
vs_shipped $C runs/gng_confirm "GRPO (F's settings; seed 1)"
