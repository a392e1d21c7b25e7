"""Report figures, drawn with matplotlib's Agg canvas and embedded as base64 PNG data URIs.

Figures are built with `matplotlib.figure.Figure` directly, never through pyplot: no global figure registry, no
GUI backend, nothing left open between renders. Every function returns None when its data was not recorded.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from e2eprof.render.run_tables import candidate_label

# Fixed colours for the arms we know, so the same arm looks the same in every report; others take the cycle below.
ARM_COLOURS = {"baseline": "#4c72b0", "patched": "#dd8452", "sdpa": "#55a868", "compile": "#8172b3"}
OTHER_COLOURS = ("#c44e52", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
PHASE_MARKERS = {"warm": ("o", 1.0), "warmup": ("x", 0.45), "cold": ("^", 0.9)}
DPI = 100


def arm_colours(arm_order: list[str]) -> dict[str, str]:
    others = iter(OTHER_COLOURS * (1 + len(arm_order) // len(OTHER_COLOURS)))
    return {arm: ARM_COLOURS.get(arm) or next(others) for arm in arm_order}


def to_data_uri(fig: Figure) -> str:
    """PNG as a data: URI. No 'Software' metadata: matplotlib's default embeds its web address in the file."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _warm_ms(steps: pd.DataFrame) -> pd.DataFrame:
    warm = steps[steps["phase"] == "warm"]
    return warm.assign(ms=warm["wall_ns"].astype("float64") / 1e6)


