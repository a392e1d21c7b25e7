"""The CUDA example (examples/cuda_softmax): softmax.cu compiled with load_inline on this GPU, checked against fp64.

The CPU suite (tests/e2eprof/test_byo.py) compiles the C++ CPU path and the wrapping; only a GPU with nvcc can
build and run the .cu kernel itself.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

from e2eprof.registry import load_patch

CUDA_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cuda_softmax" / "patch.py"


def _cannot_build() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    if CUDA_HOME is None:
        return "nvcc not found (set CUDA_HOME): softmax.cu cannot be compiled here"
    if not is_ninja_available():
        return "load_inline needs ninja, which is not installed"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_cannot_build() is not None, reason=str(_cannot_build()))]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    os.environ["E2EPROF_BUILD_DIR"] = str(tmp_path_factory.mktemp("e2eprof-build"))  # a real compile, not a cache hit
    try:
        patch = load_patch(str(CUDA_EXAMPLE)).patch
        yield sys.modules[patch.replacement.__module__]
    finally:
        os.environ.pop("E2EPROF_BUILD_DIR", None)


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = torch.isfinite(ref)
    diff = (out.double() - ref)[finite]
    return float(diff.norm() / ref[finite].norm().clamp_min(1e-300)) if diff.numel() else 0.0


def _cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    masked = torch.randn(64, 1024, device="cuda", generator=g)
    masked.masked_fill_(torch.ones(1024, 1024, device="cuda", dtype=torch.bool).triu(1)[:64], float("-inf"))
    masked[3] = float("-inf")  # fully masked row: NaN, as from torch.softmax
    return {
        "attention": torch.randn(8 * 12 * 1024, 1024, device="cuda", generator=g),  # (B*nh*T, T), GPT-2 batch 8
        "odd": torch.randn(37, 1023, device="cuda", generator=g),
        "wide": torch.randn(5, 50257, device="cuda", generator=g),  # a vocabulary row: many loop trips per thread
        "one-column": torch.randn(9, 1, device="cuda", generator=g),
        "no-rows": torch.randn(0, 64, device="cuda", generator=g),
        "empty-rows": torch.randn(4, 0, device="cuda", generator=g),
        "-inf-masks": masked,
        "large-magnitudes": torch.randn(16, 513, device="cuda", generator=g) * 1e4,
    }


def test_cuda_kernel_matches_fp64_and_is_deterministic(example):
    before = example.CALLS["cuda.fwd"]
    for name, x in _cases().items():
        y = example.softmax_rows(x)
        torch.cuda.synchronize()
        assert y.device == x.device and y.dtype == torch.float32 and y.shape == x.shape, name
        assert _rel_error(y, torch.softmax(x.double(), -1)) <= 1e-6, name
        assert torch.equal(torch.nan_to_num(example.softmax_rows(x.clone())), torch.nan_to_num(y)), name
    assert example.CALLS["cuda.fwd"] - before == 2 * len(_cases())


def test_replacement_on_cuda_forward_backward_and_autocast(example):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 12, 128, 128, device="cuda", generator=g)
    leaf = x.clone().requires_grad_()
    weights = torch.randn(x.shape, device="cuda", generator=g)
    out = example.softmax(leaf, dim=-1)
    assert out.stride() == torch.softmax(x, -1).stride()
    (out * weights).sum().backward()
    leaf64 = x.double().requires_grad_()
    (torch.softmax(leaf64, -1) * weights.double()).sum().backward()
    assert _rel_error(out.detach(), torch.softmax(x.double(), -1)) <= 1e-6
    assert _rel_error(leaf.grad, leaf64.grad) <= 1e-5
    with torch.autocast("cuda", dtype=torch.bfloat16):
        stock = torch.nn.functional.softmax(x.bfloat16(), dim=-1)
        mine = example.softmax(x.bfloat16(), dim=-1)
    assert mine.dtype == stock.dtype == torch.float32
