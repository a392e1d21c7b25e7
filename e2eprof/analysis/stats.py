"""Statistics for A/B step-latency comparisons, one import for the rest of e2eprof.

Pure functions on 1-D numpy arrays: no I/O, no torch, no scipy. Raw samples are stored elsewhere; everything here is
derived from them on demand, so a report can always be recomputed from its raw rows. The functions live by concept
in samples (validation, describe), bootstrap (the ratio-of-medians interval), process_noise (the spread between
identical processes), significance (Mann-Whitney, Holm, Benjamini-Hochberg) and warmup_rule; this module names them.

Conventions:
- Latencies are positive and finite. NaN or inf means a broken timer upstream, so it raises instead of being dropped.
- ``ratio = median(baseline) / median(candidate)``: above 1 means the candidate is FASTER (a speedup factor).
- Percentiles use numpy's default linear interpolation (Hyndman-Fan type 7, as in R and pandas).
"""

from __future__ import annotations

from e2eprof.analysis.bootstrap import (MIN_PAIRED_BLOCKS, RatioCI, _independent_bootstrap, ci_halfwidth_rel,
                                        minimum_detectable_effect, ratio_of_medians_ci)
from e2eprof.analysis.process_noise import (ProcessSpread, chi2_sf, count_processes, pooled_process_noise,
                                            process_noise_estimate, process_noise_half_width, process_spread,
                                            replicated_process_noise, with_process_noise, without_process_noise)
from e2eprof.analysis.samples import _row_medians, describe
from e2eprof.analysis.significance import MWResult, benjamini_hochberg, holm, mann_whitney
from e2eprof.analysis.warmup_rule import WARMUP_Z, warm_windows_agree, warmup_noise_bound

__all__ = [
    "MIN_PAIRED_BLOCKS", "RatioCI", "_independent_bootstrap", "ci_halfwidth_rel", "minimum_detectable_effect",
    "ratio_of_medians_ci", "ProcessSpread", "chi2_sf", "count_processes", "pooled_process_noise",
    "process_noise_estimate", "process_noise_half_width", "process_spread", "replicated_process_noise",
    "with_process_noise", "without_process_noise", "_row_medians", "describe", "MWResult", "benjamini_hochberg",
    "holm", "mann_whitney", "WARMUP_Z", "warm_windows_agree", "warmup_noise_bound",
]
