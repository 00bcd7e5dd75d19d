# Shared by the scripts in this folder that run planned go / no-go arms (trace_*.sh,
# device_starts.sh);
# sourced, not run. They set BUDGET_S (the seconds of GRPO an arm may take) before calling
# pilot_updates, and call build_start first where the start may not be built yet.

shopt -s inherit_errexit  # a failed count or pilot inside $(...) stops the script
# Steps run `python launch/<script>.py` (which puts launch/, not the checkout, first on the
# path) and `python -m projects.go_no_go.<script>`: the checkout goes first, so that hours into
# a chain no step fails on a mapfjax that is not installed, nor runs another checkout's code.
PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
R=projects/go_no_go/results  # where the arms' results go

# The arms' start and the flags every arm shares (projects/go_no_go/results/PLAN_trace_bonus0.md)
TRACE_WAIT=(--policy runs/tiny_trace_wait/export --thinking --optimal_bonus 0 --kl_coef 0.1
  --wait_ratio 0.5 --samples 0)
# ... read on the fresh held-out draw of those plans, the mismatched arm run on a gain
COMMON=("${TRACE_WAIT[@]}" --held_out_seed 12348 --mismatched_when gain)

built() { [ -f "$1/VALIDATION.md" ]; }  # train_tiny.py writes it last

held_out_answers() {  # START EVAL: START's greedy answers on the gate's 400 puzzles (thinking
  # on, 640 new tokens) into EVAL (results, verdicts and answers.jsonl), once
  [ -f "$2/answers.jsonl" ] || python launch/evaluate.py --checkpoint "$1" --enable_thinking \
    --max_new_tokens 640 --batch_size 100 --instances $R/held_out_400.jsonl --out_dir "$2" \
    --answers_out "$2/answers.jsonl"
}

greedy_verdicts() {  # CHECKPOINT INSTANCES KEEP RUN: CHECKPOINT's greedy answers (thinking
  # on, 640 new tokens) on INSTANCES, evaluated in RUN, its verdicts.jsonl kept in KEEP, once
  [ -f "$3/verdicts.jsonl" ] && return 0
  python launch/evaluate.py --checkpoint "$1" --enable_thinking --max_new_tokens 640 \
    --batch_size 100 --instances "$2" --out_dir "$4"
  mkdir -p "$3" && cp "$4/verdicts.jsonl" "$3/"
}

read_start() {  # RECIPE START EVAL OUT LABEL [FORM]: START built by the train_tiny.py config
  # RECIPE unless built, its greedy answers on the gate's 400 into EVAL (held_out_answers),
  # paired with trace_wait's committed ones in OUT/comparison.md (START labelled LABEL) and
  # checked line by line in OUT/retry_check.md (lookahead_check.py --form FORM, default relay)
  built "$2" || python launch/train_tiny.py --config "$1"
  held_out_answers "$2" "$3"
  mkdir -p "$4"
  python launch/compare_evals.py --instances $R/held_out_400.jsonl --sizes 3-6 --split_wait \
    --evals "$R/trace_wait_kl0.1_wait0.5/matched/start/validation.json,$3" \
    --labels "trace_wait,$5" --out "$4/comparison.md"
  python -m projects.go_no_go.lookahead_check --instances $R/held_out_400.jsonl --eval "$3" \
    --form "${6:-relay}" --out "$4/retry_check.md"
}

build_start() {  # TRACE_WAIT's start by the trace recipe (about 8,000 SFT updates of 16: hours
  # on 2 CPU cores, minutes on a GPU); each step resumes or is skipped when built; EXTRA="..."
  # adds recipe flags to each
  local t=projects/go_no_go/configs/tiny_model.py
  built runs/tiny_trace_grid/export_aw10_6000 || python launch/train_tiny.py --config $t:trace \
    --config.sft.stages='(1000,1500,2500,4000,6000)' --config.sft.answer_weight=10 \
    --config.rl.train.steps=0 --config.out_dir=runs/tiny_trace_grid/export_aw10_6000 ${EXTRA:-}
  built runs/tiny_trace_long/export || python launch/train_tiny.py --config $t:trace_long ${EXTRA:-}
  built runs/tiny_trace_wait/export || python launch/train_tiny.py --config $t:trace_wait ${EXTRA:-}
}

ending_export() {  # N: where the ending start after N of its SFT updates is exported (none
  # for N=scratch)
  case $1 in
    6000) echo runs/tiny_trace_end_scratch/export ;;
    scratch) echo "" ;;
    *) echo runs/tiny_trace_end_scratch/export_$1 ;;
  esac
}

