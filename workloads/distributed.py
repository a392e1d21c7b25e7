"""Data-parallel training steps on torch.distributed: DistributedDataParallel and FSDP2 (`fully_shard`).

Each rank of a worker group runs one of these on its own seeded batch shard (`shard_seed`); the process group must
already be initialised (the e2eprof rank worker does that, launched by torchrun). What a real data-parallel loop
pays is all here: the wrapper's hooks, the gradient all-reduce (DDP) or the parameter all-gathers and gradient
reduce-scatters (FSDP), overlapped with backward as the wrapper schedules them.

`capture` returns the gradients after the collective: DDP averages them over ranks, FSDP's sharded gradients are
gathered whole. So every rank's capture holds the same gradients, and they equal the mean over all ranks' shards of
the single-process gradient, which is what `reference_capture` computes (in fp64, without any process group).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .batches import synthetic_token_batches
from .loops import TrainWorkload

# Far apart, so rank r's shards never reuse the seed a neighbouring run (seed + 1) gives rank 0.
SHARD_SEED_STRIDE = 1_000_003


def shard_seed(seed: int, rank: int) -> int:
    """Seed of rank `rank`'s batches. Rank 0 gets seed + 1, exactly the single-process run's batches."""
    return seed + 1 + SHARD_SEED_STRIDE * rank


def _require_process_group(name: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"workload {name!r} runs inside a torch.distributed worker group: "
                         "launch it with e2eprof compare --nproc N (or under torchrun)")


class DDPTrainWorkload(TrainWorkload):
    """`train` with the model wrapped in DistributedDataParallel: gradients are averaged over ranks in backward."""

    name = "train-ddp"

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        _require_process_group(self.name)
        super().__init__(model, device, precision, **options)
        cuda = self.device.type == "cuda"
        # The wrapper only; parameters, optimizer and captured names stay those of the bare model.
        self.wrapped = torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if cuda else None)

    def _forward(self, **inputs):
        return self.wrapped(**inputs)


class FSDPTrainWorkload(TrainWorkload):
    """`train` with FSDP2: each transformer block and then the whole model `fully_shard`-ed over all ranks.

    The blocks are the classes the model names in `_no_split_modules` (GPT2Block, LlamaDecoderLayer, ...), the
    units Hugging Face's own FSDP integration wraps. Sharding changes the model in place (its parameters become
    DTensors), so the optimizer is built over the sharded parameters, as an FSDP2 loop does.
    """

    name = "train-fsdp"

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        _require_process_group(self.name)
        model.to(device)
        shard_model(model, torch.device(device))
        super().__init__(model, device, precision, **options)

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        # A sharded gradient holds 1/world of the tensor: gather it whole (a collective every rank runs in step).
        full = t.full_tensor() if is_dtensor(t) else t
        return super()._out(full)


def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """fully_shard every block named in `_no_split_modules`, then the root; a model sharded already is left alone."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:  # torch < 2.6 kept FSDP2 under _composable
        from torch.distributed._composable.fsdp import FSDPModule, fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    # A torch.compile'd model (the compile arm) is sharded inside its wrapper, which then compiles the sharded model.
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, FSDPModule):
        return
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules())[1:]:
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        from torch.distributed._tensor import DTensor
    return isinstance(t, DTensor)


def reference_capture(model64: torch.nn.Module, device: torch.device | str, rank_batches: list[torch.Tensor]) -> dict:
    """fp64 outputs that a data-parallel capture must match, from an unwrapped fp64 model, no process group.

    rank_batches[r] is rank r's capture batch. Loss and logits are rank 0's (its own shard); each gradient is the
    mean over ranks of the single-process gradient on that rank's batch: what an averaging all-reduce produces.
    """
    train = TrainWorkload(model64, device, "fp64")
    total: dict[str, torch.Tensor] = {}
    for r, batch in enumerate(rank_batches):
        outputs = train.capture(batch)
        if r == 0:
            total = {k: v for k, v in outputs.items() if not k.startswith("grad/")}
        for key, value in outputs.items():
            if key.startswith("grad/"):
                total[key] = total[key] + value if key in total else value.clone()
    return {k: (v / len(rank_batches) if k.startswith("grad/") else v) for k, v in total.items()}


def rank_capture_batches(seed: int, world: int, batch: int, seq: int, vocab_size: int) -> list[torch.Tensor]:
    """Every rank's capture batch (its first seeded batch), rebuilt anywhere from the seeds alone."""
    return [synthetic_token_batches(1, batch, seq, vocab_size, seed=shard_seed(seed, r), pin=False)[0]
            for r in range(world)]


DISTRIBUTED_WORKLOADS = {"train-ddp": DDPTrainWorkload, "train-fsdp": FSDPTrainWorkload}
