#!/usr/bin/env bash
# The kernel library on the lent H200 in one device call (< 10 min): compiled-kernel GPU tests, gpt2 compares with
# fastgelu and fastlayernorm, then microbenchmarks of every built-in kernel in the time left. Results under $OUT.
# Installs nothing: runs from the checkout (PYTHONPATH) with the image's torch, transformers and triton.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
RUNS=$(mktemp -d)
device_deadline 560

{ env_gpu; env_versions; } 2>&1 | tee "$OUT/env-kernels.txt"

python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_kernels.log" | tail -8

for patch in fastgelu fastlayernorm; do
  start=$(date +%s)
  timeout $(( $(left) - 30 )) python3 -m e2eprof compare --model gpt2 --patch "$patch" --workload train,infer \
    --reference sdpa --budget 20 --out "$RUNS/gpt2-$patch" 2>&1 | grep -v "loss_type=None" > "$OUT/compare-$patch.log"
  echo "compare $patch: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/compare-$patch.log"
  grep -E "verdict|replaced op|beats" "$OUT/compare-$patch.log"
done

mkdir -p "$RUNS/microbench"
for patch in fastsoftmax fastgelu fastlayernorm rmsnorm swiglu; do
  [ "$(left)" -lt 40 ] && { echo "microbench $patch: skipped, out of time" | tee -a "$RUNS/microbench/summary.txt"; continue; }
  start=$(date +%s)
  timeout $(( $(left) - 20 )) python3 -m e2eprof microbench --patch "$patch" --no-sweep --out "$RUNS/microbench/$patch" \
    > "$RUNS/microbench/$patch.log" 2>&1
  echo "microbench $patch: exit $?, wall $(( $(date +%s) - start )) s" | tee -a "$RUNS/microbench/summary.txt"
done
tar czf "$OUT/reports-kernels.tgz" -C "$RUNS" .
