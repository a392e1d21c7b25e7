#!/usr/bin/env bash
# One device call (< 10 min) on the lent H200: the default `compare --model gpt2 --patch fastsoftmax` timed by phase
# (issue 2's run time, issue 8's cost part), fastsoftmax's launch-configuration sweep (issue 5's roofline target),
# the GPU test suite, then issue 8's overhead part if time is left. Results under $OUT; installs nothing.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
device_deadline 570

{ env_gpu; env_versions; } 2>&1 | tee "$OUT/env.txt"

# The cost part runs exactly the default compare (no options but --out) and splits its wall time by phase.
PART=cost RESULTS=reports/self-benchmark-h200 bash benchmarks/self_benchmark.sh 2>&1 | tail -25

timeout $(( $(left) - 60 )) python3 benchmarks/tune_fastsoftmax.py --out "$OUT/tune_fastsoftmax.csv" 2>&1 \
  | tee "$OUT/tune_fastsoftmax.log" | tail -70

if [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 40 )) python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
fi
if [ "$(left)" -gt 90 ]; then
  PART=overhead RESULTS=reports/self-benchmark-h200 DEADLINE=$(( $(left) - 45 )) timeout $(( $(left) - 10 )) \
    bash benchmarks/self_benchmark.sh 2>&1 | tail -8
fi
echo "time left at the end: $(left) s"
