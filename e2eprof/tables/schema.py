"""Declared schemas of the Parquet tables a run directory holds: ordered columns, their dtypes and meanings.

One `Table` per file name (`<name>.parquet`). Columns are listed in the order the writers produce them; `required`
columns are present in every file of that table (the writer adds a missing one as nulls of its dtype), optional ones
only in some runs (sweeps, data-parallel workloads, decoding, GPU telemetry, reference arms) and are left absent
when a run has none. The schemas were derived from what the writers produce (runner, summary, telemetry, explain,
memory, maxbatch, microbench, rundiff) and checked against CPU and H200 run directories.

The vocabulary (Column, Table, the dtypes and their checks) is e2eprof.tables.columns.
No torch import: readers (diff, render, benchmarks) use this on machines without it.
"""

from __future__ import annotations

import pandas as pd

# Re-exported: writers, readers and tests take the vocabulary from here with the tables.
from e2eprof.tables.columns import DTYPES, Column, SchemaError, Table, matches, null_series

# Columns shared by many tables: one meaning each.
_SHARED = {
    "run_id": ("str", "the run's id (run.parquet's run_id), on every row"),
    "workload": ("str", "workload name (train, infer, decode, generate, train-ddp, ...)"),
    "arm": ("str", "arm: baseline, patched (or baseline-b in A/A), sdpa, compile"),
    "point": ("str", "sweep point id, e.g. b8-s512-bf16 (one point when not sweeping)"),
    "batch": ("int64", "batch size of the point"),
    "seq": ("int64", "sequence length of the point"),
    "precision": ("str", "autocast precision of the point (fp32, bf16, fp16)"),
    "rank": ("int64", "process rank within a data-parallel workload (0 otherwise)"),
    "replica": ("int64", "which worker process (replica) of the arm ran it"),
    "phase": ("str", "phase of the run the row belongs to (warmup, timing, correctness, profile, ...)"),
    "start_unix_ns": ("int64", "wall-clock start, ns since the Unix epoch"),
    "end_unix_ns": ("int64", "wall-clock end, ns since the Unix epoch"),
    "detail": ("str", "human-readable detail"),
    "tolerance": ("float64", "tolerance the value is compared with"),
    "op": ("str", "torch operator name (aten::...)"),
    "module": ("str", "module path the op ran in"),
    "direction": ("str", "forward or backward"),
    "time_basis": ("str", "which time the comparison uses: device (CUDA) or cpu"),
    "sm_clock_median_mhz": ("float64", "median SM clock over the steps, MHz"),
    "gpu_temp_median_c": ("float64", "median GPU temperature over the steps, deg C"),
    "throttled_share": ("float64", "share of steps with a throttle reason"),
    "clock_imbalance": ("bool", "arm's SM clock differs from the baseline arm's by more than clock_tolerance"),
    "temp_imbalance": ("bool", "arm's GPU temperature differs from the baseline arm's by more than temp_tolerance_c"),
    "peak_alloc_mb": ("float64", "peak allocated device memory, MiB"),
    "peak_reserved_mb": ("float64", "peak reserved (caching allocator) device memory, MiB"),
    "host_peak_rss_mb": ("float64", "peak resident host memory of the worker, MiB"),
    "command_line": ("str", "the e2eprof command as given"),
    "config_json": ("str", "the validated config, JSON"),
    "patch_spec": ("str", "the patch as named on the command line"),
    "patch_source_sha256": ("str", "SHA-256 of the replacement's source files"),
    "started_unix_ns": ("int64", "when the command started, ns since the Unix epoch"),
    "ended_unix_ns": ("int64", "when the command ended (or last flushed), ns since the Unix epoch"),
    "median_us": ("float64", "median time per call, microseconds"),
    "mde": ("float64", "minimum detectable effect at this noise and sample size (relative)"),
    "process_noise": ("float64", "process-to-process noise used (relative standard deviation)"),
    "ci_low": ("float64", "lower bound of the confidence interval of the ratio"),
    "ci_high": ("float64", "upper bound of the confidence interval of the ratio"),
    "cause": ("str", "explanation class of the speedup (e.g. as-predicted, shifted, implausible)"),
    "status": ("str", "state of the row (run: running/complete/failed/interrupted; diff/opdiff: change class)"),
}

