"""NVML telemetry: a background sampler of clocks, temperatures, power, energy and clock-event reasons, and the
joins that turn its samples into per-step, per-block and per-arm columns.

Why: a step that ran at a lower SM clock, or on a hotter GPU, is slower for reasons that have nothing to do with the
kernel. Sampling NVML throughout the run lets a report flag throttled steps and arms that ran at different clocks,
and measure energy per block of steps.

- Sources: anything with ``read() -> dict``. `FieldSource` reads independent groups of fields and retires a group
  whose reader raises one of its ``errors`` (its fields are missing from then on, never retried). `NvmlSource` is
  the real one; tests inject fakes.
- `TelemetrySampler`: a daemon thread calling ``source.read()`` every ``interval_s``; rows kept in memory.
  `open_sampler` never raises for a missing GPU or NVML: it returns a sampler with ``available`` False and a reason.
- `join_steps`, `block_energy`, `arm_balance`: pure numpy/pandas on the steps table and the telemetry rows.

Run the sampler in the orchestrating process, not in an arm's worker: each sample runs ~0.1 ms of Python under the
GIL (the NVML calls themselves release it; on our H200 a read takes ~4 ms, almost all of it the energy counter),
which would otherwise land inside the step being timed. `NvmlSource.for_torch_device` asks torch for the device's
UUID, which initialises CUDA (not a context) in the calling process; arm workers are spawned, so that is harmless.
"""

from __future__ import annotations

import math
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pandas as pd

DEFAULT_INTERVAL_S = 0.02
# 10-50 ms: several samples per step of a real model (tens of ms), and NVML's own counters update no faster.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.01, 0.05

# One telemetry row. Units are in the names; unix_ns is int64 time.time_ns() just before the read.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "unix_ns", "sm_clock_mhz", "mem_clock_mhz", "gpu_temp_c", "mem_temp_c", "power_mw", "power_kind", "energy_mj",
    "clock_event_reasons", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
)
# What a field is when its source could not read it: None for the label and the bitmask, NaN for measurements.
_MISSING: dict[str, Any] = {c: math.nan for c in TELEMETRY_COLUMNS if c != "unix_ns"}
_MISSING["power_kind"] = None
_MISSING["clock_event_reasons"] = None

# --- Clock event ("throttle") reasons: nvmlClocksEventReason* bits -------------------------------------------------
REASON_GPU_IDLE = 0x1
REASON_APPLICATIONS_CLOCKS_SETTING = 0x2  # a clock limit someone set: not a throttle
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8  # also set along with HW thermal and power brake
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_DISPLAY_CLOCK = 0x100  # display clock setting: not a throttle

REASON_NAMES: dict[int, str] = {
    REASON_GPU_IDLE: "gpu_idle",
    REASON_APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    REASON_SW_POWER_CAP: "sw_power_cap",
    REASON_HW_SLOWDOWN: "hw_slowdown",
    REASON_SYNC_BOOST: "sync_boost",
    REASON_SW_THERMAL: "sw_thermal_slowdown",
    REASON_HW_THERMAL: "hw_thermal_slowdown",
    REASON_HW_POWER_BRAKE: "hw_power_brake_slowdown",
    REASON_DISPLAY_CLOCK: "display_clock_setting",
}
# The bits that mean "this step ran slower than the GPU could": idle, clock settings and sync boost are not among them
# (idle shows between steps, and the run, not the kernel, chooses clock settings).
THROTTLE_MASK = REASON_SW_POWER_CAP | REASON_HW_SLOWDOWN | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_POWER_BRAKE


