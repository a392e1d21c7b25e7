"""The console, report.md and report.html say when a workload's measurement changed shape without failing a check:
replicas dropped out of memory, the fp64 reference moved to the host. Read from real H100 runs' tables (tests/data)."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from rich.console import Console

from e2eprof.console import print_summary

RUNS = Path(__file__).resolve().parents[1] / "data" / "h100-runs"


def printed(run_dir: Path) -> str:
    summary = pd.read_parquet(run_dir / "summary.parquet")
    verdicts = {w: SimpleNamespace(verdict="INCONCLUSIVE", reasons=["NO_SIGNIFICANT_DIFFERENCE"], advice="")
                for w in summary.workload.unique()}
    console = Console(record=True, width=200)
    print_summary(console, summary, verdicts, run_dir)
    return console.export_text()


def section(text: str, workload: str) -> str:
    """The lines printed under one workload's table, up to the next table's title."""
    lines = [line.rstrip() for line in text.splitlines()]  # a table's title line is padded to its width
    start = lines.index(workload)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] in ("train", "infer", "decode")), len(lines))
    return "\n".join(lines[start:end])


def test_dropped_replicas_are_named_under_their_workload():
    # The default command on an 80 GB H100 (2026-12-07): both training replicas ran out of memory in the cold step.
    text = printed(RUNS / "2026-12-07-h100-default-first")
    train = section(text, "train")
    for key, arm in (("baseline#1", "baseline"), ("patched#1", "patched")):
        assert f"note: {key} ran out of memory during cold beside the other processes; dropped, {arm} went on" in train
    assert "OutOfMemoryError" not in train  # the error's text stays in correctness.parquet
    assert "note:" not in section(text, "infer") and "note:" not in section(text, "decode")


def test_a_reference_on_the_host_is_said():
    # Several candidates on an H100 (2026-12-05): the fp64 reference of training ran on the host.
    train = section(printed(RUNS / "2026-12-05-h100-gpt2-softmax-candidates"), "train")
    assert "note: the fp64 reference did not fit on cuda" in train and "ran on the host instead" in train


def test_a_run_without_such_rows_prints_no_note(tmp_path):
    run = RUNS / "2026-12-07-h100-default-first"
    (tmp_path / "summary.parquet").write_bytes((run / "summary.parquet").read_bytes())
    correctness = pd.read_parquet(run / "correctness.parquet")
    correctness[~correctness.metric.isin(["replica_dropped"])].to_parquet(tmp_path / "correctness.parquet")
    assert "note:" not in printed(tmp_path)


def test_the_written_reports_carry_the_same_notes():
    from e2eprof.render.html import render_html
    from e2eprof.render.markdown import render_markdown
    from e2eprof.render.run_tables import load_run

    run = load_run(RUNS / "2026-12-05-h100-gpt2-softmax-candidates")
    markdown, html = render_markdown(run), render_html(run)
    assert "Notes on what the figures rest on" in markdown and "Notes on what the figures rest on" in html
    assert "- train: the fp64 reference did not fit on cuda" in markdown
    assert "<li>train: the fp64 reference did not fit on cuda" in html


def test_a_sweep_names_the_point_of_each_note():
    from e2eprof.render.tables import measurement_notes

    checks = pd.read_parquet(RUNS / "2026-12-07-h100-default-first" / "correctness.parquet")
    other = checks.assign(point="b4-s1024-bf16")
    notes = measurement_notes(pd.concat([checks, other]))
    assert [where for where, _ in notes] == ["b8-s1024-bf16 train"] * 2 + ["b4-s1024-bf16 train"] * 2
    assert [where for where, _ in measurement_notes(checks)] == ["train", "train"]  # one point: the workload alone
