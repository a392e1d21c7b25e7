"""NVML telemetry: a background sampler of clocks, temperatures, power, energy and clock-event reasons, and the
joins that turn its samples into per-step, per-block and per-arm columns.

Why: a step that ran at a lower SM clock, or on a hotter GPU, is slower for reasons that have nothing to do with the
kernel. Sampling NVML throughout the run lets a report flag throttled steps and arms that ran at different clocks,
and measure energy per block of steps.

- Sources (nvml_source): anything with ``read() -> dict``. `FieldSource` reads independent groups of fields and
  retires a group whose reader raises one of its ``errors`` (its fields are missing from then on, never retried).
  `NvmlSource` is the real one; tests inject fakes. The row's columns and reason bits are in telemetry_columns.
- `TelemetrySampler` (here): a daemon thread calling ``source.read()`` every ``interval_s``; rows kept in memory.
  `open_sampler` never raises for a missing GPU or NVML: it returns a sampler with ``available`` False and a reason.
- `join_steps`, `block_energy`, `arm_balance` (telemetry_joins): pure numpy/pandas on the steps table and the rows.

Run the sampler in the orchestrating process, not in an arm's worker: each sample runs Python under the GIL (the
NVML calls themselves release it), which would otherwise land inside the step being timed
(benchmarks/sampler_overhead.py measures what a sample costs).
"""

from __future__ import annotations

import math
import threading
import time

import pandas as pd

from e2eprof.trackers.nvml_source import (FieldSource, NvmlSource, Source, TelemetryUnavailable, _normalise_uuid,
                                          match_device)
from e2eprof.trackers.telemetry_columns import (_MISSING, REASON_NAMES, TELEMETRY_COLUMNS, THROTTLE_MASK,
                                                describe_reasons)
from e2eprof.trackers.telemetry_joins import arm_balance, block_energy, join_steps, telemetry_frame

# The public names of telemetry: the sampler defined here and what its parts define (callers import them from here).
__all__ = [
    "DEFAULT_INTERVAL_S", "MIN_INTERVAL_S", "MAX_INTERVAL_S", "TelemetrySampler", "open_sampler", "FieldSource",
    "NvmlSource", "Source", "TelemetryUnavailable", "_normalise_uuid", "match_device", "REASON_NAMES",
    "TELEMETRY_COLUMNS", "THROTTLE_MASK", "describe_reasons", "arm_balance", "block_energy", "join_steps",
    "telemetry_frame",
]

DEFAULT_INTERVAL_S = 0.02
# 10-50 ms: several samples per step of a real model (tens of ms), and NVML's own counters update no faster.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.01, 0.05


def _check_interval(interval_s: float) -> None:
    if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
        raise ValueError(f"interval_s: {interval_s} s is outside {MIN_INTERVAL_S}-{MAX_INTERVAL_S} s")


