"""The one engine that applies, counts, verifies and reverts any declared `Patch`.

Applying resolves every target before touching anything (all-or-nothing), installs a `CallRecorder` that
counts calls and records argument signatures, and returns an `AppliedPatch` that reverts exactly what it
changed. In verify mode the recorder also runs the stock function and the fp64 reference on the same
arguments and records how far the patched output is from each (`OpCheck` rows).

A class target swaps each instance's class for the replacement subclass and binds one recorder per target as
each instance's `forward`, so module replacements are counted and verified too: the recorder calls
replacement.forward(module, x), the stock forward(module, x) and reference(module, x in float64).
"""

from __future__ import annotations

import importlib
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from e2eprof.errors import PatchError
from e2eprof.patch import Patch
from e2eprof.tensorcheck import compare_to_reference


class ModuleProxy(types.ModuleType):
    """Stands in for a shared module (e.g. torch.nn) inside one modeling module's namespace.

    Attributes listed in `overrides` are served from there; everything else from the real module, so the
    modeling code keeps working and the rest of the process never sees the replacement.
    """

    def __init__(self, wrapped: types.ModuleType, overrides: dict):
        super().__init__(wrapped.__name__, wrapped.__doc__)
        self.__dict__["_e2eprof_wrapped"] = wrapped
        self.__dict__.update(overrides)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_e2eprof_wrapped"], name)


def _signature_key(args: tuple, kwargs: dict) -> tuple:
    """Cheap hashable key of the shapes/dtypes/values a call received (formatted only when reported).

    This runs on every call of the patched function, inside the timed loop, so it must cost far less than a
    kernel launch: tuples of shapes and dtypes, no string formatting.
    """
    key = tuple((a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor) else a for a in args)
    if kwargs:
        key += tuple((k, (v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else v) for k, v in sorted(kwargs.items()))
    return key


def format_signature(key: tuple) -> str:
    """'float32[8,12,1024,1024], dim=-1' for a key made by _signature_key."""

    def one(value) -> str:
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.dtype):
            return f"{str(value[0]).removeprefix('torch.')}[{','.join(map(str, value[1]))}]"
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        return repr(value)

    parts = []
    for item in key:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            parts.append(f"{item[0]}={one(item[1])}")
        else:
            parts.append(one(item))
    return ", ".join(parts)


def _to_float64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().double()
    return value


@dataclass
class OpCheck:
    """Worst errors seen for one argument signature while verifying."""

    signature: str
    calls: int = 0
    passed: bool = True
    patched_error: float = 0.0
    stock_error: float = 0.0
    tolerance: float = 0.0
    problems: list[str] = field(default_factory=list)


REPLACED_RANGE_PREFIX = "e2eprof.replaced::"


class CallRecorder:
    """The callable installed at a target: counts calls, records signatures, optionally verifies."""

    def __init__(self, patch: Patch, original: Callable, passthrough: bool = False, target: Callable | None = None,
                 method: bool = False):
        self.patch = patch
        self.original = original
        # passthrough: call the stock function (used in stock arms while profiling, so the replaced region is
        # measured the same way in every arm).
        self.target = original if passthrough else (patch.replacement if target is None else target)
        # method: called as forward(module, *args) for a class target; the module is left out of signatures and
        # passed first to the stock forward and to the reference (which reads the module's weights).
        self.skip = 1 if method else 0
        self.range_name = f"{REPLACED_RANGE_PREFIX}{patch.name}"
        self.mark_ranges = False
        self.calls = 0
        self.signatures: Counter[tuple] = Counter()
        self.verify = False
        self.checks: dict[str, OpCheck] = {}

    def __call__(self, *args, **kwargs):
        self.calls += 1
        key = _signature_key(args[self.skip:], kwargs)
        self.signatures[key] += 1
        if self.mark_ranges:
            with torch.profiler.record_function(self.range_name):
                out = self.target(*args, **kwargs)
        else:
            out = self.target(*args, **kwargs)
        if self.verify:
            self._check(format_signature(key), args, kwargs, out)
        return out

    def _check(self, signature: str, args: tuple, kwargs: dict, out) -> None:
        with torch.no_grad():
            stock = self.original(*args, **kwargs)  # under the caller's autocast state: exact stock semantics
            if self.patch.reference is not None:
                device_type = stock.device.type if isinstance(stock, torch.Tensor) else "cpu"
                with torch.autocast(device_type, enabled=False):
                    reference = self.patch.reference(*[_to_float64(a) for a in args], **{k: _to_float64(v) for k, v in kwargs.items()})
            else:
                reference = stock.double() if isinstance(stock, torch.Tensor) else stock
        check = self.checks.setdefault(signature, OpCheck(signature))
        check.calls += 1
        floor = self.patch.tolerance_for(str(getattr(stock, "dtype", "")).removeprefix("torch."))
        result = compare_to_reference(out, stock, reference, floor=floor, factor=self.patch.error_factor)
        check.patched_error = max(check.patched_error, result.patched_error)
        check.stock_error = max(check.stock_error, result.stock_error)
        check.tolerance = max(check.tolerance, result.tolerance)
        if not result.passed:
            check.passed = False
            for problem in result.problems:
                if problem not in check.problems:
                    check.problems.append(problem)


