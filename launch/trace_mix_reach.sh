#!/usr/bin/env bash
# PLAN_reach.md (results/go_no_go): the start that thinks on some samples (trace_mix) rebuilt
# by its recipe where it is missing, the rebuild checked against the committed figures of the
# first build (the ending start on the gate's 400 puzzles, beside trace_end/comparison.md),
# then C's arm from it on a new held-out draw with a mismatched arm on 7x7-10x10 maps (sizes
# the held-out set and the start's SFT data leave out), run whatever the matched arm gives.
# SEED and DRAW (default 20 and 12370; the confirmation 21 and 12371) choose the run, into
# results/go_no_go/trace_mix_reach_<SEED>. Resumable: the same command goes on where it stood.
#
#   bash launch/trace_mix_reach.sh   # SFT 4-6 h where nothing is built (resumable), then about 1 h
set -euo pipefail
source launch/arms.sh
ENDING=runs/tiny_trace_end_scratch/export
SEED=${SEED:-20}
DRAW=${DRAW:-12370}
CHECK=$R/trace_mix_reach_rebuild
read_start configs/tiny_model.py:trace_end_scratch $ENDING runs/trace_end_scratch_eval $CHECK \
  "trace_end_scratch (6000 from scratch)" relay_retry_end
for f in comparison.md retry_check.md; do  # the first build's files, made by the same calls
  if cmp -s $CHECK/$f $R/trace_end/$f; then same=identical; else same=differs; fi
  echo "$f: $same to results/go_no_go/trace_end/$f"
done > $CHECK/rebuild.txt
cat $CHECK/rebuild.txt
SEED=$SEED DRAW=$DRAW MISMATCH=large WHEN=always OUT=$R/trace_mix_reach_$SEED \
  bash launch/trace_mix.sh
