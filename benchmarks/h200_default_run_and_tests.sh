#!/usr/bin/env bash
# One device call (< 10 min) on the lent H200: the default `compare --model gpt2 --patch fastsoftmax` timed by phase
# (issue 2, issue 8's cost part), a worker's start-up timed step by step, the GPU test suite, then microbenchmarks of
# the patches named in MICROBENCH (default: fastsoftmax fusedsoftmax) in the time left. Everything lands in one
# archive under $OUT (the device returns only a few files). Installs nothing: runs from the checkout with the
# image's packages.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
device_deadline 570
LOGS=$(mktemp -d)

{ env_gpu; env_versions; } 2>&1 | tee "$LOGS/env.txt"

PART=cost RESULTS=reports/self-benchmark-h200 OUT="$LOGS" bash benchmarks/self_benchmark.sh 2>&1 | tail -22

# Where each worker's 18-20 s of start-up goes (warm page cache: after the default run).
python3 benchmarks/worker_startup.py 2>&1 | tee "$LOGS/worker_startup.log"
# The kernels behind fastsoftmax's forward + backward microbench gap against torch.compile (issue 5).
timeout 90 python3 benchmarks/softmax_fwdbwd_kernels.py 2>&1 | tee "$LOGS/softmax_fwdbwd_kernels.log"

if [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) - 60 )) python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$LOGS/gpu_tests.log" | tail -12
fi
for patch in ${MICROBENCH:-fastsoftmax fusedsoftmax}; do
  [ "$(left)" -lt 60 ] && { echo "microbench $patch: skipped, out of time"; continue; }
  start=$(date +%s)
  timeout $(( $(left) - 20 )) python3 -m e2eprof microbench --patch "$patch" --no-sweep --out "$LOGS/microbench/$patch" \
    > "$LOGS/microbench-$patch.log" 2>&1
  echo "microbench $patch: exit $?, wall $(( $(date +%s) - start )) s"
  tail -22 "$LOGS/microbench-$patch.log"
done
tar czf "$OUT/results.tgz" -C "$LOGS" .
echo "time left at the end: $(left) s"
