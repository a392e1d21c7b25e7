"""Keep the checkout's top-level folders from taking names that other distributions own.

`kernels/` and `workloads/` sit at the top of the repository and are installed as `e2eprof.kernels` and
`e2eprof.workloads`. Whenever the checkout is on sys.path (`python -m pytest` or `python -m e2eprof` from the repo
root, PYTHONPATH=$PWD), Python would also find them under their bare names, before site-packages, and PyPI's
`kernels` (the Hugging Face kernel hub, which transformers >= 5.25 requires and imports) would be shadowed by ours.

Each folder's `__init__.py` calls `yield_name(globals())` when it is imported under its bare name. The name then goes
to the distribution that owns it, found on sys.path without the checkout, and where none is installed the module
is left looking uninstalled: no `__file__`, no version, and an empty `__path__`, so nothing of ours is importable as
`kernels.*` and probes such as transformers' `is_kernels_available` (find_spec, then metadata, then `__file__`)
read "not installed".
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except (OSError, RuntimeError, TypeError):
        return None


def yield_name(namespace: dict) -> None:
    """Hand the bare name of the package whose module globals are `namespace` to its rightful owner (see above)."""
    name = namespace["__name__"]
    checkout = Path(namespace["__file__"]).resolve().parent.parent
    elsewhere = [entry for entry in sys.path if isinstance(entry, str) and _resolved(entry) != checkout]
    spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
    if spec is not None and spec.origin is not None and spec.loader is not None:
        owner = importlib.util.module_from_spec(spec)
        # The import system returns whatever sys.modules holds once this module's code has run, so the owner
        # replaces us for this import and every later one.
        sys.modules[name] = owner
        try:
            spec.loader.exec_module(owner)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return
    namespace["__path__"] = []
    namespace["__file__"] = None
