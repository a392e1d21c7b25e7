"""The run's verdicts as markdown for a CI job page (GitHub's step summary) or a file (--summary-md)."""

from __future__ import annotations

from pathlib import Path

_MARK = {"PASS": "✅", "FAIL": "❌", "INCONCLUSIVE": "⚠️"}


def _cell(value, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(document: dict) -> str:
    """A heading with the run's verdict, one table row per verdict, and where the run's files are."""
    run, policy = document["run"], document["policy"]
    lines = [f"### e2eprof: {_MARK.get(document['verdict'], '')} {document['verdict']} — {run['patch']} on {run['model']}",
             "",
             f"Run `{run['run_id']}` on {run['device']}; PASS needs the {policy['confidence']:.0%} interval's lower "
             f"bound above {1 + policy['min_speedup']:g}x (correction: {policy['correction']}).",
             "",
             "| test | verdict | speedup | interval | reasons | advice |",
             "|---|---|---|---|---|---|"]
    for entry in document["verdicts"]:
        interval = (f"[{_cell(entry['ci_low'])}, {_cell(entry['ci_high'])}]"
                    if entry["ci_low"] is not None else "—")
        advice = " ".join(entry["advice"].split()).replace("|", "\\|")
        lines.append(f"| {entry['key']} | {_MARK.get(entry['verdict'], '')} {entry['verdict']} | "
                     f"{_cell(entry['speedup'])}x | {interval} | {', '.join(entry['reasons'])} | {advice} |")
    ranking = document.get("candidates")
    if ranking:
        best = f"**{ranking['best']}**, {ranking['lead']}" if ranking.get("best") else "none passes"
        lines += ["", f"Candidates ranked by speedup: {', '.join(ranking['ranking']) or 'none passed its gate'}; "
                      f"best that passes: {best}."]
    run_dir = Path(run["run_dir"])
    links = [f"[verdict.json]({run_dir / 'verdict.json'})", f"[summary.parquet]({run_dir / 'summary.parquet'})"]
    if (run_dir / "report.html").is_file():
        links.insert(0, f"[report]({run_dir / 'report.html'})")
    lines += ["", "Files: " + ", ".join(links) + f"; `e2eprof report {run_dir}` renders the full report.", ""]
    return "\n".join(lines)
