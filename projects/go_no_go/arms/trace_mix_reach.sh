#!/usr/bin/env bash
# PLAN_reach.md (projects/go_no_go/results): a start that thinks on some samples, built where it is
# missing: by default (N=scratch, the plan's second amendment) trace_mix_scratch, the mix from
# the first update in the ending recipe's first stage (about an hour of SFT on 2 cores, so that
# the start and both arms fit one sitting); N=1500, 3000 or 6000: trace_mix continued from the
# ending start's first N updates, that ending start first read on the gate's 400 puzzles (once;
# N=6000 also says whether the rebuild matches the first build's trace_end/ files). Then C's arm
# from it on a new held-out draw with a mismatched arm on 7x7-10x10 maps (sizes the held-out set
# and the start's SFT data leave out), run whatever the matched arm gives. SEED and DRAW
# (default 20 and 12370; the confirmation 21 and 12371) choose the run, into
# projects/go_no_go/results/trace_mix_reach_<SEED>; MINUTES gives each arm a time budget (projects/go_no_go/arms/trace_mix.sh;
# the fourth amendment's runs: MINUTES=27). BUILD (the fifth amendment's: BUILD=3) reads a
# start rebuilt once more into trace_mix_reach_start_<N>_build<BUILD>, its rebuild.txt set
# against the second build's reading too. Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_mix_reach.sh   # about 1.2 h of SFT where nothing is built, then 1-1.5 h
set -euo pipefail
source projects/go_no_go/arms/arms.sh
N=${N:-scratch}
SEED=${SEED:-20}
DRAW=${DRAW:-12370}
mix_starts "$N"
ENDING=$(ending_export "$N")
CHECK=$R/trace_mix_reach_start_$N${BUILD:+_build$BUILD}
# read once: a committed record of a shorter start is kept (the arms read their own start)
if [ -n "$ENDING" ] && { [ "$N" = 6000 ] || [ ! -f $CHECK/retry_check.md ]; }; then
  read_start projects/go_no_go/configs/tiny_model.py:trace_end_scratch "$ENDING" runs/trace_end_scratch_eval_$N \
    $CHECK "trace_end_scratch ($N from scratch)" relay_retry_end
fi
if [ "$N" = 6000 ]; then
  refs=($R/trace_end)  # the first build's files, made by the same calls
  [ -z "${BUILD:-}" ] || refs+=($R/trace_mix_reach_start_6000)  # and the second build's
  for ref in "${refs[@]}"; do
    for f in comparison.md retry_check.md; do
      if cmp -s $CHECK/$f $ref/$f; then same=identical; else same=differs; fi
      echo "$f: $same to $ref/$f"
    done
  done > $CHECK/rebuild.txt
  cat $CHECK/rebuild.txt
fi
N=$N SEED=$SEED DRAW=$DRAW MISMATCH=large WHEN=always OUT=$R/trace_mix_reach_$SEED \
  bash projects/go_no_go/arms/trace_mix.sh
