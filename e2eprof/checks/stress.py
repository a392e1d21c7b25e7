"""Inputs across the range an op can meet, for the verified call's stress check (issue: numerics of real checkpoints).

A seeded random-init model feeds a kernel small activations and attention logits near zero. Trained models do not:
attention logits reach the tens, a few feature channels run 20-100x the typical magnitude (LLM.int8(), Dettmers et
al. 2022; "massive activations", Sun et al. 2024), rows have large means, padded batches have fully masked rows.
Classic kernel bugs live exactly there and pass every check on random-init values: exp without max subtraction,
one-pass variance E[x^2]-E[x]^2, tanh or sigmoid through exp(2x), sums kept in bf16 over long rows, fully masked rows
handled unlike the stock op.

So the first call of each signature is also run on transformations of its own inputs, each judged against the stock
op and the fp64 reference by the usual rules; where the stock op itself breaks (an overflow to inf), the kernel is held
to the stock op's behaviour (the same NaN/Inf positions, the same error elsewhere), not to fp64. Forward and, where the
op is differentiable, backward.

A patch names its op's domain (`Patch.domain`): a kind from DOMAINS, or a function of the call's arguments that
yields its own (name, args, kwargs) points. The kinds:
- "any" (default): decades of scale until the stock op overflows, a large common offset per row, outlier channels,
  values near the dtype's largest, denormals, constant rows;
- "softmax": those, plus fully masked rows (-inf, and the dtype's lowest finite value) and NaN/Inf at masked places;
- "none": no stress (an op whose inputs cannot be transformed freely: integer ids, say).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

DOMAINS = ("any", "softmax", "none")
# Decades of scale tried on the model's own values, largest last; the loop stops after the first one at which the
# stock op overflows (that one is kept: it is where a kernel must break the way the stock op does).
DECADES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
OUTLIER_CHANNELS = 3  # channels along the last dimension made large (the model's outlier features)
OUTLIER_FACTOR = 100.0
LONG_ROW = 4096  # row length of the low-precision point: long enough that a sum kept in bf16 loses whole units
ROW_OFFSET = 100.0  # a common offset per row, in units of the row's largest magnitude (plus one)
MASKED_ROWS = 2  # rows made fully masked, per tensor

Point = tuple[str, tuple, dict]  # (name, args, kwargs)


def points(args: tuple, kwargs: dict, skip: int, domain: str | Callable, seed: int = 0,
           row_length_free: bool = False) -> Iterator[Point]:
    """(name, args, kwargs) per stress point of a call; nothing when the call has no floating tensor argument.

    row_length_free: the op takes rows of any length (no weights fix it), so it also gets long rows in bf16.
    """
    if callable(domain):
        yield from domain(args, kwargs)
        return
    if domain == "none":
        return
    index = _primary(args, kwargs, skip)
    if index is None:
        return
    x = _get(args, kwargs, index)
    generator = torch.Generator().manual_seed(seed)
    for name, value in _transforms(x, generator, domain == "softmax"):
        yield name, *_with(args, kwargs, index, value)
    if row_length_free and x.dim() >= 2 and x.shape[-1] < LONG_ROW:
        long = _long_low_precision_rows(args, kwargs, skip, x, generator)
        if long is not None:
            yield "long rows in bf16", *long


def _long_low_precision_rows(args: tuple, kwargs: dict, skip: int, x: torch.Tensor, generator: torch.Generator):
    """The call on a few rows of LONG_ROW nearly equal values in bfloat16: a sum kept in the input dtype shows there
    (a model run in fp32, as on a CPU, never feeds the op bf16; under CUDA autocast the op may well see it)."""
    from e2eprof.checks.unseen_shapes import resized_arguments

    shape = (*x.shape[:-2], 3, LONG_ROW)
    resized = resized_arguments(args, kwargs, skip, tuple(x.shape), shape, generator)
    if resized is None:
        return None
    new_args, new_kwargs, made = resized
    # Nearly equal values: a softmax's row then sums to about the row's length, where bf16 keeps whole units only.
    low = {id(t): (t * 0.05).to(torch.bfloat16) for t in made}
    swap = lambda v: low.get(id(v), v)  # noqa: E731
    return tuple(swap(a) for a in new_args), {k: swap(v) for k, v in new_kwargs.items()}


def _primary(args: tuple, kwargs: dict, skip: int):
    """Where the first floating tensor argument is: ("arg", i) or ("kw", name); None when there is none."""
    for i, a in enumerate(args):
        if i >= skip and isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 1:
            return ("arg", i)
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1:
            return ("kw", k)
    return None


def _get(args: tuple, kwargs: dict, index) -> torch.Tensor:
    kind, key = index
    return args[key] if kind == "arg" else kwargs[key]


def _with(args: tuple, kwargs: dict, index, value: torch.Tensor) -> tuple[tuple, dict]:
    kind, key = index
    if kind == "arg":
        return (*args[:key], value, *args[key + 1:]), dict(kwargs)
    return tuple(args), {**kwargs, key: value}


def _transforms(x: torch.Tensor, generator: torch.Generator, masked_rows: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The transformed copies of x (same shape, dtype, device), by name.

    Only ordinary values move: sentinels (NaN, +-inf, and magnitudes of half the dtype's largest or more, which is
    how additive attention masks hide a position) keep their value and place, so a masked position stays masked.
    """
    x = x.detach()
    info = torch.finfo(x.dtype)
    work = x.double()
    ordinary = torch.isfinite(work) & (work.abs() < info.max / 2)
    if not bool(ordinary.any()):
        return
    peak = float(work[ordinary].abs().max())

    def moved(values: torch.Tensor) -> torch.Tensor:
        return _cast(torch.where(ordinary, values, work), x.dtype)

    scale_room = math.log10(info.max / max(peak, info.tiny))
    for decade in DECADES:
        if decade >= scale_room:
            break
        yield f"scale 1e{decade}", moved(work * 10.0 ** decade)
    rows = work.reshape(-1, work.shape[-1]) if work.dim() else work.reshape(1, 1)
    signs = (torch.randint(0, 2, (rows.shape[0], 1), generator=generator).double() * 2 - 1).to(work.device)
    yield "row offset", moved((rows + signs * ROW_OFFSET * (peak + 1)).reshape(work.shape))
    if work.dim() and work.shape[-1] > OUTLIER_CHANNELS:
        channels = torch.randperm(work.shape[-1], generator=generator)[:OUTLIER_CHANNELS].to(work.device)
        outliers = work.clone()
        outliers[..., channels] *= OUTLIER_FACTOR
        yield "outlier channels", moved(outliers)
    if peak > 0:
        yield "near the dtype's largest", moved(work * (info.max / 4 / peak))
        yield "denormals", moved(work * (info.tiny / 4 / peak))
    means = torch.where(ordinary, work, 0.0).reshape(rows.shape).mean(dim=-1, keepdim=True)
    yield "constant rows", moved(means.expand_as(rows).reshape(work.shape) + 1.0)
    if masked_rows and work.dim() >= 2 and rows.shape[0] > MASKED_ROWS:
        picked = torch.randperm(rows.shape[0], generator=generator)[:MASKED_ROWS].to(work.device)
        for label, fill in (("-inf", -math.inf), ("lowest finite", info.min)):
            masked = rows.clone()
            masked[picked] = fill
            yield f"fully masked rows ({label})", _cast(masked.reshape(work.shape), x.dtype)
        special = rows.clone()
        special[picked[0], : max(1, rows.shape[1] // 2)] = -math.inf  # a padded half row...
        special[picked[0], 0] = math.nan  # ...holding NaN and +inf where padding left garbage
        special[picked[1 % len(picked)], -1] = math.inf
        yield "NaN/Inf at masked places", _cast(special.reshape(work.shape), x.dtype)


def _cast(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """value in dtype; values beyond its range become +-inf as a real overflow would."""
    return value.to(dtype).contiguous()


# ---- running and judging one point ------------------------------------------------------------------------------


def _float64(value):
    return value.detach().double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _first_tensor(out):
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return out if isinstance(out, torch.Tensor) else None


def forward(fn: Callable, reference_fn: Callable | None, args: tuple, kwargs: dict, skip: int,
            reference: bool = False):
    """(fn's output, the fp64 reference's output or None). The reference is reference_fn on float64 copies, or
    fn's output in float64 when the patch declares none."""
    with torch.no_grad():
        out = fn(*args, **kwargs)
        ref = None
        if reference:
            first = _first_tensor(out)
            device_type = first.device.type if first is not None else "cpu"
            if reference_fn is None:
                ref = tuple(_float64(o) for o in out) if isinstance(out, (tuple, list)) else _float64(out)
            else:
                with torch.autocast(device_type, enabled=False):
                    ref = reference_fn(*[_float64(a) if i >= skip else a for i, a in enumerate(args)],
                                       **{k: _float64(v) for k, v in kwargs.items()})
    return out, ref


def backward(fn: Callable, reference_fn: Callable | None, args: tuple, kwargs: dict, skip: int,
             reference: bool = False):
    """(the gradient fn's first output sends to the first floating tensor argument, the fp64 reference's), for
    the same seeded upstream gradient; (None, None) when the output does not depend on it differentiably."""
    index = _primary(args, kwargs, skip)
    if index is None:
        return None, None

    def grad_of(function, call_args, call_kwargs, dtype=None):
        x = _get(call_args, call_kwargs, index)
        leaf = (x.detach().double() if dtype is torch.float64 else x.detach().clone()).requires_grad_(True)
        new_args, new_kwargs = _with(call_args, call_kwargs, index, leaf)
        if dtype is torch.float64:
            new_args = tuple(_float64(a) if i >= skip and a is not leaf else a for i, a in enumerate(new_args))
            new_kwargs = {k: v if v is leaf else _float64(v) for k, v in new_kwargs.items()}
        with torch.enable_grad():
            out = _first_tensor(function(*new_args, **new_kwargs))
        if out is None or not out.requires_grad:
            return None
        # Drawn where the output lives, from a fixed seed, so the kernel, the stock op and the fp64 reference get
        # the same upstream gradient; a host draw of a prefill-sized softmax's 99M values took 1.2 s (H200 host).
        generator = torch.Generator(device=out.device).manual_seed(1)
        upstream = torch.randn(out.shape, generator=generator, device=out.device, dtype=torch.float32)
        (grad,) = torch.autograd.grad(out, leaf, upstream.to(out.dtype), allow_unused=True)
        return grad

    grad = grad_of(fn, args, kwargs)
    if grad is None or not reference:
        return grad, None
    if reference_fn is None:
        return grad, grad.double()
    device_type = grad.device.type
    with torch.autocast(device_type, enabled=False):
        return grad, grad_of(reference_fn, args, kwargs, dtype=torch.float64)


def judgeable(reference) -> bool:
    """Whether a relative error can judge against this reference: not where it is zero everywhere it is finite
    (constant rows through a norm with zero bias: any rounding is an infinite relative error)."""
    tensors = [r for r in (reference if isinstance(reference, (tuple, list)) else [reference]) if isinstance(r, torch.Tensor)]
    return any(bool((r[torch.isfinite(r)] != 0).any()) for r in tensors)


def judge(out, stock, reference, *, floor: float, factor: float):
    """The patched output against the stock one and the fp64 reference, as every verified call is judged. Where the
    stock output is not finite but the reference is (the stock op overflowed), the kernel is held to the stock op,
    not to fp64: it must be finite and as accurate wherever the stock op is, and may break where the stock op breaks
    (how exactly an overflow shows, NaN or inf, is the implementation's)."""
    from e2eprof.checks.tensorcheck import Agreement, compare_to_reference

    if isinstance(stock, (tuple, list)):
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        parts = [judge(o, s, r, floor=floor, factor=factor) for o, s, r in zip(outs, stock, reference)
                 if isinstance(s, torch.Tensor)]
        return Agreement(all(p.passed for p in parts), max(p.patched_error for p in parts),
                         max(p.stock_error for p in parts), max(p.tolerance for p in parts),
                         [problem for p in parts for problem in p.problems])
    if reference is None or not isinstance(stock, torch.Tensor):
        return Agreement(True, 0.0, 0.0, floor, [])
    reference = reference.to(stock.device)
    stock_broke = ~torch.isfinite(stock) & torch.isfinite(reference)
    if not bool(stock_broke.any()):
        return compare_to_reference(out, stock, reference, floor=floor, factor=factor)
    problems = []
    finite = torch.isfinite(stock)
    if not isinstance(out, torch.Tensor) or out.shape != stock.shape:
        return compare_to_reference(out, stock, reference, floor=floor, factor=factor)
    if not bool(torch.isfinite(out[finite]).all()):
        problems.append("NaN/Inf where the stock output is finite (the stock op overflows elsewhere in this input)")
    elif bool(finite.any()):
        kept = compare_to_reference(out[finite].contiguous(), stock[finite].contiguous(), reference[finite],
                                    floor=floor, factor=factor)
        problems += [p for p in kept.problems if not p.startswith("strides")]
    return Agreement(not problems, math.nan, math.nan, floor, problems)


def attention(args: tuple, kwargs: dict, mask_position: int = 4, seed: int = 0) -> Iterator[Point]:
    """A domain for attention functions (module, query, key, value, attention_mask, ...): the query across its
    range (scaling it scales the logits) and rows of the additive mask fully masked, as padding makes them."""
    yield from points(args, kwargs, 0, "any", seed)
    in_args = len(args) > mask_position and isinstance(args[mask_position], torch.Tensor)
    mask = args[mask_position] if in_args else kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or not mask.is_floating_point() or mask.dim() < 2 or mask.shape[-2] <= MASKED_ROWS:
        return
    rows = torch.randperm(mask.shape[-2], generator=torch.Generator().manual_seed(seed))[:MASKED_ROWS].to(mask.device)
    for label, fill in (("-inf", -math.inf), ("lowest finite", torch.finfo(mask.dtype).min)):
        masked = mask.clone()
        masked[..., rows, :] = fill
        if in_args:
            yield f"fully masked rows ({label})", (*args[:mask_position], masked, *args[mask_position + 1:]), dict(kwargs)
        else:
            yield f"fully masked rows ({label})", tuple(args), {**kwargs, "attention_mask": masked}
