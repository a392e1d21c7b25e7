#!/usr/bin/env bash
# Sign-off evidence on the lent H200, in two device calls of under 10 minutes each. Results under $OUT.
#   PART=1  GPU tests; A/A calibration of gpt2 train; a planted slowdown of PLANTED_FRACTION (default 2%) of the
#           A/A baseline's median train step, which must come out FAIL.
#   PART=2  gpt2 + fastsoftmax, all workloads, default arms on a GPU (baseline, patched, sdpa, compile), adaptive length.
# Installs nothing: e2eprof runs from the checkout (PYTHONPATH) with the image's torch, transformers and triton.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
PART=${PART:-1}
RUNS=$(mktemp -d)

{ env_gpu; env_versions; } 2>&1 | tee "$OUT/env-part$PART.txt"

timed() {  # timed NAME COMMAND...: run, log, record exit code and wall time
  local name=$1; shift
  local start=$(date +%s)
  "$@" 2>&1 | grep -v "loss_type=None" | tee "$OUT/$name.log" | tail -25
  echo "$name: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/$name.log"
}

if [ "$PART" = 1 ]; then
  python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
  timed aa python3 -m e2eprof calibrate --model gpt2 --workload train --out "$RUNS/aa-gpt2-train"
  # Extra work per softmax call so that the whole step grows by PLANTED_FRACTION: GPT-2 calls softmax once per
  # layer in the forward pass, and the stock backward is untouched.
  DELAY=$(python3 - "$RUNS/aa-gpt2-train" "${PLANTED_FRACTION:-0.02}" <<'PY'
import sys, pandas as pd
summary = pd.read_parquet(f"{sys.argv[1]}/summary.parquet")
median_ms = float(summary[(summary.arm == "baseline") & (summary.workload == "train")].median_ms.iloc[0])
print(f"{float(sys.argv[2]) * median_ms * 1e3 / 12:.1f}")
PY
)
  echo "planted delay per softmax call: $DELAY us (${PLANTED_FRACTION:-0.02} of the A/A baseline step)" | tee "$OUT/planted.txt"
  E2EPROF_PLANTED_DELAY_US=$DELAY timed planted python3 -m e2eprof compare --model gpt2 --patch planted-slowdown \
    --workload train --reference none --out "$RUNS/planted-gpt2-train"
else
  timed compare python3 -m e2eprof compare --model gpt2 --patch fastsoftmax --out "$RUNS/gpt2-fastsoftmax" "$@"
fi
# Few files come back from the device: one archive of all report directories.
tar czf "$OUT/reports-part$PART.tgz" -C "$RUNS" .