_ABSENT = object()  # _Change.previous of an attribute that did not exist: revert deletes it


@dataclass
class _Change:
    owner: object
    attribute: str
    previous: object


@dataclass
class AppliedPatch:
    """A patch in force: its recorders, the sites it replaced, and how to undo it."""

    patch: Patch
    recorders: list[CallRecorder]
    sites: list[dict]
    _changes: list[_Change]
    _class_swaps: list[tuple[torch.nn.Module, type]] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.recorders)

    @property
    def n_sites(self) -> int:
        return sum(s["count"] for s in self.sites)

    def signatures(self) -> Counter[str]:
        """Calls per argument signature, formatted ('float32[8,12,1024,1024], dim=-1')."""
        total: Counter[str] = Counter()
        for recorder in self.recorders:
            for key, count in recorder.signatures.items():
                total[format_signature(key)] += count
        return total

    def set_mark_ranges(self, on: bool) -> None:
        """Wrap each call in a profiler range named e2eprof.replaced::<patch> (profiling phase only)."""
        for recorder in self.recorders:
            recorder.mark_ranges = on

    def set_verify(self, on: bool) -> None:
        for recorder in self.recorders:
            recorder.verify = on

    def checks(self) -> list[OpCheck]:
        return [check for r in self.recorders for check in r.checks.values()]

    def revert(self) -> None:
        """Put back exactly what apply() replaced, in reverse order."""
        for change in reversed(self._changes):
            if change.previous is _ABSENT:
                delattr(change.owner, change.attribute)
            else:
                setattr(change.owner, change.attribute, change.previous)
        for module, cls in reversed(self._class_swaps):
            module.__class__ = cls
        self._changes.clear()
        self._class_swaps.clear()


def _resolve(target: str) -> tuple[types.ModuleType, list[str], list[object]]:
    """Import the target's module and walk its attribute path; return the module, path and objects on it."""
    module_name, _, path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PatchError(f"target {target}: module '{module_name}' cannot be imported ({exc})") from None
    parts = path.split(".")
    objects: list[object] = [module]
    for depth, part in enumerate(parts):
        owner = objects[-1]
        if not hasattr(owner, part):
            where = module_name + "".join("." + p for p in parts[:depth])
            raise PatchError(
                f"target {target}: '{where}' has no attribute '{part}' "
                f"(the modeling code may have changed in this transformers version)"
            )
        objects.append(getattr(owner, part))
    return module, parts, objects


def check_model_fits(patch: Patch, architecture: str, attn_implementation: str | None) -> None:
    """Raise PatchError when the patch does not apply to this architecture or attention implementation."""
    if patch.architectures and architecture not in patch.architectures:
        # Name what the patch replaces, so the user sees why another family's model (its own modeling code,
        # its own classes) never reaches it.
        raise PatchError(
            f"patch '{patch.name}' applies to {', '.join(patch.architectures)}; this model is '{architecture}', "
            f"whose code never reaches what the patch replaces ({', '.join(patch.targets)})"
        )
    if patch.attn_implementation and attn_implementation and attn_implementation != patch.attn_implementation:
        raise PatchError(
            f"patch '{patch.name}' needs attn_implementation='{patch.attn_implementation}', "
            f"the model uses '{attn_implementation}' (which never calls the replaced function)"
        )


