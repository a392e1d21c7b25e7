"""Turn correctness rows, kernel counters and step statistics into PASS / FAIL / INCONCLUSIVE with reasons.

PASS: correct, the custom kernel ran (and not in the baseline), and faster than baseline by at least the
margin with the confidence interval's lower bound above 1 + margin.
FAIL: incorrect, the kernel did not run, the baseline was contaminated, the patched arm failed, or it is
significantly slower (the whole interval below 1).
INCONCLUSIVE: everything else, with what would settle it; also a would-be PASS whose step gain exceeds what the
replaced region could give (IMPLAUSIBLE_GAIN, see flag_implausible).
"""

from __future__ import annotations

import math
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
CLOCK_IMBALANCE = "CLOCK_IMBALANCE"
THERMAL_IMBALANCE = "THERMAL_IMBALANCE"
THROTTLED = "THROTTLED"
NOT_SIGNIFICANT_AFTER_CORRECTION = "NOT_SIGNIFICANT_AFTER_CORRECTION"
AA_FALSE_ALARM = "AA_FALSE_ALARM"
IMPLAUSIBLE_GAIN = "IMPLAUSIBLE_GAIN"
REPLICAS_DISAGREE = "REPLICAS_DISAGREE"  # identical processes of one arm measured different things
JIT_DURING_TIMING = "JIT_DURING_TIMING"  # compilation, autotuning or graph capture inside timed steps
NOT_CAPTURABLE = "NOT_CAPTURABLE"  # the patched decode step cannot run inside a CUDA graph, as serving stacks run it
# Failures a verdict rests on timing for; the others (correctness, proof it ran, crashes) stand whatever the timing.
SPEED_FAILURES = (SLOWER, AA_FALSE_ALARM)

MIN_SAMPLES = 6


@dataclass
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    advice: str = ""

    @property
    def text(self) -> str:
        return f"{self.verdict} ({', '.join(self.reasons)})" + (f": {self.advice}" if self.advice else "")


def _significant(p_adjusted: float, alpha: float) -> bool:
    """The rank test agrees after the multiple-comparison adjustment (no test possible: the interval decides)."""
    return not math.isfinite(p_adjusted) or p_adjusted <= alpha


def _conditions(balance: list[dict] | None) -> tuple[list[str], list[str]]:
    """(imbalance reasons that forbid a PASS, notes that go with any verdict) from telemetry.arm_balance rows."""
    imbalance, notes = [], []
    for row in balance or []:
        if row.get("clock_imbalance") and CLOCK_IMBALANCE not in imbalance:
            imbalance.append(CLOCK_IMBALANCE)
        if row.get("temp_imbalance") and THERMAL_IMBALANCE not in imbalance:
            imbalance.append(THERMAL_IMBALANCE)
        if row.get("throttled") and THROTTLED not in notes:
            notes.append(THROTTLED)
    return imbalance, notes


def _more_steps(half_width: float, target: float, floor: float = 0.0) -> str:
    """What would settle it: the within-run part of an interval shrinks roughly with the square root of the number of
    steps; the process-noise part (floor, the half-width it alone gives) does not shrink at all."""
    if floor > 0 and target <= floor:
        return (f": {target * 100:g}% is inside the {floor * 100:.1f}% that separates identical processes on this "
                "machine (--process-noise); more steps cannot resolve it, more processes per arm (--replicas) can")
    if not (math.isfinite(half_width) and half_width > target > 0):
        return ": raise --steps or --budget"
    within = math.sqrt(max(half_width ** 2 - floor ** 2, 0.0))
    factor = (within / math.sqrt(target ** 2 - floor ** 2)) ** 2
    return f": about {factor:.0f}x as many timed steps (raise --steps or --budget) would resolve {target * 100:g}%"


