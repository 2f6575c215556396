#!/usr/bin/env bash
# Model search on one GPU: the trials that would take hours on 2 cores (the exact loss and the
# SASRec-style baseline over a 22,000-item catalog; short-history defaults), all at once under
# torchrun (`benchmarks/model_search.py --launcher torchrun --jobs N`), in under 9 minutes.
# A GPU step of these models leaves the GPU mostly idle, so a trial per CPU core shares it well.
# Like scripts/gpu_check.sh it needs only python3 with PyTorch, numpy, pyarrow and PyYAML there.
#
#   scripts/gpu_search.sh WIDE SHORT OUT
#
# WIDE, SHORT: datasets the feature job wrote on a machine with the project's stack:
#   ./run.sh features --source "synthetic:clients=24000,items=22000,events=216000,seed=11,\
#     cover=1,purchases_only=1,p_continue=0.4,p_drift=0.15" --out WIDE --split leave-last-out
#   SHORT: benchmarks/common.py's SHORT_HISTORIES, built the same way.
# OUT: search.jsonl (model_search records, 1 rank each: never cells of the quality report, which
# compares 2 ranks), each launcher's output, the trials' logs. Never in CI: CI has no GPU.
set -uo pipefail
if [[ $# -ne 3 ]]; then
    echo "usage: scripts/gpu_search.sh WIDE SHORT OUT" >&2
    exit 2
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WIDE=$1 SHORT=$2 OUT=$3
PYTHON=${PYTHON:-python3}
TRIAL_SECONDS=${TRIAL_SECONDS:-400}  # a trial is stopped after this; its kept model is backtested
WORK=$(mktemp -d)
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
search() {
    "$PYTHON" "$REPO/benchmarks/model_search.py" --launcher torchrun --seeds 0,1,2 \
        --timeout "$TRIAL_SECONDS" --log "$OUT/search.jsonl" "$@"
}
T=dist.threads_per_rank=1  # as the quality report's cells: a trial per core
search --jobs 12 --work "$WORK/wide" --data "$WIDE" --trial "sasrec=--config sasrec $T" \
    --trial "ctsm=$T" --trial "ctsm-shared=model.loss=shared $T" \
    --trial "ctsm-dropout0.5=model.dropout=0.5 $T" > "$OUT/wide.out" 2>&1 &
wide=$!
search --jobs 9 --work "$WORK/short" --data "$SHORT" --trial "sasrec=--config sasrec $T" \
    --trial "ctsm=$T" --trial "ctsm-dropout0.5=model.dropout=0.5 $T" > "$OUT/short.out" 2>&1 &
short=$!
for ((i = 1; i <= 18; i++)); do  # progress every 30 s until both are done
    sleep 30
    records=0
    [[ -f $OUT/search.jsonl ]] && records=$(wc -l < "$OUT/search.jsonl")
    gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)
    echo "$((i * 30)) s: $records records; GPU ${gpu:-?}; load $(cut -d' ' -f1 /proc/loadavg)"
    [[ -z $(jobs -r) ]] && break
done
status=0
wait "$wide" || status=1  # a trial that failed (its records' absence says which)
wait "$short" || status=1
for name in wide short; do
    for log in "$WORK/$name"/*.log; do
        [[ -f $log ]] && cp "$log" "$OUT/logs/$name-$(basename "$log")"
    done
    tail -n 3 "$OUT/$name.out"
done
exit $status
