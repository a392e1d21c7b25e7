"""`e2eprof report`: HTML page and markdown summary rendered from a run directory's Parquet tables.

Renders the two committed H200 report directories (copied, so the repository is never written), a synthetic run
with a second reference arm, and a run that failed before writing anything but run.parquet.
"""

import base64
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from e2eprof.errors import UsageError
from e2eprof.render import render_report
from e2eprof.tables.reports import write_table

# Tables of two H200 runs (tests/data/README.md says what was kept of them).
REPORTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "h200-runs"
PROFILED = REPORTS / "2026-12-02-h200-gpt2-fastsoftmax-profiled"
FIRST = REPORTS / "2026-12-02-h200-gpt2-fastsoftmax-first"
SECTIONS = ["Verdict", "Speedup", "Step latency distributions", "Latency, SM clock and GPU temperature over time",
            "Where the time went: op diff", "Predicted (Amdahl) vs measured", "Correctness", "Environment"]
NOT_RECORDED = "not recorded in this run"


def copy_run(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report.html", "report.md"))
    return dst


def render(run_dir: Path) -> tuple[str, str]:
    written = render_report(run_dir)
    assert written.html == run_dir / "report.html" and written.markdown == run_dir / "report.md"
    return written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")


def interval(ratio, low, high) -> str:
    return f"{ratio:.3f}x [{low:.3f}, {high:.3f}]"


def headings(html: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", html)


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def assert_self_contained(html: str) -> None:
    # Base64 payloads may spell "http" by chance; everything outside them may not, and a URL nowhere.
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    assert "http" not in text.lower() and "://" not in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    # every src= is an embedded image
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', html))


def assert_summary_numbers(html: str, md: str, summary: pd.DataFrame) -> None:
    """Each arm's median (four significant digits) and each speedup interval, in both documents."""
    for r in summary.itertuples():
        if 10 <= r.median_ms < 1000:
            assert f"{r.median_ms:.4g}" in html and f"{r.median_ms:.4g}" in md, (r.workload, r.arm)
        if r.arm != "baseline":
            text = interval(r.speedup_vs_baseline, r.ci_low, r.ci_high)
            assert text in html and text in md, (r.workload, r.arm)
        if not math.isnan(r.speedup_vs_sdpa):
            text = interval(r.speedup_vs_sdpa, r.sdpa_ci_low, r.sdpa_ci_high)
            assert text in html and text in md, (r.workload, "vs sdpa")


def verdict_cards(html: str) -> dict[str, str]:
    return dict(re.findall(r'<div class="card fg-\w+"><div class="wl">(\w+)</div><div class="verdict">(\w+)</div>', html))


def test_profiled_h200_run(tmp_path):
    run_dir = copy_run(PROFILED, tmp_path)
    html, md = render(run_dir)
    summary = pd.read_parquet(run_dir / "summary.parquet")
    patched = summary[summary.arm == "patched"]

    assert headings(html) == SECTIONS
    assert verdict_cards(html) == dict(zip(patched.workload, patched.verdict)) == {
        "train": "PASS", "infer": "FAIL", "generate": "FAIL"}
    assert 'class="overall bg-FAIL">Run verdict: FAIL &mdash; exit code 1' in html
    assert "**Run verdict: FAIL** (exit code 1" in md
    for r in patched.itertuples():
        for reason in r.reasons.split(","):
            assert f'<span class="code">{reason}</span>' in html
        assert f"| {r.workload} | **{r.verdict}** | {r.reasons.replace(',', ', ')} |" in md
    assert_summary_numbers(html, md, summary)

    explain = pd.read_parquet(run_dir / "explain.parquet")
    for r in explain.itertuples():
        row = f"| {r.workload} | {r.time_basis} | {r.f * 100:.1f}% | {r.s:.3f}x | {r.predicted:.3f}x | {r.bound:.3f}x |"
        assert row in md and r.cause in html
    # the two failed checks (profile_complete in infer and generate) come before the pass counts
    assert "Failed checks (2)" in html and html.index("Failed checks") < html.index("Checks passed per workload")
    assert "155/155" in html and "5/6" in html

    pngs = embedded_pngs(html)
    assert len(pngs) == 4 and all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 10_000 for p in pngs)
    assert f"SM clock and GPU temperature: {NOT_RECORDED}" not in html
    assert NOT_RECORDED not in html  # every table of this run is present
    assert "NVIDIA H200" in html and "65b52ab50e4a4ae438c9fa87696218342d1f24dbd478d27b030e162567597879" in md
    assert_self_contained(html)
    assert "data:image" not in md and "http" not in md


def test_first_h200_run_without_telemetry_or_profiles(tmp_path):
    run_dir = copy_run(FIRST, tmp_path)
    assert not (run_dir / "telemetry.parquet").exists()
    html, md = render(run_dir)
    summary = pd.read_parquet(run_dir / "summary.parquet")

    assert headings(html) == SECTIONS
    assert verdict_cards(html) == {"train": "PASS", "infer": "INCONCLUSIVE", "generate": "FAIL"}
    assert '<div class="card fg-INCONCLUSIVE"><div class="wl">infer</div>' in html
    assert '<span class="code">NO_SIGNIFICANT_DIFFERENCE</span>' in html
    assert_summary_numbers(html, md, summary)
    assert f"SM clock and GPU temperature: {NOT_RECORDED}" in html
    assert f"Op diff: {NOT_RECORDED}" in html and f"Explanation: {NOT_RECORDED}" in html
    assert f"Explanation: {NOT_RECORDED}" in md
    assert "No failed checks." in html and "No failed checks." in md
    assert len(embedded_pngs(html)) == 2  # latency distributions and the timeline
    assert_self_contained(html)


def synthetic_run(run_dir: Path, *, arms=("baseline", "patched", "sdpa", "compile"), candidate="patched") -> None:
    """Two workloads, a `compile` reference arm beside sdpa, no telemetry/profile tables, one failed check.

    `candidate` is the arm whose summary row carries the verdict (the second baseline in an A/A run)."""
    config = {"model": "gpt2-tiny", "patch": "fastsoftmax", "confidence": 0.9, "workloads": ["train", "infer"]}
    write_table(run_dir, "run", [{
        "run_id": "synthetic01", "schema_version": 1, "status": "complete", "command_line": "e2eprof compare",
        "config_json": json.dumps(config), "environment_json": json.dumps({"device": "cpu", "torch": "2.13.0"}),
        "patch_spec": "fastsoftmax", "patch_origin": "builtin", "patch_source_sha256": "ab" * 32, "seed": 0,
        "batch_digest": "cd" * 32, "started_unix_ns": 1_796_000_000_000_000_000,
        "ended_unix_ns": 1_796_000_060_000_000_000, "telemetry_available": False,
        "telemetry_unavailable_reason": "no CUDA device (device is 'cpu')"}])
    steps, summary = [], []
    median = {"baseline": 20.0, "patched": 18.0, "sdpa": 15.0, "compile": 12.5, "baseline-aa": 19.0}
    for w, workload in enumerate(("train", "infer")):
        for i, arm in enumerate(arms):
            for step in range(8):
                start = 1_796_000_001_000_000_000 + (w * 1000 + step * 10 + i) * 10_000_000
                wall = int((median[arm] + step % 3) * 1e6)
                steps.append({"workload": workload, "arm": arm, "block": step // 2, "step": step, "phase": "warm",
                              "wall_ns": wall, "start_unix_ns": start, "end_unix_ns": start + wall})
            row = {"workload": workload, "arm": arm, "n": 8, "median_ms": median[arm] + 1, "p10_ms": median[arm],
                   "p90_ms": median[arm] + 2, "cold_ms": 250.0, "correct": not (workload == "infer" and arm == candidate),
                   "speedup_vs_baseline": 1.0 if arm == "baseline" else median["baseline"] / median[arm],
                   "ci_low": math.nan if arm == "baseline" else 1.01, "ci_high": math.nan if arm == "baseline" else 1.3}
            for ref in [a for a in ("sdpa", "compile") if a in arms]:
                mine = arm == candidate
                row |= {f"speedup_vs_{ref}": median[ref] / median[candidate] if mine else math.nan,
                        f"{ref}_ci_low": 0.61 if mine else math.nan, f"{ref}_ci_high": 0.88 if mine else math.nan}
            if arm == candidate:
                row |= {"verdict": "PASS" if workload == "train" else "FAIL",
                        "reasons": "FASTER" if workload == "train" else "INCORRECT"}
            summary.append(row)
    write_table(run_dir, "steps", steps)
    write_table(run_dir, "summary", summary)
    checks = [{"workload": w, "arm": a, "tensor": "logits", "metric": "rel_error_vs_fp64", "value": 1e-3,
               "tolerance": 2e-3, "passed": True, "detail": ""} for w in ("train", "infer") for a in arms]
    checks.append({"workload": "infer", "arm": candidate, "tensor": "loss", "metric": "rel_error_vs_fp64",
                   "value": 0.5, "tolerance": 2e-3, "passed": False, "detail": "planted failure"})
    write_table(run_dir, "correctness", checks)


def test_synthetic_run_with_a_second_reference_arm(tmp_path):
    run_dir = tmp_path / "synthetic"
    synthetic_run(run_dir)
    html, md = render(run_dir)

    assert headings(html) == SECTIONS
    assert verdict_cards(html) == {"train": "PASS", "infer": "FAIL"}
    assert "Run verdict: FAIL &mdash; exit code 1" in html
    # reference arms are found from the summary's columns, with the run's confidence level
    for doc in (html, md):
        assert "vs sdpa [90% CI]" in doc and "vs compile [90% CI]" in doc
        assert interval(12.5 / 18.0, 0.61, 0.88) in doc and interval(15.0 / 18.0, 0.61, 0.88) in doc
        assert interval(20.0 / 12.5, 1.01, 1.3) in doc  # the compile arm's own row vs baseline
    # failures first, then the compact counts: 1 of 2 checks passed for patched/infer
    assert html.index("planted failure") < html.index("Checks passed per workload")
    assert "| infer | 1/1 | 1/2 | 1/1 | 1/1 |" in md
    assert '<tr class="fail"><td>infer</td>' in html
    assert f"SM clock and GPU temperature: {NOT_RECORDED} (no CUDA device (device is &#x27;cpu&#x27;))" in html
    for section in ("Arm balance", "Op diff", "Explanation"):
        assert f"{section}: {NOT_RECORDED}" in html
    assert len(embedded_pngs(html)) == 2
    assert_self_contained(html)


def test_verdict_of_an_aa_run_sits_on_the_second_baseline(tmp_path):
    run_dir = tmp_path / "aa"
    synthetic_run(run_dir, arms=("baseline", "baseline-aa"), candidate="baseline-aa")
    html, md = render(run_dir)
    assert verdict_cards(html) == {"train": "PASS", "infer": "FAIL"}
    assert f"baseline-aa vs baseline: {interval(20.0 / 19.0, 1.01, 1.3)}" in html
    assert "| workload | verdict | reasons | baseline-aa vs baseline [90% CI] |" in md
    assert "vs sdpa" not in html


def test_run_that_failed_before_any_table_but_run(tmp_path):
    run_dir = tmp_path / "failed"
    write_table(run_dir, "run", [{"run_id": "x1", "status": "failed", "config_json": "{}", "environment_json": "",
                                  "failure": "RunError: the baseline arm could not start"}])
    html, md = render(run_dir)
    assert headings(html) == SECTIONS
    assert "This run is marked <b>failed</b>: RunError: the baseline arm could not start" in html
    assert "This run is marked **failed**" in md
    for section in ("Verdicts", "Summary", "Timed steps", "Steps", "Op diff", "Explanation", "Correctness checks"):
        assert f"{section}: {NOT_RECORDED}" in html, section
    assert f"Configuration: {NOT_RECORDED}" in html
    assert embedded_pngs(html) == []


def test_bad_run_directories_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        render_report(tmp_path / "missing")
    with pytest.raises(UsageError, match="has no run.parquet"):
        render_report(tmp_path)
    (tmp_path / "run.parquet").write_bytes(b"not parquet")
    with pytest.raises(UsageError, match="cannot read"):
        render_report(tmp_path)
    synthetic_run(tmp_path / "ok")
    with pytest.raises(UsageError, match="--out must name an .html file"):
        render_report(tmp_path / "ok", html_path=tmp_path / "report.txt")


def e2eprof(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"}
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_writes_both_files_and_imports_no_torch(tmp_path):
    run_dir = tmp_path / "synthetic"
    synthetic_run(run_dir)
    done = e2eprof(["report", str(run_dir)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "report.html").is_file() and (run_dir / "report.md").is_file()
    assert str(run_dir / "report.html") in done.stdout

    out = tmp_path / "elsewhere" / "page.html"
    done = e2eprof(["report", str(run_dir), "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.is_file() and out.with_suffix(".md").is_file()
    assert "Figures: `page.html`" in out.with_suffix(".md").read_text()

    # Rendering needs neither torch nor transformers (fast, and usable where they are not installed).
    probe = ("import sys; from e2eprof.cli import main; code = main(['report', sys.argv[1]]); "
             "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, str(run_dir)], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stderr


@pytest.mark.parametrize("case", ["missing", "no-run-table", "bad-out"])
def test_cli_bad_directory_is_one_line_and_exit_2(tmp_path, case):
    synthetic_run(tmp_path / "ok")
    args = {"missing": ["report", str(tmp_path / "nope")], "no-run-table": ["report", str(tmp_path)],
            "bad-out": ["report", str(tmp_path / "ok"), "--out", str(tmp_path / "x.png")]}[case]
    done = e2eprof(args, tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e2eprof: error: "), done.stderr
    assert "Traceback" not in done.stderr


# ---- sweeps ------------------------------------------------------------------------------------------------------

SWEEP_POINTS = {"b1-s16-fp32": (1, 16), "b2-s16-fp32": (2, 16), "b2-s32-fp32": (2, 32)}
# Per point: baseline and patched medians (ms) and the verdict signed there; b2-s32 ran out of memory.
SWEEP_MEDIANS = {"b1-s16-fp32": (20.0, 16.0, "PASS", "FASTER"), "b2-s16-fp32": (41.0, 47.0, "FAIL", "SLOWER")}


def synthetic_sweep(run_dir: Path, *, with_memory: bool = True) -> None:
    """Three points of one workload: faster at one, slower at another, out of memory at the third (as compare
    records it: oom correctness rows, a summary row with n 0, no steps); memory and max-batch tables."""
    config = {"model": "gpt2-tiny", "patch": "fastsoftmax", "confidence": 0.95, "workloads": ["infer"],
              "batch": [1, 2], "seq": [16, 32], "precision": "fp32"}
    identity = {p: {"point": p, "batch": b, "seq": s, "precision": "fp32"} for p, (b, s) in SWEEP_POINTS.items()}
    write_table(run_dir, "run", [{
        "run_id": "sweep01", "schema_version": 1, "status": "complete", "command_line": "e2eprof compare --batch 1,2",
        "config_json": json.dumps(config), "environment_json": json.dumps({"device": "cpu"}), "patch_spec": "fastsoftmax",
        "started_unix_ns": 1_796_000_000_000_000_000, "verdict": "FAIL",
        "points_json": json.dumps(list(identity.values()))}])
    steps, summary, checks, memory = [], [], [], []
    for k, (point, (base, patched, verdict, reason)) in enumerate(SWEEP_MEDIANS.items()):
        for i, (arm, median) in enumerate((("baseline", base), ("patched", patched))):
            for step in range(6):
                start = 1_796_000_001_000_000_000 + (k * 100 + step * 10 + i) * 10_000_000
                wall = int((median + step % 2) * 1e6)
                steps.append({"workload": "infer", "arm": arm, "block": step // 2, "step": step, "phase": "warm",
                              "wall_ns": wall, "start_unix_ns": start, "end_unix_ns": start + wall, **identity[point]})
            ratio = base / median
            row = {"workload": "infer", "arm": arm, "n": 6, "median_ms": median + 0.5, "p10_ms": median, "p90_ms": median + 1,
                   "cold_ms": 90.0, "correct": True, "speedup_vs_baseline": ratio,
                   "ci_low": math.nan if arm == "baseline" else ratio - 0.05,
                   "ci_high": math.nan if arm == "baseline" else ratio + 0.05, **identity[point]}
            if arm == "patched":
                row |= {"verdict": verdict, "reasons": reason}
            summary.append(row)
            checks.append({"workload": "infer", "arm": arm, "tensor": "logits", "metric": "rel_error_vs_fp64",
                           "value": 1e-6, "tolerance": 1e-5, "passed": True, "detail": "", **identity[point]})
            for phase, extra in (("correctness", 3.0), ("timing", 0.0)):
                memory.append({"workload": "infer", "arm": arm, "phase": phase, "peak_alloc_mb": math.nan,
                               "peak_reserved_mb": math.nan, "host_rss_scope": "phase",
                               "host_peak_rss_mb": 500.0 + 10 * k + i + extra, **identity[point]})
    summary.append({"workload": "infer", "arm": "patched", "n": 0, "verdict": "INCONCLUSIVE", "reasons": "OUT_OF_MEMORY",
                    "advice": "baseline, patched ran out of memory at b2-s32-fp32", "correct": False,
                    **identity["b2-s32-fp32"]})
    for arm in ("baseline", "patched"):
        checks.append({"workload": "infer", "arm": arm, "tensor": "-", "metric": "oom", "value": math.nan,
                       "tolerance": math.nan, "passed": False, "detail": f"out of memory during cold: MemoryError ({arm})",
                       **identity["b2-s32-fp32"]})
    write_table(run_dir, "steps", steps)
    write_table(run_dir, "summary", summary)
    write_table(run_dir, "correctness", checks)
    if with_memory:
        write_table(run_dir, "memory", memory)
        write_table(run_dir, "maxbatch", [
            {"seq": 16, "precision": "fp32", "arm": "baseline", "max_batch": 6, "capped": False, "smallest_failed": 7,
             "probes": 5, "peak_alloc_mb_at_max": math.nan, "detail": "MemoryError"},
            {"seq": 16, "precision": "fp32", "arm": "patched", "max_batch": 12, "capped": False, "smallest_failed": 13,
             "probes": 6, "peak_alloc_mb_at_max": math.nan, "detail": "MemoryError"}])


def point_section(html: str, point: str) -> str:
    start = html.index(f'<section id="point-{point}"')
    return html[start:html.index("</section>\n", start)]


def test_sweep_report_grid_points_apart_memory_and_max_batch(tmp_path):
    run_dir = tmp_path / "sweep"
    synthetic_sweep(run_dir)
    html, md = render(run_dir)

    points = [f"Point {p}: batch {b}, seq {s}, fp32" for p, (b, s) in SWEEP_POINTS.items()]
    assert headings(html) == ["Verdict", "Peak memory", "Largest batch without running out of memory", *points,
                              "Latency, SM clock and GPU temperature over time", "Environment"]
    assert "Run verdict: FAIL &mdash; exit code 1" in html and "1 PASS, 1 INCONCLUSIVE, 1 FAIL" in html
    # The grid: one coloured cell per (point, workload) with the speedup and its interval, linked to the point.
    cells = re.findall(r'<th class="point"><a href="#point-([\w-]+)">[\w-]+</a></th><td class="cell cell-(\w+)"[^>]*><b>([\w ]+)</b>', html)
    assert cells == [("b1-s16-fp32", "PASS", "PASS"), ("b2-s16-fp32", "FAIL", "FAIL"), ("b2-s32-fp32", "OOM", "OUT OF MEMORY")]
    for point, (base, patched, verdict, reason) in SWEEP_MEDIANS.items():
        ratio = base / patched
        text = interval(ratio, ratio - 0.05, ratio + 0.05)
        assert text in html and f"| {point} | {verdict} {text} ({reason}) |" in md
        # Each point's numbers sit in its own section only: nothing pooled, nothing from a neighbour.
        own = point_section(html, point)
        assert f"{patched + 0.5:.4g}" in own and text in own
        others = [p for p in SWEEP_MEDIANS if p != point]
        assert all(f"{SWEEP_MEDIANS[o][1] + 0.5:.4g}" not in own for o in others)
        assert len(embedded_pngs(own)) == 1  # this point's latency distribution
    assert "| b2-s32-fp32 | OUT OF MEMORY (INCONCLUSIVE) |" in md
    oom = point_section(html, "b2-s32-fp32")
    assert "OUT OF MEMORY" in oom and "nothing timed" in oom and "out of memory during cold" in oom
    assert "significantly faster at b1-s16-fp32/infer and slower at b2-s16-fp32/infer" in html
    assert "OUT_OF_MEMORY</b>: the baseline or the arm under test ran out of memory" in html

    # Memory: the timed phase's host peak per arm against the baseline, the largest phase, the arms that ran out.
    assert "| b1-s16-fp32 | infer | patched | 501.0 | +0.2% | correctness: 504.0 |" in md
    assert "| b2-s16-fp32 | infer | baseline | 510.0 | - | correctness: 513.0 |" in md
    assert "| b2-s32-fp32 | infer | baseline | out of memory | - | out of memory during cold: MemoryError (baseline) |" in md
    assert "Device memory: not measured (no CUDA device)" in html
    assert "| 16 | fp32 | patched | 12 | 13 | 6 | - | MemoryError |" in md
    assert "seq 16, fp32: patched fits batch 12, baseline 6 (2.00x)" in html
    assert f"Op diff and Predicted (Amdahl) vs measured: {NOT_RECORDED}" in html
    assert "sweep of 3 points: batch 1, 2 x seq 16, 32 x dtype fp32" in html
    # the sweep plot, one latency distribution per point that ran, the timeline
    assert len(embedded_pngs(html)) == 1 + 2 + 1
    assert_self_contained(html)


def test_sweep_without_memory_tables_says_not_recorded(tmp_path):
    run_dir = tmp_path / "sweep"
    synthetic_sweep(run_dir, with_memory=False)
    html, _ = render(run_dir)
    assert "Largest batch" not in html
    # the summary carries no memory columns either, but the out-of-memory arms are still named
    assert "out of memory during cold: MemoryError (patched)" in point_section(html, "b2-s32-fp32")
    table = re.search(r'<section id="memory">.*?</section>', html).group(0)
    assert "host peak RSS" not in table and "vs baseline" not in table and "out of memory during cold" in table
    assert f"Peaks: {NOT_RECORDED}; only the arms that ran out of memory are known." in table


def test_one_point_run_with_point_columns_renders_as_before_plus_memory(tmp_path):
    run_dir = tmp_path / "one"
    synthetic_run(run_dir)
    for name in ("steps", "summary", "correctness"):
        frame = pd.read_parquet(run_dir / f"{name}.parquet")
        write_table(run_dir, name, frame.assign(point="b1-s64-fp32", batch=1, seq=64, precision="fp32"))
    html, md = render(run_dir)
    assert headings(html) == [*SECTIONS[:2], "Peak memory", *SECTIONS[2:]]
    assert f"Peak memory: {NOT_RECORDED}." in html and f"Peak memory: {NOT_RECORDED}." in md
    assert verdict_cards(html) == {"train": "PASS", "infer": "FAIL"}
    assert 'class="grid"' not in html and "Point b1" not in html
