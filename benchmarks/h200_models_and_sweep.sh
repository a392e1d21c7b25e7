#!/usr/bin/env bash
# One device call (< 10 min) on the lent H200 for issues 7 and 5: BERT-base inference with fastgelu (erf GELU),
# a gpt2 + fastsoftmax sweep over 3 batch x 2 seq x 2 dtype points (train), gpt2 with the attention-fused softmax,
# and the microbenchmarks of the patches in MICROBENCH (default fusedsoftmax), in that order while time lasts
# (SWEEP=0 leaves the sweep out). One archive under $OUT; installs nothing.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
device_deadline 540
RUNS=$(mktemp -d)
{ env_gpu; env_versions; } 2>&1 | tee "$RUNS/env.txt"

run_e2eprof bert-base-fastgelu 90 compare --model bert-base --patch fastgelu --workload infer --reference sdpa --budget 20
[ "${SWEEP:-1}" = 1 ] && run_e2eprof gpt2-fastsoftmax-sweep 200 compare --model gpt2 --patch fastsoftmax --workload train --batch 1,4,8 --seq 256,1024 \
  --dtype bf16,fp32 --reference none --no-profile --steps 10 --block-steps 5 --budget 0
run_e2eprof gpt2-fusedsoftmax 90 compare --model gpt2 --patch fusedsoftmax --workload train,infer --reference sdpa --budget 15
for patch in ${MICROBENCH:-fusedsoftmax}; do  # e.g. MICROBENCH="fastgelu fastlayernorm rmsnorm swiglu"
  run_e2eprof "microbench-$patch" 60 microbench --patch "$patch" --no-sweep
done
echo "time left at the end: $(left) s"
