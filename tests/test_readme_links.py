"""Every report README cites exists, and reports/ stays a small set of curated runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "reports/README.md")
MAX_REPORTS_BYTES = 5_000_000


def cited_paths(text: str) -> set[str]:
    """`reports/...` paths, and the results table's short names ("2026-12-03 `-gpt2-fastgelu-references`")."""
    paths = {m.rstrip(".,:;)") for m in re.findall(r"reports/[A-Za-z0-9_./-]*", text)}
    paths |= {f"reports/{date}-h200{name}/" for date, name in re.findall(r"(\d{4}-\d\d-\d\d) `(-[a-z0-9-]+)`", text)}
    # "reports/<date>-h200-..." is a pattern, not a path
    return {p for p in paths if p not in ("reports/", "reports") and not p.endswith("-")}


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_report_exists(doc):
    cited = cited_paths((ROOT / doc).read_text())
    assert cited, f"{doc} cites no report"
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"{doc} cites reports that do not exist: {missing}"


def test_cited_run_folders_keep_their_summary():
    cited = cited_paths((ROOT / "README.md").read_text())
    runs = {p.rstrip("/") for p in cited if (ROOT / p).is_dir() and (ROOT / p / "run.parquet").exists()}
    assert runs
    # a run inside a measurement's folder (2026-12-04-h200-gate-cost/default-run) is described by that folder's summary
    bare = sorted(p for p in runs if not (ROOT / p / "summary.md").is_file() and not (ROOT / p).parent.joinpath("summary.md").is_file())
    assert not bare, f"cited runs without a summary.md: {bare}"


def test_reports_stay_small():
    size = sum(p.stat().st_size for p in (ROOT / "reports").rglob("*") if p.is_file())
    assert size < MAX_REPORTS_BYTES, f"reports/ holds {size / 1e6:.1f} MB; keep curated runs only (under 5 MB)"


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_script_and_test_exists(doc):
    """The commands README gives name scripts that are there (benchmarks/gpu_suite.sh, not a removed one)."""
    text = (ROOT / doc).read_text()
    cited = {m.rstrip(".,:;)") for m in re.findall(r"(?:benchmarks|examples|tests)/[A-Za-z0-9_./-]*", text)}
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"{doc} names files that do not exist: {missing}"
