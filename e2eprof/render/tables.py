"""What a report says, read from a run directory's Parquet tables and turned into tables of formatted strings.

The HTML page and the markdown summary both render these, so a number can never read differently in the two.
Only pandas is needed: rendering a report must not import torch or re-run anything. Reading the run and formatting
numbers live in run_tables, verdicts and sweeps in verdicts, memory in memory_tables; speedups, the Amdahl
explanation, arm balance, correctness and the environment are here.
"""

from __future__ import annotations

import re

import pandas as pd

from e2eprof.render.memory_tables import (MEMORY_PHASE, MEMORY_VALUES, maxbatch_lines, maxbatch_table, memory_notes,
                                          memory_table)
from e2eprof.render.run_tables import (NOT_RECORDED, OPTIONAL_TABLES, RunTables, Table, _json, arms, fmt_ms, fmt_num,
                                       fmt_ratio, fmt_time, has_points, is_sweep, load_run, missing, point_label, points,
                                       sweep_line, workloads)
from e2eprof.render.verdicts import (REASON_MEANING, WorkloadVerdict, candidates, grid_cell_text, mixed_direction, overall_verdict,
                                     sweep_speedups, verdict_grid, workload_verdicts)

# The renderers read every table through this module (`tables as t`): the names its parts define are named here too.
__all__ = [
    "MEMORY_PHASE", "MEMORY_VALUES", "maxbatch_lines", "maxbatch_table", "memory_notes", "memory_table",
    "NOT_RECORDED", "OPTIONAL_TABLES", "RunTables", "Table", "arms", "fmt_ms", "fmt_num", "fmt_ratio", "fmt_time",
    "has_points", "is_sweep", "load_run", "missing", "point_label", "points", "sweep_line", "workloads",
    "REASON_MEANING", "WorkloadVerdict", "candidates", "grid_cell_text", "mixed_direction", "overall_verdict", "sweep_speedups",
    "verdict_grid", "workload_verdicts", "reference_arms", "confidence_label", "speedup_table", "amdahl_table",
    "amdahl_details", "balance_table", "correctness_failures", "correctness_counts", "measurement_notes", "NOTE_METRICS",
    "run_facts", "flatten",
    "telemetry_note", "title", "device_line",
]


# ---- speedups ------------------------------------------------------------------------------------------------------


def reference_arms(summary: pd.DataFrame) -> list[str]:
    """Stock reference arms the patched arm is compared against: each `speedup_vs_<arm>` with `<arm>_ci_low`
    beside it, except baseline (whose interval columns are plain ci_low/ci_high). A column with no value at all
    is left out: write_table adds the sdpa columns to every summary, also to runs without an sdpa arm."""
    found = [m.group(1) for c in summary.columns if (m := re.fullmatch(r"speedup_vs_(\w+)", c))]
    return [arm for arm in found if arm != "baseline" and f"{arm}_ci_low" in summary.columns
            and summary[f"speedup_vs_{arm}"].notna().any()]


def confidence_label(run: RunTables) -> str:
    confidence = run.config().get("confidence")
    return f"{float(confidence) * 100:.0f}% CI" if isinstance(confidence, (int, float)) else "CI"


def speedup_table(run: RunTables, workload: str) -> Table:
    """Per arm: samples, median and spread, cold step, speedup vs baseline and vs each stock reference arm."""
    summary = run.get("summary")
    rows = summary[summary["workload"] == workload]
    refs = reference_arms(summary)
    ci = confidence_label(run)
    has_decode = "tpot_median_ms" in rows and rows["tpot_median_ms"].notna().any()
    columns = ["arm", "n", "median ms", "p10 / p90 ms", "cold ms", f"vs baseline [{ci}]",
               *[f"vs {ref} [{ci}]" for ref in refs], *(["TTFT ms", "ms / token"] if has_decode else []), "correct"]
    body = []
    for _, r in rows.iterrows():
        arm = str(r["arm"])
        vs_base = "1 (reference)" if arm == "baseline" else fmt_ratio(r.get("speedup_vs_baseline"), r.get("ci_low"), r.get("ci_high"))
        vs_refs = [fmt_ratio(r.get(f"speedup_vs_{ref}"), r.get(f"{ref}_ci_low"), r.get(f"{ref}_ci_high")) for ref in refs]
        decode = [fmt_ms(r.get("ttft_median_ms")), fmt_ms(r.get("tpot_median_ms"))] if has_decode else []
        correct = "-" if missing(r.get("correct")) else ("yes" if bool(r.get("correct")) else "NO")
        n = "-" if missing(r.get("n")) else str(int(r["n"]))
        body.append([arm, n, fmt_ms(r.get("median_ms")), f"{fmt_ms(r.get('p10_ms'))} / {fmt_ms(r.get('p90_ms'))}",
                     fmt_ms(r.get("cold_ms")), vs_base, *vs_refs, *decode, correct])
    return Table(columns, body, numeric=set(range(1, len(columns) - 1)),
                 row_classes=["fail" if row[-1] == "NO" else "" for row in body])


