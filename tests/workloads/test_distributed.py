"""Data-parallel workloads on gpt2-tiny: shard seeds, the fp64 reference of an averaging all-reduce, and DDP / FSDP2
in a one-rank gloo group in this process (the 2-rank runs are in tests/e2eprof/test_distributed.py)."""

import pytest
import torch
import torch.distributed as dist

from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.distributed import rank_capture_batches, reference_capture, shard_seed
from e2eprof.workloads.loops import make_workload
from e2eprof.workloads.models import build_model, resolve_model

CPU = torch.device("cpu")
B, T, V = 1, 16, 512


def tiny():
    return build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)


def rel_err(a, b):
    return (torch.linalg.norm((a - b).double()) / torch.linalg.norm(b.double()).clamp_min(1e-30)).item()


def grads(outputs):
    return {k: v for k, v in outputs.items() if k.startswith("grad/")}


def test_rank_zero_gets_the_single_process_batches_and_other_ranks_their_own():
    assert shard_seed(7, 0) == 8
    assert len({shard_seed(7, r) for r in range(8)}) == 8
    shards = rank_capture_batches(7, 2, B, T, V)
    assert torch.equal(shards[0], synthetic_token_batches(4, B, T, V, seed=8, pin=False)[0])
    assert not torch.equal(shards[0], shards[1])


def test_reference_is_the_mean_of_each_ranks_gradients():
    shards = rank_capture_batches(0, 2, B, T, V)
    reference = reference_capture(tiny().double(), CPU, shards)
    per_rank = [make_workload("train", tiny().double(), CPU, "fp64").capture(b) for b in shards]
    assert torch.equal(reference["loss"], per_rank[0]["loss"])  # loss and logits: rank 0's own shard
    for key in grads(reference):
        assert torch.allclose(reference[key], (per_rank[0][key] + per_rank[1][key]) / 2, rtol=1e-12, atol=1e-15)
    # A group whose gradients were never averaged holds rank 0's own: far outside any fp32 tolerance, so the
    # correctness gate can tell a working all-reduce from a missing one.
    local = torch.cat([v.flatten() for v in grads(per_rank[0]).values()])
    mean = torch.cat([v.flatten() for v in grads(reference).values()])
    assert rel_err(local, mean) > 1e-2


@pytest.mark.parametrize("name", ["train-ddp", "train-fsdp"])
def test_data_parallel_workloads_need_a_process_group(name):
    with pytest.raises(ValueError, match="--nproc"):
        make_workload(name, tiny(), CPU, "fp32")


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", ["train-ddp", "train-fsdp"])
def test_one_rank_group_matches_the_plain_train_step(one_rank_group, name):
    batch = rank_capture_batches(0, 1, B, T, V)[0]
    plain = make_workload("train", tiny(), CPU, "fp32").capture(batch)
    wrapped = make_workload(name, tiny(), CPU, "fp32")
    captured = wrapped.capture(batch)
    assert captured.keys() == plain.keys()  # bare parameter names: no "module." prefix, FSDP grads gathered whole
    for key, value in captured.items():
        assert value.dtype == torch.float32 and not hasattr(value, "full_tensor")
        assert rel_err(value, plain[key]) < 1e-5, key
    before = {n: p.detach().clone() for n, p in wrapped.params}
    wrapped.step(batch)
    assert any(not torch.equal(before[n], p.detach()) for n, p in wrapped.params), "the optimizer step must move weights"
