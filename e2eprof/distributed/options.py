"""--nproc, --nnodes and --rdzv-endpoint: which runs are data-parallel, and what torchrun is told.

Kept apart from config.py so the core config only holds the three fields; everything about them is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

from e2eprof.errors import UsageError

DISTRIBUTED_WORKLOAD_NAMES = ("train-ddp", "train-fsdp")


@dataclass(frozen=True)
class LaunchSpec:
    """How each arm's worker group is launched: nproc ranks on this node (of nnodes), rendezvous at an endpoint."""

    nproc: int
    nnodes: int = 1
    rdzv_endpoint: str | None = None

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def torchrun_args(self, arm_index: int) -> list[str]:
        """torchrun's options for the arm_index-th arm. Every arm is its own group, so each needs its own
        rendezvous: --standalone picks a free local port; an endpoint host:port gives arm i the port port + i.
        This node is node rank 0 (static rendezvous), so it holds rank 0, the rank that talks to the parent."""
        if self.rdzv_endpoint is None:
            return ["--standalone", "--nproc-per-node", str(self.nproc)]
        host, port = split_endpoint(self.rdzv_endpoint)
        return ["--nnodes", str(self.nnodes), "--node-rank", "0", "--nproc-per-node", str(self.nproc),
                "--master-addr", host, "--master-port", str(port + arm_index)]


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint: expected HOST:PORT, got '{endpoint}'")
    return host, int(port)


def is_distributed(workloads, nproc: int, nnodes: int) -> bool:
    return nproc > 1 or nnodes > 1 or any(w in DISTRIBUTED_WORKLOAD_NAMES for w in workloads)


def check_launch(*, workloads: tuple[str, ...], device: str, nproc, nnodes, rdzv_endpoint, find_max_batch: bool) -> LaunchSpec | None:
    """The LaunchSpec of a data-parallel run, None for a single-process one; UsageError (one line) for bad options."""
    for name, value in (("nproc", nproc), ("nnodes", nnodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"--{name}: must be an integer >= 1, got {value!r}")
    if not is_distributed(workloads, nproc, nnodes):
        if rdzv_endpoint is not None:
            raise UsageError("--rdzv-endpoint: only for data-parallel runs (--nproc N with --workload train-ddp or train-fsdp)")
        return None
    single = [w for w in workloads if w not in DISTRIBUTED_WORKLOAD_NAMES]
    if single:
        raise UsageError(f"--workload: a data-parallel run (--nproc {nproc}) runs {' or '.join(DISTRIBUTED_WORKLOAD_NAMES)}; "
                         f"'{single[0]}' is a single-process workload: run it without --nproc")
    if len(workloads) > 1:
        raise UsageError("--workload: train-ddp and train-fsdp wrap the same model in different ways; run them one at a time")
    if find_max_batch:
        raise UsageError("--find-max-batch: not available for data-parallel runs yet; run it without --nproc")
    if nnodes > 1 and rdzv_endpoint is None:
        raise UsageError(f"--nnodes {nnodes}: needs --rdzv-endpoint HOST:PORT, the address every node meets at")
    if rdzv_endpoint is not None:
        split_endpoint(rdzv_endpoint)
    if device.startswith("cuda"):
        if ":" in device:
            raise UsageError(f"--device: '{device}' names one GPU; a data-parallel run takes GPUs 0..N-1, use --device cuda")
        import torch

        visible = torch.cuda.device_count()
        if nproc > visible:
            raise UsageError(f"--nproc: {nproc} ranks need {nproc} GPUs on this machine, {visible} visible "
                             "(use --device cpu to run the ranks on the CPU with gloo)")
    return LaunchSpec(nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint)