def apply_patch(patch: Patch, model: torch.nn.Module | None = None, *, passthrough: bool = False) -> AppliedPatch:
    """Install `patch` at all its targets; with a model, also swap classes of existing instances.

    Resolves every target first, so a patch with one bad target changes nothing. Raises PatchError when a
    target does not exist or the patch would replace zero sites. With passthrough=True the recorder calls the
    stock function (a stock arm's profiling instrument): no class is swapped, the model's instances of a class
    target only get a counting forward, and the model need not fit the patch (a reference arm's attention differs).
    """
    if model is not None and not passthrough:
        config = getattr(model, "config", None)
        check_model_fits(patch, getattr(config, "model_type", ""), getattr(config, "_attn_implementation", None))
    resolved = [(target, *_resolve(target)) for target in patch.targets]
    applied = AppliedPatch(patch, recorders=[], sites=[], _changes=[])
    try:
        for target, module, parts, objects in resolved:
            original = objects[-1]
            if isinstance(original, type):
                _apply_class(applied, target, module, parts, original, model, passthrough)
            else:
                _apply_function(applied, target, module, parts, objects, original, passthrough)
    except Exception:
        applied.revert()
        raise
    if applied.n_sites == 0 and not passthrough:
        applied.revert()
        raise PatchError(f"patch '{patch.name}' replaced zero sites in this model")
    return applied


def _install(applied: AppliedPatch, target: str, module, parts: list[str], new: object) -> None:
    """Put `new` at `parts` as `module` sees it, recording the change; never mutates a shared module."""
    # Walk the live path, not the one resolved before applying: an earlier target of this patch may already
    # have put a proxy on it, and that proxy must be extended, not overwritten.
    objects: list[object] = [module]
    for part in parts[:-1]:
        objects.append(getattr(objects[-1], part))
    # Find the outermost shared module on the path: proxy from there down so nothing outside `module` changes.
    first_shared = next(
        (i for i in range(1, len(parts)) if isinstance(objects[i], types.ModuleType) and objects[i] is not module),
        None,
    )
    if first_shared is None:
        owner = objects[-1]
        if isinstance(owner, type):
            # A plain callable stored on a class is not bound to instances (and staticmethods, classmethods and
            # inherited attributes would not be restored exactly): the model would break or stay changed.
            raise PatchError(
                f"target {target}: '{parts[-1]}' is an attribute of class {owner.__name__}; replace the class "
                f"with a subclass instead (target '{target.partition(':')[0]}:{'.'.join(parts[:-1])}')"
            )
        applied._changes.append(_Change(owner, parts[-1], getattr(owner, parts[-1])))
        setattr(owner, parts[-1], new)
        return
    for i in range(len(parts) - 1, first_shared - 1, -1):
        if not isinstance(objects[i], types.ModuleType):
            raise PatchError(f"target {target}: cannot scope a replacement inside non-module '{parts[i - 1]}'")
        new = ModuleProxy(objects[i], {parts[i]: new})
    owner = objects[first_shared - 1]
    applied._changes.append(_Change(owner, parts[first_shared - 1], objects[first_shared]))
    setattr(owner, parts[first_shared - 1], new)


def _apply_function(applied: AppliedPatch, target: str, module, parts: list[str], objects: list, original,
                    passthrough: bool = False) -> None:
    if not callable(original):
        raise PatchError(f"target {target}: '{parts[-1]}' is not callable")
    recorder = CallRecorder(applied.patch, original, passthrough)
    _install(applied, target, module, parts, recorder)
    applied.recorders.append(recorder)
    applied.sites.append({"target": target, "kind": "function", "count": 1})


def _apply_class(applied: AppliedPatch, target: str, module, parts: list[str], original: type, model,
                 passthrough: bool = False) -> None:
    replacement = applied.patch.replacement
    if not (isinstance(replacement, type) and issubclass(replacement, original)):
        raise PatchError(f"target {target} is a class; the replacement must be a subclass of {original.__name__}")
    if not passthrough:
        _install(applied, target, module, parts, replacement)
    # One recorder for all instances: each instance's forward becomes the recorder bound to it, so calls are
    # counted and, in verify mode, checked against the stock forward and the reference like function targets.
    # Passthrough: the recorder calls the stock forward, and only stock instances are instrumented.
    recorder = CallRecorder(applied.patch, original.forward, passthrough, target=replacement.forward, method=True)
    count = 0
    if model is not None:
        for sub in model.modules():
            if type(sub) not in ((original,) if passthrough else (original, replacement)):
                continue
            if "forward" in vars(sub):
                # The instance attribute would run instead of the replacement's forward: nothing would change.
                raise PatchError(f"target {target}: a {original.__name__} instance has its own forward attribute "
                                 f"(set by a hook library?), so replacing its class would not take effect")
            if type(sub) is original and not passthrough:
                applied._class_swaps.append((sub, original))
                sub.__class__ = replacement
            applied._changes.append(_Change(sub, "forward", _ABSENT))
            sub.forward = types.MethodType(recorder, sub)  # deepcopy rebinds it to the copy
            count += 1
    applied.recorders.append(recorder)
    applied.sites.append({"target": target, "kind": "class", "count": count})
