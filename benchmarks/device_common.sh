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
