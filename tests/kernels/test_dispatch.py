"""The implementation chooser every built-in kernel shares: Triton on CUDA, the CPU implementation on the CPU,
and never a silent fallback to the stock op."""

import importlib
import types

import pytest
import torch

KERNELS = ["fastsoftmax", "fastgelu", "fastlayernorm", "rmsnorm", "swiglu"]


@pytest.fixture(params=KERNELS)
def op(request):
    return importlib.import_module(f"e2eprof.kernels.{request.param}.op")


def test_cuda_without_triton_raises_instead_of_falling_back(op, monkeypatch):
    monkeypatch.setattr(op, "TRITON_AVAILABLE", False)
    fake_cuda = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda"))  # no GPU needed to reach the check
    with pytest.raises(RuntimeError, match="refusing to fall back"):
        op._choose_impl(fake_cuda)


def test_cpu_tensors_run_the_cpu_implementation_by_default(op, monkeypatch):
    monkeypatch.delenv(op.IMPL_ENV, raising=False)
    assert op._choose_impl(torch.zeros(1)) == "cpu"


def test_bad_impl_switch_raises_naming_the_variable(op, monkeypatch):
    monkeypatch.setenv(op.IMPL_ENV, "torch")
    with pytest.raises(ValueError, match=op.IMPL_ENV):
        op._choose_impl(torch.zeros(1))


def test_forced_triton_needs_the_interpreter_on_cpu(op, monkeypatch):
    monkeypatch.setenv(op.IMPL_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET|not installed"):
        op._choose_impl(torch.zeros(1))


def test_other_devices_have_no_implementation(op):
    with pytest.raises(RuntimeError, match="no implementation for device meta"):
        op._choose_impl(torch.zeros(1, device="meta"))