def decide(*, correct: bool, kernel_ran: bool, baseline_clean: bool, arm_failed: bool, n_baseline: int,
           n_patched: int, ratio: float, ci_low: float, ci_high: float, min_speedup: float,
           balance: list[dict] | None = None, p_adjusted: float = math.nan, alpha: float = 0.05,
           target_half_width: float = 0.01, noise_floor: float = 0.0) -> Verdict:
    """Apply the sign-off rules for one workload (or sweep point); see the module docstring.

    balance: telemetry.arm_balance rows. Arms that ran at different clocks or temperatures cannot PASS (the
    difference may be the card's, not the kernel's); throttled steps are named in the reasons of any verdict.
    p_adjusted: the Mann-Whitney p-value after adjustment across the run's workloads; a difference is only
    called significant when the interval excludes 1 AND this is at most alpha. The interval already carries the
    process noise (stats.with_process_noise); noise_floor, the half-width that noise alone gives, shapes the advice.
    """
    imbalance, notes = _conditions(balance)
    significant = _significant(p_adjusted, alpha)
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
    if enough and ci_high < 1.0 and significant:
        failures.append(SLOWER)
    if failures:
        return Verdict(FAIL, failures + notes)
    if not enough:
        return Verdict(INCONCLUSIVE, [TOO_FEW_SAMPLES], f"need at least {MIN_SAMPLES} timed steps per arm; raise --steps")
    if (ci_low > 1.0 or ci_high < 1.0) and not significant:
        return Verdict(INCONCLUSIVE, [NOT_SIGNIFICANT_AFTER_CORRECTION, *notes],
                       f"the interval [{ci_low:.4f}, {ci_high:.4f}] excludes 1, but the adjusted p-value {p_adjusted:.3g} "
                       f"is above {alpha:g} once every workload of the run is counted: raise --steps or --budget")
    if ci_low > 1.0 + min_speedup:
        if imbalance:
            thresholds = ", ".join(f"{r['arm']}: SM clock {r.get('clock_diff_rel', float('nan')) * 100:+.1f}% "
                                   f"(limit {r['clock_tolerance'] * 100:.0f}%), temperature {r.get('temp_diff_c', float('nan')):+.1f} C "
                                   f"(limit {r['temp_tolerance_c']:.0f} C)" for r in balance if r.get("arm") != r.get("baseline_arm"))
            return Verdict(INCONCLUSIVE, [FASTER, *imbalance, *notes], f"arms ran at different clocks or temperatures ({thresholds})")
        return Verdict(PASS, [FASTER, *notes], "some steps were throttled (see steps.parquet)" if notes else "")
    if ci_low > 1.0:
        return Verdict(INCONCLUSIVE, [BELOW_MARGIN, *notes],
                       f"faster, but the interval's lower bound {ci_low:.4f} is under the margin 1+{min_speedup:g}")
    half = (ci_high - ci_low) / 2
    return Verdict(INCONCLUSIVE, [NO_SIGNIFICANT_DIFFERENCE, *notes],
                   f"speedup {ratio:.4f} with interval [{ci_low:.4f}, {ci_high:.4f}]; a difference under "
                   f"~{half * 100:.1f}% cannot be resolved with this many steps{_more_steps(half, target_half_width, noise_floor)}")


