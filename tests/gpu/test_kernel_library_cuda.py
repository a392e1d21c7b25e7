"""fastgelu (tanh and erf), fastlayernorm, rmsnorm and swiglu compiled on CUDA at the shapes GPT-2, BERT-base and
Llama-1B use, against fp64.

The CPU suite runs the same Triton kernels under the interpreter; compilation (register limits, num_warps, the
looped paths, large offsets) only shows here. Forward and every input gradient are checked by relative-norm
error against autograd through each kernel's fp64 reference, and the Triton implementation must be the one
that ran.
"""

import pytest
import torch

from e2eprof.kernels import fastgelu as gelu_pkg
from e2eprof.kernels import fastlayernorm as ln_pkg
from e2eprof.kernels import rmsnorm as rms_pkg
from e2eprof.kernels import swiglu as swiglu_pkg

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

F32, BF16 = torch.float32, torch.bfloat16
TOL = {F32: 1e-5, BF16: 1e-2}


def _rel(value: torch.Tensor, ref: torch.Tensor) -> float:
    return ((value.double() - ref).norm() / ref.norm()).item()


def _inputs(shapes, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, generator=g, device="cuda", dtype=F32).to(dtype).requires_grad_() for s in shapes]


def _check(run, reference, inputs, dtype, counters, tol_factor=1.0):
    """Forward and backward of `run` against autograd through `reference` on fp64 copies of the inputs."""
    before = {k: v for k, v in counters.items()}
    out = run(*inputs)
    grad = torch.randn_like(out, dtype=F32).to(out.dtype)
    out.backward(grad)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref = reference(*ref_inputs)
    ref.backward(grad.double())
    tol = TOL[dtype] * tol_factor
    assert torch.isfinite(out).all()
    assert _rel(out, ref) <= tol, f"forward error {_rel(out, ref):.3g}"
    for got, want in zip(inputs, ref_inputs):
        assert _rel(got.grad, want.grad) <= tol * 4, f"gradient error {_rel(got.grad, want.grad):.3g}"
    ran = {k: counters[k] - before.get(k, 0) for k in counters}
    assert ran.get("triton.fwd", 0) >= 1 and ran.get("triton.bwd", 0) >= 1, ran


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(8, 1024, 3072), (3, 77, 1001)])
def test_fastgelu(shape, dtype):
    _check(lambda x: gelu_pkg.fastgelu(x), gelu_pkg.reference_gelu, _inputs([shape], dtype), dtype, gelu_pkg.IMPL_CALLS)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(8, 512, 3072), (3, 77, 1001)])  # BERT-base's FFN activation, then a ragged one
def test_fastgelu_erf(shape, dtype):
    # BERT's exact GELU: the _gelu_fwd_erf / _gelu_bwd_erf kernels (tl.math.erf compiled, not interpreted).
    _check(lambda x: gelu_pkg.fastgelu(x, approximate="none"), lambda x: gelu_pkg.reference_gelu(x, "none"),
           _inputs([shape], dtype), dtype, gelu_pkg.IMPL_CALLS)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("rows, cols", [(8 * 1024, 768), (37, 1023), (16, 16384)])
def test_fastlayernorm(rows, cols, dtype):
    x, w, b = _inputs([(rows, cols), (cols,), (cols,)], dtype)
    _check(lambda x, w, b: ln_pkg.fastlayernorm(x, (cols,), w, b, 1e-5),
           lambda x, w, b: ln_pkg.reference_layer_norm(x, (cols,), w, b, 1e-5), [x, w, b], dtype, ln_pkg.IMPL_CALLS)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("rows, cols", [(4 * 1024, 2048), (33, 1000)])
def test_rmsnorm(rows, cols, dtype):
    x, w = _inputs([(rows, cols), (cols,)], dtype)
    _check(lambda x, w: rms_pkg.rmsnorm(x, w, 1e-5), lambda x, w: rms_pkg.reference_rmsnorm(x, w, 1e-5), [x, w], dtype,
           rms_pkg.IMPL_CALLS)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(4, 1024, 5632), (3, 7, 999)])
def test_swiglu(shape, dtype):
    _check(swiglu_pkg.swiglu, swiglu_pkg.reference_swiglu, _inputs([shape, shape], dtype), dtype, swiglu_pkg.IMPL_CALLS)