_POINT = ("point", "batch", "seq", "precision")


def _c(name: str, dtype: str | None = None, meaning: str | None = None, required: bool = True) -> Column:
    """A column; dtype and meaning default to the shared definition of that name."""
    shared = _SHARED.get(name, (None, None))
    return Column(name, dtype or shared[0], meaning or shared[1], required)


def _opt(name: str, dtype: str | None = None, meaning: str | None = None) -> Column:
    return _c(name, dtype, meaning, required=False)


def _point(required: bool = True) -> tuple[Column, ...]:
    return tuple(_c(n, required=required) for n in _POINT)


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("run", "one row: what was asked for, on what, with which patch, and how the run ended", (
        _c("run_id", meaning="unique id of this run"),
        _c("schema_version", "int64", "version of these table layouts (reports.SCHEMA_VERSION)"),
        _c("status"),
        _c("command_line"),
        _c("config_json"),
        _c("environment_json", "str", "host, devices, library versions, JSON"),
        _c("patch_spec"),
        _c("patch_origin", "str", "where the patch was found (built-in, entry point, file)"),
        _c("patch_source_sha256"),
        _c("seed", "int64", "seed of weights, batches and random inputs"),
        _c("batch_digest", "str", "digest of the input batches (the same across arms)"),
        _c("started_unix_ns", meaning="when the run started, ns since the Unix epoch"),
        _c("ended_unix_ns", meaning="when the run ended (or last flushed), ns since the Unix epoch"),
        _opt("failure", "str", "why the run failed (null unless it did)"),
        _opt("mode", "str", "what the command did instead of timing (find-max-batch)"),
        _opt("model_json", "str", "the model's name, config and parameter count, JSON"),
        _opt("telemetry_available", "bool", "whether GPU telemetry was sampled"),
        _opt("telemetry_unavailable_reason", "str", "why not, when it was not"),
        _opt("telemetry_json", "str", "the sampler's interval, source and counts, JSON"),
        _opt("points_json", "str", "every point of the run (also those where nothing ran), JSON"),
        _opt("isolation_json", "str", "process isolation settings (CPU pinning, priorities), JSON"),
        _opt("startup_json", "str", "each worker process of the first point: when it started (Unix ns), when its "
                                    "imports were done, it read its setup and its build began (s since its start), "
                                    "and its build's seconds, JSON"),
        _opt("compile_cache_dir", "str", "the compile-cache folder every worker shared, and any TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR set in the environment that the workers used instead (null: torch's defaults)"),
        _opt("compile_cache_warm", "bool", "whether the cache folders the workers used already held compiled artifacts as the run began"),
        _opt("sites_json", "str", "where the patch replaced code and how often, JSON"),
        _opt("ranks_json", "str", "data-parallel ranks and their devices, JSON"),
        _opt("resume_json", "str", "finished units and their timing/profile state, for --resume, JSON"),
        _opt("resumes_json", "str", "each --resume of this run: when, from which status, units kept, JSON"),
        _opt("verdict", "str", "the run's verdict: the worst over (point, workload)"),
        _opt("candidates_json", "str", "several --patch candidates: their ranking, the best one that passes and "
                                       "whether its lead is significant, JSON"),
    )),
    Table("steps", "one row per timed (or warm-up) step of a worker: the raw observations", (
        _c("run_id"), _c("workload"), _c("arm"),
        _c("block", "int64", "timing block the step belongs to (arms alternate block by block)"),
        _c("step", "int64", "step index within the block"),
        _c("rank"), _c("phase"),
        _c("wall_ns", "int64", "host wall time of the step, ns"),
        _c("device_ms", "float64", "device time of the step from CUDA events, ms (NaN on CPU)"),
        _c("start_unix_ns"), _c("end_unix_ns"),
        _c("ttft_ms", "float64", "decode: time to first token, ms (NaN otherwise)"),
        _c("tpot_ms", "float64", "decode: time per output token after the first, ms (NaN otherwise)"),
        _opt("replica"),
        _opt("threads_delta", "int64", "host threads started during the step"),
        *_point(required=False),
        _opt("sm_clock_min_mhz", "float64", "lowest SM clock sampled in the step, MHz"),
        _opt("sm_clock_median_mhz", "float64", "median SM clock sampled in the step, MHz"),
        _opt("gpu_temp_c", "float64", "GPU temperature in the step, deg C"),
        _opt("mem_temp_c", "float64", "memory temperature in the step, deg C"),
        _opt("power_median_mw", "float64", "median board power in the step, mW"),
        _opt("throttle_reasons", "Int64", "bitwise OR of the clock event reasons seen in the step"),
        _opt("throttled", "boolean", "a throttle reason was seen (NA when none could be read)"),
        _opt("telemetry_samples", "int64", "telemetry samples inside the step"),
        _opt("telemetry_match", "str", "how samples were matched to the step (inside, nearest, none)"),
    )),
    Table("telemetry", "GPU samples taken during the run (GPU runs with NVML only)", (
        _c("unix_ns", "int64", "sample time, ns since the Unix epoch"),
        _c("sm_clock_mhz", "float64", "SM clock, MHz"),
        _c("mem_clock_mhz", "float64", "memory clock, MHz"),
        _c("gpu_temp_c", "float64", "GPU temperature, deg C"),
        _c("mem_temp_c", "float64", "memory temperature, deg C"),
        _c("power_mw", "float64", "board power, mW"),
        _c("power_kind", "string", "which power reading (instant or average)"),
        _c("energy_mj", "float64", "total energy counter, mJ"),
        _c("clock_event_reasons", "Int64", "NVML clock event reason bits"),
        _c("gpu_util_pct", "float64", "GPU utilisation, %"),
        _c("mem_util_pct", "float64", "memory utilisation, %"),
        _c("mem_used_bytes", "Int64", "device memory used, bytes"),
        _opt("rank"), _c("run_id"),
    )),
    Table("blocks", "energy per timing block from the telemetry (GPU runs with NVML only)", (
        _c("workload"), _c("arm"),
        _c("block", "int64", "timing block"),
        _c("steps", "int64", "steps in the block"),
        _c("start_unix_ns"), _c("end_unix_ns"),
        _c("duration_s", "float64", "block duration, s"),
        _c("energy_j", "float64", "energy used in the block, J"),
        _c("energy_per_step_j", "float64", "energy per step, J"),
        _c("mean_power_w", "float64", "mean power over the block, W"),
        _c("energy_updates", "int64", "how often the energy counter changed in the block"),
        _opt("rank"), *_point(), _c("run_id"),
    )),
    Table("correctness", "one row per check of the patched arm against the reference (also OOM and event rows)", (
        _c("run_id"), _c("workload"), _c("arm"),
        _c("tensor", "str", "what was compared (logits, loss, a gradient, a call) or the event's subject"),
        _c("metric", "str", "the check's metric (max_abs, rel_l2, ...) or an event name (oom, microbench_ran, ...)"),
        _c("value", "float64", "the metric's value"),
        _c("tolerance"),
        _c("passed", "bool", "value within tolerance (event rows: True unless the event is a failure)"),
        _c("detail"),
        *_point(required=False),
    )),
    Table("phases", "wall time of each phase of the run, for the time budget and the report", (
        _c("workload", meaning="workload the phase worked on ('*' for run-wide phases)"),
        _c("phase", meaning="phase name (start-up and checks, timing, profile, summary and tables, ...)"),
        _c("start_unix_ns"), _c("end_unix_ns"),
        _c("seconds", "float64", "phase duration, s"),
        *_point(), _c("run_id"),
    )),
    Table("memory", "peak memory per (point, workload, arm, rank, phase)", (
        _c("workload"), _c("phase"),
        _c("peak_alloc_mb"), _c("peak_reserved_mb"), _c("host_peak_rss_mb"),
        _opt("start_alloc_mb", "float64", "allocated device memory as the phase began, MiB"),
        _opt("start_reserved_mb", "float64", "reserved device memory as the phase began, MiB"),
        _c("host_rss_scope", "str", "what host_peak_rss_mb covers (process lifetime or phase)"),
        _c("arm"), _opt("rank"), *_point(), _c("run_id"),
    )),
    Table("jit", "just-in-time work per process and phase: compilations, autotuning, CUDA graph captures", (
        _c("run_id"), _c("point"), _c("workload"), _c("arm"), _c("replica"), _c("rank"), _c("phase"),
        _c("triton_compiles", "float64", "Triton kernels compiled"),
        _c("autotune_runs", "float64", "Triton autotuning runs"),
        _c("compile_graphs", "float64", "torch.compile graphs compiled"),
        _c("graph_captures", "float64", "CUDA graphs captured"),
        _opt("fxgraph_cache_hits", "float64", "Inductor graphs loaded from the FX graph cache"),
        _opt("fxgraph_cache_misses", "float64", "Inductor graphs compiled and added to the FX graph cache"),
        _opt("batch"), _opt("seq"), _opt("precision"),
    )),
    Table("ops", "per-op rows of the profiled steps (torch.profiler), per arm and rank", (
        _c("run_id"), _c("point"), _c("workload"), _c("arm"), _c("rank"), _c("module"), _c("op"),
        _c("input_shapes", "str", "the op's input shapes"),
        _c("in_replaced", "bool", "the op ran inside the patched (replaced) code"),
        _c("direction"),
        _c("count", "float64", "calls per profiled step"),
        _c("self_device_us", "float64", "self device time per step, us"),
        _c("self_cpu_us", "float64", "self host time per step, us"),
        _c("kernels", "str", "device kernels the op launched"),
        _opt("batch"), _opt("seq"), _opt("precision"),
    )),
    Table("kernels", "per-kernel rows of the profiled steps (a CPU run launches none: columns, no rows)", (
        _c("run_id"), _c("point"),
        _opt("batch"), _opt("seq"), _opt("precision"),
        _c("workload"), _c("arm"), _c("rank"),
        _c("kernel", "str", "device kernel name"),
        _c("op", meaning="torch operator that launched it"),
        _c("calls", "float64", "launches per profiled step"),
        _c("total_us", "float64", "total device time per step, us"),
        _c("median_us"),
    )),
    Table("balance", "whether each arm ran at the same clocks and temperature as the baseline (GPU telemetry only)", (
        _c("workload"), _c("arm"),
        _c("baseline_arm", "str", "the arm compared with"),
        _c("steps", "int64", "timed steps of the arm"),
        _c("steps_with_telemetry", "int64", "of those, steps with telemetry samples"),
        _c("sm_clock_median_mhz"), _c("gpu_temp_median_c"),
        _c("throttled_steps", "int64", "steps with a throttle reason"),
        _c("throttled_share"),
        _c("clock_diff_rel", "float64", "relative SM clock difference from the baseline arm"),
        _c("clock_imbalance"),
        _c("temp_diff_c", "float64", "temperature difference from the baseline arm, deg C"),
        _c("temp_imbalance"),
        _c("throttled", "bool", "some steps of the arm were throttled"),
        _c("clock_tolerance", "float64", "relative clock difference allowed"),
        _c("temp_tolerance_c", "float64", "temperature difference allowed, deg C"),
        *_point(), _c("run_id"),
    )),
    Table("summary", "one row per (point, workload, arm): statistics, speedups, verdict; derived from steps", (
        _c("run_id"), _c("workload"), _c("arm"),
        _c("n", "int64", "timed steps used"),
        _c("median_ms", "float64", "median step time, ms"),
        _c("mean_ms", "float64", "mean step time, ms"),
        _c("p10_ms", "float64", "10th percentile step time, ms"),
        _c("p90_ms", "float64", "90th percentile step time, ms"),
        _c("iqr_ms", "float64", "interquartile range of step times, ms"),
        _c("cv", "float64", "coefficient of variation of step times"),
        _c("cold_ms", "float64", "first (cold) step time, ms"),
        _c("speedup_vs_baseline", "float64", "baseline median / this arm's median (ratio of the estimator)"),
        _c("ci_low"), _c("ci_high"),
        _c("mw_p", "float64", "Mann-Whitney p-value against the baseline"),
        _c("speedup_vs_sdpa", "float64", "speedup of the patched arm over the sdpa reference arm"),
        _c("sdpa_ci_low", "float64", "lower bound of speedup_vs_sdpa"),
        _c("sdpa_ci_high", "float64", "upper bound of speedup_vs_sdpa"),
        _c("correct", "bool", "every correctness check of the arm passed"),
        _c("verdict", "str", "PASS, FAIL, INCONCLUSIVE, ... for the patched arm"),
        _c("reasons", "str", "reason codes behind the verdict"),
        _opt("device_median_ms", "float64", "median device time per step, ms"),
        _opt("ttft_median_ms", "float64", "decode: median time to first token, ms"),
        _opt("tpot_median_ms", "float64", "decode: median time per output token, ms"),
        _opt("blocks", "int64", "timing blocks used"),
        _opt("processes", "int64", "worker processes (replicas) used"),
        _opt("sm_clock_median_mhz"), _opt("gpu_temp_median_c"), _opt("throttled_share"),
        _opt("clock_imbalance"), _opt("temp_imbalance"),
        _opt("speedup_vs_compile", "float64", "speedup of the patched arm over the torch.compile reference arm"),
        _opt("compile_ci_low", "float64", "lower bound of speedup_vs_compile"),
        _opt("compile_ci_high", "float64", "upper bound of speedup_vs_compile"),
        *_point(required=False),
        _opt("profile_device_ms", "float64", "device (or CPU) time of a profiled step, ms"),
        _opt("idle_share", "float64", "share of the profiled step the device was idle"),
        _opt("replaced_ms", "float64", "time in the replaced ops per profiled step, ms"),
        _opt("ranks", "int64", "data-parallel ranks"),
        _opt("rank_spread", "float64", "relative spread of the ranks' median step times"),
        _opt("slowest_rank", "int64", "rank with the slowest median step"),
        _opt("comm_share", "float64", "share of the step spent in collectives"),
        _opt("peak_alloc_mb"), _opt("peak_reserved_mb"), _opt("host_peak_rss_mb"),
        _opt("peak_memory_vs_baseline", "float64", "timed-phase peak / the baseline's (device allocated, else host RSS)"),
        _opt("process_noise"),
        _opt("process_noise_floor", "float64", "configured floor of the process noise"),
        _opt("process_noise_estimate", "float64", "process noise estimated from the replicas"),
        _opt("process_noise_df", "float64", "degrees of freedom of that estimate"),
        _opt("replicas_disagree_p", "float64", "p-value that the replicas' medians differ beyond their noise"),
        _opt("ci_half_width", "float64", "half width of the ratio's confidence interval"),
        _opt("mde"),
        _opt("stop_reason", "str", "why adaptive timing stopped (precision reached, budget, max steps)"),
        _opt("timing_s", "float64", "seconds spent timing the workload"),
        _opt("advice", "str", "what to change to reach a verdict"),
        _opt("mw_p_adjusted", "float64", "mw_p adjusted for multiple comparisons"),
        _opt("correction", "str", "the multiple-comparison correction used (holm, bh, none)"),
        _opt("replaced_share", "float64", "Amdahl: share f of the step in the replaced ops"),
        _opt("replaced_speedup", "float64", "Amdahl: speedup s of the replaced ops"),
        _opt("predicted_speedup", "float64", "Amdahl: step speedup predicted from f and s"),
        _opt("amdahl_bound", "float64", "Amdahl: the largest step speedup the replaced share allows"),
        _opt("cause"),
        _opt("cause_detail", "str", "the explanation in words"),
        _opt("candidate", "str", "several candidates: the candidate this arm runs (its patch names, 'a+b' stacked)"),
        _opt("rank", "float64", "several candidates: rank by speedup over the baseline among those whose gate passed"),
        _opt("best", "bool", "several candidates: the highest-ranked one that passes everywhere"),
    )),
    Table("pairwise", "several candidates: each pair compared per (point, workload), in the family of the "
                      "multiple-comparison correction with the comparisons against the baseline", (
        *_point(), _c("workload"),
        _c("arm_a", "str", "the first candidate's arm"), _c("arm_b", "str", "the second candidate's arm"),
        _c("candidate_a", "str", "the first candidate"), _c("candidate_b", "str", "the second candidate"),
        _c("speedup", "float64", "candidate_b's median / candidate_a's: above 1 means a is faster"),
        _c("ci_low"), _c("ci_high"),
        _c("mw_p", "float64", "Mann-Whitney p-value of a against b"),
        _c("mw_p_adjusted", "float64", "mw_p adjusted with every test of the run"),
        _c("correction", "str", "the multiple-comparison correction used (holm, bh, none)"),
        _c("significant", "bool", "interval excludes 1 and the adjusted p-value is under 1 - confidence"),
        _opt("faster", "str", "the significantly faster candidate (null when neither)"),
        _c("run_id"),
    )),
    Table("opdiff", "per-op difference between the baseline and patched profiles (rank 0)", (
        _c("workload"), _c("module"), _c("op"), _c("direction"), _c("time_basis"),
        _c("baseline_us", "float64", "op time per step in the baseline arm, us"),
        _c("patched_us", "float64", "op time per step in the patched arm, us"),
        _c("delta_us", "float64", "patched_us - baseline_us"),
        _c("status", meaning="replaced, removed, added, grown, shrunk or same"),
        _opt("candidate", "str", "several candidates: the candidate whose arm is compared with the baseline"),
        *_point(), _c("run_id"),
    )),
    Table("explain", "Amdahl explanation of the patched arm's speedup per (point, workload)", (
        *_point(), _c("workload"), _c("time_basis"),
        _c("measured", "float64", "measured step speedup"),
        _c("f", "float64", "share of the baseline step in the replaced ops"),
        _c("s", "float64", "speedup of the replaced ops"),
        _c("predicted", "float64", "step speedup Amdahl predicts from f and s"),
        _c("bound", "float64", "largest step speedup possible from f"),
        _c("cause"), _c("detail"), _c("tolerance"),
        _c("outside_growth_us", "float64", "growth of ops outside the replaced code, us per step"),
        _c("patched_idle_share", "float64", "share of the patched step the device was idle"),
        _c("grown_ops", "str", "ops outside the replacement that grew, JSON"),
        _c("run_id"),
    )),
    Table("microbench", "the replaced op alone on the model's shapes: replacement vs eager vs torch.compile", (
        _c("patch", "str", "patch name"),
        _c("source", "str", "where the shape came from (model capture or sweep)"),
        _c("workload", meaning="workload whose calls were captured"),
        _c("signature", "str", "call signature of the op"),
        _c("shape", "str", "input shape"),
        _c("dtype_in", "str", "input dtype"),
        _c("calls_per_step", "int64", "calls of this shape per model step"),
        _c("dtype_out", "str", "output dtype"),
        _c("impl", "str", "implementation: replacement, eager or compile"),
        _c("pass", "str", "forward or backward"),
        _c("bytes", "int64", "bytes read and written per call"),
        _c("trials", "int64", "timed calls"),
        _c("detail"),
        _c("compile_s", "float64", "compile/first-call time, s"),
        _c("error", "float64", "error against the reference"),
        _c("tolerance"),
        _c("passed", "boolean", "error within tolerance (NA when not checked)"),
        _c("median_us"),
        _c("p10_us", "float64", "10th percentile time per call, us"),
        _c("p90_us", "float64", "90th percentile time per call, us"),
        _c("samples_us", "list", "every timed call, us"),
        _c("device", "str", "device type"),
        _c("bandwidth_gbs", "float64", "achieved bandwidth, GB/s"),
        _c("copy_gbs", "float64", "measured copy bandwidth of the device, GB/s"),
        _c("roofline_share", "float64", "achieved bandwidth / copy bandwidth"),
        _c("floor_share", "float64", "time floor from bandwidth / measured time"),
        _c("plausible", "boolean", "the time is physically plausible"),
        _c("plausibility", "str", "why not, when not"),
        _c("speedup_vs_eager", "float64", "eager time / replacement time"),
        _c("speedup_vs_compile", "float64", "compile time / replacement time"),
        _c("run_id"), _c("started_unix_ns"), _c("ended_unix_ns"),
        _c("model", "str", "model the calls were captured from"),
        _c("batch"), _c("seq"), _c("precision"),
        _c("device_name", "str", "device name"),
        _c("patch_spec"), _c("patch_source_sha256"), _c("command_line"),
        _c("autocast_dtype", "str", "autocast dtype of the captured steps"),
        _c("config_json"),
        _c("torch_version", "str", "torch version"),
        _c("transformers_version", "str", "transformers version"),
        _c("triton_version", "str", "triton version"),
    )),
    Table("maxbatch", "--find-max-batch: each arm's largest batch per (seq, precision)", (
        _c("seq"), _c("precision"), _c("arm"),
        _c("workloads", "str", "workloads each probe ran"),
        _c("max_batch_cap", "int64", "largest batch tried (--max-batch)"),
        _c("max_batch", "int64", "largest batch that ran"),
        _c("capped", "bool", "max_batch reached the cap"),
        _c("smallest_failed", "int64", "smallest batch that ran out of memory"),
        _c("detail"),
        _c("probes", "int64", "batches tried"),
        _c("probes_json", "str", "every probe and its outcome, JSON"),
        _c("peak_alloc_mb_at_max", "float64", "peak allocated memory at max_batch, MiB"),
        _c("search_s", "float64", "seconds the search took"),
        _c("run_id"),
    )),
    Table("diff", "`e2eprof diff`: run B against run A, one row per workload/arm, then speedup rows", (
        _c("kind", "str", "row kind: arm (step times) or speedup"),
        _c("point"), _c("workload"), _c("arm"),
        _c("n_a", "float64", "steps in run A"),
        _c("n_b", "float64", "steps in run B"),
        _c("median_a_ms", "float64", "median in run A, ms"),
        _c("median_b_ms", "float64", "median in run B, ms"),
        _c("ratio", "float64", "B / A"),
        _c("ci_low"), _c("ci_high"), _c("mde"),
        _c("p", "float64", "p-value of the change"),
        _c("status"),
        _c("process_noise"),
        _c("p_adjusted", "float64", "p adjusted for multiple comparisons"),
        _c("speedup_a", "float64", "patched speedup in run A"),
        _c("speedup_a_low", "float64", "its lower bound"),
        _c("speedup_a_high", "float64", "its upper bound"),
        _c("speedup_b", "float64", "patched speedup in run B"),
        _c("speedup_b_low", "float64", "its lower bound"),
        _c("speedup_b_high", "float64", "its upper bound"),
        _c("diff", "float64", "speedup_b - speedup_a"),
        _c("diff_low", "float64", "its lower bound"),
        _c("diff_high", "float64", "its upper bound"),
        _c("run_a", "str", "run A's directory"),
        _c("run_b", "str", "run B's directory"),
        _c("run_a_id", "str", "run A's run_id"),
        _c("run_b_id", "str", "run B's run_id"),
        _c("metric", "str", "compared metric (wall or device)"),
        _c("min_change", "float64", "smallest relative change reported"),
        _c("confidence", "float64", "confidence level of the intervals"),
        _c("changes_json", "str", "environment changes between the runs, JSON"),
        _c("flags_json", "str", "warnings about the comparison, JSON"),
    )),
)}


