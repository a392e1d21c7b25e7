"""Sign-off thresholds from a TOML file (`--policy`), so a team can pin them in its repository.

    # e2eprof-policy.toml
    min_speedup = 0.02        # PASS needs the interval's lower bound above 1.02
    confidence = 0.99
    correction = "holm"       # holm, bh or none, across workloads
    target_ci = 0.01          # adaptive length: stop adding blocks at this interval half-width...
    budget = 120              # ...or after this many extra seconds of timed steps per workload
    max_blocks = 400
    clock_tolerance = 0.02    # arms at SM clocks further apart than this cannot PASS
    temp_tolerance_c = 5
    warmup_tolerance = 0.02
    max_warmup_seconds = 60
    process_noise = 0.0044    # between-process spread folded into every interval (measure yours with A/A runs)
    replicas = 2              # identical processes for the baseline and the candidate arm each

Command-line options given explicitly win over the file. Unknown keys are an error (a typo such as
`min_speedp` must not silently leave the default in force).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from e2eprof.suggest import suggest
from e2eprof.errors import UsageError

# policy key -> (CompareConfig field, accepted types)
POLICY_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "min_speedup": ("min_speedup", (int, float)),
    "confidence": ("confidence", (int, float)),
    "correction": ("correction", (str,)),
    "target_ci": ("target_half_width", (int, float)),
    "budget": ("budget_seconds", (int, float)),
    "max_blocks": ("max_blocks", (int,)),
    "clock_tolerance": ("clock_tolerance", (int, float)),
    "temp_tolerance_c": ("temp_tolerance_c", (int, float)),
    "warmup_tolerance": ("warmup_tolerance", (int, float)),
    "max_warmup_seconds": ("max_warmup_seconds", (int, float)),
    "process_noise": ("process_noise", (int, float)),
    "replicas": ("replicas", (int,)),
}


def load_policy(path: str | Path) -> dict:
    """CompareConfig overrides from a policy file; UsageError (exit 2) for anything unreadable or unknown."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"--policy: cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--policy: {path} is not valid TOML: {exc}") from None
    overrides = {}
    for key, value in data.items():
        if key not in POLICY_KEYS:
            raise UsageError(f"--policy: unknown key '{key}' in {path}{suggest(key, list(POLICY_KEYS))}; "
                             f"known: {', '.join(POLICY_KEYS)}")
        field, types = POLICY_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise UsageError(f"--policy: '{key}' in {path} must be {wanted}, got {value!r}")
        # TOML writes 30 and 30.0 differently; a number field takes either.
        overrides[field] = float(value) if float in types else value
    return overrides
