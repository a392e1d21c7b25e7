"""JUnit XML of a run's verdicts: one test case per (point, workload, candidate), as CI systems display tests.

PASS passes; FAIL is a <failure> whose message is the reason codes and whose text is the advice; INCONCLUSIVE is
<skipped> with its reasons (nothing was proven either way). A run that crashed is one <error> case (RUN_FAILED).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from e2eprof.analysis.verdict import FAIL, INCONCLUSIVE

RUN_FAILED = "RUN_FAILED"


def _ident(text: str) -> str:
    """A dotted-name part from a model name or path ('/models/my-llama' -> 'my_llama')."""
    return re.sub(r"[^0-9A-Za-z_]+", "_", str(text).rstrip("/").rsplit("/", 1)[-1]).strip("_") or "model"


def _interval(entry: dict) -> str:
    if entry.get("speedup") is None:
        return "speedup not measured"
    text = f"speedup {entry['speedup']:.4f}x"
    if entry.get("ci_low") is not None and entry.get("ci_high") is not None:
        text += f" [{entry['ci_low']:.4f}, {entry['ci_high']:.4f}] at {entry['confidence']:.0%}"
    return text


def to_xml(document: dict) -> str:
    """JUnit XML text for a verdict.json document (signoff.document)."""
    run = document["run"]
    suite_name = f"e2eprof.{_ident(run['model'])}.{_ident(run['patch'])}"
    entries = document["verdicts"]
    counts = {"tests": len(entries), "failures": sum(e["verdict"] == FAIL for e in entries), "errors": 0,
              "skipped": sum(e["verdict"] == INCONCLUSIVE for e in entries)}
    root = ET.Element("testsuites", name="e2eprof", **{k: str(v) for k, v in counts.items()})
    suite = ET.SubElement(root, "testsuite", name=suite_name, **{k: str(v) for k, v in counts.items()})
    properties = ET.SubElement(suite, "properties")
    for name, value in (("run_id", run.get("run_id")), ("run_dir", run.get("run_dir")),
                        ("device", run.get("device")), ("min_speedup", document["policy"]["min_speedup"]),
                        ("confidence", document["policy"]["confidence"])):
        ET.SubElement(properties, "property", name=name, value=str(value))
    for entry in entries:
        case = ET.SubElement(suite, "testcase", name=f"{entry['key']} [{entry['candidate']}]",
                             classname=f"e2eprof.{_ident(run['model'])}.{_ident(entry['workload'])}")
        reasons = ",".join(entry["reasons"])
        if entry["verdict"] == FAIL:
            failure = ET.SubElement(case, "failure", message=f"FAIL ({reasons})", type="FAIL")
            failure.text = f"{reasons}: {entry['advice']}\n{_interval(entry)}"
        elif entry["verdict"] == INCONCLUSIVE:
            ET.SubElement(case, "skipped", message=f"INCONCLUSIVE ({reasons}): {entry['advice']}")
        ET.SubElement(case, "system-out").text = f"{entry['verdict']} ({reasons}) {_interval(entry)}"
    return _text(root)


def run_failed_xml(message: str, name: str = "e2eprof") -> str:
    """JUnit XML of a run that crashed before it reached a verdict: one <error> case."""
    counts = {"tests": "1", "failures": "0", "errors": "1", "skipped": "0"}
    root = ET.Element("testsuites", name="e2eprof", **counts)
    suite = ET.SubElement(root, "testsuite", name=name, **counts)
    case = ET.SubElement(suite, "testcase", name="run", classname=name)
    ET.SubElement(case, "error", message=message, type=RUN_FAILED).text = message
    return _text(root)


def _text(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
