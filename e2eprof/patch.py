"""The public patch API: one declarative description per patch.

Our own kernels and users' kernels declare patches the same way:

    from e2eprof.patch import Patch

    PATCH = Patch(
        name="fastsoftmax",
        targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
        replacement=softmax_like_torch,
        reference=reference_softmax,
        architectures=("gpt2",),
        attn_implementation="eager",
    )

A target is "module:attribute.path". The engine (`e2eprof.patching`) resolves the path inside the module's
namespace and replaces the last attribute *as that module sees it*: when the path goes through a shared
module (here `torch.nn`), the engine installs a proxy in the modeling module instead of mutating torch for
the whole process, so only the model under test is affected.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Relative-norm error floors by output dtype: a patched output passes when its error against the fp64
# reference is at most max(k * stock error, floor). Peers' fixed tolerances (KernelBench 1e-4 fp32, 1e-2 bf16)
# are the floors; the stock path's own error is the better yardstick above them.
DEFAULT_TOLERANCES: Mapping[str, float] = {
    "float64": 1e-10,
    "float32": 1e-5,
    "bfloat16": 1e-2,
    "float16": 2e-3,
}
DEFAULT_ERROR_FACTOR = 2.0


@dataclass(frozen=True)
class Patch:
    """What a custom kernel replaces, where, for which models, and how to check it.

    name: short name used on the command line.
    targets: "module:attribute.path" strings; each must resolve, or applying the patch fails.
    replacement: the callable installed at every target (same signature as what it replaces).
    reference: trusted fp64 implementation with the replaced function's signature, returning float64.
        For a class target it is called like the forward: reference(module, *args), args in float64.
    architectures: Hugging Face `model_type` values this patch applies to; empty means any.
    attn_implementation: the attention implementation the patch needs to be called at all ("eager" for
        softmax: SDPA never calls softmax), or None.
    implementations: returns call counts per implementation (e.g. {"triton.fwd": 24}) so a report can
        say which implementation ran and prove the custom kernel, not a fallback, did the work.
    kernel_names: substrings of device kernel names the custom kernel launches (checked in profiles).
    tolerances: relative-norm error floor per output dtype name; error_factor: k in max(k * stock, floor).
    domain: the range of inputs the op must handle, for the gate's stress check (e2eprof.checks.stress): "any" (scales up
        to overflow, row offsets, outlier channels, extremes, denormals, constant rows), "softmax" (also fully masked
        rows and NaN/Inf at masked places), "none", or a function of a call's (args, kwargs) yielding
        (name, args, kwargs) points of its own.
    workloads: the workloads the patch applies to (e.g. ("train",) for a loss the model only computes in training);
        empty means every workload.
    omitted_outputs: outputs of the replaced code the replacement does not return, by design (a fused linear cross
        entropy returns the loss but never the logits): the gate compares everything else instead of failing.
    requires_triton: the replacement has no CPU path, only Triton kernels: on a CPU device it runs only under the
        Triton interpreter (TRITON_INTERPRET=1), so a run without it is refused before measuring.
    """

    name: str
    targets: tuple[str, ...]
    replacement: Callable
    reference: Callable | None = None
    architectures: tuple[str, ...] = ()
    attn_implementation: str | None = None
    description: str = ""
    implementations: Callable[[], Mapping[str, int]] | None = None
    kernel_names: tuple[str, ...] = ()
    tolerances: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    error_factor: float = DEFAULT_ERROR_FACTOR
    domain: str | Callable = "any"
    workloads: tuple[str, ...] = ()
    omitted_outputs: tuple[str, ...] = ()
    requires_triton: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"Patch.name must be a short identifier, got {self.name!r}")
        if isinstance(self.targets, str):
            object.__setattr__(self, "targets", (self.targets,))
        if not self.targets:
            raise ValueError(f"patch {self.name}: targets is empty")
        for target in self.targets:
            module, sep, attr = target.partition(":")
            if not sep or not module or not attr:
                raise ValueError(f"patch {self.name}: target {target!r} must look like 'package.module:attribute.path'")
        if not callable(self.replacement):
            raise ValueError(f"patch {self.name}: replacement must be callable")
        if self.reference is not None and not callable(self.reference):
            raise ValueError(f"patch {self.name}: reference must be callable")
        if not callable(self.domain) and self.domain not in ("any", "softmax", "none"):
            raise ValueError(f"patch {self.name}: domain must be 'any', 'softmax', 'none' or a function, got {self.domain!r}")
        object.__setattr__(self, "architectures", tuple(self.architectures))
        object.__setattr__(self, "kernel_names", tuple(self.kernel_names))
        for name in ("workloads", "omitted_outputs"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))

    @property
    def model_attention(self) -> str:
        """The attention implementation every arm but the sdpa one runs: what the patch needs, else stock SDPA.

        A patch that does not touch attention (a norm, an activation) is measured on the fastest stock attention, so
        its gain is judged inside the model users would deploy, not inside a slowed-down eager one.
        """
        return self.attn_implementation or "sdpa"

    def tolerance_for(self, dtype_name: str) -> float:
        """Error floor for an output dtype name such as 'float32'."""
        return float(self.tolerances.get(dtype_name, DEFAULT_TOLERANCES.get(dtype_name, 1e-2)))

    def source_files(self) -> list[Path]:
        """Files whose content defines this patch: the replacement's package (hashed into run.parquet)."""
        files: set[Path] = set()
        for obj in (self.replacement, self.reference):
            if obj is None:
                continue
            try:
                path = Path(inspect.getfile(obj)).resolve()
            except (TypeError, OSError):
                continue
            # A kernel's package is its unit: hash every Python file beside the replacement.
            files.update(p for p in path.parent.glob("*.py"))
        return sorted(files)
