"""The report's text parts as markdown, short enough to paste into a pull request or a reports/*/summary.md."""

from __future__ import annotations

from e2eprof.render import tables as t


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(table: t.Table) -> str:
    align = ["---:" if i in table.numeric else "---" for i in range(len(table.columns))]
    lines = ["| " + " | ".join(_cell(c) for c in table.columns) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _status(run: t.RunTables) -> list[str]:
    status = str(run.run.get("status") or "")
    if status == "complete":
        return []
    failure = run.run.get("failure")
    return [f"> This run is marked **{status}**" + ("" if t.missing(failure) else f": {_cell(failure)}")
            + "; its tables may be partial.", ""]


def _glossary(verdicts: list[t.WorkloadVerdict]) -> list[str]:
    seen = list(dict.fromkeys(r for w in verdicts for r in w.reasons))
    return [f"- `{r}`: {t.REASON_MEANING[r]}" for r in seen if r in t.REASON_MEANING]


def _verdict(run: t.RunTables) -> list[str]:
    out = ["## Verdict", "", *_status(run)]
    verdicts = t.workload_verdicts(run)
    if not verdicts:
        return out + [f"Verdicts: {t.NOT_RECORDED}.", ""]
    worst, code = t.overall_verdict(run, verdicts)
    ranking = t.candidates(run)
    how = ("FAIL if any candidate is broken, else the best candidate's" if ranking else
           f"worst over {len(verdicts)} workload(s)")
    out += [f"**Run verdict: {worst}** (exit code {code}; {how})", ""]
    ci = t.confidence_label(run)
    rows = [[w.workload, f"**{w.verdict}**", ", ".join(w.reasons), w.speedup, w.advice] for w in verdicts]
    show_advice = any(w.advice for w in verdicts)
    tested = "candidate" if ranking else " / ".join(dict.fromkeys(w.arm for w in verdicts))
    if ranking:  # one row per candidate: say which
        rows = [[r[0] + f" ({w.arm})", *r[1:]] for r, w in zip(rows, verdicts)]
    columns = ["workload", "verdict", "reasons", f"{tested} vs baseline [{ci}]", *(["advice"] if show_advice else [])]
    out += [_table(t.Table(columns, [r if show_advice else r[:-1] for r in rows], numeric={3})), ""]
    return out + _glossary(verdicts) + [""] + _ranking(run, ranking)


def _ranking(run: t.RunTables, ranking: dict | None) -> list[str]:
    """Several candidates: their ranking, the best one that passes, and the pairwise intervals."""
    if not ranking:
        return []
    out = ["## Candidates", "", "Ranked by speedup over the baseline (geometric mean over workloads), among those whose "
           "gate passed: " + ("; ".join(f"{i + 1}. {n} {ranking['gmean'][n]:.3f}x" for i, n in enumerate(ranking["ranking"]))
                              or "none"), ""]
    out += [f"**Best: {ranking['best']}** ({ranking['lead']})" if ranking["best"] else "**Best: none passes**", ""]
    pairs = run.get("pairwise")
    if pairs is not None and len(pairs):
        ci = t.confidence_label(run)
        body = [[r.workload, f"{r.candidate_a} vs {r.candidate_b}", t.fmt_ratio(r.speedup, r.ci_low, r.ci_high),
                 f"{r.mw_p_adjusted:.3g}", "neither (not significant)" if t.missing(r.faster) else r.faster]
                for r in pairs.itertuples()]
        out += [_table(t.Table(["workload", "pair", f"a's speedup over b [{ci}]", "p (adjusted)", "faster"], body,
                               numeric={2, 3})), ""]
    return out


def _sweep_verdict(run: t.RunTables) -> list[str]:
    """The grid: one cell per (point, workload) with verdict and speedup [CI]."""
    out = ["## Verdict", "", *_status(run)]
    verdicts = t.workload_verdicts(run)
    if not verdicts:
        return out + [f"Verdicts: {t.NOT_RECORDED}.", ""]
    worst, code = t.overall_verdict(run, verdicts)
    out += [(f"**Run verdict: {worst}** (exit code {code}; worst over {len(verdicts)} point/workload verdicts; "
             f"{t.sweep_line(run)})"), ""]
    rows, workloads, cells = t.verdict_grid(run)
    ci = t.confidence_label(run)
    tested = " / ".join(dict.fromkeys(w.arm for w in verdicts))
    body = [[point, *[t.grid_cell_text(cells.get((point, w))) for w in workloads]] for point in rows]
    out += [f"{tested} vs baseline, speedup [{ci}] per point and workload:", "",
            _table(t.Table(["point", *workloads], body)), ""]
    mixed = t.mixed_direction(verdicts)
    if mixed:
        out += [f"> {mixed}", ""]
    return out + _glossary(verdicts) + [""]


def _memory(run: t.RunTables) -> list[str]:
    out = ["## Peak memory", ""]
    table = t.memory_table(run)
    if table is None:
        return out + [f"Peak memory: {t.NOT_RECORDED}.", ""]
    return out + [f"_{n}_" for n in t.memory_notes(run)] + ["", _table(table), ""]


def _maxbatch(run: t.RunTables) -> list[str]:
    table = t.maxbatch_table(run)
    if table is None:
        return []
    return (["## Largest batch without running out of memory", "", _table(table), ""]
            + [f"- {line}" for line in t.maxbatch_lines(run)] + [""])


def _point(run: t.RunTables, point: str) -> list[str]:
    """One sweep point's speedups and failed checks, under its own heading."""
    here = run.at(point)
    out = [f"## Point {t.point_label(run, point)}", ""]
    for w in t.workload_verdicts(here):
        out.append(f"- {w.workload}: {t.grid_cell_text(w)}" + (f" — {_cell(w.advice)}" if w.advice else ""))
    out.append("")
    summary = here.get("summary")
    for workload in t.workloads(here):
        rows = summary[summary["workload"] == workload] if summary is not None else None
        if rows is not None and "n" in rows and (rows["n"].fillna(0) > 0).any():  # not where memory ran out
            out += [f"**{workload}**", "", _table(t.speedup_table(here, workload)), ""]
    table = t.amdahl_table(here)
    if table is not None:
        out += ["Predicted (Amdahl) vs measured:", "", _table(table), ""]
    failures, n_failed = t.correctness_failures(here, limit=10)
    if failures is not None and n_failed:
        out += [f"Failed checks ({n_failed}):", "", _table(failures), ""]
    return out


def _speedups(run: t.RunTables) -> list[str]:
    out = ["## Speedup (host wall time per warm step)", ""]
    summary = run.get("summary")
    if summary is None:
        return out + [f"Summary: {t.NOT_RECORDED}.", ""]
    for workload in t.workloads(run):
        if (summary["workload"] == workload).any():
            out += [f"**{workload}**", "", _table(t.speedup_table(run, workload)), ""]
    return out


def _amdahl(run: t.RunTables) -> list[str]:
    out = ["## Predicted (Amdahl) vs measured", ""]
    table = t.amdahl_table(run)
    if table is None:
        return out + [f"Explanation: {t.NOT_RECORDED}.", ""]
    out += [_table(table), ""]
    out += [f"- {workload}: {_cell(detail)}" for workload, detail in t.amdahl_details(run)]
    return out + [""]


def _correctness(run: t.RunTables) -> list[str]:
    out = ["## Correctness", ""]
    failures, n_failed = t.correctness_failures(run, limit=20)
    if failures is None:
        return out + [f"Correctness checks: {t.NOT_RECORDED}.", ""]
    if n_failed:
        out += [f"Failed checks ({n_failed}):", "", _table(failures), ""]
        if len(failures.rows) < n_failed:
            out += [f"({n_failed - len(failures.rows)} more in correctness.parquet)", ""]
    else:
        out += ["No failed checks.", ""]
    notes = t.measurement_notes(run.get("correctness"))
    if notes:
        out += ["Notes on what the figures rest on:", "", *[f"- {workload}: {note}" for workload, note in notes], ""]
    return out + ["Checks passed per workload and arm:", "", _table(t.correctness_counts(run)), ""]


def _environment(run: t.RunTables) -> list[str]:
    out = ["## Environment", ""]
    out += [f"- {key}: `{_cell(value)}`" for key, value in t.run_facts(run)]
    for heading, mapping in (("machine and versions", run.environment()), ("configuration", run.config())):
        items = t.flatten(mapping)
        text = "; ".join(f"{k}={_cell(val)}" for k, val in items) if items else t.NOT_RECORDED
        out.append(f"- {heading}: `{text}`" if items else f"- {heading}: {text}")
    return out + [""]


def render_markdown(run: t.RunTables, html_name: str = "report.html") -> str:
    """Verdicts, speedups, predicted vs measured, correctness and environment as one markdown document."""
    lines = [f"# e2eprof report: {t.title(run)}", "",
             f"Run `{run.run.get('run_id')}`, {run.run.get('status')}, started {t.fmt_time(run.run.get('started_unix_ns'))}, "
             f"{t.device_line(run)}. Figures: `{html_name}`.", ""]
    if t.is_sweep(run):
        parts = [_sweep_verdict, _memory, _maxbatch, *[lambda r, p=p: _point(r, p) for p in t.points(run)], _environment]
    else:  # a run from before sweeps has no memory records: its summary stays as it was
        parts = [_verdict, _speedups, *([_memory] if t.has_points(run) else []), _maxbatch, _amdahl, _correctness,
                 _environment]
    for part in parts:
        lines += part(run)
    return "\n".join(lines).rstrip() + "\n"
