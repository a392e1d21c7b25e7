"""From raw step and correctness rows to summary rows per (point, workload, arm) and a verdict per (point, workload).

Everything here is derived from what the run recorded (steps.parquet, correctness.parquet, balance rows), so a
summary can always be rebuilt from a report directory. The candidate is the patched arm, or in an A/A run the
second baseline. Every (point, workload) of a run is one test: their p-values are adjusted together for multiple
comparisons (Holm by default) before any verdict calls a difference significant. A point of a sweep is a (batch, seq,
precision); rows without a `point` column (a run from before sweeps, synthetic tests) belong to the config's one point.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from e2eprof import candidates as cand
from e2eprof.analysis import stats
from e2eprof.config import DECODING_WORKLOADS, CompareConfig
from e2eprof.distributed.ranks import slowest_rank
from e2eprof.sweep import OOM_METRIC, OUT_OF_MEMORY, SweepPoint
from e2eprof.trackers.jit_events import COUNTS as COUNTED_JIT
from e2eprof.analysis.verdict import (ARM_FAILED, INCONCLUSIVE, JIT_DURING_TIMING, NOT_CAPTURABLE, REPLICAS_DISAGREE, Verdict,
                             decide, decide_aa, withhold_speed)

KERNEL_PROOF_METRICS = ("patched_calls", "custom_kernel_calls", "profile_complete")
ADJUSTERS = {"holm": stats.holm, "bh": stats.benjamini_hochberg, "none": lambda p: [float(x) for x in p]}
MEMORY_COLUMNS = ("peak_alloc_mb", "peak_reserved_mb", "host_peak_rss_mb")
MEMORY_PHASE = "timing"  # the summary's memory columns: peaks over the timed steps (memory.parquet has every phase)
# Replicas whose medians lie this improbably far apart, given their steps' noise and the device's process noise, did
# not measure the same thing: the workload gets no speed verdict. Rare by construction (1 in 1000 workloads of
# well-behaved processes), so it flags a real fault: a starved core, a noisy neighbour, one process's clock.
REPLICAS_ALPHA = 0.001


def _at(frame: pd.DataFrame, point: SweepPoint) -> pd.DataFrame:
    """The rows measured at one point."""
    return frame[frame["point"] == point.id] if len(frame) and "point" in frame else frame


def verdict_key(config: CompareConfig, point: SweepPoint, workload: str, arm: str | None = None) -> str:
    """The workload's name, or "<point>/<workload>" in a sweep; with several candidates "<label>/" before it."""
    key = f"{point.id}/{workload}" if config.is_sweep else workload
    return f"{cand.label_of_arm(arm)}/{key}" if arm and cand.is_multi(config) else key


def _balance_columns(balance: list[dict] | None, workload: str, arm: str) -> dict:
    for row in balance or []:
        if row["workload"] == workload and row["arm"] == arm:
            return {"sm_clock_median_mhz": row["sm_clock_median_mhz"], "gpu_temp_median_c": row["gpu_temp_median_c"],
                    "throttled_share": row["throttled_share"], "clock_imbalance": row["clock_imbalance"],
                    "temp_imbalance": row["temp_imbalance"]}
    return {}


def _ms(frame: pd.DataFrame) -> np.ndarray:
    return frame.wall_ns.to_numpy() / 1e6


