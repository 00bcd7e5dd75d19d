#!/usr/bin/env bash
# PLAN_reach.md (results/go_no_go): the two starts of launch/trace_mix_reach.sh built on one GPU
# in minutes where 2 CPU cores take one to several hours: the ending start's first N SFT updates
# (configs/tiny_model.py:trace_end_scratch; N as there, default 1500), then trace_mix from it
# (`mix_starts` in launch/arms.sh). Run on the device machine from the repository root; the
# exports (with their VALIDATION.md) and the SFT logs come back in $OUT/starts.tgz. Each start
# is skipped where it is built, and one cut off mid-way resumes from its last checkpoint on the
# same machine. ml-collections travels as a wheel in .whl (here, once:
# `echo /.whl/ >> .git/info/exclude && python3 -m pip download --no-deps -d .whl
# ml-collections==1.1.0`; carry [".whl"]).
#
#   OUT=/somewhere bash launch/device_starts.sh   # then here: tar xzf starts.tgz &&
#                                                 # bash launch/trace_mix_reach.sh
set -euo pipefail
: "${OUT:?OUT: the folder the exports are written to}"
N=${N:-1500}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
python() { python3 "$@"; }  # the GPU image has python3 only
source launch/arms.sh
# one compiled shape per prompt length (a compile costs hundreds of updates there), the data
# made by 14 of the machine's 16 cores, fewer checkpoint writes
EXTRA="--config.sft.completion_multiple=1152 --config.processes=14 --config.sft.checkpoint_every=500"
mix_starts "$N"
ending=$(ending_export "$N")
mix=$(mix_export "$N")
tar czf "$OUT/starts.tgz" "$ending" "$mix" "${ending%/*}/log.jsonl" "${mix%/export}/log.jsonl"
