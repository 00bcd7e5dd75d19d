#!/usr/bin/env bash
# PLAN_mix.md (projects/go_no_go/results): a start that thinks on some samples and answers at once on
# others (projects/go_no_go/configs/tiny_model.py:trace_mix: the ending start + 600 SFT updates, 60 % of the
# puzzles answered after an empty think block), then C's arm from it on a new held-out draw
# with its 3x3 mismatched arm on a gain, beside the shipped model and the ending start.
# SEED and DRAW (default 18 and 12368) run the plan's confirmation (19 and 12369) into
# projects/go_no_go/results/trace_mix_<SEED>; MISMATCH (a go_no_go.py --mismatched choice, default 3x3),
# WHEN (--mismatched_when, default gain) and OUT (the results folder) run other mismatched arms
# (projects/go_no_go/arms/trace_mix_reach.sh). The ending start is built first where it is missing (about 3.6 h).
# N (default 6000) starts from trace_mix continued from the ending start's first N SFT updates
# (`mix_starts` in projects/go_no_go/arms/arms.sh: 1500, 3000 or 6000), or N=scratch from trace_mix_scratch
# (no ending start to set beside it). MINUTES (default 0: none) gives each arm a time budget
# (go_no_go.py --minutes: at most C's update count, ending sooner where the budget runs out;
# PLAN_reach.md's fourth amendment: 27, within the gate's 30). Resumable: the same command
# goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_mix.sh   # about 30 minutes of SFT, then 30-60 of GRPO, on 2 CPU cores
set -euo pipefail
source projects/go_no_go/arms/arms.sh
N=${N:-6000}
ENDING=$(ending_export "$N")
START=$(mix_export "$N")
SEED=${SEED:-18}
DRAW=${DRAW:-12368}
MISMATCH=${MISMATCH:-3x3}
WHEN=${WHEN:-gain}
MINUTES=${MINUTES:-0}
DEFAULT_OUT=$R/trace_mix
[ "$SEED" = 18 ] || DEFAULT_OUT=$R/trace_mix_$SEED
OUT=${OUT:-$DEFAULT_OUT}
W=runs/gng_mix_$SEED  # the arms' workdir and the start's label
LABEL=trace_mix
[ "$N" = 6000 ] || { W=runs/gng_mix${N}_$SEED; LABEL="trace_mix ($N)"; }
[ "$N" = scratch ] && LABEL=trace_mix_scratch
mix_starts "$N"
source $R/trace_greedy_pilot.txt  # X_UPDATES: C's update count
check_counts $R/trace_greedy_pilot.txt X_UPDATES
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates "$X_UPDATES" \
  --seed "$SEED" --held_out_seed "$DRAW" --mismatched "$MISMATCH" --mismatched_when "$WHEN" \
  --minutes "$MINUTES" --workdir $W --out $OUT
GRPO="GRPO ($X_UPDATES updates)"
[ "$MINUTES" = 0 ] || GRPO="GRPO (at most $X_UPDATES updates in $MINUTES minutes)"
vs_shipped $OUT $W "$GRPO" "$LABEL"
last=$(printf '%s\n' $OUT/matched/round_*/validation.json | sort -V | tail -n 1)
M=$OUT/mismatched_$MISMATCH/round_0/validation.json  # the mismatched arm, where it ran
MS=()  # the mismatched arm's end too, where it ran
[ -f $M ] && MS=($M)
bare_answers $OUT/matched/start/validation.json $last "${MS[@]}" > $OUT/bare_answers.md
[ -n "$ENDING" ] || exit 0  # N=scratch: no start that always thinks to set beside them
# the ending start (always thinking) on the same 400 puzzles
greedy_verdicts $ENDING $W/matched/validation_set.jsonl $OUT/ending ${W}_ending
python launch/compare_evals.py --instances $W/matched/validation_set.jsonl \
  --sizes 3-6 --split_wait --evals $OUT/matched/start/validation.json,$last,$OUT/ending \
  --labels "start ($LABEL),$GRPO,ending start (always thinks)" \
  --out $OUT/vs_ending.md
case $MISMATCH in 3x3) ML="3x3 only" ;; large) ML="7x7-10x10 only" ;; *) ML=$MISMATCH ;; esac
if [ -f $M ]; then
  python launch/compare_evals.py --sizes 3-6 --evals $OUT/ending,$last,$M \
    --instances $W/matched/validation_set.jsonl \
    --labels "ending start (always thinks),GRPO matched,GRPO $ML" \
    --out $OUT/vs_ending_reference.md
fi
