"""Merge several device calls of benchmarks/h200_replicas.sh into one reports/self-benchmark-h200 table per part.

Each device call starts from this machine's tree. When a call's results were not extracted here before the next call,
the next call numbers (and seeds) its runs again from the same index, and a call that returned too many files left
its sensitivity table behind. This script puts the calls together without re-measuring anything:

- run folders are renamed to the next free index of their part (aa-NNN, planted-<level>pct-NNN), in call order, and
  each row's command keeps the seed it really ran with (a repeated seed means the same weights and batches in fresh
  processes; the process offsets under test are drawn afresh);
- A/A rows come from the call's aa.parquet; a planted run whose row is missing is rebuilt from its own folder with
  self_benchmark's functions (verdict_columns, signed_row) and its log line (exit code, wall time), its delay from
  the environment its run.parquet recorded.

Usage: python3 benchmarks/assemble_device_calls.py --into reports/self-benchmark-h200 CALL_DIR [CALL_DIR ...]
where each CALL_DIR holds what one call returned (runs.tgz or results.tgz, aa.parquet, sensitivity.log, ...).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from e2eprof.config import DeviceDefaults
from e2eprof.rundir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent))
import self_benchmark as sb  # noqa: E402

RUN_NAME = re.compile(r"^(aa|planted-[0-9.]+pct)-(\d{3})$")
LOG_LINE = re.compile(r"^\s+(\S+): exit (\d+), ([0-9.]+) s")


def extract(call: Path, into: Path) -> Path:
    """The call's run folders, extracted into a temporary folder; returns the folder that holds them."""
    archive = next((call / n for n in ("results.tgz", "runs.tgz") if (call / n).exists()), None)
    if archive is None:
        raise SystemExit(f"{call}: no runs.tgz or results.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    nested = into / "reports" / "self-benchmark-h200" / "runs"  # results.tgz keeps the checkout's paths
    return nested if nested.exists() else into


def log_lines(call: Path) -> dict[str, tuple[int, float]]:
    """run name -> (exit code, wall seconds) from the call's part logs."""
    found = {}
    for log in call.glob("*.log"):
        for line in log.read_text().splitlines():
            if m := LOG_LINE.match(line):
                found[m.group(1)] = (int(m.group(2)), float(m.group(3)))
    return found


def part_command(call: Path, part: str) -> str:
    """The self_benchmark command the call ran for PART: the last one its logs list (each log ends with the part's
    markdown, whose reproduce lines end with this call's)."""
    commands = [m.group(1) for log in sorted(call.glob("*.log")) + sorted(call.glob("*.md"))
                for m in re.finditer(r"reproduce: `([^`]*--part " + part + r"[^`]*)`", log.read_text())]
    if not commands:
        raise SystemExit(f"{call}: no record of the {part} command")
    return commands[-1]


def next_index(table: pd.DataFrame, runs: Path, prefix: str) -> int:
    used = set(table.run.astype(int)) if len(table) else set()
    used |= {int(m.group(2)) for p in runs.iterdir() if (m := RUN_NAME.match(p.name)) and m.group(1) == prefix}
    return max(used, default=-1) + 1


def rebuilt_planted_row(run_dir: Path, name: str, logs: dict, template: pd.Series) -> dict:
    """A planted run's row from its folder: what part_sensitivity would have written."""
    run = RunDir(run_dir).read("run").iloc[0]
    env = json.loads(run.environment_json)
    delay = float(env["env_vars"]["E2EPROF_PLANTED_DELAY_US"])
    level = float(name.split("-")[1].removesuffix("pct")) / 100
    code, wall = logs[name]
    seed = json.loads(run.config_json)["seed"]
    command = re.sub(r"--seed \d+", f"--seed {seed}", template.command)
    command = re.sub(r"E2EPROF_PLANTED_DELAY_US=[0-9.]+", f"E2EPROF_PLANTED_DELAY_US={delay:.3f}", command)
    row = {"level": level, "delay_us": delay, "calls_per_step": int(template.calls_per_step),
           "baseline_median_ms": delay * template.calls_per_step / (level * 1e3),
           "baseline_command": "median of the A/A runs in reports/self-benchmark-h200/aa.parquet when the call ran",
           "exit_code": code, "wall_s": wall, "error": "", "command": command}
    row |= sb.verdict_columns(sb.signed_row(run_dir))
    row["detected"] = row["verdict"] == "FAIL" and "SLOWER" in str(row["reasons"])
    row["measured_slowdown"] = 1 / row["speedup"] - 1
    started = pd.Timestamp(int(run.started_unix_ns), unit="ns", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
    return row | {k: template[k] for k in ("gpu", "python", "torch", "transformers", "triton", "model", "workload",
                                           "e2eprof_options")} | {"date": started}


def assemble(into: Path, calls: list[Path]) -> None:
    runs = into / "runs"
    tables = {part: pd.read_parquet(into / f"{part}.parquet") for part in ("aa", "sensitivity")}
    known = {part: len(t) for part, t in tables.items()}
    for call in calls:
        logs = log_lines(call)
        returned = {part: pd.read_parquet(call / f"{part}.parquet") for part in ("aa", "sensitivity")
                    if (call / f"{part}.parquet").exists()}
        template = pd.concat([tables["sensitivity"], returned.get("sensitivity", pd.DataFrame())]).iloc[-1]
        with tempfile.TemporaryDirectory() as tmp:
            source = extract(call, Path(tmp))
            for folder in sorted(p for p in source.iterdir() if p.is_dir() and RUN_NAME.match(p.name)):
                prefix, old_index = RUN_NAME.match(folder.name).groups()
                part = "aa" if prefix == "aa" else "sensitivity"
                index = next_index(tables[part], runs, prefix)
                new_name = f"{prefix}-{index:03d}"
                shutil.copytree(folder, runs / new_name)
                log = folder.with_name(folder.name + ".log")
                if log.exists():
                    shutil.copy(log, runs / f"{new_name}.log")
                mine = returned.get(part)
                row = None
                if mine is not None:  # this call's own row for the run: the last one with that index
                    hits = mine.iloc[known[part]:]
                    hits = hits[hits.run == int(old_index)]
                    if len(hits):
                        row = hits.iloc[-1].to_dict()
                if row is None and part == "sensitivity":
                    row = rebuilt_planted_row(folder, folder.name, logs, template)
                    row["self_benchmark_command"] = part_command(call, "sensitivity")
                if row is None:
                    raise SystemExit(f"{call}: no row for {folder.name}")
                row["run"] = index
                row["command"] = row["command"].replace(f"/runs/{folder.name} ", f"/runs/{new_name} ")
                row["device_call"] = call.name
                tables[part] = pd.concat([tables[part], pd.DataFrame([row])], ignore_index=True)
                print(f"{call.name}: {folder.name} -> {new_name} ({row['verdict']})")
    for part, table in tables.items():
        table.to_parquet(into / f"{part}.parquet", index=False)
        defaults = DeviceDefaults.for_device("cuda")  # the runs were made with e2eprof's GPU defaults
        (into / f"{part}.md").write_text(sb.markdown(part, table, defaults.process_noise, defaults.replicas))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--into", type=Path, required=True)
    p.add_argument("calls", nargs="+", type=Path)
    a = p.parse_args()
    assemble(a.into, a.calls)


if __name__ == "__main__":
    main()
