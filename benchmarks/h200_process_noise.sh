#!/usr/bin/env bash
# One device call (< 10 min): where A/A false alarms come from (benchmarks/process_noise.py: 6 fresh gpt2-train
# processes, rounds with the layout kept vs re-allocated, plus a kernel-by-kernel spread of 24 profiled steps),
# then `PART=aa` A/A runs of issue 8's self-benchmark in the time left (appended to reports/self-benchmark-h200).
# Everything lands in one archive under $OUT. Installs nothing.
set -uo pipefail
OUT=${OUT:-/tmp/e2eprof-out}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEADLINE=$(( $(date +%s) + ${SECONDS_AVAILABLE:-570} ))
left() { echo $(( DEADLINE - $(date +%s) )); }
LOGS=$(mktemp -d)
mkdir -p "$OUT"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c 'import torch, transformers, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$LOGS/env.txt"

timeout "${NOISE_SECONDS:-260}" python3 benchmarks/process_noise.py --processes "${PROCESSES:-6}" --profile-steps 24 \
  --out "$LOGS/process-noise" 2>&1 | tee "$LOGS/process_noise.log"

if [ "$(left)" -gt 110 ]; then
  PART=aa RUNS=${RUNS:-12} DEADLINE=$(( $(left) - 60 )) OUT="$LOGS" bash benchmarks/self_benchmark.sh 2>&1 | tail -16
fi
tar czf "$OUT/results.tgz" -C "$LOGS" . && tar czf "$OUT/self-benchmark.tgz" reports/self-benchmark-h200
echo "time left at the end: $(left) s"
