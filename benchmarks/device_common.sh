# The preamble shared by the scripts that run on the lent GPU machine (benchmarks/h200_*.sh, self_benchmark.sh,
# microbench_all.sh). Each script sources it right after `set -uo pipefail`, from the repository root:
#   source "$(dirname "$0")/device_common.sh"
# Sourcing it starts no GPU work: it sets the variables below and defines the functions; the script calls them.

# Where results go: the device call returns only what lands under $OUT (the default is for a run by hand).
OUT=${OUT:-/tmp/e2eprof-out}
mkdir -p "$OUT"
# Python's output through `| tee` and `| grep` arrives as it is printed, so a call cut short still shows how far it got.
export PYTHONUNBUFFERED=1
# Nothing installed: e2eprof runs from the checkout (e2eprof/__init__.py finds kernels/ and workloads/) with the
# image's torch, transformers and triton; a PYTHONPATH already set is kept behind it.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# device_deadline SECONDS: one device call may run 10 minutes, so a script plans against a deadline of SECONDS from
# now (SECONDS_AVAILABLE overrides it) and skips or shortens the later steps; left prints the seconds still left.
# A function, not set here: self_benchmark.sh reads DEADLINE from its caller with another meaning (seconds after which
# no new run starts).
device_deadline() { DEADLINE=$(( $(date +%s) + ${SECONDS_AVAILABLE:-$1} )); }
left() { echo $(( DEADLINE - $(date +%s) )); }

# What every result file is read against: when it was measured and the GPU's state then (clocks, temperature and
# power tell a throttled or shared GPU), and the Python stack it ran with.
GPU_QUERY=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw
env_gpu() {  # env_gpu [FIELDS]: the UTC time, then nvidia-smi's CSV of FIELDS (default $GPU_QUERY)
  date -u +%FT%TZ
  nvidia-smi --query-gpu="${1:-$GPU_QUERY}" --format=csv
}
env_versions() {  # one line: the versions of python, torch (and its CUDA), transformers and triton
  python3 -c 'import torch, transformers, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "triton", triton.__version__)'
}

# run_e2eprof NAME MIN_SECONDS ARGS...: one e2eprof command into $RUNS/NAME (RUNS and a device_deadline set by the
# caller), skipped when fewer than MIN_SECONDS are left; its log is $RUNS/NAME.log. Every finished run is archived
# at once into $OUT/results.tgz, so a call cut short still returns what finished. E2EPROF_EXTRA (a CPU dry run:
# "--device cpu --steps 6 --seq 16") goes after ARGS.
run_e2eprof() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "$name: skipped, $(left) s left" | tee -a "$RUNS/skipped.txt"; return; fi
  local start; start=$(date +%s)
  # shellcheck disable=SC2086  # E2EPROF_EXTRA is a list of options
  echo "\$ python3 -m e2eprof $* ${E2EPROF_EXTRA:-} --out $name" > "$RUNS/$name.log"
  timeout $(( $(left) - 10 )) python3 -m e2eprof "$@" ${E2EPROF_EXTRA:-} --out "$RUNS/$name" 2>&1 | grep -v "loss_type=None" >> "$RUNS/$name.log"
  echo "$name: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$RUNS/$name.log"
  grep -E "verdict|speedup|replaced|beats|point" "$RUNS/$name.log" | head -30
  tar czf "$OUT/results.tgz" -C "$RUNS" .
}
