"""Presets built on the GPU (workloads.models.build_model with device="cuda"): every arm's worker builds this way
on a GPU, so the same seed must give the same weights in every process, and the caller's RNG must stay as it was."""

import pytest
import torch

from e2eprof.workloads.models import build_model, resolve_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def build(seed, device="cuda"):
    return build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=seed, device=device)


def test_the_weights_are_made_on_the_gpu_and_the_same_seed_gives_the_same_weights():
    first, again, other = build(0), build(0), build(1)
    assert {p.device.type for p in first.parameters()} == {"cuda"}
    assert {p.dtype for p in first.parameters()} == {torch.float32}
    for (name, a), (_, b), (_, c) in zip(first.state_dict().items(), again.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, c) for a, c in zip(first.state_dict().values(), other.state_dict().values()))
    # Drawn, not left at zero: the std of a projection matches GPT-2's initializer range (0.02).
    weight = first.transformer.h[0].mlp.c_fc.weight
    assert 0.015 < weight.std().item() < 0.025


def test_the_callers_rng_is_left_as_it_was():
    torch.cuda.manual_seed(123)
    expected = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(123)
    build(0)
    assert torch.equal(torch.rand(4, device="cuda"), expected)
