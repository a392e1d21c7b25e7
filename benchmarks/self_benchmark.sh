#!/usr/bin/env bash
# Issue 8's self-benchmark on the lent H200: one or more parts per device call (each call under 10 minutes).
#   PART=aa|sensitivity|overhead|cost|agreement (default aa), or several: PART="agreement cost" runs them in turn.
#   Extra arguments go to every benchmarks/self_benchmark.py call.
#   RESULTS (default reports/self-benchmark-h200, inside the checkout): aa and sensitivity append to the Parquet
#   already there, so extract the previous call's results.tgz into the checkout before the next call to accumulate runs.
#   DEADLINE (default 420): seconds after which no new run starts, leaving room for the last run inside 10 minutes.
# A plan that fits (about 45 s per A/A or planted run on the H200; benchmarks/h200_replicas.sh runs A/A and planted
# runs together in one call): PART=overhead (about 2 min); PART="agreement cost" (about 1 + 5 min: the default
# compare took 291 s with its 6 workers on 2026-12-03).
# Installs nothing: e2eprof runs from the checkout (PYTHONPATH) with the image's torch, transformers and triton.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
PARTS=${PART:-aa}
RESULTS=${RESULTS:-reports/self-benchmark-h200}
mkdir -p "$RESULTS/runs"
started=$(mktemp)  # outside $OUT: only about 8 files come back from a device call, so every one counts

args=(--out "$RESULTS" --deadline "${DEADLINE:-420}")
[ -n "${RUNS:-}" ] && args+=(--runs "$RUNS")
[ -n "${LEVELS:-}" ] && args+=(--levels "$LEVELS")
for part in $PARTS; do
  env_gpu >>"$OUT/env.txt" 2>&1
  python3 benchmarks/self_benchmark.py --part "$part" "${args[@]}" "$@" 2>&1 | grep -v "loss_type=None" | tee "$OUT/$part.log" | tail -30
  echo "self_benchmark $part: exit ${PIPESTATUS[0]}" | tee -a "$OUT/$part.log"
  cp "$RESULTS/$part.md" "$OUT/" 2>/dev/null
done

# Every part's table and the run folders this call wrote, in one archive (tar paths are relative to the checkout).
{ for part in $PARTS; do ls "$RESULTS/$part.md" "$RESULTS/$part.parquet" 2>/dev/null; done
  find "$RESULTS/runs" -mindepth 1 -maxdepth 1 -newer "$started"; } | tar czf "$OUT/results.tgz" -T -
