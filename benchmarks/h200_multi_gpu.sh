#!/usr/bin/env bash
# Data-parallel runs (issue 9) on a lent 2-GPU H200 machine (kind nvidia-h200-x2) in one device call (< 10 min):
# gpt2 + fastsoftmax and llama-1b + rmsnorm / swiglu with --nproc 2 (DDP, then FSDP2 in the time left).
# NCCL runs with NVLink multicast off (NCCL_NVLS_ENABLE=0), as the lent machines need. Results under $OUT.
# Installs nothing: runs from the checkout (PYTHONPATH) with the image's torch, transformers and triton.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"
export NCCL_NVLS_ENABLE=0
RUNS=$(mktemp -d)
device_deadline 560

{  # with each GPU's index and UUID, how they are linked, and NCCL's version and the GPU count
  env_gpu index,name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw
  nvidia-smi topo -m
  python3 -c 'import torch, transformers, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), "transformers", transformers.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env-multi-gpu.txt"

# The fast distributed tests (option checks, merge, slowest rank) on this image's torch.
python3 -m pytest tests/e2eprof/test_distributed.py tests/workloads/test_distributed.py -q -m "not slow" -p no:cacheprovider \
  2>&1 | tee "$OUT/tests_multi_gpu.log" | tail -3

# name model patch workload [extra options]; llama-1b at batch 4 x 1024 per rank, as in the single-GPU runs.
RUN_LIST=(
  "gpt2-fastsoftmax-ddp gpt2 fastsoftmax train-ddp"
  "llama1b-rmsnorm-ddp llama-1b rmsnorm train-ddp --batch 4"
  "llama1b-swiglu-ddp llama-1b swiglu train-ddp --batch 4"
  "gpt2-fastsoftmax-fsdp gpt2 fastsoftmax train-fsdp"
  "llama1b-rmsnorm-fsdp llama-1b rmsnorm train-fsdp --batch 4"
)
for entry in "${RUN_LIST[@]}"; do
  read -r name model patch workload extra <<< "$entry"
  [ "$(left)" -lt 90 ] && { echo "compare $name: skipped, out of time" | tee -a "$OUT/summary-multi-gpu.txt"; continue; }
  start=$(date +%s)
  # --reference sdpa: compiling a DDP/FSDP model takes minutes of the call's 10; the sdpa arm is the stock yardstick.
  timeout $(( $(left) - 30 )) python3 -m e2eprof compare --model "$model" --patch "$patch" --workload "$workload" \
    --nproc 2 --device cuda --reference sdpa --budget 20 ${extra:-} --out "$RUNS/$name" 2>&1 \
    | grep -v "loss_type=None" > "$OUT/compare-$name.log"
  echo "compare $name: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/summary-multi-gpu.txt"
  grep -E "verdict|ranks:|communication|replaced op" "$OUT/compare-$name.log" | tee -a "$OUT/summary-multi-gpu.txt"
done
tar czf "$OUT/reports-multi-gpu.tgz" -C "$RUNS" .
