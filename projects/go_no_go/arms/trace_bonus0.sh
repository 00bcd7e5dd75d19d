#!/usr/bin/env bash
# The trace policy with the reward's optimal bonus off, end to end, as planned in
# projects/go_no_go/results/PLAN_trace_bonus0.md: the start built by the trace recipe, its check on the
# gate's 400 puzzles, pilots that fix the update counts (30 minutes / mean seconds of an update
# after the first), then arms B, C and A on the fresh held-out draw. Every step resumes or is
# skipped when done, so after any stop the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_bonus0.sh            # hours on 2 CPU cores; EXTRA="..." adds recipe flags
set -euo pipefail
shopt -s inherit_errexit  # a failed pilot inside $(...) stops the script
R=projects/go_no_go/results
BUDGET_S=${BUDGET_S:-1800}
source projects/go_no_go/arms/arms.sh  # build_start, gate, pilot_updates, check_counts; COMMON, the arms' flags

build_start

START=$R/trace_wait_bonus0_start3  # the third build (the second's check: trace_wait_bonus0_start)
if [ ! -f $START/vs_earlier_builds.md ]; then
  python launch/evaluate.py --checkpoint runs/tiny_trace_wait/export --enable_thinking \
    --max_new_tokens 640 --batch_size 100 --instances $R/held_out_400.jsonl \
    --out_dir runs/trace_wait_build3_eval
  mkdir -p $START
  cp runs/trace_wait_build3_eval/{results.md,results.csv,verdicts.jsonl} $START/
  python launch/compare_evals.py --instances $R/held_out_400.jsonl --sizes 3-6 --split_wait \
    --evals $R/trace_wait_bonus0_start,$START \
    --labels "trace_wait (second build),trace_wait (third build)" --out $START/vs_earlier_builds.md
fi

if [ ! -f $R/trace_bonus0_pilots.txt ]; then
  N8=$(pilot_updates trace_bonus0_pilot_g8 5 --groups 8 --lr 1e-4)
  N32=$(pilot_updates trace_bonus0_pilot_g32 3 --groups 32 --lr 2e-4)
  printf 'N8=%s\nN32=%s\n' "$N8" "$N32" > $R/trace_bonus0_pilots.txt
fi
source $R/trace_bonus0_pilots.txt
check_counts $R/trace_bonus0_pilots.txt N8 N32
echo "updates: $N8 at 8 groups, $N32 at 32 groups"

gate "${COMMON[@]}" --groups 32 --lr 2e-4 --updates "$N32" --workdir runs/gng_bonus0_B \
  --out $R/trace_wait_bonus0_g32                                                      # B
gate "${COMMON[@]}" --groups 32 --lr 2e-4 --updates "$N32" --objective placebo \
  --workdir runs/gng_bonus0_C --out $R/trace_wait_bonus0_g32_placebo                  # C
gate "${COMMON[@]}" --groups 8 --lr 1e-4 --updates "$N8" --workdir runs/gng_bonus0_A \
  --out $R/trace_wait_bonus0_g8                                                       # A
V=matched/round_0/validation.json
python launch/compare_evals.py --instances runs/gng_bonus0_B/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $R/trace_wait_bonus0_g32/$V,$R/trace_wait_bonus0_g32_placebo/$V \
  --labels "B (GRPO),C (placebo)" --out $R/trace_wait_bonus0_B_vs_C.md
