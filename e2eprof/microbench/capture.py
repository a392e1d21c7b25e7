"""Which calls the replaced op really gets: capture them from the model's own loops, then add a sweep around them.

`capture_shapes` builds the model, applies the patch, runs one train step and one inference step, and records every
call that goes through the patch: each tensor argument's shape, dtype, strides and whether it required grad; the
non-tensor arguments exactly as passed; the autocast and grad state at the call; and, for a class target, the module
the forward ran on (its weights are part of the op). Identical calls collapse into one `CallSpec` with a count per
step. `sweep_shapes` derives unseen sizes and dtypes from those specs: kernels that are right only on the benchmark's
shapes are a known way to fool a benchmark.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from e2eprof.patch import Patch
from e2eprof.patching import apply_patch, check_model_fits
from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.loops import make_workload
from e2eprof.workloads.models import build_model, describe, resolve_model

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else ""


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument as the op received it: enough to draw a fresh one just like it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    requires_grad: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(tuple(t.shape), t.dtype, tuple(t.stride()), t.requires_grad)

    @property
    def contiguous(self) -> bool:
        return self.stride == contiguous_strides(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of distinct memory: a broadcast (stride-0) dimension is stored once, and read from memory once.

        Counting every element of an expanded mask would overstate the bytes an op must move, and with them its
        bandwidth (a lower bound is what the bandwidth-floor check needs).
        """
        if 0 in self.shape:
            return 0
        return math.prod(n for n, step in zip(self.shape, self.stride) if step != 0) * self.dtype.itemsize

    def describe(self) -> str:
        text = f"{dtype_name(self.dtype)}[{','.join(map(str, self.shape))}]"
        return text if self.contiguous else f"{text}(stride {','.join(map(str, self.stride))})"


@dataclass
class CallSpec:
    """One distinct call of the replaced op: arguments, autocast/grad state, module, and how often a step makes it.

    args holds TensorSpec for tensors and the plain value otherwise, in call order (a class target's module is not
    in args: it is `module`). source is "model" for captured calls and "sweep" for derived ones.
    """

    target: str
    kind: str  # "function" or "class"
    args: tuple
    kwargs: dict
    device: str
    autocast: bool
    autocast_dtype: torch.dtype | None
    grad_enabled: bool
    module: torch.nn.Module | None = None
    source: str = "model"
    workload: str = ""
    calls_per_step: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def tensors(self) -> list[TensorSpec]:
        return [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, TensorSpec)]

    @property
    def primary(self) -> TensorSpec:
        """The first tensor argument: the one whose shape and dtype name the row."""
        return self.tensors[0]

    @property
    def needs_grad(self) -> bool:
        """Did the model differentiate through this call (so forward+backward is what it costs)?"""
        params = self.module.parameters() if self.module is not None else ()
        return self.grad_enabled and (any(t.requires_grad for t in self.tensors) or any(p.requires_grad for p in params))

    def signature(self) -> str:
        """'float32[1,4,64,64], dim=-1 | autocast bfloat16' (module weights named by their shapes)."""
        def one(value) -> str:
            return value.describe() if isinstance(value, TensorSpec) else repr(value)

        parts = [one(a) for a in self.args] + [f"{k}={one(v)}" for k, v in self.kwargs.items()]
        if self.module is not None:
            parts.insert(0, f"{type(self.module).__name__}({_module_shapes(self.module)})")
        state = f"autocast {dtype_name(self.autocast_dtype)}" if self.autocast else "no autocast"
        return f"{', '.join(parts)} | {state}{'' if self.grad_enabled else ', no grad'}"

    def context(self):
        """The autocast state the model called the op under (grad mode is set by the caller per pass)."""
        return torch.autocast(torch.device(self.device).type, dtype=self.autocast_dtype, enabled=self.autocast)


def _module_shapes(module: torch.nn.Module) -> str:
    return ", ".join(f"{n}={dtype_name(p.dtype)}[{','.join(map(str, p.shape))}]" for n, p in module.named_parameters())


