"""Turn correctness rows, kernel counters and step statistics into PASS / FAIL / INCONCLUSIVE with reasons.

PASS: correct, the custom kernel ran (and not in the baseline), and faster than baseline by at least the
margin with the confidence interval's lower bound above 1 + margin.
FAIL: incorrect, the kernel did not run, the baseline was contaminated, the patched arm failed, or it is
significantly slower (the whole interval below 1).
INCONCLUSIVE: everything else, with what would settle it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
SEVERITY = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2}
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}

# Reason codes (stable strings: CI pipelines may match on them).
INCORRECT = "INCORRECT"
KERNEL_NOT_RUN = "KERNEL_NOT_RUN"
BASELINE_CONTAMINATED = "BASELINE_CONTAMINATED"
ARM_FAILED = "ARM_FAILED"
SLOWER = "SLOWER"
FASTER = "FASTER"
BELOW_MARGIN = "BELOW_MARGIN"
NO_SIGNIFICANT_DIFFERENCE = "NO_SIGNIFICANT_DIFFERENCE"
TOO_FEW_SAMPLES = "TOO_FEW_SAMPLES"

MIN_SAMPLES = 6


@dataclass
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    advice: str = ""

    @property
    def text(self) -> str:
        return f"{self.verdict} ({', '.join(self.reasons)})" + (f": {self.advice}" if self.advice else "")


def decide(*, correct: bool, kernel_ran: bool, baseline_clean: bool, arm_failed: bool, n_baseline: int,
           n_patched: int, ratio: float, ci_low: float, ci_high: float, min_speedup: float) -> Verdict:
    """Apply the sign-off rules for one workload (or sweep point); see the module docstring."""
    failures = []
    if arm_failed:
        failures.append(ARM_FAILED)
    if not correct:
        failures.append(INCORRECT)
    if not kernel_ran:
        failures.append(KERNEL_NOT_RUN)
    if not baseline_clean:
        failures.append(BASELINE_CONTAMINATED)
    enough = n_baseline >= MIN_SAMPLES and n_patched >= MIN_SAMPLES
    if enough and ci_high < 1.0:
        failures.append(SLOWER)
    if failures:
        return Verdict(FAIL, failures)
    if not enough:
        return Verdict(INCONCLUSIVE, [TOO_FEW_SAMPLES], f"need at least {MIN_SAMPLES} timed steps per arm; raise --steps")
    if ci_low > 1.0 + min_speedup:
        return Verdict(PASS, [FASTER])
    if ci_low > 1.0:
        return Verdict(INCONCLUSIVE, [BELOW_MARGIN],
                       f"faster, but the interval's lower bound {ci_low:.4f} is under the margin 1+{min_speedup:g}")
    half = (ci_high - ci_low) / 2
    return Verdict(INCONCLUSIVE, [NO_SIGNIFICANT_DIFFERENCE],
                   f"speedup {ratio:.4f} with interval [{ci_low:.4f}, {ci_high:.4f}]; "
                   f"a difference under ~{half * 100:.1f}% cannot be resolved with this many steps: raise --steps")


def worst(verdicts: list[str]) -> str:
    """FAIL over INCONCLUSIVE over PASS."""
    return max(verdicts, key=SEVERITY.__getitem__) if verdicts else INCONCLUSIVE
