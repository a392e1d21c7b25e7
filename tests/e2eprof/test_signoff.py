"""Sign-off outputs (JUnit XML, step summary, verdict.json) and `gate` on a real small CPU run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from e2eprof.signoff import document, junit
from e2eprof.signoff.regate import regate

XSD = Path(__file__).resolve().parents[1] / "data" / "junit.xsd"
ENV = {**os.environ, "TRITON_INTERPRET": "1"}


def run_cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], capture_output=True, text=True, timeout=900,
                          env=env or ENV)


def schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(XSD)))


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A real compare on the CPU with the outputs of a CI job: JUnit file, summary file, step summary."""
    base = tmp_path_factory.mktemp("signoff")
    step_summary = base / "step_summary.md"
    step_summary.write_text("earlier step's text\n")
    result = run_cli("compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "train,infer",
                     "--steps", "6", "--block-steps", "2", "--device", "cpu", "--no-profile", "--out", str(base / "run"),
                     "--junit", str(base / "junit.xml"), "--summary-md", str(base / "summary.md"),
                     env={**ENV, "GITHUB_STEP_SUMMARY": str(step_summary)})
    return result, base


def test_junit_validates_and_has_one_case_per_verdict(cpu_run):
    result, base = cpu_run
    assert result.returncode in (0, 1, 3), result.stderr
    tree = etree.parse(str(base / "junit.xml"))
    schema().assertValid(tree)
    doc = document.read(base / "run" / "verdict.json")
    cases = tree.findall(".//testcase")
    assert len(cases) == len(doc["verdicts"]) == 2
    for case, entry in zip(cases, doc["verdicts"]):
        failure, skipped = case.find("failure"), case.find("skipped")
        assert (failure is not None) == (entry["verdict"] == "FAIL")
        assert (skipped is not None) == (entry["verdict"] == "INCONCLUSIVE")
        carrier = failure if failure is not None else skipped
        text = carrier.get("message") if carrier is not None else case.findtext("system-out")
        assert entry["reasons"] and all(reason in text for reason in entry["reasons"])


def test_failure_carries_reason_codes_and_advice():
    entry = {"key": "train", "point": "b1", "batch": 1, "seq": 64, "precision": "fp32", "workload": "train",
             "candidate": "patched", "verdict": "FAIL", "reasons": ["SLOWER", "INCORRECT"], "advice": "fix it",
             "speedup": 0.9, "ci_low": 0.85, "ci_high": 0.95, "confidence": 0.95, "n": 6}
    doc = {"run": {"model": "gpt2-tiny", "patch": "fastsoftmax", "run_id": "x", "run_dir": "d", "device": "cpu"},
           "policy": {"min_speedup": 0.01, "confidence": 0.95}, "verdicts": [entry, {**entry, "verdict": "PASS",
                                                                                   "reasons": ["FASTER"]}]}
    tree = etree.fromstring(junit.to_xml(doc).encode())
    schema().assertValid(tree)
    failure = tree.find(".//failure")
    assert "SLOWER,INCORRECT" in failure.get("message") and "fix it" in failure.text
    assert tree.get("failures") == "1" and tree.get("tests") == "2"


def test_run_failed_case_validates():
    tree = etree.fromstring(junit.run_failed_xml("the run failed: worker died").encode())
    schema().assertValid(tree)
    assert tree.find(".//error").get("type") == junit.RUN_FAILED


def test_schema_accepts_what_pytest_writes(tmp_path):
    """pytest's own --junitxml validates against the schema: it is the one CI tools read."""
    (tmp_path / "test_x.py").write_text("import pytest\ndef test_a(): pass\ndef test_b(): assert 0\n"
                                        "@pytest.mark.skip('no')\ndef test_c(): pass\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_x.py"),
                    f"--junitxml={tmp_path / 'out.xml'}"], capture_output=True, cwd=tmp_path)
    schema().assertValid(etree.parse(str(tmp_path / "out.xml")))
    with pytest.raises(etree.DocumentInvalid):  # and it is not a schema that accepts anything
        schema().assertValid(etree.fromstring(b"<testsuites><testcase name='x'/></testsuites>"))