mix_export() {  # N: where trace_mix continued from ending_export N is exported (N=scratch:
  # trace_mix_scratch's export)
  case $1 in
    6000) echo runs/tiny_trace_mix/export ;;
    *) echo runs/tiny_trace_mix_$1/export ;;
  esac
}

mix_starts() {  # N: the ending start after the first N of its recipe's SFT updates
  # (projects/go_no_go/configs/tiny_model.py:trace_end_scratch, whose stages end at 1500, 3000 and 6000: a shorter
  # build is the longer one's prefix and the longer one resumes it in the same workdir), then
  # trace_mix continued from it, each unless built, into ending_export N and mix_export N;
  # N=scratch: trace_mix_scratch alone (the mix from the first update, no ending start);
  # EXTRA="..." adds recipe flags
  local t=projects/go_no_go/configs/tiny_model.py stages ending mix
  case $1 in
    1500) stages='(1500,)' ;;
    3000) stages='(1500,3000)' ;;
    6000) stages='(1500,3000,6000)' ;;
    scratch)
      built "$(mix_export scratch)" ||
        python launch/train_tiny.py --config $t:trace_mix_scratch ${EXTRA:-}
      return ;;
    *) echo "mix_starts: $1 is neither scratch nor where a stage of trace_end_scratch ends" \
         "(1500, 3000, 6000)" >&2
       return 2 ;;
  esac
  ending=$(ending_export "$1")
  mix=$(mix_export "$1")
  built "$ending" || python launch/train_tiny.py --config $t:trace_end_scratch \
    --config.sft.stages="$stages" --config.out_dir="$ending" ${EXTRA:-}
  built "$mix" || python launch/train_tiny.py --config $t:trace_mix --config.init="$ending" \
    --config.workdir="${mix%/export}" --config.out_dir="$mix" ${EXTRA:-}
}

