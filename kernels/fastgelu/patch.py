"""Model-facing side of fastgelu: GPT-2's `gelu_new` activation modules, replaced by a subclass, declared as a patch.

How GPT-2 gets its activation: GPT2MLP does `self.act = ACT2FN[config.activation_function]`, and ACT2FN builds a
fresh `transformers.activations.NewGELUActivation()` for "gelu_new" from a class table it holds by reference. So
there is no function in modeling_gpt2's namespace to swap: the sites are the NewGELUActivation *instances* inside the
model. The patch is a class target: the engine swaps the class of exactly those instances (one per layer) to
FastNewGELU and puts them back on revert. Other models' instances keep the stock class, and ACT2FN keeps building
stock instances because it holds the class, not its name; only code that looks up the name
`transformers.activations.NewGELUActivation` while the patch is applied sees the subclass.

Output dtype: the stock forward is a chain of elementwise ops, none of which autocast recasts, so the result has
the input's dtype; rather than encode that, we ask the stock forward once per (device, dtype, autocast state) on a
1-element tensor, as fastsoftmax does, so a future transformers or torch that changes the rule is followed.
"""

from __future__ import annotations

import functools

import torch
from transformers.activations import NewGELUActivation

from e2eprof.kernels.fastgelu.op import IMPL_CALLS, fastgelu, reference_gelu
from e2eprof.patch import Patch

# Captured at import, before any patch is installed: the genuine stock forward, and a stateless instance to call it on.
_STOCK_FORWARD = NewGELUActivation.forward
_STOCK_MODULE = NewGELUActivation()


@functools.lru_cache(maxsize=64)
def _stock_output_dtype(device_type: str, in_dtype: torch.dtype, autocast_on: bool,
                        autocast_dtype: torch.dtype | None) -> torch.dtype:
    probe = torch.zeros(1, dtype=in_dtype, device=device_type)
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        return _STOCK_FORWARD(_STOCK_MODULE, probe).dtype


def gelu_like_transformers(input: torch.Tensor) -> torch.Tensor:
    """NewGELUActivation's forward with the same output dtype and layout, computed by fastgelu."""
    device_type = input.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
    return fastgelu(input, out_dtype=_stock_output_dtype(device_type, input.dtype, autocast_on, autocast_dtype))


class FastNewGELU(NewGELUActivation):
    """NewGELUActivation whose forward runs `e2eprof::fastgelu` (same state: none)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu_like_transformers(input)


def gelu_reference(module: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
    """fp64 reference with the replaced forward's signature (module first, as for any class target)."""
    return reference_gelu(input)


PATCH = Patch(
    name="fastgelu",
    description="Triton tanh-GELU (one read, one write forward and backward) for GPT-2's MLP activation",
    targets=("transformers.activations:NewGELUActivation",),
    replacement=FastNewGELU,
    reference=gelu_reference,
    architectures=("gpt2",),
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_gelu_fwd", "_gelu_bwd"),
    # Relative-norm floors by output dtype: a few units of the dtype's rounding (GELU's error is just the output's
    # rounding when the math is fp32), the same levels as fastsoftmax's.
    tolerances={"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3},
)
