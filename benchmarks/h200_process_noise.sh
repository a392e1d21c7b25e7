#!/usr/bin/env bash
# One device call (< 10 min): where A/A false alarms come from (benchmarks/process_noise.py: 6 fresh gpt2-train
# processes, rounds with the layout kept vs re-allocated, plus a kernel-by-kernel spread of 24 profiled steps),
# then `PART=aa` A/A runs of issue 8's self-benchmark in the time left (appended to reports/self-benchmark-h200).
# Everything lands in one archive under $OUT. Installs nothing.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
device_deadline 570
LOGS=$(mktemp -d)
{ env_gpu; env_versions; } 2>&1 | tee "$LOGS/env.txt"

timeout "${NOISE_SECONDS:-260}" python3 benchmarks/process_noise.py --processes "${PROCESSES:-6}" --profile-steps 24 \
  --out "$LOGS/process-noise" 2>&1 | tee "$LOGS/process_noise.log"

if [ "$(left)" -gt 110 ]; then
  PART=aa RUNS=${RUNS:-12} DEADLINE=$(( $(left) - 60 )) OUT="$LOGS" bash benchmarks/self_benchmark.sh 2>&1 | tail -16
fi
tar czf "$OUT/results.tgz" -C "$LOGS" . && tar czf "$OUT/self-benchmark.tgz" reports/self-benchmark-h200
echo "time left at the end: $(left) s"