def latency_distributions(steps: pd.DataFrame | None, arm_order: list[str], workloads: list[str]) -> Figure | None:
    """Box (quartiles, whiskers at 1.5 IQR) plus every timed warm step as a dot, per arm, one panel per workload."""
    if steps is None:
        return None
    warm = _warm_ms(steps)
    shown = [w for w in workloads if (warm["workload"] == w).any()]
    if not shown:
        return None
    colours = arm_colours(arm_order)
    ncols = min(len(shown), 3)
    nrows = -(-len(shown) // ncols)
    fig = Figure(figsize=(4.4 * ncols, 3.4 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    rng = np.random.default_rng(0)  # fixed jitter: the same run renders to the same picture
    for ax, workload in zip(axes, shown):
        rows = warm[warm["workload"] == workload]
        present = [a for a in arm_order if (rows["arm"] == a).any()]
        data = [rows.loc[rows["arm"] == a, "ms"].to_numpy() for a in present]
        ax.boxplot(data, positions=range(len(present)), widths=0.55, showfliers=False,
                   medianprops={"color": "black", "linewidth": 1.5}, boxprops={"color": "#555555"},
                   whiskerprops={"color": "#555555"}, capprops={"color": "#555555"})
        for i, (arm, values) in enumerate(zip(present, data)):
            ax.scatter(i + rng.uniform(-0.18, 0.18, len(values)), values, s=12, color=colours[arm], alpha=0.75,
                       edgecolors="none", zorder=3)
        ax.set_xticks(range(len(present)), present)
        ax.set_title(workload, loc="left", fontsize=11, fontweight="bold")
        ax.set_ylabel("step wall time, ms")
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    return fig


def timeline(steps: pd.DataFrame | None, telemetry: pd.DataFrame | None, arm_order: list[str], t0_ns: int | None
             ) -> tuple[Figure | None, bool]:
    """Step latency, SM clock and GPU temperature against seconds since the run started, coloured by arm.

    Returns the figure and whether clock/temperature panels were drawn (False when neither steps nor telemetry
    carry them: a CPU run). Workloads ran one after another, so each gets a shaded band and a label.
    """
    if steps is None or not len(steps):
        return None, False
    t0 = int(t0_ns) if t0_ns is not None and not pd.isna(t0_ns) else int(steps["start_unix_ns"].min())
    steps = steps.assign(t_s=((steps["start_unix_ns"] + steps["end_unix_ns"]) / 2 - t0) / 1e9,
                         ms=steps["wall_ns"].astype("float64") / 1e6)
    samples = telemetry if telemetry is not None and len(telemetry) else None
    panels = [("ms", "step wall time, ms (log)", None)]
    for step_col, sample_col, label in (("sm_clock_median_mhz", "sm_clock_mhz", "SM clock, MHz"),
                                        ("gpu_temp_c", "gpu_temp_c", "GPU temperature, C")):
        in_steps = step_col in steps and steps[step_col].notna().any()
        in_samples = samples is not None and sample_col in samples and samples[sample_col].notna().any()
        if in_steps or in_samples:
            panels.append((step_col if in_steps else None, label, sample_col if in_samples else None))
    colours = arm_colours(arm_order)
    fig = Figure(figsize=(13, 2.6 + 2.1 * len(panels)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(panels), 1, sharex=True, squeeze=False)).ravel()
    # A sweep ran each workload once per point: one band per (point, workload), so points are not drawn as one.
    band_keys = ["point", "workload"] if "point" in steps and steps["point"].nunique() > 1 else ["workload"]
    bands = steps.groupby(band_keys, sort=False).agg(start=("t_s", "min"), end=("t_s", "max"))
    bands.index = ["\n".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in bands.index]
    for ax, (step_col, label, sample_col) in zip(axes, panels):
        for i, (workload, band) in enumerate(bands.iterrows()):
            ax.axvspan(band["start"], band["end"], color="#000000", alpha=0.07 if i % 2 == 0 else 0.035, lw=0)
        if sample_col is not None:
            t = (samples["unix_ns"] - t0) / 1e9
            ax.plot(t, samples[sample_col], color="#999999", lw=0.6, zorder=1)
        if step_col is not None:
            for arm in arm_order:
                for phase, (marker, alpha) in PHASE_MARKERS.items():
                    rows = steps[(steps["arm"] == arm) & (steps["phase"] == phase)]
                    if len(rows):
                        ax.scatter(rows["t_s"], rows[step_col], s=14, marker=marker, color=colours[arm],
                                   alpha=alpha, zorder=3, linewidths=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    for workload, band in bands.iterrows():
        axes[0].annotate(str(workload), xy=((band["start"] + band["end"]) / 2, 1.0), xycoords=("data", "axes fraction"),
                         ha="center", va="bottom", fontsize=10 if len(bands) <= 4 else 8, fontweight="bold")
    axes[-1].set_xlabel("seconds since the run started")
    handles = [Line2D([], [], ls="", marker="o", color=colours[a], label=a) for a in arm_order]
    handles += [Line2D([], [], ls="", marker=m, color="#444444", alpha=al, label=f"{p} step")
                for p, (m, al) in PHASE_MARKERS.items()]
    if samples is not None and len(panels) > 1:
        handles.append(Line2D([], [], color="#999999", lw=1, label="NVML samples (whole run)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    return fig, len(panels) > 1


def _op_label(row, width: int = 78) -> str:
    """'aten::_softmax [fwd] (removed)  in e2eprof.replaced::fastsoftmax', cut to `width` characters."""
    status = f" ({row['status']})" if row.get("status") in ("added", "removed") else ""
    label = f"{row['op']} [{row['direction']}]{status}  in {row['module']}"
    return label if len(label) <= width else label[: width - 1] + "…"


def op_diff_bars(opdiff: pd.DataFrame | None, workloads: list[str], top: int = 10) -> Figure | None:
    """Top changes per workload, patched minus baseline per step: green saved time, red added time."""
    if opdiff is None:
        return None
    if "candidate" in opdiff and opdiff["candidate"].notna().any():  # several candidates: a panel per candidate
        opdiff = opdiff.assign(workload=[candidate_label(r) for _, r in opdiff.iterrows()])
        workloads = [label for w in workloads for label in dict.fromkeys(opdiff["workload"]) if label.startswith(f"{w} (")]
    shown = [w for w in workloads if (opdiff["workload"] == w).any()]
    if not shown:
        return None
    heights = [min(top, int((opdiff["workload"] == w).sum())) for w in shown]
    fig = Figure(figsize=(12, 0.9 * len(shown) + 0.32 * sum(heights)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(shown), 1, squeeze=False, height_ratios=[h + 1.5 for h in heights])).ravel()
    for ax, workload in zip(axes, shown):
        rows = opdiff[opdiff["workload"] == workload]
        net_ms = float(rows["delta_us"].sum()) / 1e3  # every op, not only the bars shown
        rows = rows.reindex(rows["delta_us"].abs().sort_values(ascending=False, kind="stable").index).head(top)
        ms = (rows["delta_us"] / 1e3).to_numpy()[::-1]  # largest change at the top
        labels = [_op_label(r) for _, r in rows.iloc[::-1].iterrows()]
        ax.barh(range(len(ms)), ms, color=["#2e7d32" if x < 0 else "#c62828" for x in ms], height=0.65)
        ax.set_yticks(range(len(ms)), labels, fontsize=8.5)
        ax.axvline(0, color="black", lw=0.8)
        limit = float(np.abs(ms).max()) * 1.28 or 1.0  # room for the value labels on both sides
        ax.set_xlim(-limit, limit)
        for y, x in enumerate(ms):
            ax.annotate(f"{x:+.3f}", xy=(x, y), xytext=(3 if x >= 0 else -3, 0), textcoords="offset points",
                        ha="left" if x >= 0 else "right", va="center", fontsize=8)
        basis = str(rows["time_basis"].iloc[0]) if "time_basis" in rows and len(rows) else "device"
        ax.set_title(f"{workload}: patched - baseline, ms per step ({basis} time; all ops together {net_ms:+.3f} ms)",
                     loc="left", fontsize=10, fontweight="bold")
        ax.grid(axis="x", alpha=0.3)
    return fig


def amdahl_plot(explain: pd.DataFrame | None, summary: pd.DataFrame | None) -> Figure | None:
    """Per workload: Amdahl's prediction, its bound 1/(1-f), and the measured speedup with its interval."""
    if explain is None:
        return None
    fig = Figure(figsize=(7.5, 3.4), layout="constrained")
    ax = fig.subplots()
    patched = ARM_COLOURS["patched"]
    for i, (_, r) in enumerate(explain.iterrows()):
        ax.scatter([i - 0.12], [r["predicted"]], marker="D", s=45, color="#555555", zorder=3,
                   label="predicted (Amdahl)" if i == 0 else None)
        ax.scatter([i - 0.12], [r["bound"]], marker="_", s=300, color="#555555", linewidths=2, zorder=3,
                   label="bound 1/(1-f)" if i == 0 else None)
        low = high = np.nan
        if summary is not None:
            rows = summary[(summary["workload"] == r["workload"]) & (summary["arm"] == "patched")]
            if len(rows):
                low, high = rows.iloc[0].get("ci_low", np.nan), rows.iloc[0].get("ci_high", np.nan)
        yerr = None if pd.isna(low) or pd.isna(high) else [[r["measured"] - low], [high - r["measured"]]]
        ax.errorbar([i + 0.12], [r["measured"]], yerr=yerr, fmt="o", color=patched, capsize=4, zorder=3,
                    label="measured [CI]" if i == 0 else None)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(explain)), explain["workload"].astype(str))
    ax.set_xlim(-0.6, len(explain) - 0.4)
    ax.set_ylabel("step speedup, patched vs baseline")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside right upper", frameon=False, fontsize=9)
    return fig


VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#bf8700"}


def sweep_speedups(speedups: pd.DataFrame | None, points: list[str], workloads: list[str]) -> Figure | None:
    """Speedup [CI] of the arm under test at every sweep point, one panel per workload, coloured by verdict.

    A point where memory ran out has no speedup: it is marked "OOM" on the 1x line instead of leaving a silent gap.
    """
    if speedups is None or not len(speedups):
        return None
    shown = [w for w in workloads if (speedups["workload"] == w).any()]
    fig = Figure(figsize=(max(6.0, 0.9 * len(points) + 2.5), 2.9 * len(shown)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(shown), 1, sharex=True, squeeze=False)).ravel()
    x = {p: i for i, p in enumerate(points)}
    for ax, workload in zip(axes, shown):
        rows = speedups[(speedups["workload"] == workload) & speedups["point"].isin(points)]
        for _, r in rows.iterrows():
            colour = VERDICT_COLOURS.get(str(r["verdict"]), "#6e7781")
            ratio, low, high = r.get("speedup_vs_baseline"), r.get("ci_low"), r.get("ci_high")
            if pd.isna(ratio):
                ax.annotate("OOM" if "OUT_OF_MEMORY" in str(r.get("reasons", "")) else "no data", xy=(x[r["point"]], 1.0),
                            ha="center", va="center", fontsize=8, color="#59636e", fontweight="bold",
                            bbox={"boxstyle": "round", "fc": "white", "ec": "#d0d7de"})
                continue
            yerr = None if pd.isna(low) or pd.isna(high) else [[ratio - low], [high - ratio]]
            ax.errorbar([x[r["point"]]], [ratio], yerr=yerr, fmt="o", color=colour, capsize=4, ms=6, zorder=3)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        # A ratio's interval is symmetric on a log scale: 0.5x and 2x lie equally far from 1.
        bounds = rows[["ci_low", "ci_high", "speedup_vs_baseline"]].to_numpy(dtype=float)
        bounds = bounds[np.isfinite(bounds) & (bounds > 0)]
        if len(bounds) and bounds.max() / bounds.min() > 3:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{workload}: {rows['arm'].iloc[0] if len(rows) else 'patched'} vs baseline per point",
                     loc="left", fontsize=10, fontweight="bold")
        ax.set_ylabel("speedup [CI]")
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlim(-0.6, len(points) - 0.4)
    axes[-1].set_xticks(range(len(points)), points, rotation=30 if len(points) > 6 else 0, ha="right" if len(points) > 6 else "center")
    handles = [Line2D([], [], ls="", marker="o", color=c, label=v) for v, c in VERDICT_COLOURS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    return fig
