#!/usr/bin/env bash
# Issue 8's self-benchmark on the lent H200, one part per device call (each under 10 minutes). Results under $OUT.
#   PART=aa|sensitivity|overhead|cost|agreement (default aa); extra arguments go to benchmarks/self_benchmark.py.
#   RESULTS (default reports/self-benchmark-h200, inside the checkout): aa and sensitivity append to the Parquet
#   already there, so extract the previous call's archive into the checkout before the next call to accumulate runs.
#   DEADLINE (default 420): seconds after which no new run starts, leaving room for the last run inside 10 minutes.
# A plan that fits (about 45 s per run on the H200, so 9 runs per call; benchmarks/h200_replicas.sh runs A/A and
# planted runs together in one call):
#   PART=aa  RUNS=9 (twice or three times, for at least 20 A/A runs); then
#   PART=sensitivity RUNS=9 LEVELS=0.01 (the target level; takes the baseline median from aa.parquet), then
#   PART=sensitivity RUNS=2 LEVELS=0.005,0.02,0.05; PART=overhead; PART=agreement;
#   PART=cost alone: the default compare (compile arm, profiling) took 506 s on 2026-12-02, close to the 10 minutes.
# Installs nothing: e2eprof runs from the checkout (PYTHONPATH) with the image's torch, transformers and triton.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
PART=${PART:-aa}
RESULTS=${RESULTS:-reports/self-benchmark-h200}
mkdir -p "$RESULTS"

env_gpu >"$OUT/env-$PART.txt" 2>&1

args=(--part "$PART" --out "$RESULTS" --deadline "${DEADLINE:-420}")
[ -n "${RUNS:-}" ] && args+=(--runs "$RUNS")
[ -n "${LEVELS:-}" ] && args+=(--levels "$LEVELS")
python3 benchmarks/self_benchmark.py "${args[@]}" "$@" 2>&1 | grep -v "loss_type=None" | tee "$OUT/$PART.log" | tail -30
echo "self_benchmark $PART: exit ${PIPESTATUS[0]}" | tee -a "$OUT/$PART.log"

# Few files come back from the device: the part's table and section as they are, everything else in one archive.
cp "$RESULTS/$PART.md" "$RESULTS/$PART.parquet" "$OUT/" 2>/dev/null
tar czf "$OUT/self-benchmark-$PART.tgz" "$RESULTS"
