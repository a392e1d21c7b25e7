"""e2eprof: does a custom kernel's microbenchmark win survive inside a real training or inference loop?"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# Installed, `kernels/` and `workloads/` become e2eprof.kernels and e2eprof.workloads (pyproject package-dir).
# Run straight from a source checkout (e.g. `python -m e2eprof` on a GPU machine where nothing is installed),
# the same names resolve by searching the checkout's root as part of this package.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "kernels" / "__init__.py").is_file():
    if str(_checkout) not in __path__:
        __path__.append(str(_checkout))