gate() {  # go_no_go.py exits 1 on NO-GO, which is a result here; 2 or more is an error
  local rc=0 name=verdict.md prev="" a stamp
  for a in "$@"; do  # the verdict this run writes: verdict_<name>.md against another mismatch
    [ "$prev" = --mismatched ] && [ "$a" != 3x3 ] && name=verdict_$a.md
    [[ "$a" == --mismatched=* ]] && [ "${a#*=}" != 3x3 ] && name=verdict_${a#*=}.md
    prev=$a
  done
  stamp=$(date +%s)
  python -m projects.go_no_go.go_no_go "$@" || rc=$?
  # a flag error also exits 1, writing nothing: the verdict must be this run's
  [ "$rc" -le 1 ] && [ -f "${@: -1}/$name" ] && [ "$(stat -c %Y "${@: -1}/$name")" -ge "$stamp" ]
}

pilot_updates() {  # NAME N FLAGS...: a pilot of N updates, then the updates that fit BUDGET_S
  local out=runs/$1 n=$2  # at the pilot's mean seconds per update after the first
  shift 2
  gate "${COMMON[@]}" "$@" --updates "$n" --per_size 5 --workdir "${out}_work" --out "$out" >&2
  updates_that_fit "$out/matched"
}

updates_that_fit() {  # RUN [SCALE]: the updates that fit BUDGET_S at SCALE (default 1) x RUN's
  # mean seconds per update after the first (whose compilations take minutes more); RUN's
  # round_*/metrics.jsonl(.gz). SCALE: an update of SCALE x RUN's rows (groups) costs about SCALE x
  python - "$1" "$BUDGET_S" "${2:-1}" <<'PY'
import pathlib, sys
from mapfjax.eval import report
secs = [row["seconds"] for _, row in report.training_curves(pathlib.Path(sys.argv[1]))][1:]
if not secs:
    sys.exit(f"error: {sys.argv[1]} logs fewer than 2 updates; no mean after the first")
scale = float(sys.argv[3])
if not scale > 0:
    sys.exit(f"error: updates_that_fit scale {sys.argv[3]}; allowed: a number > 0")
print(int(float(sys.argv[2]) // (scale * sum(secs) / len(secs))))
PY
}

kept_count() {  # FILE VAR COMMAND...: VAR, an update count that COMMAND prints (`pilot_updates`,
  # `updates_that_fit`), counted once and kept in FILE; then FILE sourced and checked
  local file=$1 var=$2 n
  shift 2
  if [ ! -f "$file" ]; then
    n=$("$@")
    printf '%s=%s\n' "$var" "$n" > "$file"
  fi
  source "$file"
  check_counts "$file" "$var"
}

pilot_then_arm() {  # NAME VAR SEED DRAW LABEL FLAGS...: a 3-update pilot of FLAGS fixes VAR,
  # the updates that fit BUDGET_S (once, kept in projects/go_no_go/results/trace_NAME_pilot.txt); then
  # the arm (TRACE_WAIT's start) on held-out draw DRAW with its no-wait mismatched arm on a
  # gain (runs/gng_NAME -> projects/go_no_go/results/trace_wait_NAME), and the arm beside the shipped
  # model under LABEL
  local name=$1 var=$2 seed=$3 draw=$4 label=$5 r=projects/go_no_go/results
  shift 5
  kept_count "$r/trace_${name}_pilot.txt" "$var" pilot_updates "trace_${name}_pilot" 3 "$@"
  gate "${TRACE_WAIT[@]}" "$@" --updates "${!var}" --seed "$seed" --held_out_seed "$draw" \
    --mismatched no_wait --mismatched_when gain --workdir "runs/gng_$name" \
    --out "$r/trace_wait_$name"
  vs_shipped "$r/trace_wait_$name" "runs/gng_$name" "$label"
}

check_counts() {  # FILE NAME...: each NAME in FILE is a count >= 1, else exit 2
  local file=$1 name
  shift
  for name in "$@"; do
    [[ "${!name:-}" =~ ^[1-9][0-9]*$ ]] || {
      echo "error: $file holds $name=${!name:-}; allowed: a count >= 1" >&2
      exit 2
    }
  done
}

vs_shipped() {  # OUT WORKDIR LABEL [START]: the shipped answer-only model on the matched arm's
  # held-out puzzles (once), then the start (labelled START, trace_wait unless given), the GRPO
  # arm's last round (LABEL) and it side by side in OUT/vs_shipped.md
  local out=$1 work=$2 label=$3 start=${4:-trace_wait} l
  for l in "$label" "$start"; do
    if [[ $l == *,* ]]; then  # compare_evals splits its --labels at commas
      echo "error: vs_shipped label '$l' holds a comma; write it without one" >&2
      return 2
    fi
  done
  local last  # the run's last round (round_0 for a one-round arm)
  last=$(printf '%s\n' "$out"/matched/round_*/validation.json | sort -V | tail -n 1)
  if [ ! -f "$last" ]; then
    echo "error: vs_shipped: $out/matched holds no round_*/validation.json; run the arm first" >&2
    return 2
  fi
  if [ ! -f "$out/shipped/verdicts.jsonl" ]; then
    python launch/evaluate.py --checkpoint mapfjax/assets/tiny --max_new_tokens 64 \
      --batch_size 100 --instances "$work/matched/validation_set.jsonl" --out_dir "${work}_shipped"
    mkdir -p "$out/shipped"
    cp "${work}_shipped"/{results.md,results.csv,verdicts.jsonl} "$out/shipped/"
  fi
  local evals=$out/matched/start/validation.json,$last,$out/shipped
  python launch/compare_evals.py --instances "$work/matched/validation_set.jsonl" --sizes 3-6 \
    --split_wait --evals "$evals" --labels "start ($start),$label,shipped model" \
    --out "$out/vs_shipped.md"
}

momentum_lr() {  # RUN: the momentum optimiser's lr for about twice the step of RUN's Adam
  # (PLAN_optim.md): Adam's parameter change per unit of scheduled lr and of gradient norm, the
  # median over RUN's updates, times 2 x RUN's peak lr (1e-4 for arm H)
  python - "$1" <<'PY'
import pathlib, statistics, sys
from mapfjax.eval import report
rows = [row for _, row in report.training_curves(pathlib.Path(sys.argv[1]))]
if not rows or any("train_update_norm" not in r for r in rows):
    sys.exit(f"error: {sys.argv[1]} logs no train_update_norm for every update")
if any(r["train_grad_norm"] > 1.0 for r in rows):  # optim.grad_clip: the ratio assumes no clip
    sys.exit(f"error: a gradient of {sys.argv[1]} was clipped; the step rule does not hold")
ratio = statistics.median(
    r["train_update_norm"] / (r["train_lr"] * r["train_grad_norm"]) for r in rows
)
print(f"{2 * max(r['train_lr'] for r in rows) * ratio:.4g}")
PY
}

bare_answers() {  # VALIDATION...: per validation.json, how many greedy answers have an empty
  # think block (rows' bare_answer) and how many of each kind are valid, as a Markdown table
  python - "$@" <<'PY'
import json, sys
from mapfjax import stats
print("| validation | n | bare answers | valid among them | traces | valid among them |")
print("|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    bare = [r for r in rows if r["bare_answer"]]
    trace = [r for r in rows if not r["bare_answer"]]
    cell = lambda sel: stats.interval_text(stats.proportion([r["valid"] for r in sel])) if sel else "-"
    print(f"| {path} | {len(rows)} | {len(bare)} | {cell(bare)} | {len(trace)} | {cell(trace)} |")
PY
}
