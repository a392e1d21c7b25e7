"""Target resolution and fit checks: does a patch's every target exist, and can its replacement take the calls?

Run before anything is installed or measured (apply_patch and check_model_fits), so a typo in a target or a
wrongly declared replacement is one precise PatchError line instead of a crashed arm.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from collections.abc import Callable

from e2eprof.errors import PatchError
from e2eprof.patch import Patch
from e2eprof.suggest import nearby


def resolve(target: str) -> tuple[types.ModuleType, list[str], list[object]]:
    """Import the target's module and walk its attribute path; return the module, path and objects on it."""
    module_name, _, path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that raises anything on import is a bad target, said in one line
        raise PatchError(f"target {target}: module '{module_name}' cannot be imported "
                         f"({' '.join(f'{type(exc).__name__}: {exc}'.split())}){_nearby_modules(module_name)}") from None
    parts = path.split(".")
    objects: list[object] = [module]
    for depth, part in enumerate(parts):
        owner = objects[-1]
        if not hasattr(owner, part):
            where = module_name + "".join("." + p for p in parts[:depth])
            raise PatchError(
                f"target {target}: '{where}' has no attribute '{part}'{nearby(part, dir(owner))} "
                f"(the modeling code may have changed in this transformers version)"
            )
        objects.append(getattr(owner, part))
    return module, parts, objects


def _nearby_modules(module_name: str) -> str:
    """Sibling modules of a module that failed to import, the closest first (a typo in a path is the usual cause)."""
    parent, _, leaf = module_name.rpartition(".")
    try:
        package = importlib.import_module(parent) if parent else None
    except Exception:  # only a hint for an error already being raised: no hint beats a second failure
        return ""
    if package is None or not hasattr(package, "__path__"):
        return ""
    return nearby(leaf, [info.name for info in pkgutil.iter_modules(package.__path__)])


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def signature_mismatch(replaced: Callable, replacement: Callable) -> str | None:
    """Why `replacement` cannot take every call that `replaced` takes, naming the parameter; None when it can.

    The model calls the replacement exactly as it called the stock function, positionally or by keyword, so
    each of the stock function's parameters must exist in the replacement at the same position, with the same
    name (unless positional-only) and kind, and keep its default. The replacement may take more: *args/**kwargs,
    or extra parameters with defaults. Callables without a readable signature (some builtins) are not compared.
    """
    try:
        want, have = inspect.signature(replaced), inspect.signature(replacement)
    except (TypeError, ValueError):
        return None
    have_params = list(have.parameters.values())
    have_positional = [p for p in have_params if p.kind in _POSITIONAL]
    have_keyword = {p.name: p for p in have_params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in have_params)
    var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in have_params)
    matched: set[str] = set()
    want_positional = [p for p in want.parameters.values() if p.kind in _POSITIONAL]
    for p in want.parameters.values():
        kind = p.kind.description
        if p.kind is inspect.Parameter.VAR_POSITIONAL and not var_args:
            return f"the replaced function takes *{p.name}, the replacement has no *args"
        if p.kind is inspect.Parameter.VAR_KEYWORD and not var_kwargs:
            return f"the replaced function takes **{p.name}, the replacement has no **kwargs"
        if p.kind in _POSITIONAL:
            index = want_positional.index(p)
            mine = have_positional[index] if index < len(have_positional) else None
            if mine is None:
                if var_args and (p.kind is inspect.Parameter.POSITIONAL_ONLY or var_kwargs):
                    continue
                return (f"parameter {index + 1} '{p.name}' ({kind}) of the replaced function is missing from the "
                        f"replacement, which takes {len(have_positional)} positional parameter(s)")
            matched.add(mine.name)
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and mine.kind is inspect.Parameter.POSITIONAL_ONLY:
                return (f"parameter {index + 1} '{mine.name}' is positional-only in the replacement but {kind} "
                        f"('{p.name}') in the replaced function")
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and mine.name != p.name:
                return (f"parameter {index + 1} is '{mine.name}' in the replacement but '{p.name}' in the replaced "
                        f"function (callers may pass it by name)")
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            mine = have_keyword.get(p.name)
            if mine is None:
                if var_kwargs:
                    continue
                return f"keyword-only parameter '{p.name}' of the replaced function is missing from the replacement"
            matched.add(mine.name)
        else:
            continue
        if p.default is not inspect.Parameter.empty and mine.default is inspect.Parameter.empty:
            return (f"parameter '{p.name}' has a default in the replaced function but none in the replacement "
                    f"(callers may leave it out)")
    for mine in have_params:
        required = mine.default is inspect.Parameter.empty and mine.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if required and mine.name not in matched:
            return f"the replacement requires parameter '{mine.name}', which the replaced function does not have"
    return None


def check_targets(patch: Patch) -> None:
    """Raise PatchError when a target does not exist or the replacement's signature does not fit it.

    Run before any measurement (check_model_fits calls it), so a typo in a target or a wrongly declared
    replacement is one precise line instead of a crashed arm.
    """
    for target in patch.targets:
        _, _, objects = resolve(target)
        original = objects[-1]
        if isinstance(original, type):
            # A class target's replacement is a subclass; its forward is what the model calls instead.
            replaced, replacement, what = original.forward, getattr(patch.replacement, "forward", None), "forward of "
            if replacement is None or replacement is replaced:
                continue
        else:
            replaced, replacement, what = original, patch.replacement, ""
        problem = signature_mismatch(replaced, replacement)
        if problem:
            raise PatchError(f"patch '{patch.name}': the {what}replacement does not match the signature of "
                             f"{target}: {problem}")


def check_model_fits(patch: Patch, architecture: str, attn_implementation: str | None) -> None:
    """Raise PatchError when the patch does not apply to this architecture or attention implementation, or when
    a target does not exist or its replacement's signature does not fit (check_targets)."""
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
    check_targets(patch)
