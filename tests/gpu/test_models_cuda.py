"""Presets built on the GPU (what a worker does there): the same seed gives the same weights in every build, the
caller's generators are left alone, and the model is the preset's, fp32, on the device."""

from __future__ import annotations

import pytest
import torch

from e2eprof.workloads.models import build_model, resolve_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _weights(model):
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_gpu_build_is_seeded_and_leaves_the_callers_generators_alone():
    torch.manual_seed(123)
    cpu_before, cuda_before = torch.get_rng_state(), torch.cuda.get_rng_state()
    a = build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0, device="cuda")
    assert torch.equal(torch.get_rng_state(), cpu_before) and torch.equal(torch.cuda.get_rng_state(), cuda_before)
    b = build_model(resolve_model("gpt2-tiny"), attn_implementation="sdpa", seed=0, device=torch.device("cuda", 0))
    c = build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=1, device="cuda")
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # every arm of a run holds the same weights
    assert not torch.equal(wa["transformer.h.0.attn.c_attn.weight"], wc["transformer.h.0.attn.c_attn.weight"])
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in a.parameters())
    assert not a.training


def test_gpu_weights_have_the_presets_statistics():
    # transformers' own init ran on the GPU (std 0.02 for GPT-2's linear weights), not only torch's defaults.
    model = build_model(resolve_model("gpt2"), attn_implementation="eager", seed=0, device="cuda")
    std = model.transformer.h[0].mlp.c_fc.weight.float().std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    cpu = build_model(resolve_model("gpt2"), attn_implementation="eager", seed=0)
    assert cpu.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(std, rel=0.05)
