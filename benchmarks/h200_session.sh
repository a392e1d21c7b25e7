#!/usr/bin/env bash
# One device call on the lent H200: GPU tests, then the main compare job, results under $OUT.
# Installs nothing: the image has torch, transformers, triton, nvidia-ml-py, pandas, pyarrow, typer.
# Usage (from the repository root on the GPU machine): bash benchmarks/h200_session.sh [extra compare args]
set -uo pipefail
source "$(dirname "$0")/device_common.sh"

{ env_gpu; env_versions; } 2>&1 | tee "$OUT/env.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi

if [ "${SKIP_OVERHEAD:-0}" != 1 ]; then
  python3 benchmarks/sampler_overhead.py 2>&1 | tee "$OUT/sampler_overhead.txt" | tail -3
fi

if [ "${SKIP_COMPARE:-0}" != 1 ]; then
  start=$(date +%s)
  RUNS=$(mktemp -d)
  python3 -m e2eprof compare --model gpt2 --patch fastsoftmax --out "$RUNS/gpt2-fastsoftmax" "$@" 2>&1 | tee "$OUT/compare.log"
  echo "compare exit code ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/compare.log"
  # Few files come back from the device: one archive of all report directories.
  tar czf "$OUT/reports.tgz" -C "$RUNS" .
fi