class _Workload:
    """The warm samples of one workload, and the statistics every row of it needs."""

    def __init__(self, frame: pd.DataFrame, workload: str, config: CompareConfig):
        self.name = workload
        self.config = config
        self.candidates = cand.arm_names(config)
        self.candidate = self.candidates[0]
        self._spread: stats.ProcessSpread | None = None
        mine = frame[frame.workload == workload] if len(frame) else frame
        warm = mine[mine.phase == "warm"] if len(mine) else mine
        self.cold = mine[mine.phase == "cold"] if len(mine) else mine
        self.arms = list(dict.fromkeys(warm.arm)) if len(warm) else []
        self.samples = {a: warm[warm.arm == a] for a in self.arms}

    def ratio_ci(self, base_arm: str, cand_arm: str, n_boot: int = 2000) -> stats.RatioCI | None:
        if base_arm not in self.samples or cand_arm not in self.samples:
            return None
        b, c = self.samples[base_arm], self.samples[cand_arm]
        within = stats.ratio_of_medians_ci(_ms(b), _ms(c), baseline_blocks=b.block.to_numpy(),
                                           candidate_blocks=c.block.to_numpy(), confidence=self.config.confidence,
                                           n_boot=n_boot, seed=self.config.seed)
        # Every arm runs in its own processes: what separates identical processes belongs in every interval, less
        # as each arm pools more of them.
        noise = stats.replicated_process_noise(self.process_noise(), self.processes(base_arm), self.processes(cand_arm))
        return stats.with_process_noise(within, noise)

    def spread(self) -> stats.ProcessSpread:
        """What this run's own processes of the baseline and the candidate say about process noise (once per
        workload: it is the machine's and the loop's property, the same for every interval of the workload)."""
        if self._spread is None:
            by_process = {}
            for arm in ("baseline", *self.candidates):
                if len(self.samples.get(arm, ())):
                    by_process[arm] = [(_ms(g), g.block.to_numpy()) for g in self.per_process(arm)]
            self._spread = stats.process_spread(by_process, floor=self.config.noise_floor(self.name),
                                                seed=self.config.seed)
        return self._spread

    def per_process(self, arm: str) -> list[pd.DataFrame]:
        """This arm's warm steps, one frame per process (steps without a replica id came from one)."""
        rows = self.samples[arm]
        return [g for _, g in rows.groupby(rows["replica"].fillna(0))] if "replica" in rows else [rows]

    def process_noise(self) -> float:
        """The process noise every interval of this workload carries: the floor (the device's, or the workload's own
        where A/A runs measured a higher one) or what this run's replicas show, whichever is larger."""
        estimate = self.spread().estimate
        floor = self.config.noise_floor(self.name)
        return max(floor, estimate) if math.isfinite(estimate) else floor

    def processes(self, arm: str) -> int:
        """How many identical processes (replicas) timed this arm's warm steps."""
        return stats.count_processes(self.samples[arm].get("replica"))

    def mann_whitney_p(self, arm: str, against: str = "baseline") -> float:
        if arm == against or against not in self.samples or arm not in self.samples:
            return math.nan
        return stats.mann_whitney(self.samples[against].wall_ns.to_numpy(), self.samples[arm].wall_ns.to_numpy()).p_two_sided

    def row(self, arm: str) -> dict:
        d = stats.describe(_ms(self.samples[arm]))
        cold = self.cold[self.cold.arm == arm]
        if "replica" in cold:  # the arm's first process: its cold step is the one the gate and profiles follow
            cold = cold[cold.replica.fillna(0) == 0]
        arm_samples = self.samples[arm]
        generate = self.name in DECODING_WORKLOADS
        return {
            "workload": self.name, "arm": arm, "n": d["n"], "median_ms": d["median"], "mean_ms": d["mean"],
            "p10_ms": d["p10"], "p90_ms": d["p90"], "iqr_ms": d["iqr"], "cv": d["cv"],
            # A compiled arm's first step includes compilation: its cold time is the compile cost users pay.
            "cold_ms": cold.wall_ns.iloc[0] / 1e6 if len(cold) else math.nan,
            "device_median_ms": float(np.nanmedian(arm_samples.device_ms)) if arm_samples.device_ms.notna().any() else math.nan,
            "ttft_median_ms": float(arm_samples.ttft_ms.median()) if generate else math.nan,
            "tpot_median_ms": float(arm_samples.tpot_ms.median()) if generate else math.nan,
            "blocks": int(arm_samples.block.nunique()),
            "processes": self.processes(arm),
        }


def summary_interval(steps: pd.DataFrame, workload: str, config: CompareConfig, candidate: str,
                     n_boot: int = 2000) -> stats.RatioCI | None:
    """The candidate's speedup interval over the baseline from warm steps, as the summary computes it."""
    return _Workload(steps, workload, config).ratio_ci("baseline", candidate, n_boot=n_boot)


def _arm_checks_pass(checks: pd.DataFrame, workload: str, arm: str) -> bool:
    if not len(checks):
        return False
    mine = checks[(checks.arm == arm) & checks.workload.isin([workload, "*"])]
    return bool(len(mine)) and bool(mine.passed.all())


