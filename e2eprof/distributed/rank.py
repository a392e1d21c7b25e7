"""One rank of an arm's data-parallel worker group; torchrun starts N of these per arm (`-m e2eprof.distributed.rank`).

Rank 0 connects back to the parent (multiprocessing.connection, authkey from the environment), receives the arm's
WorkerSetup and then one command at a time, exactly as a single worker does over its pipe. Each command is broadcast
to every rank over a gloo group (commands and results travel on the CPU, never on the GPU's streams), every rank runs
it, and rank 0 gathers the answers, merges them (merge.py) and replies.

A rank that raises cannot report over the group: the other ranks may be waiting in the step's own collectives. It
writes its error to the errors folder and exits; torchrun then stops the whole group, and the parent reports the
arm failed with the earliest rank's error (ArmFailed, as for a single worker).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
import traceback
from multiprocessing.connection import Client
from pathlib import Path

import torch
import torch.distributed as dist

from e2eprof.distributed import ENV_ADDRESS, ENV_AUTHKEY, ENV_BACKEND, ENV_ERRORS, die_with_parent
from e2eprof.distributed.merge import merge
from e2eprof.harness.protocol import WorkerSetup
from e2eprof.harness.worker import ArmWorker, _save_outputs
from e2eprof.workloads.distributed import (DISTRIBUTED_WORKLOADS, is_dtensor, rank_capture_batches, reference_capture,
                                           shard_seed)
from e2eprof.workloads.models import describe


def rank_path(path: str, rank: int) -> str:
    """Where rank `rank` saves a capture the parent asked for at `path` (rank 0 uses `path` itself)."""
    if rank == 0:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


class RankWorker(ArmWorker):
    """An ArmWorker that is one rank: its own device and batch shard, collective decisions, fp64 reference on rank 0."""

    def __init__(self, setup: WorkerSetup, rank: int, world: int, local_rank: int, control):
        device = f"cuda:{local_rank}" if setup.device.startswith("cuda") else setup.device
        super().__init__(dataclasses.replace(setup, device=device))
        self.rank, self.world, self.control = rank, world, control

    def build(self) -> dict:
        result = super().build()
        self.vocab_size = result["model"]["vocab_size"]
        cuda = self.device.type == "cuda"
        uuid = getattr(torch.cuda.get_device_properties(self.device), "uuid", None) if cuda else None
        return result | {"device": str(self.device), "gpu_uuid": str(uuid) if uuid is not None else None}

    def _batch_seed(self) -> int:
        return shard_seed(self.setup.seed, self.rank)

    def _agree(self, decision: bool) -> bool:
        flag = [decision]
        dist.broadcast_object_list(flag, src=0, group=self.control)
        return bool(flag[0])

    def _restore_pristine(self) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if not any(is_dtensor(p) for p in self.model.parameters()):
            return super()._restore_pristine()
        # FSDP has sharded the model: its state dict holds DTensors, the pristine copy whole tensors.
        set_model_state_dict(self.model, self.pristine, options=StateDictOptions(full_state_dict=True))

    def capture(self, workload: str, path: str, verify: bool, extended: bool = True) -> dict:
        return super().capture(workload, rank_path(path, self.rank), verify, extended)

    def trained_like(self, workload: str) -> dict:
        if workload in DISTRIBUTED_WORKLOADS:
            # FSDP shards the weights the transform would move, and each rank's pass would need its own fp64
            # check; the kernel's calls meet the same values in a single-process run of the model.
            return {"op_checks": [], "skipped": f"{workload} is data-parallel: run the train or infer workload "
                                                "for the trained-like capture"}
        return super().trained_like(workload)

    def reference(self, workload: str, path: str, host_fallback: bool = True) -> dict:
        """fp64 outputs a data-parallel capture must match, computed on rank 0 alone from a fresh stock model."""
        if workload not in DISTRIBUTED_WORKLOADS:
            return super().reference(workload, path, host_fallback)
        if self.applied is not None:
            raise RuntimeError("the fp64 reference must come from an unpatched arm")
        if self.rank != 0:
            return {}
        model64 = self._fresh_fp64_model()
        batches = rank_capture_batches(self.setup.seed, self.world, self.setup.batch, self.setup.seq,
                                       describe(model64)["vocab_size"])
        outputs = reference_capture(model64, self.device, batches)
        del model64
        path = _save_outputs(outputs, path)
        return {"path": path, "keys": sorted(outputs)}


def _write_error(errors_dir: str, rank: int, exc: BaseException) -> None:
    """rank<N>.json with the error, written whole (temporary name, then rename) so the parent never reads half."""
    record = {"rank": rank, "type": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else "",
              "traceback": traceback.format_exc(limit=20), "unix_ns": time.time_ns()}
    final = Path(errors_dir) / f"rank{rank}.json"
    tmp = final.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, final)


def _next_command(conn) -> tuple[str, dict]:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return ("close", {})  # the parent is gone: the whole group leaves


def serve(worker: RankWorker, conn, control) -> None:
    """Answer the parent's commands until 'close': broadcast, run on every rank, gather, merge, reply."""
    while True:
        message = [_next_command(conn) if worker.rank == 0 else None]
        dist.broadcast_object_list(message, src=0, group=control)
        command, kwargs = message[0]
        if command == "close":
            return
        result = worker.dispatch(command, kwargs)
        answers = [None] * worker.world if worker.rank == 0 else None
        dist.gather_object(result, answers, dst=0, group=control)
        if worker.rank == 0:
            conn.send(("ok", merge(command, answers, worker.setup.arm.apply_patch)))


def main() -> None:
    # Ctrl-C is the parent's to handle (as for single workers); SIGTERM from torchrun or the death signal ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()  # if torchrun's agent is killed outright, its ranks go too
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    conn = None
    try:
        if rank == 0:
            host, _, port = os.environ[ENV_ADDRESS].rpartition(":")
            conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[ENV_AUTHKEY]))
        backend = os.environ.get(ENV_BACKEND, "gloo")
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend)
        control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
        setup = [conn.recv() if rank == 0 else None]
        dist.broadcast_object_list(setup, src=0, group=control)
        serve(RankWorker(setup[0], rank, world, local_rank, control), conn, control)
    except BaseException as exc:  # noqa: BLE001 - reported through the errors folder; torchrun stops the group
        if ENV_ERRORS in os.environ:  # unset on another node's ranks: torchrun's own report has to do there
            _write_error(os.environ[ENV_ERRORS], rank, exc)
        traceback.print_exc()  # into torchrun's log
        os._exit(1)
    if conn is not None:
        try:
            conn.send(("ok", {}))  # the reply to 'close'
        except OSError:
            pass  # the parent left first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
