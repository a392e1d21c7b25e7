#!/usr/bin/env bash
# README's results table with both stock references (issue 8): every built-in kernel's compare with the default
# reference arms, sdpa and torch.compile, which the 2026-12-02 rows of these kernels left out to save device time.
#   MODEL (default gpt2) and PATCHES (default "fusedsoftmax fastgelu fastlayernorm"); for llama-1b:
#   MODEL=llama-1b PATCHES="rmsnorm swiglu" BATCH=4. Train and infer (decoding has no compile arm: SITS_OUT).
#   BUDGET (default 20) seconds of timed steps per workload. One call of under 10 minutes per MODEL.
# A CPU dry run: OUT=/tmp/rt E2EPROF_EXTRA="--device cpu --steps 6 --seq 16" MODEL=gpt2-tiny PATCHES=fastgelu
#   bash benchmarks/h200_results_table.sh
# Installs nothing; one archive, $OUT/results.tgz, refreshed after every run.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
device_deadline 560
RUNS=$(mktemp -d)
{ env_gpu; env_versions; } >"$RUNS/env.txt" 2>&1
model=${MODEL:-gpt2}
batch=()
[ -n "${BATCH:-}" ] && batch=(--batch "$BATCH")
for patch in ${PATCHES:-fusedsoftmax fastgelu fastlayernorm}; do
  run_e2eprof "$model-$patch-references" 120 compare --model "$model" --patch "$patch" --workload train,infer \
    "${batch[@]}" --budget "${BUDGET:-20}"
done
echo "time left at the end: $(left) s"
