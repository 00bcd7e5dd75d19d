#!/usr/bin/env bash
# Arms L and M, as planned in projects/go_no_go/results/PLAN_start.md: arm F's flags (KL 0.1, 32 groups,
# lr 1e-4, 7 updates) from the rebuilt trace_wait start (L) and from the recipe's first stage,
# 6,000 grid-trace SFT updates (M), both with seed 6 on one new held-out draw, each with its
# no-wait mismatched arm on a gain (M's also without one, by the plan's amendment) and beside
# the shipped model. Resumable: the same command goes on where it stood (each start is built
# first when it is not).
#
#   bash projects/go_no_go/arms/trace_start.sh            # about 1.5 hours on 2 CPU cores, once built
set -euo pipefail
source projects/go_no_go/arms/arms.sh
R=projects/go_no_go/results

build_start
F=(--groups 32 --lr 1e-4 --updates 7 --seed 6 --held_out_seed 12354 --mismatched no_wait
  --mismatched_when gain)
gate "${TRACE_WAIT[@]}" "${F[@]}" --workdir runs/gng_fstep --out $R/trace_wait_fstep      # L
vs_shipped $R/trace_wait_fstep runs/gng_fstep "GRPO (L: F's flags; seed 6)"
# M: the same flags; the later --policy replaces TRACE_WAIT's
gate "${TRACE_WAIT[@]}" --policy runs/tiny_trace_grid/export_aw10_6000 "${F[@]}" \
  --workdir runs/gng_grid_fstep --out $R/trace_grid6000_fstep
# M's no-wait arm although M missed the gain (PLAN_start.md, amendment); the later flag wins
gate "${TRACE_WAIT[@]}" --policy runs/tiny_trace_grid/export_aw10_6000 "${F[@]}" \
  --mismatched_when always --workdir runs/gng_grid_fstep --out $R/trace_grid6000_fstep
vs_shipped $R/trace_grid6000_fstep runs/gng_grid_fstep "GRPO (M: F's flags; seed 6)" \
  "grid trace 6000"
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_fstep/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait \
  --evals $R/trace_wait_fstep/matched/start/validation.json,$R/trace_wait_fstep/$V,$R/trace_grid6000_fstep/matched/start/validation.json,$R/trace_grid6000_fstep/$V \
  --labels "L start (trace_wait),L (GRPO),M start (grid trace 6000),M (GRPO)" \
  --out $R/trace_start_L_M.md
