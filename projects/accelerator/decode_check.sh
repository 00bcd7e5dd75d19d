#!/usr/bin/env bash
# Decoding on one GPU (H100 or H200), in one call of under 9 minutes: Qwen3-1.7B's random
# weights at batch 1 and 64, 256 and 2,048 new tokens, each decode step's time by part
# (--profile), the sampler's loop at 1 and 4 steps per iteration, then the same with the
# Pallas decode attention (attention_impl="pallas_decode"), and that kernel's exactness
# tests run on the GPU (off CPU they use the real Triton kernel); between them, the decode
# step's kernel census (projects/accelerator/decode_kernels.py) without and with command
# buffers, and batch-1 decoding with them.
#
#   bash projects/accelerator/decode_check.sh [OUT]   # default projects/accelerator/results/decode
#   MODEL=tiny BATCHES=1,2 TOKENS=4,8 bash projects/accelerator/decode_check.sh /tmp/decode  # CPU form
set -euo pipefail
OUT="${1:-projects/accelerator/results/decode}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
COMMON=(--models "${MODEL:-1.7b}" --batches "${BATCHES:-1,64}" --new-tokens "${TOKENS:-256,2048}"
        --grpo 1x2x16 --parity 1x8 --repeats 1 --profile)
python benchmarks/accelerator.py "${COMMON[@]}" --attention fused --steps-per-loop 1,4 \
    --out "$OUT/einsum_decode"
python benchmarks/accelerator.py "${COMMON[@]}" --attention pallas_decode --out "$OUT/pallas_decode"
# What one decode step launches (#92 items 2 and 4): the compiled loop body's kernels and which
# kernel each product became, at batch 1 and 64, without and with XLA's command buffers over
# the loop (CUDA graphs); then batch-1 decoding with them, against the einsum run above.
CB="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"
for B in ${KERNEL_BATCHES:-1 64}; do
  python -m projects.accelerator.decode_kernels --model "${MODEL:-1.7b}" --batch "$B" \
      --out "$OUT/kernels" || echo "decode_kernels batch $B failed"
done
XLA_FLAGS="$CB" python -m projects.accelerator.decode_kernels --model "${MODEL:-1.7b}" \
    --batch 1 --out "$OUT/kernels_command_buffers" || echo "command buffers census failed"
if [ "${JAX_PLATFORMS:-}" != cpu ]; then
  XLA_FLAGS="$CB" python benchmarks/accelerator.py --models "${MODEL:-1.7b}" --batches 1 \
      --new-tokens 256 --grpo 1x2x16 --parity 1x8 --repeats 1 --attention fused \
      --out "$OUT/command_buffers" || echo "command buffers decode failed"
fi
# the tests' own setup picks the CPU unless told; here the GPU runs the real kernel
PYTHONPATH=. JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" \
    python -m pytest -q -p no:cacheprovider tests/models/test_decode_attention.py