def describe_reasons(mask: int | None) -> list[str]:
    """Names of the bits set in a clock-event-reasons mask, lowest bit first; unknown bits as 'unknown_0x...'."""
    if mask is None or (isinstance(mask, float) and math.isnan(mask)) or mask is pd.NA:
        return []
    mask = int(mask)
    names, bit = [], 1
    while bit <= mask:
        if mask & bit:
            names.append(REASON_NAMES.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


# --- Sources -------------------------------------------------------------------------------------------------------
class Source(Protocol):
    """Anything the sampler can read: one call returns some of TELEMETRY_COLUMNS (missing ones become NaN/None)."""

    def read(self) -> dict: ...


class FieldSource:
    """A source read as independent groups of fields (one reader per NVML call).

    A reader that raises one of ``errors`` is retired: its fields are missing from that sample on and it is not
    called again (an unsupported query would otherwise cost a failed call every sample). ``unsupported`` maps each
    retired group to the error it raised, for the report.
    """

    def __init__(self, readers: dict[str, Callable[[], dict]], errors: tuple[type[BaseException], ...] = (Exception,)):
        self._readers = dict(readers)
        self._errors = errors
        self.unsupported: dict[str, str] = {}

    def read(self) -> dict:
        row: dict = {}
        for name, reader in self._readers.items():
            if name in self.unsupported:
                continue
            try:
                row.update(reader())
            except self._errors as exc:
                self.unsupported[name] = f"{type(exc).__name__}: {exc}"
        return row

    def close(self) -> None:
        pass


class TelemetryUnavailable(RuntimeError):
    """No telemetry for this device; the message is the reason a report shows."""


# nvmlValueType_t -> the member of nvmlValue_t union that holds it.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _normalise_uuid(value: Any) -> str:
    """'GPU-5E1B...' (NVML), '5e1b...' (torch) or 16 raw bytes -> '5e1b...-...' lower case without prefix."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return str(uuidlib.UUID(bytes=bytes(value)))
    if isinstance(value, (bytes, bytearray)):
        value = value.decode(errors="replace")
    text = str(value).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def match_device(torch_uuid: Any, torch_pci: tuple[int | None, int | None, int | None],
                 nvml_devices: list[tuple[str, tuple[int, int, int] | None]]) -> int:
    """Index into ``nvml_devices`` ((uuid, (domain, bus, device)) per NVML device) of the torch device.

    UUID first; PCI (domain, bus, device) when the UUID is unknown or does not match (a MIG instance's UUID names no
    NVML device, but its PCI address is its parent GPU's, whose clocks are the ones that matter). Raises LookupError.
    """
    wanted = _normalise_uuid(torch_uuid) if torch_uuid else ""
    if wanted:
        for i, (nvml_uuid, _) in enumerate(nvml_devices):
            if _normalise_uuid(nvml_uuid) == wanted:
                return i
    if all(p is not None for p in torch_pci):
        for i, (_, pci) in enumerate(nvml_devices):
            if pci is not None and tuple(pci) == tuple(torch_pci):
                return i
    raise LookupError(f"no NVML device has UUID {torch_uuid!r} or PCI address {torch_pci} "
                      f"(NVML lists {[u for u, _ in nvml_devices]})")


class NvmlSource(FieldSource):
    """Readings of one GPU through nvidia-ml-py. NVML must be initialised; `for_torch_device` does that."""

    def __init__(self, handle, *, owns_init: bool = False):
        import pynvml

        self.handle = handle
        self.uuid: str | None = None  # set by for_torch_device
        self._nvml = pynvml
        self._owns_init = owns_init
        self._power_instant = True  # until the GPU refuses NVML_FI_DEV_POWER_INSTANT
        # Newer name first; drivers that predate it raise FunctionNotFound and we fall back to the old one.
        self._reason_fns = [getattr(pynvml, n) for n in ("nvmlDeviceGetCurrentClocksEventReasons",
                                                          "nvmlDeviceGetCurrentClocksThrottleReasons")
                            if hasattr(pynvml, n)]
        super().__init__({
            "sm_clock": lambda: {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM)},
            "mem_clock": lambda: {"mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_MEM)},
            "gpu_temp": lambda: {"gpu_temp_c": pynvml.nvmlDeviceGetTemperature(self.handle,
                                                                              pynvml.NVML_TEMPERATURE_GPU)},
            "mem_temp": lambda: {"mem_temp_c": self._field(pynvml.NVML_FI_DEV_MEMORY_TEMP)},
            "power": self._read_power,
            "clock_event_reasons": self._read_reasons,
            "utilization": self._read_utilization,
            "memory": lambda: {"mem_used_bytes": pynvml.nvmlDeviceGetMemoryInfo(self.handle).used},
            # Last: on our H200 this call takes ~4 ms while the others take ~25 us together, so the row's
            # timestamp (taken before the read) is the fast fields' time. The counter itself only moves every
            # ~100 ms, so 4 ms of doubt about its time matters little.
            "energy": lambda: {"energy_mj": pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)},
        }, errors=(pynvml.NVMLError,))

    @classmethod
    def for_torch_device(cls, device: str) -> NvmlSource:
        """The NVML handle of a torch CUDA device, found by UUID, else PCI address (never by index: NVML ignores
        CUDA_VISIBLE_DEVICES and may order devices differently from CUDA). Raises TelemetryUnavailable."""
        import pynvml
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            raise TelemetryUnavailable(f"no CUDA device (device is {device!r})")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        torch_uuid = getattr(props, "uuid", None)
        torch_pci = tuple(getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise TelemetryUnavailable(f"NVML not available: {exc}") from exc
        try:
            handles, ids = [], []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    pci = pynvml.nvmlDeviceGetPciInfo(handle)
                    address = (pci.domain, pci.bus, pci.device)
                except pynvml.NVMLError:
                    address = None
                handles.append(handle)
                ids.append((pynvml.nvmlDeviceGetUUID(handle), address))
            try:
                found = match_device(torch_uuid, torch_pci, ids)
            except LookupError as exc:
                raise TelemetryUnavailable(f"no NVML device for {device}: {exc}") from exc
        except BaseException:
            pynvml.nvmlShutdown()
            raise
        source = cls(handles[found], owns_init=True)
        source.uuid = ids[found][0]
        return source

    def _field(self, field_id: int):
        (value,) = self._nvml.nvmlDeviceGetFieldValues(self.handle, [field_id])
        if value.nvmlReturn != self._nvml.NVML_SUCCESS:
            raise self._nvml.NVMLError(value.nvmlReturn)
        return getattr(value.value, _VALUE_MEMBER[value.valueType])

    def _read_power(self) -> dict:
        # Instant power where the GPU answers it; nvmlDeviceGetPowerUsage is a ~1 s average on H100/H200.
        if self._power_instant:
            try:
                return {"power_mw": self._field(self._nvml.NVML_FI_DEV_POWER_INSTANT), "power_kind": "instant"}
            except self._nvml.NVMLError as exc:
                self._power_instant = False
                self.unsupported["power_instant"] = f"{type(exc).__name__}: {exc}"
        return {"power_mw": self._nvml.nvmlDeviceGetPowerUsage(self.handle), "power_kind": "average"}

    def _read_reasons(self) -> dict:
        while True:
            try:
                return {"clock_event_reasons": int(self._reason_fns[0](self.handle))}
            except self._nvml.NVMLError_FunctionNotFound:
                if len(self._reason_fns) == 1:
                    raise
                self._reason_fns.pop(0)

    def _read_utilization(self) -> dict:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self.handle)
        return {"gpu_util_pct": rates.gpu, "mem_util_pct": rates.memory}

    def close(self) -> None:
        """Balance the nvmlInit of `for_torch_device` (NVML counts them); safe to call twice."""
        if self._owns_init:
            self._owns_init = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


# --- Sampler -------------------------------------------------------------------------------------------------------
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


def telemetry_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> a typed frame: unix_ns int64, reasons and bytes nullable Int64, power_kind string, the rest float64."""
    frame = pd.DataFrame(list(rows), columns=list(TELEMETRY_COLUMNS)) if rows else pd.DataFrame(
        {c: [] for c in TELEMETRY_COLUMNS})
    frame = frame.copy()
    for column in TELEMETRY_COLUMNS:
        if column == "unix_ns":
            frame[column] = frame[column].astype("int64")
        elif column in ("clock_event_reasons", "mem_used_bytes"):
            frame[column] = pd.to_numeric(frame[column]).astype("Int64")
        elif column == "power_kind":
            frame[column] = frame[column].astype("string")
        else:
            frame[column] = pd.to_numeric(frame[column]).astype("float64")
    return frame


# --- Joins ---------------------------------------------------------------------------------------------------------
def _sorted_samples(telemetry: pd.DataFrame) -> pd.DataFrame:
    if telemetry is None or len(telemetry) == 0:
        return telemetry_frame([])
    return telemetry.sort_values("unix_ns", kind="stable").reset_index(drop=True)


def _float(telemetry: pd.DataFrame, column: str) -> np.ndarray:
    if column not in telemetry:
        return np.full(len(telemetry), np.nan)
    return pd.to_numeric(telemetry[column]).astype("float64").to_numpy(na_value=np.nan)


def _windows(t: np.ndarray, start: np.ndarray, end: np.ndarray, tolerance_ns: float):
    """Sample index ranges [lo, hi) per step: the samples inside [start, end], else the single sample nearest the
    step's middle if within tolerance_ns (a step shorter than the sample interval), else none."""
    lo = np.searchsorted(t, start, "left")
    hi = np.searchsorted(t, end, "right")
    inside = hi - lo
    match = np.where(inside > 0, "window", "none").astype(object)
    empty = np.flatnonzero(inside == 0)
    if len(empty) and len(t):
        mid = (start[empty] + end[empty]) // 2
        right = np.clip(np.searchsorted(t, mid), 0, len(t) - 1)
        left = np.clip(right - 1, 0, len(t) - 1)
        pick = np.where(np.abs(t[left] - mid) <= np.abs(t[right] - mid), left, right)
        near = np.abs(t[pick] - mid) <= tolerance_ns
        lo[empty[near]] = pick[near]
        hi[empty[near]] = pick[near] + 1
        match[empty[near]] = "nearest"
    return lo, hi, inside, match


def _ragged_index(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, sample index) of every sample of every window, concatenated in window order."""
    n = hi - lo
    group = np.repeat(np.arange(len(lo)), n)
    index = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    return group, index


def _min_median(group: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min and median of values (NaN dropped; NaN for a group with none), without a Python loop."""
    keep = ~np.isnan(values)
    group, values = group[keep], values[keep]
    order = np.lexsort((values, group))
    values = values[order]
    counts = np.bincount(group, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    has = counts > 0
    minimum = np.full(n_groups, np.nan)
    median = np.full(n_groups, np.nan)
    minimum[has] = values[starts[has]]
    median[has] = (values[starts[has] + (counts[has] - 1) // 2] + values[starts[has] + counts[has] // 2]) / 2
    return minimum, median


def join_steps(steps: pd.DataFrame, telemetry: pd.DataFrame, *,
               nearest_tolerance_ns: int | None = None) -> pd.DataFrame:
    """Steps with telemetry columns over each step's [start_unix_ns, end_unix_ns].

    Adds: sm_clock_min_mhz, sm_clock_median_mhz, gpu_temp_c (median), mem_temp_c (median), power_median_mw,
    throttle_reasons (bitwise OR of the reasons seen, nullable Int64), throttled (any THROTTLE_MASK bit; nullable
    boolean, NA when no reasons were read), telemetry_samples (samples inside the step) and telemetry_match:
    'window' (samples inside the step), 'nearest' (none inside, so the single sample nearest the step's middle, if
    within ``nearest_tolerance_ns``, default twice the median sample spacing) or 'none' (all NaN/NA).
    """
    samples = _sorted_samples(telemetry)
    t = samples["unix_ns"].to_numpy(dtype="int64")
    start = steps["start_unix_ns"].to_numpy(dtype="int64")
    end = steps["end_unix_ns"].to_numpy(dtype="int64")
    if nearest_tolerance_ns is None:
        nearest_tolerance_ns = 2 * float(np.median(np.diff(t))) if len(t) > 1 else 0
    lo, hi, inside, match = _windows(t, start, end, nearest_tolerance_ns)
    group, index = _ragged_index(lo, hi)
    n = len(steps)

    out = steps.copy()
    sm_min, sm_median = _min_median(group, _float(samples, "sm_clock_mhz")[index], n)
    out["sm_clock_min_mhz"] = sm_min
    out["sm_clock_median_mhz"] = sm_median
    out["gpu_temp_c"] = _min_median(group, _float(samples, "gpu_temp_c")[index], n)[1]
    out["mem_temp_c"] = _min_median(group, _float(samples, "mem_temp_c")[index], n)[1]
    out["power_median_mw"] = _min_median(group, _float(samples, "power_mw")[index], n)[1]

    reasons = _float(samples, "clock_event_reasons")[index]
    known = ~np.isnan(reasons)
    ored = np.zeros(n, dtype=np.int64)
    seen = np.bincount(group[known], minlength=n) > 0
    if known.any():
        g, r = group[known], reasons[known].astype(np.int64)
        firsts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # group is ascending: each group is one run
        ored[g[firsts]] = np.bitwise_or.reduceat(r, firsts)
    throttle_reasons = pd.array(ored, dtype="Int64")
    throttle_reasons[~seen] = pd.NA
    throttled = pd.array((ored & THROTTLE_MASK) != 0, dtype="boolean")
    throttled[~seen] = pd.NA
    out["throttle_reasons"] = throttle_reasons
    out["throttled"] = throttled
    out["telemetry_samples"] = inside.astype("int64")
    out["telemetry_match"] = match
    return out


def _interp_counter(t: np.ndarray, e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The energy counter at times ``at``, linear between the samples where it changed.

    The counter moves in steps every ~10-100 ms, so interpolating the raw staircase would be off by up to one
    update's energy at each end; the first sample showing a new value marks (within one interval) when it was
    reached. NaN outside the sampled span.
    """
    keep = ~np.isnan(e)
    t, e = t[keep], e[keep]
    if len(t) < 2:
        return np.full(len(at), np.nan)
    changed = np.r_[True, e[1:] != e[:-1]]
    changed[-1] = True  # keep the last sample so the span out to it is covered
    value = np.interp(at, t[changed], e[changed])
    value[(at < t[0]) | (at > t[-1])] = np.nan
    return value


def block_energy(steps: pd.DataFrame, telemetry: pd.DataFrame) -> pd.DataFrame:
    """Energy per timed block: one row per (workload, arm, block) with block >= 0.

    Cold and warm-up steps (block -1) are left out: they are spread over the run (cold step, correctness, warm-up)
    with other arms' work in between, so the span from their first start to last end is not theirs alone.
    Columns: workload, arm, block, steps, start_unix_ns, end_unix_ns, duration_s, energy_j (counter delta over the
    span, interpolated at its ends; NaN when the samples do not cover the span), energy_per_step_j, mean_power_w,
    energy_updates (counter changes seen inside the span: below ~10 the energy is coarse).
    """
    columns = ["workload", "arm", "block", "steps", "start_unix_ns", "end_unix_ns", "duration_s", "energy_j",
               "energy_per_step_j", "mean_power_w", "energy_updates"]
    timed = steps[steps["block"] >= 0]
    if len(timed) == 0:
        return pd.DataFrame({c: [] for c in columns})
    blocks = (timed.groupby(["workload", "arm", "block"], sort=False)
              .agg(steps=("start_unix_ns", "size"), start_unix_ns=("start_unix_ns", "min"),
                   end_unix_ns=("end_unix_ns", "max"))
              .reset_index())
    samples = _sorted_samples(telemetry)
    t = samples["unix_ns"].to_numpy(dtype="int64")
    e = _float(samples, "energy_mj")
    start = blocks["start_unix_ns"].to_numpy(dtype="int64")
    end = blocks["end_unix_ns"].to_numpy(dtype="int64")
    energy_j = (_interp_counter(t, e, end) - _interp_counter(t, e, start)) / 1e3
    valid = ~np.isnan(e)
    change_t = t[valid][1:][np.diff(e[valid]) != 0]
    blocks["duration_s"] = (end - start) / 1e9
    blocks["energy_j"] = energy_j
    blocks["energy_per_step_j"] = energy_j / blocks["steps"].to_numpy()
    blocks["mean_power_w"] = energy_j / blocks["duration_s"].to_numpy()
    blocks["energy_updates"] = np.searchsorted(change_t, end, "right") - np.searchsorted(change_t, start, "left")
    return blocks[columns]


def arm_balance(joined_steps: pd.DataFrame, *, clock_tolerance: float = 0.02, temp_tolerance_c: float = 5.0,
                baseline: str = "baseline") -> list[dict]:
    """Did the arms run under the same conditions? One row per (workload, arm) over its warm steps.

    Warm steps are phase == 'warm' (or block >= 0 without a phase column). Per arm: the median over steps of each
    step's median SM clock and GPU temperature, and the share of steps throttled. Each arm is compared with
    ``baseline``: ``clock_imbalance`` when |clock / baseline clock - 1| > clock_tolerance, ``temp_imbalance`` when
    |temp - baseline temp| > temp_tolerance_c, ``throttled`` when any step was. A flag is None when it cannot be
    judged (no baseline, no telemetry). The thresholds are in every row so a summary can state them.
    """
    if not len(joined_steps):  # every arm failed before timing: nothing to balance
        return []
    if "phase" in joined_steps:
        warm = joined_steps[joined_steps["phase"] == "warm"]
    else:
        warm = joined_steps[joined_steps["block"] >= 0]
    rows = []
    for workload in dict.fromkeys(warm["workload"]):
        mine = warm[warm["workload"] == workload]
        per_arm = {}
        for arm in dict.fromkeys(mine["arm"]):
            s = mine[mine["arm"] == arm]
            clock = s["sm_clock_median_mhz"].astype("float64").dropna()
            temp = s["gpu_temp_c"].astype("float64").dropna()
            throttled = s["throttled"].astype("boolean").dropna()
            per_arm[arm] = {
                "steps": len(s), "steps_with_telemetry": int(len(clock)),
                "sm_clock_median_mhz": float(clock.median()) if len(clock) else math.nan,
                "gpu_temp_median_c": float(temp.median()) if len(temp) else math.nan,
                "throttled_steps": int(throttled.sum()),
                "throttled_share": float(throttled.mean()) if len(throttled) else math.nan,
            }
        base = per_arm.get(baseline)
        for arm, m in per_arm.items():
            clock_diff = m["sm_clock_median_mhz"] / base["sm_clock_median_mhz"] - 1 if base else math.nan
            temp_diff = m["gpu_temp_median_c"] - base["gpu_temp_median_c"] if base else math.nan
            rows.append({
                "workload": workload, "arm": arm, "baseline_arm": baseline, **m,
                "clock_diff_rel": clock_diff,
                "clock_imbalance": None if math.isnan(clock_diff) else bool(abs(clock_diff) > clock_tolerance),
                "temp_diff_c": temp_diff,
                "temp_imbalance": None if math.isnan(temp_diff) else bool(abs(temp_diff) > temp_tolerance_c),
                "throttled": None if math.isnan(m["throttled_share"]) else bool(m["throttled_share"] > 0),
                "clock_tolerance": clock_tolerance, "temp_tolerance_c": temp_tolerance_c,
            })
    return rows
