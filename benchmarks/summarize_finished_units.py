"""Statistics of a run that was stopped after its last unit but before its summary, computed on any machine.

`compare --resume` finishes such a run, but it needs the run's device again. This script applies the same
`e2eprof.analysis.summary.summarize` to the steps and correctness rows the run wrote, with the run's own configuration
(config_json; only the device is replaced by "cpu", which no statistic depends on), and writes the summary as
summary-offline.parquet and a markdown table. It does not change the run's status: the run stays incomplete.
Usage: python3 benchmarks/summarize_finished_units.py RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from e2eprof.config import CompareConfig
from e2eprof.analysis.summary import summarize
from e2eprof.tables.rundir import RunDir


def main(run_dir: Path) -> None:
    run = RunDir(run_dir).read("run").iloc[0]
    record = json.loads(run.config_json)
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record.items()
              if k in CompareConfig.__dataclass_fields__ and k not in ("out", "force")}
    config = CompareConfig(**(fields | {"device": "cpu", "out": None}))
    units = json.loads(run.resume_json) if isinstance(run.get("resume_json"), str) else {}
    timing = {tuple(key.split("/")): unit["timing"] for key, unit in units.items() if unit.get("timing")}
    steps = RunDir(run_dir).read("steps").to_dict("records")
    checks = RunDir(run_dir).read("correctness").to_dict("records")
    summary, _ = summarize(steps, checks, config, set(), None, timing)
    frame = pd.DataFrame(summary)
    frame.to_parquet(run_dir / "summary-offline.parquet")
    patched = frame[frame.arm == "patched"]
    cols = [c for c in ("point", "workload", "speedup_vs_baseline", "ci_low", "ci_high", "mw_p_adjusted", "verdict",
                        "reasons") if c in frame.columns]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in patched[cols].itertuples(index=False):
        print("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