# ---- Amdahl explanation --------------------------------------------------------------------------------------------


def amdahl_table(run: RunTables) -> Table | None:
    """Per workload: the replaced region's share f and speedup s, predicted and bound, measured, cause."""
    explain = run.get("explain")
    if explain is None:
        return None
    summary = run.get("summary")
    columns = ["workload", "time basis", "share f", "speedup s", "predicted", "bound 1/(1-f)", "measured", "cause"]
    body = []
    for _, r in explain.iterrows():
        measured = fmt_ratio(r.get("measured"))
        if summary is not None:  # the measured ratio's interval lives in the summary
            patched = summary[(summary["workload"] == r["workload"]) & (summary["arm"] == "patched")]
            if len(patched):
                p = patched.iloc[0]
                measured = fmt_ratio(p.get("speedup_vs_baseline"), p.get("ci_low"), p.get("ci_high"))
        share = "-" if missing(r.get("f")) else f"{float(r['f']) * 100:.1f}%"
        body.append([str(r["workload"]), str(r.get("time_basis") or "-"), share, fmt_ratio(r.get("s")),
                     fmt_ratio(r.get("predicted")), fmt_ratio(r.get("bound")), measured, str(r.get("cause") or "-")])
    return Table(columns, body, numeric={2, 3, 4, 5, 6})


def amdahl_details(run: RunTables) -> list[tuple[str, str]]:
    explain = run.get("explain")
    if explain is None or "detail" not in explain:
        return []
    return [(str(r["workload"]), str(r["detail"])) for _, r in explain.iterrows() if not missing(r["detail"])]


# ---- arm balance ---------------------------------------------------------------------------------------------------


def balance_table(run: RunTables) -> Table | None:
    """Median SM clock and GPU temperature per arm against the baseline's, as the verdict checked them."""
    balance = run.get("balance")
    if balance is None:
        return None
    sweep = "point" in balance and balance["point"].nunique() > 1
    columns = [*(["point"] if sweep else []), "workload", "arm", "steps with telemetry", "SM clock MHz",
               "clock vs baseline", "GPU temp C", "temp vs baseline", "throttled share", "flags"]
    body, classes = [], []
    for _, r in balance.iterrows():
        flags = [name for name in ("clock_imbalance", "temp_imbalance", "throttled") if bool(r.get(name) or False)]
        clock = "-" if missing(r.get("clock_diff_rel")) else f"{float(r['clock_diff_rel']) * 100:+.1f}%"
        temp = "-" if missing(r.get("temp_diff_c")) else f"{float(r['temp_diff_c']):+.1f} C"
        share = "-" if missing(r.get("throttled_share")) else f"{float(r['throttled_share']) * 100:.0f}%"
        body.append([*([str(r["point"])] if sweep else []), str(r["workload"]), str(r["arm"]),
                     f"{r.get('steps_with_telemetry', '-')}/{r.get('steps', '-')}",
                     fmt_num(r.get("sm_clock_median_mhz"), ".0f"), clock, fmt_num(r.get("gpu_temp_median_c"), ".0f"),
                     temp, share, ", ".join(flags) or "none"])
        classes.append("fail" if flags else "")
    return Table(columns, body, numeric={i + sweep for i in (2, 3, 4, 5, 6, 7)}, row_classes=classes)


# ---- correctness ---------------------------------------------------------------------------------------------------


def correctness_failures(run: RunTables, limit: int = 50) -> tuple[Table | None, int]:
    """Failed checks (at most `limit` rows) and how many failed in all."""
    checks = run.get("correctness")
    if checks is None:
        return None, 0
    failed = checks[~checks["passed"].fillna(False).astype(bool)]
    body = [[str(r["workload"]), str(r["arm"]), str(r["tensor"]), str(r["metric"]), fmt_num(r.get("value")),
             fmt_num(r.get("tolerance")), str(r.get("detail") or "")] for _, r in failed.head(limit).iterrows()]
    table = Table(["workload", "arm", "tensor", "metric", "value", "tolerance", "detail"], body, numeric={4, 5},
                  row_classes=["fail"] * len(body))
    return table, len(failed)


# Informational rows (passed) that change what a workload's figures rest on: said in words wherever results are shown.
NOTE_METRICS = ("replica_dropped", "reference_on_host")


