"""`e2eprof report`: an HTML page and a markdown summary rendered from a run directory's Parquet tables alone.

Nothing is re-run and neither torch nor transformers is imported; a missing optional table becomes a
"not recorded in this run" note in its section.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from e2eprof.errors import UsageError
from e2eprof.render.tables import load_run


@dataclass(frozen=True)
class RenderedReport:
    html: Path
    markdown: Path


def render_report(run_dir: Path, html_path: Path | None = None) -> RenderedReport:
    """Write RUN_DIR/report.html and RUN_DIR/report.md (or html_path and the same name with .md)."""
    run_dir = Path(run_dir)
    html_path = Path(html_path) if html_path is not None else run_dir / "report.html"
    if html_path.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out must name an .html file, got {html_path}")
    if html_path.is_dir():
        raise UsageError(f"--out {html_path} is a directory; name an .html file")
    run = load_run(run_dir)
    # matplotlib (imported by html) is only needed once the run directory has proved readable.
    from e2eprof.render.html import render_html
    from e2eprof.render.markdown import render_markdown

    md_path = html_path.with_suffix(".md")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    _write(html_path, render_html(run))
    _write(md_path, render_markdown(run, html_path.name))
    return RenderedReport(html_path, md_path)


def _write(path: Path, text: str) -> None:
    """Write then rename, so a reader never sees half a report (as reports.write_table does for tables)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
