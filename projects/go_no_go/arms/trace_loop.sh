#!/usr/bin/env bash
# PLAN_loop.md (projects/go_no_go/results): the retry policy continued with loop lessons
# (projects/go_no_go/configs/tiny_model.py:trace_retry_lessons), its greedy answers on the gate's 400 puzzles
# against the retry start's, then arm T (F's flags) from it on a new held-out draw with its
# no-wait mismatched arm, and beside the shipped model; then control C, the same continuation
# without lessons, on the gate's 400.
# Resumable: the same command goes on where it stood.
#
#   bash projects/go_no_go/arms/trace_loop.sh   # SFT about 45 min on 2 CPU cores (resumable), then about 1.5 h
set -euo pipefail
source projects/go_no_go/arms/arms.sh
START=runs/tiny_trace_retry_lessons/export
EVAL=runs/trace_retry_lessons_eval
H=projects/go_no_go/results/held_out_400.jsonl

built $START || python launch/train_tiny.py --config projects/go_no_go/configs/tiny_model.py:trace_retry_lessons
held_out_answers $START $EVAL
mkdir -p $R/trace_loop
python launch/compare_evals.py --instances $H --sizes 3-6 --split_wait \
  --evals runs/trace_retry_scratch_eval,$EVAL \
  --labels "trace_retry_scratch,trace_retry_lessons (+1000 with loop lessons)" \
  --out $R/trace_loop/comparison.md
python -m projects.go_no_go.lookahead_check --instances $H --eval $EVAL --form relay \
  --out $R/trace_loop/retry_check.md
gate "${TRACE_WAIT[@]}" --policy $START --groups 32 --lr 1e-4 --updates 7 --seed 13 \
  --held_out_seed 12361 --mismatched no_wait --mismatched_when always --workdir runs/gng_loop \
  --out $R/trace_loop_fstep
vs_shipped $R/trace_loop_fstep runs/gng_loop "GRPO (T: F's flags; seed 13)" "loop lessons"

# control C: the same continuation without lessons, on the gate's 400 beside the two above
C=runs/tiny_trace_retry_nolessons
CEVAL=runs/trace_retry_nolessons_eval
built $C/export || python launch/train_tiny.py --config projects/go_no_go/configs/tiny_model.py:trace_retry_lessons \
  --config.sft.extra_examples= --config.workdir=$C --config.out_dir=$C/export
held_out_answers $C/export $CEVAL
python launch/compare_evals.py --instances $H --sizes 3-6 --split_wait \
  --evals runs/trace_retry_scratch_eval,$EVAL,$CEVAL \
  --labels "trace_retry_scratch,loop lessons (+1000),no lessons (+1000)" \
  --out $R/trace_loop/control.md
python -m projects.go_no_go.loop_count --answers runs/trace_retry_scratch_eval/answers.jsonl,$EVAL/answers.jsonl,$CEVAL/answers.jsonl \
  --labels "trace_retry_scratch,loop lessons (+1000),no lessons (+1000)" --out $R/trace_loop/loops.md
python -m projects.go_no_go.loop_count --answers $CEVAL/answers.jsonl,$EVAL/answers.jsonl \
  --labels "no lessons (+1000),loop lessons (+1000)" --out $R/trace_loop/loops_vs_control.md
python launch/compare_evals.py --instances $H --sizes 3-6 --split_wait --evals $CEVAL,$EVAL \
  --labels "no lessons (+1000),loop lessons (+1000)" --out $R/trace_loop/lessons_vs_control.md