def _freeze(value):
    """A hashable stand-in for a non-tensor argument (lists become tuples; anything else unhashable, its repr)."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class _CallLog:
    """Wraps what one recorder calls, so each call's real arguments are described before the replacement runs."""

    def __init__(self, recorder, target: str, kind: str):
        self.recorder, self.target, self.kind = recorder, target, kind
        self.inner = recorder.target
        self.workload = ""
        self.specs: dict[tuple, CallSpec] = {}

    def install(self) -> None:
        skip = self.recorder.skip  # 1 for a class target: the module comes first

        def observed(*args, **kwargs):
            self.record(args[0] if skip else None, args[skip:], kwargs)
            return self.inner(*args, **kwargs)

        self.recorder.target = observed

    def uninstall(self) -> None:
        self.recorder.target = self.inner

    def record(self, module, args: tuple, kwargs: dict) -> None:
        describe_arg = lambda v: TensorSpec.of(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        args_d = tuple(describe_arg(a) for a in args)
        kwargs_d = {k: describe_arg(v) for k, v in kwargs.items()}
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None:
            return  # nothing to size a benchmark on
        device_type = first.device.type
        autocast = torch.is_autocast_enabled(device_type)
        autocast_dtype = torch.get_autocast_dtype(device_type) if autocast else None
        module_key = (type(module).__name__, _module_shapes(module)) if module is not None else None
        key = (self.workload, _freeze(args_d), _freeze(tuple(sorted(kwargs_d.items()))), autocast, autocast_dtype,
               torch.is_grad_enabled(), module_key)
        spec = self.specs.get(key)
        if spec is None:
            spec = self.specs[key] = CallSpec(self.target, self.kind, args_d, kwargs_d, str(first.device), autocast,
                                              autocast_dtype, torch.is_grad_enabled(), module, "model", self.workload)
        spec.calls_per_step += 1


def capture_shapes(patch: Patch, model: str, *, device: str, precision: str, batch: int, seq: int, seed: int = 0,
                   workloads: Sequence[str] = ("train", "infer")) -> list[CallSpec]:
    """Run one step of each workload with the patch applied; return one CallSpec per distinct call of the op.

    Raises ModelLoadError / PatchError (one line) when the model or patch cannot be used. A class target's module is
    deep-copied after the patch is reverted, so the specs hold stock modules with the model's weights.
    """
    source = resolve_model(model)
    attn = patch.model_attention
    check_model_fits(patch, source.architecture, attn)
    net = build_model(source, attn_implementation=attn, seed=seed)
    applied = apply_patch(patch, net)
    if len(applied.recorders) != len(applied.sites):
        applied.revert()
        raise RuntimeError("patch engine returned recorders that do not match its sites")  # one recorder per target
    logs = [_CallLog(r, s["target"], s["kind"]) for r, s in zip(applied.recorders, applied.sites)]
    dev = torch.device(device)
    try:
        net.to(dev)
        vocab = describe(net)["vocab_size"]
        host_batch = synthetic_token_batches(1, batch, seq, vocab, seed=seed + 1, pin=dev.type == "cuda")[0]
        for log in logs:
            log.install()
        for name in workloads:
            for log in logs:
                log.workload = name
            make_workload(name, net, dev, precision).step(host_batch)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
    finally:
        for log in logs:
            log.uninstall()
        applied.revert()
    specs = [spec for log in logs for spec in log.specs.values()]
    copies: dict[int, torch.nn.Module] = {}
    for spec in specs:
        if spec.module is not None:
            # One copy per module object: the model (and its optimizer state) can then be freed.
            spec.module = copies.setdefault(id(spec.module), copy.deepcopy(spec.module))
    return specs


def _sweep_sizes(rows: int, cols: int, free_cols: bool) -> list[tuple[int, int]]:
    """(rows, cols) pairs around the model's: powers of two and an odd size, at about the same element count."""
    numel = rows * cols
    if free_cols:
        pairs = [(max(1, numel // c), c) for c in (cols // 2, cols * 2) if c >= 2]
        odd = cols + 1 if cols % 2 == 0 else cols + 2
        pairs.append((max(1, numel // odd) | 1, odd))  # odd rows too: tails in both directions
    else:
        # The module's weights fix the last dimension; only the rows may change.
        pairs = [(max(1, rows // 2), cols), (rows * 2, cols), (rows + 1 if rows % 2 == 0 else rows + 2, cols)]
    pairs.insert(0, (rows, cols))
    return list(dict.fromkeys(pairs))


def sweep_shapes(model_specs: Sequence[CallSpec], dtypes: Sequence[torch.dtype]) -> list[CallSpec]:
    """Sweep specs derived from the model's: per target, the most-called differentiated call, reshaped to 2-D
    [rows, cols] sizes around its own and re-typed to each of `dtypes`, under the same autocast state.

    Every tensor argument shaped like the first one follows it; the others (and a module's weights) stay. A
    parameterless module (an activation) may change its last dimension; a module with weights may not.
    """
    bases: dict[str, CallSpec] = {}
    for spec in model_specs:
        best = bases.get(spec.target)
        if best is None or (spec.needs_grad, spec.calls_per_step) > (best.needs_grad, best.calls_per_step):
            bases[spec.target] = spec
    out = []
    for base in bases.values():
        primary = base.primary
        if len(primary.shape) == 0:
            continue
        rows, cols = math.prod(primary.shape[:-1]), primary.shape[-1]
        free_cols = base.module is None or not any(True for _ in base.module.parameters())
        for r, c in _sweep_sizes(rows, cols, free_cols):
            for dtype in dtypes:
                def resize(value, r=r, c=c, dtype=dtype):
                    if isinstance(value, TensorSpec) and value.shape == primary.shape:
                        return TensorSpec((r, c), dtype, contiguous_strides((r, c)), value.requires_grad)
                    return value

                out.append(replace(base, args=tuple(resize(a) for a in base.args),
                                   kwargs={k: resize(v) for k, v in base.kwargs.items()},
                                   source="sweep", workload="", calls_per_step=0, notes=[]))
    return out
