"""Find patches by name, file, module or entry point.

A patch spec is one of:
  - a built-in name ("fastsoftmax"),
  - a path to a Python file ("my_kernels/softmax.py") that declares one or more `Patch` objects,
    optionally with ":NAME" to pick one,
  - "package.module:NAME" for an importable module,
  - a name registered by an installed package under the entry-point group "e2eprof.patches".
Patch files are code and run with the user's rights: they are loaded only from what the user names.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from e2eprof.suggest import suggest
from e2eprof.errors import PatchError
from e2eprof.patch import Patch

BUILTIN_PATCHES = {
    "fastsoftmax": "e2eprof.kernels.fastsoftmax.patch:PATCH",
    "fastgelu": "e2eprof.kernels.fastgelu.patch:PATCH",
    "fastlayernorm": "e2eprof.kernels.fastlayernorm.patch:PATCH",
    "fusedsoftmax": "e2eprof.kernels.fusedsoftmax.patch:PATCH",
    "planted-slowdown": "e2eprof.kernels.planted_slowdown.patch:PATCH",
    "rmsnorm": "e2eprof.kernels.rmsnorm.patch:PATCH",
    "swiglu": "e2eprof.kernels.swiglu.patch:PATCH",
}
# Liger-Kernel's kernels (the optional extra e2eprof[liger]): built-in names only where liger_kernel is installed.
LIGER_PATCHES = {
    "liger-rmsnorm": "e2eprof.kernels.liger.norms:RMSNORM",
    "liger-layernorm": "e2eprof.kernels.liger.norms:LAYERNORM",
    "liger-swiglu": "e2eprof.kernels.liger.norms:SWIGLU",
    "liger-softmax": "e2eprof.kernels.liger.attention:SOFTMAX",
    "liger-rope": "e2eprof.kernels.liger.attention:ROPE",
    "liger-cross-entropy": "e2eprof.kernels.liger.losses:CROSS_ENTROPY",
    "liger-flce": "e2eprof.kernels.liger.losses:FLCE",
    "liger-flce-gpt2": "e2eprof.kernels.liger.losses:FLCE_GPT2",
}
ENTRY_POINT_GROUP = "e2eprof.patches"


def liger_available() -> bool:
    """Whether liger_kernel is installed (found without importing it: importing it loads Triton)."""
    try:
        return importlib.util.find_spec("liger_kernel") is not None
    except (ImportError, ValueError):  # blocked (sys.modules entry None) or a broken parent: not usable
        return False


def builtin_patches() -> dict[str, str]:
    """Built-in names -> "module:ATTR", the Liger ones included when liger_kernel is installed."""
    return {**BUILTIN_PATCHES, **(LIGER_PATCHES if liger_available() else {})}
NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp")


@dataclass(frozen=True)
class LoadedPatch:
    """A resolved patch and where it came from (shown by `e2eprof list` and stored in run.parquet)."""

    patch: Patch
    spec: str
    origin: str  # "builtin", "file", "module" or "entry-point:<distribution>"
    source_hash: str


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known_patch_names() -> list[str]:
    return sorted(set(builtin_patches()) | set(_entry_points()))


def source_hash(patch: Patch) -> str:
    """sha256 over the patch's source files, so a report names exactly which kernel code was measured."""
    digest = hashlib.sha256()
    # Native sources beside the Python files (a .cu kernel that a patch compiles with load_inline) are kernel
    # code too: editing one must change the hash.
    native = {p for f in patch.source_files() for suffix in NATIVE_SUFFIXES for p in f.parent.glob("*" + suffix)}
    for path in sorted(set(patch.source_files()) | native):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _one_line(exc: BaseException) -> str:
    """'Type: message' on one line (user code may raise multi-line messages; a PatchError is one line)."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


# What importing user code may raise that is the code's fault, not ours: any error, and also SystemExit (a patch
# file that calls sys.exit() or exit() at import would otherwise end e2eprof with exit code 0 and no output).
# KeyboardInterrupt is the user's and stays one.
USER_CODE_ERRORS = (Exception, SystemExit)


def _patches_in(namespace: dict, where: str) -> list[Patch]:
    found = [value for value in namespace.values() if isinstance(value, Patch)]
    if not found:
        raise PatchError(f"{where} declares no e2eprof.patch.Patch object")
    return found


def _pick(patches: list[Patch], name: str | None, where: str) -> Patch:
    if name is None:
        if len(patches) > 1:
            names = ", ".join(p.name for p in patches)
            raise PatchError(f"{where} declares several patches ({names}); pick one with {where}:NAME")
        return patches[0]
    for patch in patches:
        if patch.name == name:
            return patch
    raise PatchError(f"{where} has no patch named '{name}'{suggest(name, [p.name for p in patches])}")


def _load_file(path: Path) -> dict:
    module_name = "e2eprof_user_patch_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PatchError(f"patch file {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except USER_CODE_ERRORS as exc:  # any error in user code is a usage error about that file
        sys.modules.pop(module_name, None)
        raise PatchError(f"patch file {path} failed to import: {_one_line(exc)}") from None
    return vars(module)


def _import_attr(module_name: str, attr: str | None, spec: str) -> list[Patch] | Patch:
    try:
        module = importlib.import_module(module_name)
    except USER_CODE_ERRORS as exc:
        raise PatchError(f"patch '{spec}': module '{module_name}' failed to import: {_one_line(exc)}") from None
    if attr is None:
        return _patches_in(vars(module), f"module {module_name}")
    if not hasattr(module, attr):
        raise PatchError(f"patch '{spec}': module '{module_name}' has no attribute '{attr}'")
    value = getattr(module, attr)
    if not isinstance(value, Patch):
        raise PatchError(f"patch '{spec}': {module_name}.{attr} is a {type(value).__name__}, not an e2eprof.patch.Patch")
    return value


def load_patch(spec: str) -> LoadedPatch:
    """Resolve a patch spec (see module docstring); raise PatchError with a one-line reason on failure."""
    if spec in LIGER_PATCHES and not liger_available():
        raise PatchError(f"patch '{spec}' needs Liger-Kernel: pip install e2eprof[liger]")
    builtins = builtin_patches()
    if spec in builtins:
        module_name, _, attr = builtins[spec].partition(":")
        patch = _import_attr(module_name, attr, spec)
        return LoadedPatch(patch, spec, "builtin", source_hash(patch))
    file_part, _, name = spec.partition(".py:") if ".py:" in spec else (spec, "", "")
    if file_part.endswith(".py") or ".py:" in spec:
        path = Path(file_part if file_part.endswith(".py") else file_part + ".py")
        if not path.is_file():
            raise PatchError(f"patch file {path} does not exist")
        patch = _pick(_patches_in(_load_file(path), f"patch file {path}"), name or None, str(path))
        return LoadedPatch(patch, spec, "file", source_hash(patch))
    entry_points = _entry_points()
    if spec in entry_points:
        ep = entry_points[spec]
        try:
            value = ep.load()
        except USER_CODE_ERRORS as exc:
            raise PatchError(f"patch '{spec}' (entry point {ep.value}) failed to load: {_one_line(exc)}") from None
        if not isinstance(value, Patch):
            raise PatchError(f"entry point '{spec}' ({ep.value}) is not an e2eprof.patch.Patch")
        dist = ep.dist.name if ep.dist else "?"
        return LoadedPatch(value, spec, f"entry-point:{dist}", source_hash(value))
    if ":" in spec or ("." in spec and "/" not in spec):
        module_name, _, attr = spec.partition(":")
        value = _import_attr(module_name, attr or None, spec)
        patch = value if isinstance(value, Patch) else _pick(value, None, module_name)
        return LoadedPatch(patch, spec, "module", source_hash(patch))
    known = known_patch_names()
    raise PatchError(
        f"unknown patch '{spec}'{suggest(spec, known)}; known: {', '.join(known)}, "
        "or a file.py, package.module:NAME"
    )
