#!/usr/bin/env bash
# The GPU check (benchmarks/gpu.py): the catalog-scale code's unit-test properties on the GPU
# (parity), CUDA step time and memory by catalog size, loss and AMP mode, and the ML-100K default
# trained on one GPU (bf16, fp32, and the shared loss with sparse item gradients), in about 5
# minutes. It needs only a
# GPU machine whose python3 has PyTorch, numpy, pyarrow and PyYAML: nothing is installed, nothing
# is fetched (no Spark, Petastorm or Horovod there; the trainer runs under torchrun).
#
#   scripts/gpu_check.sh FEATURES OUT
#
# FEATURES: MovieLens 100K as the feature job writes it (./run.sh features --source
# movielens:PATH --out FEATURES --split leave-last-out, on any machine with the project's stack);
# OUT: where gpu.json and the runs' logs go. Never in CI: CI has no GPU.
set -euo pipefail
if [[ $# -ne 2 ]]; then
    echo "usage: scripts/gpu_check.sh FEATURES OUT" >&2
    exit 2
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import torch, numpy, pyarrow, yaml; print("torch", torch.__version__, "numpy", numpy.__version__, "pyarrow", pyarrow.__version__, "cuda", torch.cuda.is_available())'
exec "$PYTHON" "$REPO/benchmarks/gpu.py" --data "$1" --out "$2" ${GPU_CHECK_ARGS:-}