def summarize(steps: list[dict], correctness: list[dict], config: CompareConfig,
              failed_arms: set[str] | dict[str, set[str]], balance: list[dict] | None = None,
              timing: dict | None = None, jit: list[dict] | None = None, pairwise: list[dict] | None = None):
    """Summary rows per (point, workload, arm) and a Verdict per (point, workload), derived from the raw rows.

    jit: just-in-time work per (point, workload, process, phase) (jit.parquet); any in the timed steps of the
    baseline or the candidate withholds the workload's speed verdict (JIT_DURING_TIMING).

    failed_arms: arms that failed (not by running out of memory), for the whole run or per point id. timing: per
    (point id, workload), or per workload. Verdicts are keyed as verdict_key says.

    Several candidates (e2eprof.candidates): each is judged against the baseline, and every pair of candidates is
    compared (appended to `pairwise` when given); all of these tests are one family for the p-value adjustment.
    """
    all_steps = pd.DataFrame(slowest_rank(steps))  # a data-parallel step takes as long as its slowest rank
    all_checks = pd.DataFrame(correctness)
    all_jit = pd.DataFrame(jit or [])
    candidates = cand.arm_names(config)
    rows: list[dict] = []
    per_test: dict[tuple, dict] = {}  # (point, workload, candidate arm) or (point, workload, arm a, arm b)
    for point in config.points:
        frame, checks = _at(all_steps, point), _at(all_checks, point)
        point_balance = [b for b in balance or [] if b.get("point", point.id) == point.id]
        for workload in config.workloads:
            key = (point, workload)
            times = (timing or {}).get((point.id, workload)) or (timing or {}).get(workload, {})
            point_rows, tests = _workload_rows(frame, checks, config.at(point), workload, candidates,
                                               point_balance, times)
            per_test.update({(*key, *arms): info for arms, info in tests.items()})
            rows += [r | point.columns() for r in point_rows]

    _adjust_pvalues(per_test, config.correction)
    verdicts = {}
    for test, info in per_test.items():
        if len(test) == 4:
            if pairwise is not None:
                pairwise.append(_pairwise_row(test, info, config))
            continue
        point, workload, candidate = test
        checks = _at(all_checks, point)
        failed = failed_arms.get(point.id, set()) if isinstance(failed_arms, dict) else set(failed_arms)
        verdict = (_out_of_memory_verdict(checks, workload, candidate, point)
                   or _decide_workload(workload, info, checks, config, failed, info["balance"], candidate))
        verdict = _not_capturable(verdict, _at(all_checks, point), workload, candidate)
        verdict = _replicas_finding(verdict, info["data"])
        verdict = _jit_finding(verdict, _at(all_jit, point), workload, candidate)
        verdicts[verdict_key(config, point, workload, candidate)] = verdict
        placed = False
        for row in rows:
            if row["point"] == point.id and row["workload"] == workload and row["arm"] == candidate:
                row.update(verdict=verdict.verdict, reasons=",".join(verdict.reasons), advice=verdict.advice,
                           mw_p_adjusted=info["p_adjusted"],
                           correction=config.correction)
                placed = True
        if not placed:
            rows.append({**point.columns(), "workload": workload, "arm": candidate, "n": 0, "verdict": verdict.verdict,
                         "reasons": ",".join(verdict.reasons), "advice": verdict.advice, "correct": False})
    return rows, verdicts


def _workload_rows(frame, checks, config, workload, candidates, balance, times) -> tuple[list[dict], dict]:
    """One point's summary rows of one workload (without verdicts) and what its tests need: per candidate arm
    (keyed (arm,)), and per pair of candidates (keyed (arm a, arm b)): b's time over a's, a's speedup over b."""
    rows: list[dict] = []
    data = _Workload(frame, workload, config)
    vs_base = {a: data.ratio_ci("baseline", a) for a in data.arms if a != "baseline"}
    references = {c: {ref: data.ratio_ci(ref, c) for ref in config.reference_arms if ref in data.arms} for c in candidates}
    for arm in data.arms:
        ci = vs_base.get(arm)
        row = data.row(arm) | {
            "speedup_vs_baseline": ci.ratio if ci else (1.0 if arm == "baseline" else math.nan),
            "ci_low": ci.low if ci else math.nan, "ci_high": ci.high if ci else math.nan,
            "mw_p": data.mann_whitney_p(arm),
            "correct": _arm_checks_pass(checks, workload, arm), "verdict": None, "reasons": None,
            **_balance_columns(balance, workload, arm),
        }
        for ref, ref_ci in references.get(arm, references[candidates[0]]).items():
            on_candidate = arm in candidates and ref_ci is not None
            row[f"speedup_vs_{ref}"] = ref_ci.ratio if on_candidate else math.nan
            row[f"{ref}_ci_low"] = ref_ci.low if on_candidate else math.nan
            row[f"{ref}_ci_high"] = ref_ci.high if on_candidate else math.nan
        if arm in candidates and ci is not None:
            spread = data.spread()
            row["process_noise"] = ci.process_noise
            row.update(process_noise_floor=config.process_noise, process_noise_estimate=spread.estimate,
                       process_noise_df=spread.df, replicas_disagree_p=spread.p_disagree)
            row["ci_half_width"] = stats.ci_halfwidth_rel(ci)
            row["mde"] = stats.minimum_detectable_effect(ci)
            row.update({k: v for k, v in times.items() if k in ("stop_reason", "timing_s")})
        rows.append(row)
    tests = {(c,): {"data": data, "ci": vs_base.get(c), "p": data.mann_whitney_p(c), "balance": balance} for c in candidates}
    for i, a in enumerate(candidates):
        for b in candidates[i + 1:]:
            tests[(a, b)] = {"data": data, "ci": data.ratio_ci(b, a), "p": data.mann_whitney_p(a, against=b)}
    return rows, tests


