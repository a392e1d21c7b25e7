"""Model-facing side of fastgelu: the GELU activation modules of GPT-2 (`gelu_new`) and BERT (`gelu`), replaced by one
subclass, declared as a patch.

How the models get their activation: GPT2MLP does `self.act = ACT2FN["gelu_new"]` and BertIntermediate
`ACT2FN["gelu"]`; ACT2FN builds a fresh `NewGELUActivation()` (tanh approximation, stateless) or `GELUActivation()`
(exact erf GELU, which stores its function as `self.act`: `nn.functional.gelu`, or its own erf formula
`_gelu_python` when built with use_gelu_python=True) from a class table it holds by reference. So there is no function
in a modeling module's namespace to swap: the sites are those *instances*. The patch has two class targets; the
engine swaps the class of exactly those instances (one per layer) to FastGELU and puts them back on revert. A model
holds instances of one of the two classes, so the other target counts zero sites. Other models' instances keep the
stock class, and ACT2FN keeps building stock instances because it holds the classes, not their names.

Why one class for both: a Patch has one replacement, and a class target's replacement must subclass the target, so
FastGELU subclasses both stock classes. A swapped instance keeps its own state, and that state says which GELU it is
(an instance with `act` is a GELUActivation); FastGELU's forward follows it. FastGELU itself is never constructed: a
name lookup of either class while the patch is applied would not say which GELU is wanted, so construction raises.

Output dtype: both stock forwards are elementwise ops that autocast leaves alone, so the result has the input's dtype;
rather than encode that, we ask the stock forward once per (GELU, device, dtype, autocast state) on a 1-element
tensor, as fastsoftmax does, so a future transformers or torch that changes the rule is followed.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.activations import GELUActivation, NewGELUActivation

from e2eprof.kernels.fastgelu.op import IMPL_CALLS, fastgelu, reference_gelu
from e2eprof.patch import Patch

# Captured at import, before any patch is installed: stateless (or fixed-state) stock instances of each variant,
# the genuine stock forward that runs them, and the functions a GELUActivation may hold as `act`.
_STOCK_F_GELU = torch.nn.functional.gelu
_STOCK_GELU_PYTHON = GELUActivation._gelu_python
_PROBES = {
    "tanh": (NewGELUActivation.forward, NewGELUActivation()),
    "erf": (GELUActivation.forward, GELUActivation()),
    "erf_python": (GELUActivation.forward, GELUActivation(use_gelu_python=True)),
}
_APPROXIMATE = {"tanh": "tanh", "erf": "none", "erf_python": "none"}  # torch.nn.functional.gelu's names
_NO_ACT = object()


def gelu_variant(module: torch.nn.Module) -> str:
    """Which stock GELU `module` is, read from its state: "tanh" (NewGELUActivation), "erf" (GELUActivation over
    nn.functional.gelu) or "erf_python" (GELUActivation(use_gelu_python=True)). Raises for an `act` we cannot vouch for,
    rather than compute another function than the stock forward would."""
    act = vars(module).get("act", _NO_ACT)
    if act is _NO_ACT:
        return "tanh"
    if act is _STOCK_F_GELU:
        return "erf"
    if inspect.ismethod(act) and act.__func__ is _STOCK_GELU_PYTHON and act.__self__ is module:
        return "erf_python"
    raise RuntimeError(f"fastgelu: a GELUActivation whose act is {act!r}, neither nn.functional.gelu nor its own "
                       f"_gelu_python; refusing to replace a function it does not compute")


@functools.lru_cache(maxsize=64)
def _stock_output_dtype(variant: str, device_type: str, in_dtype: torch.dtype, autocast_on: bool,
                        autocast_dtype: torch.dtype | None) -> torch.dtype:
    forward, module = _PROBES[variant]
    probe = torch.zeros(1, dtype=in_dtype, device=device_type)
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        return forward(module, probe).dtype


def gelu_like_transformers(input: torch.Tensor, variant: str = "tanh") -> torch.Tensor:
    """The stock forward of GELU `variant` (see gelu_variant) with the same output dtype and layout, by fastgelu."""
    device_type = input.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
    out_dtype = _stock_output_dtype(variant, device_type, input.dtype, autocast_on, autocast_dtype)
    return fastgelu(input, out_dtype=out_dtype, approximate=_APPROXIMATE[variant])


class FastGELU(NewGELUActivation, GELUActivation):
    """NewGELUActivation or GELUActivation (whichever the swapped instance was) running `e2eprof::fastgelu`."""

    def __init__(self, *args, **kwargs):
        raise TypeError("FastGELU is not built directly: the fastgelu patch swaps it onto existing NewGELUActivation "
                        "and GELUActivation instances (build one of those)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu_like_transformers(input, gelu_variant(self))


def gelu_reference(module: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
    """fp64 reference with the replaced forward's signature (module first, as for any class target)."""
    return reference_gelu(input, approximate=_APPROXIMATE[gelu_variant(module)])


PATCH = Patch(
    name="fastgelu",
    description="Triton GELU (one read, one write forward and backward): GPT-2's tanh GELU and BERT's exact erf GELU",
    targets=("transformers.activations:NewGELUActivation", "transformers.activations:GELUActivation"),
    replacement=FastGELU,
    reference=gelu_reference,
    architectures=("gpt2", "bert"),
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_gelu_fwd", "_gelu_bwd"),  # _gelu_fwd_tanh / _gelu_fwd_erf and their backward kernels
    # Relative-norm floors by output dtype: a few units of the dtype's rounding (GELU's error is just the output's
    # rounding when the math is fp32), the same levels as fastsoftmax's.
    tolerances={"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3},
)