def table(name: str) -> Table:
    """The declared schema of `<name>.parquet`; KeyError names the known tables."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no declared schema for table {name!r} (known: {', '.join(sorted(TABLES))})") from None


def problems(frame: pd.DataFrame, name: str, missing: bool = True) -> list[str]:
    """Every way `frame` differs from table `name`'s schema: a missing required column (unless missing=False), an
    undeclared column, a column whose values do not match its dtype. Empty when it conforms."""
    schema = table(name)
    declared = set(schema.names)
    found = [f"{name}: required column {c!r} is missing" for c in schema.required if missing and c not in frame.columns]
    found += [f"{name}: column {c!r} is not declared in e2eprof.tables.schema" for c in frame.columns if c not in declared]
    found += [f"{name}: column {c.name!r} does not hold {c.dtype} (pandas dtype {frame[c.name].dtype})"
              for c in schema.columns if c.name in frame.columns and not matches(frame[c.name], c.dtype)]
    return found


def typed(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """`frame` (changed in place and returned) with each declared column that holds only untyped nulls (object
    dtype, nothing in it) given its declared dtype. Nothing else changes: no value is ever converted."""
    declared = TABLES.get(name)
    if declared is None:
        return frame
    for column in declared.columns:
        if column.name in frame.columns and frame[column.name].dtype == object and not frame[column.name].notna().any():
            frame[column.name] = null_series(column.dtype, frame.index)
    return frame