def _pairwise_row(test: tuple, info: dict, config: CompareConfig) -> dict:
    """One pair of candidates at one (point, workload): a's speedup over b (b's time / a's) with its interval."""
    point, workload, a, b = test
    ci = info["ci"]
    low, high = (ci.low, ci.high) if ci else (math.nan, math.nan)
    alpha = 1 - config.confidence
    significant = bool(ci) and (low > 1 or high < 1) and info["p_adjusted"] < alpha
    return {**point.columns(), "workload": workload, "arm_a": a, "arm_b": b, "candidate_a": cand.label_of_arm(a),
            "candidate_b": cand.label_of_arm(b), "speedup": ci.ratio if ci else math.nan, "ci_low": low,
            "ci_high": high, "mw_p": info["p"], "mw_p_adjusted": info["p_adjusted"], "correction": config.correction,
            "significant": significant,
            "faster": (cand.label_of_arm(a) if low > 1 else cand.label_of_arm(b)) if significant else None}


def _out_of_memory_verdict(checks: pd.DataFrame, workload: str, candidate: str, point: SweepPoint) -> Verdict | None:
    """INCONCLUSIVE (OUT_OF_MEMORY) when the baseline or the candidate ran out of memory at this point and workload."""
    if not len(checks):
        return None
    oom = checks[(checks.metric == OOM_METRIC) & checks.workload.isin([workload, "*"])
                 & checks.arm.isin(["baseline", candidate])]
    if not len(oom):
        return None
    arms = ", ".join(dict.fromkeys(oom.arm))
    return Verdict(INCONCLUSIVE, [OUT_OF_MEMORY],
                   f"{arms} ran out of memory at {point.id} ({oom.detail.iloc[0]}); a smaller batch or seq would fit, "
                   "--find-max-batch finds the largest batch")


def _replicas_finding(verdict: Verdict, data: "_Workload") -> Verdict:
    """REPLICAS_DISAGREE when the processes of one arm disagree beyond their steps' noise and the process noise."""
    spread = data.spread()
    if not spread.p_disagree < REPLICAS_ALPHA:
        return verdict
    medians = "; ".join(f"{arm}: " + ", ".join(f"{float(np.median(_ms(g))):.2f}" for g in data.per_process(arm)) + " ms"
                        for arm in ("baseline", *data.candidates) if arm in data.samples)
    return withhold_speed(verdict, REPLICAS_DISAGREE,
                          f"identical processes of one arm disagree (per-process medians {medians}; chance "
                          f"{spread.p_disagree:.1e} under their steps' noise and a process noise of "
                          f"{data.config.process_noise:.2%}): the timing measured the machine, not the kernel; "
                          f"rerun on a quieter host")


def _not_capturable(verdict: Verdict, checks: pd.DataFrame, workload: str, candidate: str = "patched") -> Verdict:
    """The patched arm failed because its decode step could not be captured in a CUDA graph: say that, not just
    ARM_FAILED (a kernel that breaks graph capture cannot be deployed where decoding is served from graphs)."""
    if not len(checks) or ARM_FAILED not in verdict.reasons:
        return verdict
    failed = checks[(checks.metric == "arm_failed") & (checks.arm == candidate) & checks.workload.isin([workload, "*"])]
    capture = failed[failed.detail.str.contains("NotCapturable", regex=False)]
    if not len(capture):
        return verdict
    reasons = [NOT_CAPTURABLE if r == ARM_FAILED else r for r in verdict.reasons]
    return Verdict(verdict.verdict, reasons, capture.detail.iloc[0])


