"""A complete user patch: GPT-2's attention softmax replaced by a hand-written one. Copy it and change the kernel.

Run it with

    e2eprof compare --model gpt2 --patch examples/my_softmax.py

The file uses only the public API (`e2eprof.patch.Patch`); e2eprof imports it, finds the `Patch` object and
does the rest: applies it in the patched arm only, counts calls, checks every call against the stock softmax
and the fp64 `reference`, times both arms and reverts it. The kernel here is plain PyTorch (max-subtracted exp,
then a division), so it runs on any device and autograd derives its backward; put a Triton or CUDA kernel in
its place (see examples/cuda_softmax/ for a CUDA one) and keep the signature.
"""

from collections import Counter

import torch

from e2eprof.patch import Patch

# Calls per implementation. e2eprof reads them through Patch.implementations to prove that this code, not a
# fallback to the stock op, did the work in the patched arm, and that no stock arm ever ran it.
CALLS: Counter = Counter()


def _legacy_dim(ndim: int) -> int:
    # What torch.nn.functional.softmax does when called without dim (GPT-2 always passes dim=-1).
    return 0 if ndim in (0, 1, 3) else 1


def my_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Same signature as torch.nn.functional.softmax, which it replaces (e2eprof checks that before running)."""
    dim = _legacy_dim(input.dim()) if dim is None else dim
    x = input if dtype is None else input.to(dtype)
    if torch.is_autocast_enabled(x.device.type):
        x = x.float()  # autocast runs softmax in fp32; the output dtype must be the stock op's
    CALLS[f"{x.device.type}.fwd"] += 1
    # Largest exponent 0: no overflow. The shift is a constant to autograd (detached): letting the gradient flow
    # through amax adds the rounding residue of sum(y) - 1 at each row's maximum, which e2eprof's stress check
    # flags where the softmax saturates (logits of 1e5 and beyond).
    shifted = x - x.amax(dim, keepdim=True).detach()
    e = shifted.exp()
    return e / e.sum(dim, keepdim=True)


def reference_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """The trusted result: e2eprof calls it with float64 inputs and compares each patched call against it."""
    return torch.softmax(input, _legacy_dim(input.dim()) if dim is None else dim)


PATCH = Patch(
    name="mysoftmax",
    description="plain-PyTorch softmax in GPT-2 eager attention (the README example)",
    # "module:attribute.path" as the modeling module sees it: only GPT-2's softmax is replaced, not torch's.
    targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
    replacement=my_softmax,
    reference=reference_softmax,
    architectures=("gpt2",),
    attn_implementation="eager",  # SDPA attention never calls softmax
    implementations=lambda: dict(CALLS),
    # The range of inputs the gate stresses it with: a softmax also meets fully masked rows (padding).
    domain="softmax",
)
