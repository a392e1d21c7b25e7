#!/usr/bin/env bash
# Issue 8 with two processes per compared arm (e2eprof's GPU default since replicas): A/A runs, then planted
# slowdowns, in one device call of under 10 minutes, so that one call already holds evidence on both targets.
#   AA_S (default 300): seconds after which no new A/A run starts; SENS_S (default 250): the same for planted runs,
#   counted from the start of the planted part. LEVELS (default 0.01), SENS_RUNS (default 10) per level.
#   Extra arguments go to both self_benchmark.py calls (a CPU dry run: --model gpt2-tiny --steps 6 --seq 16).
#   Each part is cut 60 s after its deadline, so the copy and archive at the end always run.
# Results accumulate in RESULTS (default reports/self-benchmark-h200, in the checkout): the device starts from this
# machine's tree, so extract the previous call's results.tgz here before the next call, or its runs are numbered (and
# seeded) again from the same index. This call's run folders come back in results.tgz with every table.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
R=${RESULTS:-reports/self-benchmark-h200}
mkdir -p "$R/runs"

{ env_gpu "$GPU_QUERY,memory.used"; env_versions; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
started=$(mktemp)  # outside $OUT: only about 8 files come back from a device call, so every one counts

timeout $(( ${AA_S:-300} + 60 )) python3 benchmarks/self_benchmark.py --part aa --runs 40 --out "$R" --deadline "${AA_S:-300}" "$@" 2>&1 \
  | grep -v "loss_type=None" >"$OUT/aa.log"
grep -E "exit|measured" "$OUT/aa.log" | tail -25
timeout $(( ${SENS_S:-250} + 60 )) python3 benchmarks/self_benchmark.py --part sensitivity --runs "${SENS_RUNS:-10}" --levels "${LEVELS:-0.01}" --out "$R" \
  --deadline "${SENS_S:-250}" "$@" 2>&1 | grep -v "loss_type=None" >"$OUT/sensitivity.log"
grep -E "exit|measured|^\|" "$OUT/sensitivity.log" | tail -25

# The tables go into the archive as well as beside it: a call that returns too many files keeps them there.
cp "$R"/aa.md "$R"/aa.parquet "$R"/sensitivity.md "$R"/sensitivity.parquet "$OUT/" 2>/dev/null
{ ls "$R"/*.md "$R"/*.parquet; find "$R/runs" -mindepth 1 -maxdepth 1 -newer "$started"; } | tar czf "$OUT/results.tgz" -T -