def decide_aa(*, correct: bool, arm_failed: bool, n_baseline: int, n_patched: int, ratio: float, ci_low: float,
              ci_high: float, min_speedup: float, balance: list[dict] | None = None, p_adjusted: float = math.nan,
              alpha: float = 0.05, target_half_width: float = 0.01) -> Verdict:
    """An A/A calibration: the same stock arm in two processes must come out as no difference.

    PASS (NO_SIGNIFICANT_DIFFERENCE) states the noise floor reached; FAIL (AA_FALSE_ALARM) means the harness
    itself produced a significant difference between identical arms: no verdict on this machine can be trusted
    until the cause (order effects, a noisy neighbour, clocks) is found. "No difference" with a noise floor wider
    than the target (or the margin, if larger) is INCONCLUSIVE: such a run would not have seen a real difference.
    """
    imbalance, notes = _conditions(balance)
    if arm_failed or not correct:
        return Verdict(FAIL, ([ARM_FAILED] if arm_failed else []) + ([] if correct else [INCORRECT]) + notes)
    if n_baseline < MIN_SAMPLES or n_patched < MIN_SAMPLES:
        return Verdict(INCONCLUSIVE, [TOO_FEW_SAMPLES], f"need at least {MIN_SAMPLES} timed steps per arm; raise --steps")
    half = (ci_high - ci_low) / 2 / ratio if ratio > 0 else math.nan
    if (ci_low > 1.0 or ci_high < 1.0) and _significant(p_adjusted, alpha):
        return Verdict(FAIL, [AA_FALSE_ALARM, *imbalance, *notes],
                       f"identical arms differ: {ratio:.4f} [{ci_low:.4f}, {ci_high:.4f}]")
    agree = f"identical arms agree: {ratio:.4f} [{ci_low:.4f}, {ci_high:.4f}]; noise floor +-{half * 100:.2f}%"
    if not half <= max(target_half_width, min_speedup):
        return Verdict(INCONCLUSIVE, [NO_SIGNIFICANT_DIFFERENCE, *imbalance, *notes],
                       f"{agree}, wider than the {max(target_half_width, min_speedup) * 100:g}% target: raise --steps or --budget")
    return Verdict(PASS, [NO_SIGNIFICANT_DIFFERENCE, *imbalance, *notes], agree)


def flag_implausible(verdict: Verdict, detail: str) -> Verdict:
    """The step gained more than the replaced region held (explain's Amdahl bound): IMPLAUSIBLE_GAIN.

    Such a gain is no win to sign off: something other than the kernel changed (work skipped or moved off the
    clock, a timing artefact, a profile range that misses calls). A PASS becomes INCONCLUSIVE; any other verdict
    keeps its severity and gains the reason, so CI pipelines can match on it either way.
    """
    if IMPLAUSIBLE_GAIN in verdict.reasons:
        return verdict
    advice = f"{detail}; {verdict.advice}" if verdict.advice else detail
    if verdict.verdict == PASS:
        return Verdict(INCONCLUSIVE, [IMPLAUSIBLE_GAIN, *verdict.reasons], advice)
    return Verdict(verdict.verdict, [*verdict.reasons, IMPLAUSIBLE_GAIN], advice)


def withhold_speed(verdict: Verdict, reason: str, detail: str) -> Verdict:
    """A finding that leaves the timing untrustworthy (REPLICAS_DISAGREE, JIT_DURING_TIMING): the workload can
    neither PASS nor FAIL on speed. A PASS, or a FAIL that rests only on speed (SLOWER, AA_FALSE_ALARM), becomes
    INCONCLUSIVE; a FAIL on correctness or on the kernel's proof stands, with the reason added."""
    if reason in verdict.reasons:
        return verdict
    advice = f"{detail}; {verdict.advice}" if verdict.advice else detail
    rest = [r for r in verdict.reasons if r not in SPEED_FAILURES]
    if verdict.verdict == PASS or (verdict.verdict == FAIL and any(r in SPEED_FAILURES for r in verdict.reasons)
                                   and not _other_failures(rest)):
        return Verdict(INCONCLUSIVE, [reason, *[r for r in rest if r != FASTER]], advice)
    return Verdict(verdict.verdict, [*verdict.reasons, reason], advice)


def _other_failures(reasons: list[str]) -> bool:
    return any(r in (INCORRECT, KERNEL_NOT_RUN, BASELINE_CONTAMINATED, ARM_FAILED) for r in reasons)


def worst(verdicts: list[str]) -> str:
    """FAIL over INCONCLUSIVE over PASS."""
    return max(verdicts, key=SEVERITY.__getitem__) if verdicts else INCONCLUSIVE
