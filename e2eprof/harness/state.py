"""What a run has measured so far (steps, checks, phases, memory, profiles), flushed to Parquet after every phase
so that nothing measured is lost when a later phase fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from e2eprof.tables import reports
from e2eprof.analysis import explain
from e2eprof.trackers import telemetry
from e2eprof import resume as resume_run
from e2eprof.harness.arm_process import ArmFailed
from e2eprof.distributed import ranks as dp
from e2eprof.distributed.telemetry import RankSamplers, per_rank
from e2eprof.sweep import SweepPoint, by_point, is_oom, stamp

Events = Callable[..., None]


class RunState:
    """Everything measured so far, flushed to Parquet after each phase so nothing is lost."""

    def __init__(self, out_dir: Path, run_row: dict, sampler: RankSamplers):
        self.out_dir = out_dir
        self.sampler = sampler
        self.run_row = run_row
        self.steps: list[dict] = []
        self.correctness: list[dict] = []
        self.arm_failures: dict[str, ArmFailed] = {}
        self.profiles: dict[tuple[SweepPoint, str, str], dict] = {}  # (point, workload, arm) -> ProfileResult.to_dict()
        self.phases: list[dict] = []  # where the run's own wall time went (issue: timing should dominate)
        self.timing: dict[tuple[str, str], dict] = {}  # (point id, workload) -> blocks run, why timing stopped, seconds
        self.memory: list[dict] = []  # peak device/host memory per (point, workload, arm, phase)
        self.jit: list[dict] = []  # just-in-time work per (point, workload, process, phase)
        # Workers are started afresh at every point, so arm_failures is per point; the past points' are kept here.
        self.point: SweepPoint | None = None
        self.failed_by_point: dict[str, set[str]] = {}
        self.out_of_memory: set[tuple[str, str]] = set()  # (arm, workload) that ran out of memory at this point
        # Commands sent and not yet answered, by process key (harness.pool.Pending): untimed work that runs on while
        # the parent talks to the other processes. Not measurements: nothing here is written to a table.
        self.pending: dict[str, object] = {}
        self._stamped = {"steps": 0, "correctness": 0, "phases": 0, "memory": 0, "jit": 0}
        # --resume: rows of the units an earlier attempt finished, kept as written (resume.py), and those units
        # with what the tables cannot hold (why timing stopped, profiles), recorded in run.parquet's resume_json.
        self.prior: dict[str, pd.DataFrame] = {}
        self.units: dict[str, dict] = {}

    def begin_point(self, point: SweepPoint) -> None:
        self.point = point
        self.arm_failures = {}
        self.out_of_memory = set()

    def end_point(self) -> None:
        """Stamp this point's rows and keep which arms failed for real (running out of memory is not a failure)."""
        self._stamp()
        failed = {a for a, f in self.arm_failures.items() if not is_oom(f)}
        prior = self.prior.get("correctness")
        if prior is not None and len(prior):  # arms that failed in this point's units an earlier attempt finished
            mine = prior[(prior["point"] == self.point.id) & (prior["metric"] == "arm_failed")]
            failed |= set(mine["arm"])
        self.failed_by_point[self.point.id] = failed

    def _stamp(self) -> None:
        """Every row recorded since the last stamp was measured at the current point: give it the identity columns."""
        if self.point is not None:
            for name in self._stamped:
                self._stamped[name] = stamp(getattr(self, name), self.point, self._stamped[name])

    @contextmanager
    def phase(self, events: Events, workload: str, name: str, detail: str = "") -> Iterator[None]:
        """Announce a phase and record its wall time in phases.parquet, also when it fails."""
        events("phase", name=f"{workload}: {name}" if workload != "*" else name, detail=detail)
        start = time.time_ns()
        try:
            yield
        finally:
            self.record_phase(workload, name, start)

    def record_phase(self, workload: str, name: str, start_unix_ns: int) -> None:
        """A phases.parquet row for work from start_unix_ns until now."""
        end = time.time_ns()
        self.phases.append({"workload": workload, "phase": name, "start_unix_ns": start_unix_ns, "end_unix_ns": end,
                            "seconds": (end - start_unix_ns) / 1e9})

    def steps_frame(self) -> pd.DataFrame:
        """Steps joined with the telemetry samples that fall inside each step (clocks, temperature, throttling).

        Kept steps of an earlier attempt come first, as written (joined with that attempt's samples).
        """
        steps = pd.DataFrame(self.steps)
        samples = self.sampler.frame() if self.sampler.available else None
        if samples is not None and len(samples) and len(steps):
            steps = per_rank(telemetry.join_steps, steps, samples)
        return self._with_prior("steps", steps)

    def _with_prior(self, name: str, rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        prior = self.prior.get(name)
        if prior is None or not len(prior):
            return frame
        if not len(frame):
            return prior
        return pd.concat([prior, frame.assign(run_id=self.run_row["run_id"])], ignore_index=True)

    def all_rows(self, name: str) -> list[dict]:
        """Kept rows of an earlier attempt, then this attempt's (steps, correctness, memory), for the summary."""
        prior = self.prior.get(name)
        return (prior.to_dict("records") if prior is not None else []) + getattr(self, name)

    def samples_frame(self) -> pd.DataFrame:
        return self._with_prior("telemetry", self.sampler.frame())

    def finish_unit(self, workload: str) -> None:
        """This (point, workload) is done: recorded with its rows in the next flush, kept by a --resume."""
        timing = self.timing.get((self.point.id, workload))
        profiles = {a: resume_run.without_profile_rows(r) for (p, w, a), r in self.profiles.items()
                    if p == self.point and w == workload}
        self.units[resume_run.unit_key(self.point.id, workload)] = {"timing": timing, "profiles": profiles}
        self.run_row["resume_json"] = reports.to_json(self.units)

    def flush_steps(self) -> None:
        """Only the steps table: what the timing loop adds between rounds. A full flush rewrites every table (the
        profiles' ops among them), seconds of a timing phase on a GPU host; the others are written at the end of each
        phase as before, and by the run's final flush."""
        self._stamp()
        steps = self.steps_frame()
        reports.write_table(self.out_dir, "steps", steps.assign(run_id=self.run_row["run_id"]) if len(steps) else [])

    def flush(self) -> None:
        self._stamp()
        run_id = self.run_row["run_id"]
        self.run_row["telemetry_json"] = reports.to_json(self.sampler.info())
        steps = self.steps_frame()
        reports.write_table(self.out_dir, "steps", steps.assign(run_id=run_id) if len(steps) else [])
        if self.sampler.available and len(steps):
            samples = self.samples_frame()
            reports.write_table(self.out_dir, "telemetry", samples.assign(run_id=run_id))
            reports.write_table(self.out_dir, "blocks", by_point(steps, lambda s: per_rank(telemetry.block_energy, s, samples)).assign(run_id=run_id))
        reports.write_table(self.out_dir, "correctness", self._with_prior("correctness", self.correctness).assign(run_id=run_id))
        for name in ("phases", "memory", "jit"):
            table = self._with_prior(name, getattr(self, name))
            if len(table):
                reports.write_table(self.out_dir, name, table.assign(run_id=run_id))
        if self.profiles:
            reports.write_table(self.out_dir, "ops", self.ops_frame().assign(run_id=run_id))
            reports.write_table(self.out_dir, "kernels", [
                k | {"workload": w, "arm": a, "rank": rank, "run_id": run_id, **p.columns()}
                for (p, w, a), r in self.profiles.items() for rank, result in dp.by_rank(r) for k in result["kernels"]])
        reports.write_table(self.out_dir, "run", [self.run_row])


    def ops_frame(self) -> pd.DataFrame:
        """Every profiled (point, workload, arm)'s ops, with the point's identity columns."""
        return pd.concat([explain.ops_frame(result, workload=w, arm=a).assign(rank=rank, **p.columns())
                          for (p, w, a), r in self.profiles.items() for rank, result in dp.by_rank(r)], ignore_index=True)
