"""One self-contained HTML page: inline CSS, figures as data: URIs, no scripts and no external resources."""

from __future__ import annotations

from html import escape

from e2eprof.render import plots
from e2eprof.render import tables as t

CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; color: #1f2328; margin: 0; }
main { max-width: 1320px; margin: 0 auto; padding: 20px 28px 40px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 34px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub, .note { color: #59636e; }
.note { font-style: italic; }
.overall { font-size: 20px; font-weight: 600; padding: 12px 16px; border-radius: 6px; color: #fff; margin: 14px 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 2px solid; border-radius: 6px; padding: 10px 14px; min-width: 250px; flex: 1 1 250px; }
.card .wl { font-weight: 600; font-size: 15px; }
.card .verdict { font-size: 22px; font-weight: 700; }
.code { font: 12px ui-monospace, Menlo, Consolas, monospace; background: #eef1f4; border-radius: 4px; padding: 1px 6px;
        margin-right: 4px; display: inline-block; }
.advice { color: #59636e; margin-top: 4px; }
.bg-PASS { background: #1a7f37; } .bg-FAIL { background: #cf222e; } .bg-INCONCLUSIVE { background: #bf8700; }
.bg-NONE { background: #6e7781; }
.fg-PASS { color: #1a7f37; border-color: #1a7f37; } .fg-FAIL { color: #cf222e; border-color: #cf222e; }
.fg-INCONCLUSIVE { color: #9a6700; border-color: #bf8700; }
.warning { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 8px 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.fail td { background: #ffebe9; }
table.kv td:first-child { font-weight: 600; white-space: nowrap; }
table.kv td { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
img { max-width: 100%; height: auto; display: block; margin: 8px 0; }
ul.glossary { margin: 8px 0; padding-left: 20px; color: #59636e; }
.columns { display: flex; flex-wrap: wrap; gap: 0 32px; align-items: flex-start; }
.columns > div { flex: 1 1 420px; min-width: 0; }
.columns table { width: 100%; }
footer { color: #59636e; font-size: 12px; margin-top: 40px; }
"""
# Only pages of runs that know sweep points use these, so a run from before sweeps renders byte for byte as it did.
SWEEP_CSS = """
h4 { font-size: 14px; margin: 12px 0 4px; }
section.point { border-top: 3px solid #d0d7de; margin-top: 30px; }
table.grid td.cell { min-width: 190px; text-align: center; vertical-align: middle; padding: 6px 10px; }
table.grid th.point { white-space: nowrap; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
table.grid .ratio { font-variant-numeric: tabular-nums; white-space: nowrap; }
table.grid .small { font-size: 11px; color: #59636e; }
.cell-PASS { background: #dafbe1; } .cell-FAIL { background: #ffebe9; } .cell-INCONCLUSIVE { background: #fff8c5; }
.cell-OOM { background: #d0d7de; }
.tag { color: #fff; border-radius: 4px; padding: 1px 7px; font-size: 12px; font-weight: 600; }
p.pverdict { margin: 6px 0; }
"""


def _table(table: t.Table, css_class: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    body = []
    for i, row in enumerate(table.rows):
        row_class = table.row_classes[i] if i < len(table.row_classes) else ""
        cells = "".join(f'<td class="num">{escape(c)}</td>' if j in table.numeric else f"<td>{escape(c)}</td>"
                        for j, c in enumerate(row))
        body.append(f'<tr class="{row_class}">{cells}</tr>' if row_class else f"<tr>{cells}</tr>")
    cls = f' class="{css_class}"' if css_class else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv(items: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><td>{escape(key)}</td><td>{escape(value)}</td></tr>" for key, value in items)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def _note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _figure(fig, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="{plots.to_data_uri(fig)}">'


def _h(level: int, text: str) -> str:
    return f"<h{level}>{escape(text)}</h{level}>"


def _verdict_section(run: t.RunTables) -> str:
    verdicts = t.workload_verdicts(run)
    parts = ['<section id="verdict"><h2>Verdict</h2>', _status_warning(run)]
    if not verdicts:
        why = ("this run searched the largest batch (--find-max-batch) and timed nothing"
               if run.run.get("mode") == "find-max-batch" else "no summary.parquet with a signed verdict")
        parts.append(_note(f"Verdicts: {t.NOT_RECORDED} ({why})."))
        return "".join(parts) + "</section>"
    worst, code = t.overall_verdict(run, verdicts)
    listing = ", ".join(f"{w.workload} {w.verdict}" for w in verdicts)
    parts.append(f'<div class="overall bg-{escape(worst)}">Run verdict: {escape(worst)} &mdash; exit code {code} '
                 f'<span style="font-weight:400">(worst of {escape(listing)})</span></div>')
    parts.append(_cards(run, verdicts))
    return "".join(parts) + _glossary(verdicts) + "</section>"


def _status_warning(run: t.RunTables) -> str:
    status = str(run.run.get("status") or "")
    if status == "complete":
        return ""
    failure = run.run.get("failure")
    return (f'<p class="warning">This run is marked <b>{escape(status)}</b>'
            + ("" if t.missing(failure) else f": {escape(str(failure))}") + "; its tables may be partial.</p>")


def _cards(run: t.RunTables, verdicts: list[t.WorkloadVerdict]) -> str:
    ci = t.confidence_label(run)
    parts = ['<div class="cards">']
    for w in verdicts:
        codes = "".join(f'<span class="code">{escape(r)}</span>' for r in w.reasons)
        advice = f'<div class="advice">{escape(w.advice)}</div>' if w.advice else ""
        parts.append(f'<div class="card fg-{escape(w.verdict)}"><div class="wl">{escape(w.workload)}</div>'
                     f'<div class="verdict">{escape(w.verdict)}</div><div>{codes}</div>'
                     f'<div class="advice">{escape(w.arm)} vs baseline: {escape(w.speedup)} ({escape(ci)})</div>{advice}</div>')
    return "".join(parts) + "</div>"


def _glossary(verdicts: list[t.WorkloadVerdict]) -> str:
    seen = list(dict.fromkeys(r for w in verdicts for r in w.reasons))
    glossary = "".join(f"<li><b>{escape(r)}</b>: {escape(t.REASON_MEANING[r])}</li>" for r in seen if r in t.REASON_MEANING)
    return f'<ul class="glossary">{glossary}</ul>' if glossary else ""


def _anchor(point: str) -> str:
    return "point-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in point)


def _sweep_verdict_section(run: t.RunTables) -> str:
    """The whole sweep at a glance: one coloured cell per (point, workload) with its speedup [CI]."""
    verdicts = t.workload_verdicts(run)
    parts = ['<section id="verdict"><h2>Verdict</h2>', _status_warning(run)]
    if not verdicts:
        parts.append(_note(f"Verdicts: {t.NOT_RECORDED} (no summary.parquet with a signed verdict)."))
        return "".join(parts) + "</section>"
    worst, code = t.overall_verdict(run, verdicts)
    counts = ", ".join(f"{sum(w.verdict == v for w in verdicts)} {v}" for v in ("PASS", "INCONCLUSIVE", "FAIL")
                       if any(w.verdict == v for w in verdicts))
    parts.append(f'<div class="overall bg-{escape(worst)}">Run verdict: {escape(worst)} &mdash; exit code {code} '
                 f'<span style="font-weight:400">(worst of {len(verdicts)} point/workload verdicts: {escape(counts)})'
                 f"</span></div>")
    rows, workloads, cells = t.verdict_grid(run)
    ci = t.confidence_label(run)
    tested = " / ".join(dict.fromkeys(w.arm for w in verdicts))
    head = "".join(f"<th>{escape(w)}</th>" for w in workloads)
    body = []
    for point in rows:
        tds = []
        for workload in workloads:
            w = cells.get((point, workload))
            if w is None:
                tds.append('<td class="cell">-</td>')
            elif w.out_of_memory:
                tds.append(f'<td class="cell cell-OOM" title="{escape(w.advice)}"><b>OUT OF MEMORY</b>'
                           f'<div class="small">{escape(w.verdict)}</div></td>')
            else:
                reasons = ", ".join(r for r in w.reasons)
                tds.append(f'<td class="cell cell-{escape(w.verdict)}"><b>{escape(w.verdict)}</b>'
                           f'<div class="ratio">{escape(w.speedup)}</div><div class="small">{escape(reasons)}</div></td>')
        body.append(f'<tr><th class="point"><a href="#{_anchor(point)}">{escape(point)}</a></th>{"".join(tds)}</tr>')
    parts.append(_note(f"{tested} vs baseline per point (rows) and workload (columns): verdict, speedup [{ci}], "
                       "reasons. p-values are adjusted over every cell of the sweep together."))
    parts.append(f'<table class="grid"><thead><tr><th>point</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    mixed = t.mixed_direction(verdicts)
    if mixed:
        parts.append(f'<p class="warning">{escape(mixed)}</p>')
    fig = plots.sweep_speedups(t.sweep_speedups(run), rows, workloads)
    if fig is not None:
        parts.append(_figure(fig, "speedup with its interval at every point of the sweep"))
    return "".join(parts) + _glossary(verdicts) + "</section>"


def _speedup_section(run: t.RunTables, level: int = 2, anchor: str = "") -> str:
    parts = [f'<section id="{anchor}speedup">', _h(level, "Speedup")]
    if run.get("summary") is None:
        return "".join(parts) + _note(f"Summary: {t.NOT_RECORDED}.") + "</section>"
    parts.append(_note("Host wall time per warm step. A ratio above 1 means the row's arm is faster than the "
                       "column's; 'vs <arm>' columns compare the arm under test with each stock reference arm."))
    for workload in t.workloads(run):
        rows = run.get("summary")
        if (rows["workload"] == workload).any():
            parts.append(_h(level + 1, workload) + _table(t.speedup_table(run, workload)))
    return "".join(parts) + "</section>"


def _latency_section(run: t.RunTables, arm_order: list[str], workloads: list[str], level: int = 2, anchor: str = "") -> str:
    parts = [f'<section id="{anchor}latency">', _h(level, "Step latency distributions")]
    fig = plots.latency_distributions(run.get("steps"), arm_order, workloads)
    if fig is None:
        return "".join(parts) + _note(f"Timed steps: {t.NOT_RECORDED}.") + "</section>"
    parts.append(_note("Every timed warm step (dots) over the box of its quartiles; whiskers reach 1.5 IQR."))
    return "".join(parts) + _figure(fig, "step latency per arm and workload") + "</section>"


def _timeline_section(run: t.RunTables, arm_order: list[str]) -> str:
    parts = ['<section id="timeline"><h2>Latency, SM clock and GPU temperature over time</h2>']
    fig, clocks = plots.timeline(run.get("steps"), run.get("telemetry"), arm_order, run.run.get("started_unix_ns"))
    if fig is None:
        return "".join(parts) + _note(f"Steps: {t.NOT_RECORDED}.") + "</section>"
    band = "point and workload" if t.is_sweep(run) else "workload"
    parts.append(_note(f"Each {band}'s steps lie in a grey band; the gaps between timed steps are the correctness "
                       "gate, warm-up checks and the profiling phase."))
    parts.append(_figure(fig, "step latency, SM clock and GPU temperature over the run"))
    if not clocks:
        parts.append(_note(f"SM clock and GPU temperature: {t.telemetry_note(run)}."))
    balance = t.balance_table(run)
    parts.append("<h3>Arm balance (what the verdict checked)</h3>"
                 + (_table(balance) if balance is not None else _note(f"Arm balance: {t.NOT_RECORDED}.")))
    return "".join(parts) + "</section>"


def _opdiff_section(run: t.RunTables, workloads: list[str], level: int = 2, anchor: str = "") -> str:
    parts = [f'<section id="{anchor}opdiff">', _h(level, "Where the time went: op diff")]
    fig = plots.op_diff_bars(run.get("opdiff"), workloads)
    if fig is None:
        return "".join(parts) + _note(f"Op diff: {t.NOT_RECORDED} (profiling phase off or not reached).") + "</section>"
    parts.append(_note("Largest per-op changes from the profiling phase, per (module, op, direction), patched minus "
                       "baseline: negative bars are time the patch saved."))
    return "".join(parts) + _figure(fig, "top per-op time changes, patched minus baseline") + "</section>"


def _amdahl_section(run: t.RunTables, level: int = 2, anchor: str = "") -> str:
    parts = [f'<section id="{anchor}amdahl">', _h(level, "Predicted (Amdahl) vs measured")]
    table = t.amdahl_table(run)
    if table is None:
        return "".join(parts) + _note(f"Explanation: {t.NOT_RECORDED}.") + "</section>"
    parts.append(_note("f: baseline share of step time in the replaced region; s: its speedup in the profile; "
                       "predicted = 1/(1-f+f/s); no s can beat the bound 1/(1-f)."))
    parts.append(_table(table))
    details = "".join(f"<li><b>{escape(w)}</b>: {escape(d)}</li>" for w, d in t.amdahl_details(run))
    if details:
        parts.append(f"<ul>{details}</ul>")
    fig = plots.amdahl_plot(run.get("explain"), run.get("summary"))
    return "".join(parts) + (_figure(fig, "predicted vs measured speedup") if fig is not None else "") + "</section>"


def _correctness_section(run: t.RunTables, level: int = 2, anchor: str = "") -> str:
    parts = [f'<section id="{anchor}correctness">', _h(level, "Correctness")]
    failures, n_failed = t.correctness_failures(run)
    if failures is None:
        return "".join(parts) + _note(f"Correctness checks: {t.NOT_RECORDED}.") + "</section>"
    if n_failed:
        shown = len(failures.rows)
        parts.append(_h(level + 1, f"Failed checks ({n_failed})") + _table(failures))
        if shown < n_failed:
            parts.append(_note(f"{n_failed - shown} more failed checks in correctness.parquet."))
    else:
        parts.append("<p>No failed checks.</p>")
    notes = t.measurement_notes(run.get("correctness"))
    if notes:
        parts.append(_h(level + 1, "Notes on what the figures rest on") + "<ul>" + "".join(
            f"<li>{escape(workload)}: {escape(note)}</li>" for workload, note in notes) + "</ul>")
    parts.append(_h(level + 1, "Checks passed per workload and arm") + _table(t.correctness_counts(run)))
    return "".join(parts) + "</section>"


def _memory_section(run: t.RunTables) -> str:
    parts = ['<section id="memory"><h2>Peak memory</h2>']
    table = t.memory_table(run)
    if table is None:
        return "".join(parts) + _note(f"Peak memory: {t.NOT_RECORDED}.") + "</section>"
    parts.append(_note("Peaks over the timed steps of each arm (its own process), reset at the start of the phase; "
                       "'largest phase' is the highest peak of any phase (cold step, correctness, warm-up, timing, "
                       "profile) from memory.parquet."))
    parts += [_note(n) for n in t.memory_notes(run)]
    return "".join(parts) + _table(table) + "</section>"


def _maxbatch_section(run: t.RunTables) -> str:
    table = t.maxbatch_table(run)
    if table is None:
        return ""
    parts = ['<section id="maxbatch"><h2>Largest batch without running out of memory</h2>',
             _note("--find-max-batch: each arm alone in its own process, one train and one infer step per probe, "
                   "doubling then bisecting up to the cap."), _table(table)]
    lines = "".join(f"<li>{escape(line)}</li>" for line in t.maxbatch_lines(run))
    return "".join(parts) + (f"<ul>{lines}</ul>" if lines else "") + "</section>"


def _point_section(run: t.RunTables, point: str, arm_order: list[str]) -> str:
    """Everything measured at one sweep point, so no number pools two shapes."""
    here = run.at(point)
    anchor = _anchor(point)
    parts = [f'<section id="{anchor}" class="point">', _h(2, f"Point {t.point_label(run, point)}")]
    verdicts = t.workload_verdicts(here)
    for w in verdicts:
        label = "OUT OF MEMORY" if w.out_of_memory else w.verdict
        measured = "nothing timed" if w.out_of_memory else f"{w.arm} vs baseline {w.speedup}"
        parts.append(f'<p class="pverdict"><span class="tag bg-{escape(w.verdict)}">{escape(label)}</span> '
                     f"<b>{escape(w.workload)}</b>: {escape(measured)}"
                     + (f" &middot; {escape(', '.join(w.reasons))}" if w.reasons else "")
                     + (f'<span class="advice"> &mdash; {escape(w.advice)}</span>' if w.advice else "") + "</p>")
    if here.get("steps") is None and verdicts and all(w.out_of_memory for w in verdicts):
        return "".join(parts) + _correctness_section(here, 3, anchor + "-") + "</section>"
    workloads = t.workloads(here)
    parts += [_speedup_section(here, 3, anchor + "-"), _latency_section(here, arm_order, workloads, 3, anchor + "-")]
    # Without a profiling phase the run-level note says so once, instead of once per point.
    if run.get("opdiff") is not None:
        parts.append(_opdiff_section(here, workloads, 3, anchor + "-"))
    if run.get("explain") is not None:
        parts.append(_amdahl_section(here, 3, anchor + "-"))
    return "".join(parts) + _correctness_section(here, 3, anchor + "-") + "</section>"


def _unprofiled_note(run: t.RunTables) -> str:
    missing = [name for table, name in (("opdiff", "Op diff"), ("explain", "Predicted (Amdahl) vs measured"))
               if run.get(table) is None]
    return _note(f"{' and '.join(missing)}: {t.NOT_RECORDED} (profiling phase off or not reached).") if missing else ""


def _environment_section(run: t.RunTables) -> str:
    parts = ['<section id="environment"><h2>Environment</h2>', "<h3>Run</h3>", _kv(t.run_facts(run)), '<div class="columns">']
    for heading, mapping in (("Machine and versions", run.environment()), ("Configuration", run.config())):
        items = t.flatten(mapping)
        parts.append(f"<div><h3>{heading}</h3>" + (_kv(items) if items else _note(f"{heading}: {t.NOT_RECORDED}.")) + "</div>")
    return "".join(parts) + "</div></section>"


def render_html(run: t.RunTables) -> str:
    """The whole page as a string."""
    arm_order, workloads = t.arms(run), t.workloads(run)
    heading = f"e2eprof report: {t.title(run)}"
    sweep = t.sweep_line(run)
    sub = (f"run {escape(str(run.run.get('run_id')))} &middot; {escape(str(run.run.get('status')))} &middot; started "
           f"{escape(t.fmt_time(run.run.get('started_unix_ns')))} &middot; {escape(t.device_line(run))}"
           + (f" &middot; {escape(sweep)}" if sweep else ""))
    if t.is_sweep(run):
        body = [_sweep_verdict_section(run), _memory_section(run), _maxbatch_section(run), _unprofiled_note(run),
                *[_point_section(run, point, arm_order) for point in t.points(run)],
                _timeline_section(run, arm_order), _environment_section(run)]
    else:
        # A run from before sweeps has no memory records: its page stays as it was.
        memory = [_memory_section(run)] if t.has_points(run) else []
        body = [_verdict_section(run), _speedup_section(run), *memory, _maxbatch_section(run),
                _latency_section(run, arm_order, workloads), _timeline_section(run, arm_order),
                _opdiff_section(run, workloads), _amdahl_section(run), _correctness_section(run),
                _environment_section(run)]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title>'
            f"<style>{CSS}{SWEEP_CSS if t.has_points(run) else ''}</style></head><body><main><h1>{escape(heading)}</h1><p class=\"sub\">{sub}</p>"
            + "\n".join(part for part in body if part)
            + f"<footer>Rendered by <code>e2eprof report</code> from the Parquet tables in "
              f"{escape(run.run_dir.resolve().name)}/.</footer></main></body></html>\n")
