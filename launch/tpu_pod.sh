#!/usr/bin/env bash
# Run the training loop on every worker of a TPU pod slice (each worker runs the same command;
# jax.distributed discovers the pod from the TPU environment).
#
#   TPU=my-v5e-64 ZONE=us-west4-a WORKDIR=/mnt/runs/paper bash launch/tpu_pod.sh \
#       --config.model.path=/mnt/models/Qwen3-4B
#
# WORKDIR must be shared by all workers (a GCS FUSE mount or NFS). Extra arguments go to
# launch/train.py.
set -euo pipefail
: "${TPU:?set TPU to the TPU VM name}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR}"
CONFIG="${CONFIG:-configs/paper_qwen3_4b.py}"
REPO="${REPO:-\$HOME/mapfjax}"
ARGS=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "
  set -e
  cd $REPO
  pip install -q -e '.[tpu]'
  python launch/train.py --config=$CONFIG --workdir=$WORKDIR $ARGS
"