def measurement_notes(checks: pd.DataFrame | None, workload: str | None = None) -> list[tuple[str, str]]:
    """(where, sentence) for each replica dropped out of memory (its arm went on with fewer processes, so its
    interval leans on the noise floor) and each fp64 reference moved to the host; one workload's only if given.
    `where` is the workload, with the sweep point before it when the run has several points."""
    if checks is None or not {"workload", "arm", "metric", "detail"} <= set(checks.columns):
        return []
    rows = checks[checks["metric"].isin(NOTE_METRICS)]
    if workload is not None:
        rows = rows[rows["workload"] == workload]
    several_points = "point" in checks and checks["point"].nunique() > 1
    notes = []
    keys = [c for c in ("point", "workload", "arm", "metric", "detail") if c in rows]
    for _, row in rows.drop_duplicates(keys).iterrows():
        where = f"{row['point']} {row['workload']}" if several_points else str(row["workload"])
        if row["metric"] == "replica_dropped":  # "<key> ran out of memory during <phase> beside ...: <the error>"
            notes.append((where, f"{str(row['detail']).split(': ', 1)[0]}; dropped, {row['arm']} went on with fewer "
                                 "processes"))
        else:
            notes.append((where, str(row["detail"])))
    return notes


def correctness_counts(run: RunTables) -> Table | None:
    """Checks passed / run per workload (rows) and arm (columns)."""
    checks = run.get("correctness")
    if checks is None:
        return None
    passed = checks.assign(ok=checks["passed"].fillna(False).astype(bool))
    arm_names = [a for a in arms(run) if a in set(passed["arm"])] + sorted(set(passed["arm"]) - set(arms(run)))
    body, classes = [], []
    for workload, rows in passed.groupby("workload", sort=False):
        cells = []
        for arm in arm_names:
            mine = rows[rows["arm"] == arm]
            cells.append(f"{int(mine['ok'].sum())}/{len(mine)}" if len(mine) else "-")
        body.append([str(workload), *cells])
        classes.append("" if rows["ok"].all() else "fail")
    return Table(["workload", *[f"{a} passed" for a in arm_names]], body, numeric=set(range(1, len(arm_names) + 1)),
                 row_classes=classes)


# ---- environment ---------------------------------------------------------------------------------------------------


def run_facts(run: RunTables) -> list[tuple[str, str]]:
    """What was run, when, with which patch: the facts a reader needs to reproduce or trust the run."""
    r = run.run
    model = _json(r.get("model_json"))
    facts = [
        ("run id", str(r.get("run_id"))), ("status", str(r.get("status"))),
        ("started", fmt_time(r.get("started_unix_ns"))), ("ended", fmt_time(r.get("ended_unix_ns"))),
        ("command line", str(r.get("command_line") or "-")),
        ("patch", f"{r.get('patch_spec')} (origin: {r.get('patch_origin')})"),
        ("patch source sha256", str(r.get("patch_source_sha256") or "-")),
        ("seed", str(r.get("seed"))), ("batch digest", str(r.get("batch_digest") or "-")),
    ]
    if model:
        facts.append(("model", ", ".join(f"{k}={val}" for k, val in sorted(model.items()))))
    if not missing(r.get("failure")):
        facts.append(("failure", str(r.get("failure"))))
    if "telemetry_available" in r and not missing(r.get("telemetry_available")) and not bool(r.get("telemetry_available")):
        facts.append(("telemetry", f"unavailable: {r.get('telemetry_unavailable_reason') or 'no reason recorded'}"))
    return facts


def flatten(mapping: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested JSON as sorted dotted keys: env_vars.CUDA_VISIBLE_DEVICES = 0."""
    out = []
    for key in sorted(mapping):
        value = mapping[key]
        if isinstance(value, dict) and value:
            out += flatten(value, f"{prefix}{key}.")
        else:
            text = ", ".join(map(str, value)) if isinstance(value, list) else ("-" if value is None else str(value))
            out.append((f"{prefix}{key}", text))
    return out


def telemetry_note(run: RunTables) -> str:
    reason = run.run.get("telemetry_unavailable_reason")
    return NOT_RECORDED + ("" if missing(reason) else f" ({reason})")


def title(run: RunTables) -> str:
    config = run.config()
    return f"{config.get('model', '?')} + {run.run.get('patch_spec') or config.get('patch', '?')}"


def device_line(run: RunTables) -> str:
    env = run.environment()
    device = env.get("gpu_name") or env.get("cpu_model") or env.get("device") or "unknown device"
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "triton") if env.get(k))
    return f"{device}" + (f"; {versions}" if versions else "")