class TelemetrySampler:
    """Reads ``source`` every ``interval_s`` on a daemon thread, from `start` to `stop`, and keeps every row.

    One sample is taken before `start` returns and one as `stop` is called, so a span of steps between them is
    bracketed by samples. A ``read`` that raises is counted (``failures``, ``last_error``), never raised: telemetry
    must not end a run. Without a source (see `open_sampler`) ``available`` is False, start/stop do nothing and
    ``unavailable_reason`` says why.
    """

    def __init__(self, source: Source | None, interval_s: float = DEFAULT_INTERVAL_S, *,
                 unavailable_reason: str | None = None, close_source: bool = False):
        _check_interval(interval_s)
        self.interval_s = interval_s
        self._source = source
        self.unavailable_reason = unavailable_reason if source is None else None
        if source is None and self.unavailable_reason is None:
            self.unavailable_reason = "no telemetry source"
        self._close_source = close_source
        self._rows: list[dict] = []
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.failures = 0
        self.last_error: str | None = None

    @classmethod
    def unavailable(cls, reason: str, interval_s: float = DEFAULT_INTERVAL_S) -> TelemetrySampler:
        return cls(None, interval_s, unavailable_reason=reason)

    @property
    def available(self) -> bool:
        return self._source is not None

    @property
    def unsupported(self) -> dict[str, str]:
        """Field groups the source gave up on, with the error each raised."""
        return dict(getattr(self._source, "unsupported", {}) or {})

    def start(self) -> TelemetrySampler:
        if not self.available:
            return self
        if self._thread is not None:
            raise RuntimeError("TelemetrySampler.start: already started (a sampler runs once)")
        self._thread = threading.Thread(target=self._run, name="e2eprof-telemetry", daemon=True)
        self._thread.start()
        self._first.wait(timeout=1.0)
        return self

    def stop(self) -> None:
        """Stop sampling (after one last sample) and wait for the thread; safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            # A read is a few NVML calls (well under a millisecond); the bound only guards against a hung driver.
            self._thread.join(timeout=max(1.0, 10 * self.interval_s))
        if self._close_source and self._source is not None and hasattr(self._source, "close"):
            if self._thread is None or not self._thread.is_alive():
                self._source.close()

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def rows(self) -> list[dict]:
        """The rows so far (a copy of the list; safe while sampling)."""
        return list(self._rows)

    def frame(self) -> pd.DataFrame:
        return telemetry_frame(self._rows)

    def info(self) -> dict:
        """What a run record needs to know about the telemetry itself."""
        return {"available": self.available, "unavailable_reason": self.unavailable_reason,
                "interval_s": self.interval_s, "samples": len(self._rows), "failures": self.failures,
                "last_error": self.last_error, "unsupported": self.unsupported,
                "uuid": getattr(self._source, "uuid", None)}

    def _run(self) -> None:
        next_tick = time.monotonic()
        try:
            while True:
                self._sample()
                self._first.set()
                next_tick += self.interval_s
                now = time.monotonic()
                if next_tick < now:  # a slow read: skip the missed ticks rather than sample in a burst
                    next_tick += self.interval_s * math.ceil((now - next_tick) / self.interval_s)
                if self._stop.wait(next_tick - now):
                    break
            self._sample()  # the closing sample, so the last step before stop() is bracketed
        finally:
            self._first.set()

    def _sample(self) -> None:
        # Stamped before the read: a source reads its fast, time-critical fields first (see NvmlSource).
        unix_ns = time.time_ns()
        try:
            values = self._source.read()
        except Exception as exc:  # noqa: BLE001 - telemetry never ends the run; the failure is recorded
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        row = dict(_MISSING)
        row.update(values)
        row["unix_ns"] = unix_ns
        self._rows.append(row)


def open_sampler(device: str, interval_s: float = DEFAULT_INTERVAL_S) -> TelemetrySampler:
    """A sampler for a torch device, or, when there is no GPU or NVML, one with ``available`` False and the reason.

    Only a bad ``interval_s`` raises (a usage error); everything about the machine is reported, not raised.
    """
    _check_interval(interval_s)
    try:
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            return TelemetrySampler.unavailable(f"no CUDA device (device is {device!r})", interval_s)
        if not torch.cuda.is_available():
            return TelemetrySampler.unavailable("no CUDA device (torch.cuda.is_available() is False)", interval_s)
        try:
            import pynvml  # noqa: F401
        except ImportError as exc:
            return TelemetrySampler.unavailable(f"NVML not available: {exc}", interval_s)
        source = NvmlSource.for_torch_device(device)
    except TelemetryUnavailable as exc:
        return TelemetrySampler.unavailable(str(exc), interval_s)
    except Exception as exc:  # noqa: BLE001 - a run goes on without telemetry
        return TelemetrySampler.unavailable(f"telemetry unavailable: {type(exc).__name__}: {exc}", interval_s)
    return TelemetrySampler(source, interval_s, close_source=True)
