#!/usr/bin/env bash
# `e2eprof microbench` for every built-in patch (or the patches named as arguments), one report directory each,
# all under one directory; runs from the checkout on the GPU machine, installs nothing.
# Usage (repository root): bash benchmarks/microbench_all.sh [PATCH ...]
#   OUT=/dir (default /tmp/e2eprof-out), EXTRA="--trials 50 --no-sweep" (passed to every run).
# Each patch is a separate process, so a crash in one leaves the others' tables; the exit code is the worst one.
# Budget: with the sweep and torch.compile on, expect one to a few minutes per patch on an H200 (compilation
# dominates); name a subset of patches to stay inside one 10-minute device call.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
RUNS="$OUT/microbench"
mkdir -p "$RUNS"

if [ "$#" -gt 0 ]; then
  PATCHES=("$@")
else
  # planted-slowdown is a known slowdown used to test the sign-off; its microbenchmark shows it too.
  read -r -a PATCHES <<< "$(python3 -c 'from e2eprof.registry import BUILTIN_PATCHES; print(*BUILTIN_PATCHES)')"
fi

worst=0
for patch in "${PATCHES[@]}"; do
  start=$(date +%s)
  # shellcheck disable=SC2086  # EXTRA is a list of options on purpose
  python3 -m e2eprof microbench --patch "$patch" --out "$RUNS/$patch" --force ${EXTRA:-} 2>&1 | tee "$RUNS/$patch.log"
  code=${PIPESTATUS[0]}
  echo "microbench $patch: exit code $code, wall $(( $(date +%s) - start )) s" | tee -a "$RUNS/summary.txt"
  [ "$code" -gt "$worst" ] && worst=$code
done
tar czf "$OUT/microbench.tgz" -C "$RUNS" .
exit "$worst"