def test_step_summary_appended_and_summary_file_written(cpu_run):
    _, base = cpu_run
    text = (base / "step_summary.md").read_text()
    assert text.startswith("earlier step's text\n")  # appended, not replaced
    doc = document.read(base / "run" / "verdict.json")
    assert (base / "summary.md").read_text() in text
    for entry in doc["verdicts"]:
        assert f"| {entry['key']} |" in text and entry["verdict"] in text
    assert "verdict.json" in text


def test_verdict_json_fields(cpu_run):
    _, base = cpu_run
    doc = json.loads((base / "run" / "verdict.json").read_text())
    assert doc["schema"] == document.SCHEMA and doc["version"] == document.VERSION
    assert {"run", "policy", "verdict", "exit_code", "verdicts"} <= set(doc)
    assert doc["run"]["status"] == "complete"  # written once the run is, as run.parquet says
    for entry in doc["verdicts"]:
        assert {"point", "workload", "candidate", "verdict", "reasons", "advice", "speedup", "ci_low", "ci_high",
                "confidence"} <= set(entry)
    worst = max(doc["verdicts"], key=lambda e: {"PASS": 0, "INCONCLUSIVE": 1, "FAIL": 2}[e["verdict"]])
    assert doc["verdict"] == worst["verdict"]


def test_gate_reproduces_compare_exactly(cpu_run):
    result, base = cpu_run
    recorded = json.loads((base / "run" / "verdict.json").read_text())
    regated = regate(base / "run")
    assert regated.changed == []
    assert regated.exit_code == recorded["exit_code"] == result.returncode
    assert regated.document["verdicts"] == recorded["verdicts"]
    gate = run_cli("gate", str(base / "run"))
    assert gate.returncode == result.returncode, gate.stderr
    assert "no verdict changed" in gate.stderr


def test_gate_with_a_higher_bar_and_other_confidence(cpu_run):
    _, base = cpu_run
    recorded = document.read(base / "run" / "verdict.json")
    stricter = regate(base / "run", min_speedup=0.9)  # no step gets 1.9x faster here
    assert all(e["verdict"] != "PASS" for e in stricter.document["verdicts"])
    passed = [e["key"] for e in recorded["verdicts"] if e["verdict"] == "PASS"]
    assert all(any(line.startswith(f"{k}: PASS ->") for line in stricter.changed) for k in passed)
    wider = regate(base / "run", confidence=0.999)  # recomputed from the raw steps: a wider interval
    for old, new in zip(recorded["verdicts"], wider.document["verdicts"]):
        if old["ci_low"] is not None:
            assert new["ci_low"] <= old["ci_low"] and new["ci_high"] >= old["ci_high"]


def test_gate_refusals(cpu_run, tmp_path):
    _, base = cpu_run
    policy = tmp_path / "team.toml"
    policy.write_text("budget = 999\n")
    refused = run_cli("gate", str(base / "run"), "--policy", str(policy))
    assert refused.returncode == 2 and "new measurements" in refused.stderr and "Traceback" not in refused.stderr
    empty = run_cli("gate", str(tmp_path))
    assert empty.returncode == 2 and "run.parquet" in empty.stderr
    bad = run_cli("gate", str(base / "run"), "--confidence", "1.5")
    assert bad.returncode == 2 and "--confidence" in bad.stderr
    # A folder trimmed for space (steps and summary kept, correctness dropped) is refused, not judged INCORRECT.
    trimmed = tmp_path / "trimmed"
    shutil.copytree(base / "run", trimmed)
    (trimmed / "correctness.parquet").unlink()
    refused = run_cli("gate", str(trimmed))
    assert refused.returncode == 2 and "lacks correctness.parquet" in refused.stderr, refused.stderr


def test_bad_junit_path_refused_before_measuring(tmp_path):
    result = run_cli("compare", "--model", "gpt2-tiny", "--device", "cpu", "--out", str(tmp_path / "run"),
                     "--junit", str(tmp_path / "missing" / "j.xml"))
    assert result.returncode == 2 and "--junit" in result.stderr
    assert not (tmp_path / "run").exists()
