"""Installing and reverting a declared `Patch`: the one engine that applies any of them.

Applying resolves every target before touching anything (all-or-nothing, `targets.resolve`), installs a
`CallRecorder` that counts calls and records argument signatures, and returns an `AppliedPatch` that reverts
exactly what it changed. A shared module (e.g. torch.nn) is never mutated: the modeling module gets a
`ModuleProxy` that serves the replacement instead.

A class target swaps each instance's class for the replacement subclass and binds one recorder per target as
each instance's `forward`, so module replacements are counted and verified too: the recorder calls
replacement.forward(module, x), the stock forward(module, x) and reference(module, x in float64).
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field

import torch

from e2eprof.errors import PatchError
from e2eprof.patch import Patch
from e2eprof.patching.recorder import CallRecorder, OpCheck
from e2eprof.patching.signatures import format_signature
from e2eprof.patching.targets import check_model_fits, resolve


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

    def set_verify(self, on: bool, extended: bool = True) -> None:
        """Verify every call (or stop); extended=False leaves out the unseen-shape and stress checks, which move a
        call's inputs to shapes and ranges of their own and so need running only once per signature per run."""
        for recorder in self.recorders:
            recorder.verify = on
            recorder.extended = extended

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
    resolved = [(target, *resolve(target)) for target in patch.targets]
    if model is not None:
        # The model's own modeling module's targets first: when two targets resolve to one class (nn.LayerNorm as
        # modeling_gpt2 and modeling_bert see it), the model's instances are counted under its own target.
        resolved.sort(key=lambda r: r[0].partition(":")[0] != type(model).__module__)
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
    # An instance an earlier target of this patch already took is counted once, by that target: two targets can
    # resolve to one class (nn.LayerNorm as two modeling modules see it), or share one replacement subclass.
    taken = {id(c.owner) for c in applied._changes if c.attribute == "forward"}
    if model is not None:
        for sub in model.modules():
            if type(sub) not in ((original,) if passthrough else (original, replacement)) or id(sub) in taken:
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