def _jit_finding(verdict: Verdict, jit: pd.DataFrame, workload: str, candidate: str) -> Verdict:
    """JIT_DURING_TIMING when the baseline's or the candidate's processes compiled, tuned or captured during timing."""
    if not len(jit):
        return verdict
    timed = jit[(jit.workload == workload) & (jit.phase == "timing") & jit.arm.isin(["baseline", candidate])]
    found = []
    for name in COUNTED_JIT:
        if name not in timed.columns:  # a run written before this count existed (`e2eprof gate` on an old report)
            continue
        for arm, count in timed.groupby("arm", sort=False)[name].sum(min_count=1).items():
            if count > 0:
                found.append(f"{arm} {int(count)} {name.replace('_', ' ')}")
    if not found:
        return verdict
    return withhold_speed(verdict, JIT_DURING_TIMING,
                          f"just-in-time work inside timed steps ({', '.join(found)}): those steps timed a "
                          f"compilation, not the kernel; warm-up must cover every shape the loop meets")


def attach_memory(summary: list[dict], memory: list[dict]) -> None:
    """Peak device and host memory of the timed phase into each summary row (NaN where not measured)."""
    peaks = {(m.get("point"), m["workload"], m["arm"]): m for m in memory if m["phase"] == MEMORY_PHASE}
    for row in summary:
        found = peaks.get((row.get("point"), row["workload"], row["arm"]), {})
        row.update({c: found.get(c, math.nan) for c in MEMORY_COLUMNS})
    # The peak against the baseline's, in the same cell: a memory-saving patch (liger-flce) is judged on this as much
    # as on time. Device allocated memory where measured, else the host's RSS (a CPU run).
    for row in summary:
        base = next((r for r in summary if r["arm"] == "baseline" and r["workload"] == row["workload"]
                     and r.get("point") == row.get("point")), None)
        basis = "peak_alloc_mb" if base and not math.isnan(base.get("peak_alloc_mb", math.nan)) else "host_peak_rss_mb"
        ratio = math.nan
        if base and base.get(basis, math.nan) > 0 and not math.isnan(row.get(basis, math.nan)):
            ratio = row[basis] / base[basis]
        row["peak_memory_vs_baseline"] = ratio


def _adjust_pvalues(per_workload: dict, correction: str) -> None:
    """Adjusted p-value per (point, workload) test (NaN where no test could run), across all tests of the run."""
    tested = [w for w, info in per_workload.items() if not math.isnan(info["p"])]
    adjusted = ADJUSTERS[correction]([per_workload[w]["p"] for w in tested]) if tested else []
    for workload, info in per_workload.items():
        info["p_adjusted"] = math.nan
    for workload, p in zip(tested, adjusted):
        per_workload[workload]["p_adjusted"] = p


def _decide_workload(workload, info, checks, config, failed_arms, balance, candidate) -> Verdict:
    ci, data = info["ci"], info["data"]
    common = dict(
        arm_failed=bool({candidate, "baseline"} & failed_arms),
        n_baseline=len(data.samples.get("baseline", [])), n_patched=len(data.samples.get(candidate, [])),
        ratio=ci.ratio if ci else math.nan, ci_low=ci.low if ci else math.nan, ci_high=ci.high if ci else math.nan,
        p_adjusted=info["p_adjusted"], alpha=1 - config.confidence, min_speedup=config.min_speedup,
        # Only the two arms this verdict compares: another candidate's (or a reference's) clocks say nothing about it.
        balance=[b for b in balance or [] if b["workload"] == workload and b["arm"] in (candidate, "baseline")],
    )
    if config.aa:
        return decide_aa(target_half_width=config.target_half_width, correct=_arm_checks_pass(checks[~checks.metric.isin(KERNEL_PROOF_METRICS)] if len(checks) else checks,
                                                  workload, candidate), **common)
    mine = checks[checks.workload == workload] if len(checks) else checks
    proof = mine[(mine.arm == candidate) & mine.metric.isin(KERNEL_PROOF_METRICS)] if len(mine) else mine
    patched_ran = bool((proof.metric == "patched_calls").any()) and bool(proof.passed.all()) if len(proof) else False
    stock_calls = mine[~mine.arm.map(cand.is_candidate) & (mine.metric == "custom_kernel_calls")] if len(mine) else mine
    baseline_clean = bool(stock_calls.passed.all()) if len(stock_calls) else True
    correctness_rows = checks[(checks.arm == candidate) & checks.workload.isin([workload, "*"])
                              & ~checks.metric.isin(KERNEL_PROOF_METRICS)] if len(checks) else checks
    return decide(target_half_width=config.target_half_width,
                  noise_floor=stats.process_noise_half_width(ci.process_noise if ci else config.process_noise,
                                                             config.confidence),
                  correct=bool(len(correctness_rows)) and bool(correctness_rows.passed.all()),
                  kernel_ran=patched_ran, baseline_clean=baseline_clean, **common)
