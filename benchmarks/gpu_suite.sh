#!/usr/bin/env bash
# The GPU measurements behind README's figures, on any CUDA machine, from the repository root:
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [PART ...]        (no PART: tests default)
#
# Parts (each writes under OUT_DIR/<part>/, with env.txt and one log per command):
#   tests          python3 -m pytest tests/gpu
#   default        the default command: e2eprof compare --model gpt2 --patch fastsoftmax
#   aa sensitivity overhead cost agreement
#                  benchmarks/self_benchmark.py --part PART; aa and sensitivity append to the tables in
#                  $RESULTS (default OUT_DIR/self-benchmark): point RESULTS at reports/self-benchmark-h200 to add runs;
#                  SELF_BENCHMARK_EXTRA adds options, e.g. "--workload decode --runs 14 --deadline 500" with
#                  RESULTS=reports/self-benchmark-h200-decode, or "--model llama-1b --batch 4 --workload infer";
#                  "--workload train,infer,decode" measures the three default workloads in each run (a row each)
#   results-table  every built-in kernel with both stock references (sdpa, compile), train and infer:
#                  gpt2 fusedsoftmax, fastgelu, fastlayernorm; llama-1b rmsnorm, swiglu at batch 4
#   sweep          gpt2 fastsoftmax train over batch 1,4,8 x seq 256,1024 x bf16,fp32
#   bert           bert-base fastgelu, infer, stock SDPA reference
#   microbench     e2eprof microbench for every built-in patch
#   tuning         benchmarks/tune_fastsoftmax.py (fastsoftmax's launch sweep)
#   process-noise  benchmarks/process_noise.py (what separates identical processes)
#   host-bound     benchmarks/process_spread.py on decode and generate (8 identical processes, with and without pinning)
#   startup        benchmarks/worker_startup.py (one worker's start-up, step by step)
#   multi-gpu      train-ddp and train-fsdp, --nproc 2 (needs two GPUs)
#   host-cost      benchmarks/host_overhead.py --device cuda --layers (each built-in op's host cost per call vs the stock op,
#                  and a forward call split into dispatcher, wrapper and Triton launch)
#   repeat         the default command twice on a fresh compile cache (OUT_DIR/repeat/compile-cache, Inductor's and
#                  Triton's caches in it whatever the environment sets): first and repeat,
#                  their phases side by side in repeat/phases.log (benchmarks/phase_breakdown.py), with each
#                  worker's start-up in seconds from the command's start
#   candidates     several candidates per run, Liger-Kernel beside ours (needs liger-kernel importable): gpt2 softmax
#                  (fastsoftmax, liger-softmax, fusedsoftmax) and layernorm; llama-1b norms and MLPs in inference,
#                  norms and liger-flce (memory) in training; candidates-gpt2 and candidates-llama run either half
#
# Environment: PYTHON (default python3); E2EPROF_EXTRA, options added to every e2eprof command (a CPU dry run:
# E2EPROF_EXTRA="--device cpu --steps 6 --seq 16" with MODEL=gpt2-tiny); MODEL overrides gpt2 in default,
# results-table, sweep and repeat; BUDGET the timing budget of each candidates run (default 12 s), REPLICAS its processes per arm (default 1); TIMEOUT (seconds, default none) bounds each command.
# DEADLINE (seconds from the suite's start, default none): no command starts after it, and a running one is
# stopped there (a stopped e2eprof run keeps the tables it wrote); a skipped command is listed in status.txt.
# For a machine lent for a fixed time: the suite ends before the lease does, and what ran comes back.
# Installs nothing: e2eprof runs from the checkout (PYTHONPATH) with the torch, transformers and triton installed.
set -uo pipefail

