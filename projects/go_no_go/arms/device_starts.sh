#!/usr/bin/env bash
# PLAN_reach.md (projects/go_no_go/results): the start of projects/go_no_go/arms/trace_mix_reach.sh built on one GPU in
# minutes where 2 CPU cores take one to several hours (`mix_starts` in projects/go_no_go/arms/arms.sh; N as
# there: scratch by default, trace_mix_scratch; 1500, 3000 or 6000: the ending start's first N
# SFT updates, then trace_mix from it). Run on the device machine from the repository root; the
# exports (with their VALIDATION.md) and the SFT logs come back in $OUT/starts.tgz. Each start
# is skipped where it is built, and one cut off mid-way resumes from its last checkpoint on the
# same machine. ml-collections travels as a wheel in .whl (here, once:
# `echo /.whl/ >> .git/info/exclude && python3 -m pip download --no-deps -d .whl
# ml-collections==1.1.0`; carry [".whl"]).
#
#   OUT=/somewhere bash projects/go_no_go/arms/device_starts.sh   # then here: tar xzf starts.tgz &&
#                                                 # bash projects/go_no_go/arms/trace_mix_reach.sh
set -euo pipefail
: "${OUT:?OUT: the folder the exports are written to}"
N=${N:-scratch}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
python() { python3 "$@"; }  # the GPU image has python3 only
source projects/go_no_go/arms/arms.sh
# one compiled shape per prompt length (a compile costs hundreds of updates there), the data
# made by 14 of the machine's 16 cores, fewer checkpoint writes
EXTRA="--config.sft.completion_multiple=1152 --config.processes=14 --config.sft.checkpoint_every=500"
mix_starts "$N"
ending=$(ending_export "$N")
mix=$(mix_export "$N")
packed=("$mix" "${mix%/export}/log.jsonl")
[ -z "$ending" ] || packed+=("$ending" "${ending%/*}/log.jsonl")
tar czf "$OUT/starts.tgz" "${packed[@]}"
