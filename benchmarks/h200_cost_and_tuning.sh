#!/usr/bin/env bash
# One device call (< 10 min) on the lent H200: the default `compare --model gpt2 --patch fastsoftmax` timed by phase
# (issue 2's run time, issue 8's cost part), fastsoftmax's launch-configuration sweep (issue 5's roofline target),
# the GPU test suite, then issue 8's overhead part if time is left. Results under $OUT; installs nothing.
set -uo pipefail
OUT=${OUT:-/tmp/e2eprof-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEADLINE=$(( $(date +%s) + ${SECONDS_AVAILABLE:-570} ))
left() { echo $(( DEADLINE - $(date +%s) )); }

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c 'import torch, transformers, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"

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
