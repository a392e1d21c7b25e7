#!/usr/bin/env bash
# Issue 8 with two processes per compared arm (e2eprof's GPU default since replicas): A/A runs, then planted
# slowdowns, in one device call of under 10 minutes, so that one call already holds evidence on both targets.
#   AA_S (default 300): seconds after which no new A/A run starts; SENS_S (default 250): the same for planted runs,
#   counted from the start of the planted part. LEVELS (default 0.01), SENS_RUNS (default 10) per level.
#   Extra arguments go to both self_benchmark.py calls (a CPU dry run: --model gpt2-tiny --steps 6 --seq 16).
#   Each part is cut 60 s after its deadline, so the copy and archive at the end always run.
#   GPU_TEST=1 runs tests/gpu/test_build_on_device.py first (the workers build their models on the GPU).
# Results accumulate in RESULTS (default reports/self-benchmark-h200, in the checkout); this call's run folders come
# back in one archive, with the two parts' tables and sections.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
R=${RESULTS:-reports/self-benchmark-h200}
mkdir -p "$R/runs"

{ env_gpu "$GPU_QUERY,memory.used"; env_versions; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
touch "$OUT/.started"

if [ "${GPU_TEST:-0}" = 1 ]; then
  timeout 120 python3 -m pytest -q tests/gpu/test_build_on_device.py >"$OUT/gputest.log" 2>&1
  tail -2 "$OUT/gputest.log"
fi

timeout $(( ${AA_S:-300} + 60 )) python3 benchmarks/self_benchmark.py --part aa --runs 40 --out "$R" --deadline "${AA_S:-300}" "$@" 2>&1 \
  | grep -v "loss_type=None" >"$OUT/aa.log"
grep -E "exit|measured" "$OUT/aa.log" | tail -25
timeout $(( ${SENS_S:-250} + 60 )) python3 benchmarks/self_benchmark.py --part sensitivity --runs "${SENS_RUNS:-10}" --levels "${LEVELS:-0.01}" --out "$R" \
  --deadline "${SENS_S:-250}" "$@" 2>&1 | grep -v "loss_type=None" >"$OUT/sensitivity.log"
grep -E "exit|measured|^\|" "$OUT/sensitivity.log" | tail -25

cp "$R"/aa.md "$R"/aa.parquet "$R"/sensitivity.md "$R"/sensitivity.parquet "$OUT/" 2>/dev/null
find "$R/runs" -maxdepth 1 -newer "$OUT/.started" -printf "%P\n" | tar czf "$OUT/runs.tgz" -C "$R/runs" -T -