if [ "$#" -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
OUT=$1; shift
for var in TIMEOUT DEADLINE; do  # whole seconds, or the arithmetic below fails halfway through a suite
  value=${!var:-}
  if [ -n "$value" ] && ! [[ $value =~ ^[0-9]+$ ]]; then echo "gpu_suite: $var must be whole seconds, not '$value'" >&2; exit 2; fi
done
PARTS=("$@")
[ "${#PARTS[@]}" -eq 0 ] && PARTS=(tests default)
expanded=()
for part in "${PARTS[@]}"; do  # candidates is its two halves
  if [ "$part" = candidates ]; then expanded+=(candidates-gpt2 candidates-llama); else expanded+=("$part"); fi
done
PARTS=("${expanded[@]}")
PY=${PYTHON:-python3}
MODEL_=${MODEL:-gpt2}
RESULTS=${RESULTS:-$OUT/self-benchmark}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

env_txt() {  # the time, the GPU's state (clocks, temperature and power tell a throttled or shared GPU), the versions
  date -u +%FT%TZ
  nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
  "$PY" -c 'import torch, transformers, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "transformers", transformers.__version__, "triton", triton.__version__)' 2>&1
}

worst=0
SUITE_START=$(date +%s)
step() {  # step DIR NAME COMMAND...: run COMMAND, its output in DIR/NAME.log, its exit code and wall time in DIR/status.txt
  local dir=$1 name=$2; shift 2
  local start; start=$(date +%s)
  local limit=${TIMEOUT:-}
  if [ -n "${DEADLINE:-}" ]; then
    local left=$(( SUITE_START + DEADLINE - start ))
    if [ "$left" -le 0 ]; then
      echo "$name: skipped, the deadline (${DEADLINE} s) had passed" | tee -a "$dir/status.txt"
      [ "$worst" -lt 124 ] && worst=124
      return 0
    fi
    if [ -z "$limit" ] || [ "$left" -lt "$limit" ]; then limit=$left; fi
  fi
  echo "\$ $*" > "$dir/$name.log"
  if [ -n "$limit" ]; then timeout "$limit" "$@" >> "$dir/$name.log" 2>&1; else "$@" >> "$dir/$name.log" 2>&1; fi
  local code=$?
  echo "$name: exit $code, wall $(( $(date +%s) - start )) s" | tee -a "$dir/status.txt"
  [ "$code" -gt "$worst" ] && worst=$code
  return 0
}
compare() {  # compare DIR NAME ARGS...: one e2eprof command into DIR/NAME
  local dir=$1 name=$2; shift 2
  # shellcheck disable=SC2086  # E2EPROF_EXTRA is a list of options
  step "$dir" "$name" "$PY" -m e2eprof "$@" ${E2EPROF_EXTRA:-} --out "$dir/$name" --force
}

for part in "${PARTS[@]}"; do
  dir="$OUT/$part"
  mkdir -p "$dir"
  env_txt > "$dir/env.txt"
  case $part in
    tests) step "$dir" gpu_tests "$PY" -m pytest tests/gpu -q -p no:cacheprovider ;;
    default) compare "$dir" "$MODEL_-fastsoftmax" compare --model "$MODEL_" --patch fastsoftmax ;;
    aa|sensitivity|overhead|cost|agreement)
      mkdir -p "$RESULTS"
      # shellcheck disable=SC2086  # SELF_BENCHMARK_EXTRA is a list of options
      step "$dir" "$part" "$PY" benchmarks/self_benchmark.py --part "$part" --out "$RESULTS" ${SELF_BENCHMARK_EXTRA:-} ;;
    results-table)
      for patch in fusedsoftmax fastgelu fastlayernorm; do
        compare "$dir" "$MODEL_-$patch-references" compare --model "$MODEL_" --patch "$patch" --workload train,infer --budget 20
      done
      for patch in rmsnorm swiglu; do
        compare "$dir" "llama-1b-$patch-references" compare --model llama-1b --patch "$patch" --workload train,infer \
          --batch 4 --budget 15
      done ;;
    sweep) compare "$dir" "$MODEL_-fastsoftmax-sweep" compare --model "$MODEL_" --patch fastsoftmax --workload train \
             --batch 1,4,8 --seq 256,1024 --dtype bf16,fp32 --reference none --no-profile --steps 10 --block-steps 5 --budget 0 ;;
    bert) compare "$dir" bert-base-fastgelu compare --model bert-base --patch fastgelu --workload infer --reference sdpa --budget 20 ;;
    microbench)
      read -r -a patches <<< "$("$PY" -c 'from e2eprof.registry import BUILTIN_PATCHES; print(*BUILTIN_PATCHES)')"
      for patch in "${patches[@]}"; do compare "$dir" "$patch" microbench --patch "$patch"; done ;;
    tuning) step "$dir" tune_fastsoftmax "$PY" benchmarks/tune_fastsoftmax.py --out "$dir/tune_fastsoftmax.csv" ;;
    process-noise) step "$dir" process_noise "$PY" benchmarks/process_noise.py --processes 6 --profile-steps 24 --out "$dir/process-noise" ;;
    host-bound) step "$dir" process_spread "$PY" benchmarks/process_spread.py "$dir/host-bound" --model gpt2 \
                  --workload decode,generate --isolate none,all ;;
    startup) step "$dir" worker_startup "$PY" benchmarks/worker_startup.py ;;
    multi-gpu)
      export NCCL_NVLS_ENABLE=0
      for entry in "gpt2 fastsoftmax train-ddp" "llama-1b rmsnorm train-ddp --batch 4" "llama-1b swiglu train-ddp --batch 4" \
                   "gpt2 fastsoftmax train-fsdp" "llama-1b rmsnorm train-fsdp --batch 4"; do
        read -r model patch workload extra <<< "$entry"
        # shellcheck disable=SC2086  # extra is a list of options
        compare "$dir" "$model-$patch-$workload" compare --model "$model" --patch "$patch" --workload "$workload" \
          --nproc 2 --device cuda --reference sdpa --budget 20 ${extra:-}
      done ;;
    host-cost) step "$dir" host_overhead "$PY" benchmarks/host_overhead.py --device cuda --layers --out "$dir/host-cost" ;;
    repeat)
      # Every compiler cache in the fresh folder: a TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR set by the machine's
      # image wins over e2eprof's folder, and would hand the "first" run an earlier run's graphs.
      saved_caches=$(declare -p TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR 2>/dev/null)
      export E2EPROF_COMPILE_CACHE="$dir/compile-cache"
      export TORCHINDUCTOR_CACHE_DIR="$E2EPROF_COMPILE_CACHE/inductor" TRITON_CACHE_DIR="$E2EPROF_COMPILE_CACHE/triton"
      rm -rf "$E2EPROF_COMPILE_CACHE"
      compare "$dir" "$MODEL_-fastsoftmax-first" compare --model "$MODEL_" --patch fastsoftmax
      compare "$dir" "$MODEL_-fastsoftmax-repeat" compare --model "$MODEL_" --patch fastsoftmax
      unset E2EPROF_COMPILE_CACHE TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
      eval "$saved_caches"
      step "$dir" phases "$PY" benchmarks/phase_breakdown.py "$dir/$MODEL_-fastsoftmax-first" \
        "$dir/$MODEL_-fastsoftmax-repeat" --workers ;;
    candidates-gpt2)
      # One process per arm by default (REPLICAS): three candidates beside both references at two per arm are ten
      # processes, and on the H200 those had not finished training's correctness checks after six minutes. Six gpt2
      # 8 x 1024 training processes hold ~21 GB each: on an 80 GB card two of them run out of memory (add --seq 512).
      # Decode too for the softmax kernels (the decoder replays a CUDA graph, so capturability is checked); fastgelu
      # rides with the layernorm kernels (another site, the same SDPA baseline), so every gpt2 kernel is measured.
      compare "$dir" gpt2-softmax-candidates compare --model gpt2 --patch fastsoftmax --patch liger-softmax \
        --patch fusedsoftmax --workload train,infer,decode --replicas "${REPLICAS:-1}" --budget "${BUDGET:-12}"
      compare "$dir" gpt2-layernorm-candidates compare --model gpt2 --patch fastlayernorm --patch liger-layernorm \
        --patch fastgelu --workload train,infer --replicas "${REPLICAS:-1}" --budget "${BUDGET:-12}" ;;
    candidates-llama)
      # Inference with both stock references; training with one process per arm and no reference arms, because
      # five llama-1b training processes and the fp64 reference do not fit in one 141 GB card.
      compare "$dir" llama-1b-infer-candidates compare --model llama-1b --batch 8 --patch rmsnorm --patch liger-rmsnorm \
        --patch swiglu --patch liger-swiglu --workload infer --replicas "${REPLICAS:-1}" --no-profile \
        --budget "${BUDGET:-12}"
      compare "$dir" llama-1b-train-candidates compare --model llama-1b --batch 4 --patch rmsnorm --patch liger-rmsnorm \
        --patch liger-flce --workload train --replicas 1 --reference none --no-profile --budget "${BUDGET:-12}" ;;
    *) echo "gpu_suite: unknown part '$part'" >&2; exit 2 ;;
  esac
done
exit "$worst"
