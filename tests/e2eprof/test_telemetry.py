"""e2eprof.trackers.telemetry without a GPU: the sampler on fake sources, NvmlSource on a faked pynvml, and the joins on
hand-made steps and samples with known answers."""

import math
import threading
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pynvml
import pytest

from e2eprof.trackers.telemetry import (
    TELEMETRY_COLUMNS,
    THROTTLE_MASK,
    FieldSource,
    NvmlSource,
    TelemetrySampler,
    arm_balance,
    block_energy,
    describe_reasons,
    join_steps,
    match_device,
    open_sampler,
    telemetry_frame,
)

MS = 1_000_000  # ns


class CountingSource:
    """Every field, constant values; counts reads (from the sampler thread)."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def read(self) -> dict:
        with self.lock:
            self.calls += 1
        return {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "gpu_temp_c": 40, "mem_temp_c": 45,
                "power_mw": 300_000, "power_kind": "instant", "energy_mj": 1_000 + self.calls,
                "clock_event_reasons": 0, "gpu_util_pct": 100, "mem_util_pct": 50, "mem_used_bytes": 2**30}


def not_supported():
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


# --- sampler -------------------------------------------------------------------------------------------------------
def test_sampler_rows_interval_and_idempotent_stop():
    source = CountingSource()
    sampler = TelemetrySampler(source, interval_s=0.01)
    assert sampler.available and sampler.unavailable_reason is None
    sampler.start()
    assert len(sampler.rows()) >= 1, "start() returns after the first sample"
    time.sleep(0.3)
    t0 = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - t0 < 0.5, "stop() must not wait long for the thread"
    sampler.stop()  # idempotent
    calls = source.calls
    time.sleep(0.05)
    assert source.calls == calls, "no reads after stop"
    assert not sampler._thread.is_alive()

    rows = sampler.rows()
    assert 10 <= len(rows) <= 40  # ~30 ticks of 10 ms plus the first and closing samples; loose for slow CI
    assert len(rows) == calls and sampler.failures == 0
    for row in rows:
        assert set(TELEMETRY_COLUMNS) <= set(row)
    t = np.array([r["unix_ns"] for r in rows])
    assert np.all(np.diff(t) > 0)
    assert 5 * MS <= np.median(np.diff(t)) <= 25 * MS


def test_sampler_context_manager_and_single_start():
    with TelemetrySampler(CountingSource(), interval_s=0.01) as sampler:
        time.sleep(0.03)
    assert not sampler._thread.is_alive()
    with pytest.raises(RuntimeError):
        sampler.start()


def test_field_that_raises_nvml_error_is_nan_and_not_retried():
    calls = {"mem_temp": 0}

    def mem_temp():
        calls["mem_temp"] += 1
        not_supported()

    source = FieldSource({
        "sm_clock": lambda: {"sm_clock_mhz": 1755},
        "mem_temp": mem_temp,
        "reasons": lambda: {"clock_event_reasons": 0x4},
    }, errors=(pynvml.NVMLError,))
    with TelemetrySampler(source, interval_s=0.01) as sampler:
        time.sleep(0.1)
    rows = sampler.rows()
    assert len(rows) >= 3
    assert all(math.isnan(r["mem_temp_c"]) for r in rows)
    assert all(r["sm_clock_mhz"] == 1755 and r["clock_event_reasons"] == 0x4 for r in rows)
    assert all(math.isnan(r["power_mw"]) and r["power_kind"] is None for r in rows)  # never provided
    assert calls["mem_temp"] == 1, "an unsupported field is not read again"
    assert "Not Supported" in sampler.unsupported["mem_temp"]
    frame = telemetry_frame(rows)
    assert frame["unix_ns"].dtype == "int64" and frame["clock_event_reasons"].dtype == "Int64"


def test_source_whose_read_raises_is_counted_not_raised():
    class Broken:
        def read(self):
            raise RuntimeError("GPU is lost")

    with TelemetrySampler(Broken(), interval_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.rows() == [] and sampler.failures >= 2
    assert "GPU is lost" in sampler.last_error


def test_open_sampler_on_cpu_is_unavailable_not_an_error():
    sampler = open_sampler("cpu")
    assert sampler.available is False
    assert "no CUDA device" in sampler.unavailable_reason
    with sampler:
        pass
    sampler.stop()
    assert sampler.rows() == [] and sampler.frame().empty
    assert sampler.info()["available"] is False


@pytest.mark.parametrize("interval", [0.001, 0.5])
def test_interval_outside_10_to_50_ms_is_refused(interval):
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(CountingSource(), interval_s=interval)


# --- NvmlSource on a faked pynvml ----------------------------------------------------------------------------------
def fake_field(value, ok=True):
    return SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                           valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value=SimpleNamespace(uiVal=value))


@pytest.fixture
def fake_nvml(monkeypatch):
    calls = {"instant": 0, "average": 0, "event_reasons": 0}
    answers = {"instant_ok": True, "mem_temp_ok": True}

    def field_values(handle, ids):
        (field,) = ids
        if field == pynvml.NVML_FI_DEV_POWER_INSTANT:
            calls["instant"] += 1
            return [fake_field(412_000, answers["instant_ok"])]
        return [fake_field(51, answers["mem_temp_ok"])]

    def average(handle):
        calls["average"] += 1
        return 398_000

    def event_reasons(handle):
        calls["event_reasons"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # an old driver

    fakes = {
        "nvmlDeviceGetClockInfo": lambda h, kind: {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[kind],
        "nvmlDeviceGetTemperature": lambda h, kind: 38,
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetPowerUsage": average,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123_456_789,
        "nvmlDeviceGetCurrentClocksEventReasons": event_reasons,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x1,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=97, memory=41),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=7 * 2**30),
    }
    for name, fn in fakes.items():
        monkeypatch.setattr(pynvml, name, fn)
    return calls, answers


def test_nvml_source_reads_every_field(fake_nvml):
    row = NvmlSource(handle=object()).read()
    assert row == {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "gpu_temp_c": 38, "mem_temp_c": 51,
                   "power_mw": 412_000, "power_kind": "instant", "energy_mj": 123_456_789,
                   "clock_event_reasons": 0x1, "gpu_util_pct": 97, "mem_util_pct": 41, "mem_used_bytes": 7 * 2**30}


def test_nvml_source_falls_back_to_average_power_and_old_reasons_call(fake_nvml):
    calls, answers = fake_nvml
    answers["instant_ok"] = False
    answers["mem_temp_ok"] = False
    source = NvmlSource(handle=object())
    rows = [source.read() for _ in range(3)]
    assert all(r["power_kind"] == "average" and r["power_mw"] == 398_000 for r in rows)
    assert calls["instant"] == 1 and calls["average"] == 3, "instant power asked once, then the average"
    assert calls["event_reasons"] == 1, "the missing newer call is dropped after one try"
    assert all(r["clock_event_reasons"] == 0x1 for r in rows)
    assert all("mem_temp_c" not in r for r in rows) and "mem_temp" in source.unsupported


def test_match_device_by_uuid_then_pci():
    nvml = [("GPU-11111111-2222-3333-4444-555555555555", (0, 0x19, 0)),
            ("GPU-AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE", (0, 0x3B, 0))]
    # CUDA_VISIBLE_DEVICES=1 makes it cuda:0 for torch: the UUID, not the index, finds NVML's device 1.
    assert match_device("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", (0, 0x3B, 0), nvml) == 1
    raw = bytes.fromhex("11111111222233334444555555555555")
    assert match_device(raw, (None, None, None), nvml) == 0
    # A MIG instance's UUID names no NVML device: its PCI address is its parent's.
    assert match_device("MIG-99999999-0000-0000-0000-000000000000", (0, 0x3B, 0), nvml) == 1
    with pytest.raises(LookupError):
        match_device("99999999-0000-0000-0000-000000000000", (0, 0x99, 0), nvml)


# --- reasons -------------------------------------------------------------------------------------------------------
def test_describe_reasons_and_mask():
    assert describe_reasons(0) == [] and describe_reasons(None) == [] and describe_reasons(pd.NA) == []
    assert describe_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert describe_reasons(0x8 | 0x40) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert describe_reasons(0x1000) == ["unknown_0x1000"]
    assert THROTTLE_MASK == 0x4 | 0x8 | 0x20 | 0x40 | 0x80
    for not_a_throttle in (0x1, 0x2, 0x10, 0x100):
        assert not THROTTLE_MASK & not_a_throttle


# --- join_steps ----------------------------------------------------------------------------------------------------
def samples(t_ms, clock, reasons, temp=None, power=None):
    n = len(t_ms)
    temp, power = temp or [40] * n, power or [300_000] * n
    return telemetry_frame([{
        "unix_ns": int(t * MS), "sm_clock_mhz": c, "clock_event_reasons": r,
        "gpu_temp_c": temp[i], "power_mw": power[i], "power_kind": "instant",
    } for i, (t, c, r) in enumerate(zip(t_ms, clock, reasons))])


def steps_frame(spans_ms, **extra):
    frame = pd.DataFrame({"start_unix_ns": [int(a * MS) for a, _ in spans_ms],
                          "end_unix_ns": [int(b * MS) for _, b in spans_ms]})
    for key, value in extra.items():
        frame[key] = value
    return frame


def test_join_steps_known_answers():
    tel = samples(
        t_ms=[0, 10, 20, 30, 40, 50, 60, 70],
        clock=[1980, 1900, 1950, 1980, 1700, 1800, 1980, 1980],
        reasons=[0x0, 0x1, 0x0, 0x0, 0x4, 0x20, 0x1, 0x1],
        temp=[40, 41, 42, 43, 50, 52, 44, 44],
    )
    steps = steps_frame([(5, 35), (38, 55), (58, 75)], arm=["a", "b", "c"])
    out = join_steps(steps, tel)
    assert list(out["telemetry_samples"]) == [3, 2, 2]
    assert list(out["telemetry_match"]) == ["window"] * 3
    assert list(out["sm_clock_min_mhz"]) == [1900, 1700, 1980]
    assert list(out["sm_clock_median_mhz"]) == [1950, 1750, 1980]
    assert list(out["gpu_temp_c"]) == [42, 51, 44]
    assert list(out["throttle_reasons"]) == [0x1, 0x4 | 0x20, 0x1]
    assert list(out["throttled"]) == [False, True, False], "idle (0x1) is not a throttle"
    assert list(out["arm"]) == ["a", "b", "c"], "the step's own columns are kept"


def test_join_steps_short_step_gets_nearest_sample_and_far_step_none():
    tel = samples(t_ms=[0, 20, 40], clock=[1500, 1600, 1700], reasons=[0, 0x40, 0])
    steps = steps_frame([(21, 23), (500, 501)])
    out = join_steps(steps, tel)
    assert list(out["telemetry_match"]) == ["nearest", "none"]
    assert list(out["telemetry_samples"]) == [0, 0]
    assert out["sm_clock_median_mhz"][0] == 1600 and out["throttled"][0]
    assert math.isnan(out["sm_clock_median_mhz"][1]) and out["throttled"].isna()[1]


def test_join_steps_ignores_missing_values():
    tel = samples(t_ms=[0, 10, 20], clock=[1500, math.nan, 1700], reasons=[None, None, None])
    out = join_steps(steps_frame([(0, 20)]), tel)
    assert out["sm_clock_median_mhz"][0] == 1600
    assert out["throttle_reasons"].isna()[0] and out["throttled"].isna()[0]


def test_join_steps_is_vectorised():
    rng = np.random.default_rng(0)
    n_samples, n_steps = 50_000, 5_000
    t = np.arange(n_samples) * 20  # ms: 1000 s of samples
    tel = pd.DataFrame({"unix_ns": t * MS, "sm_clock_mhz": rng.integers(1500, 1981, n_samples).astype(float),
                        "clock_event_reasons": pd.array(rng.choice([0, 1, 4], n_samples), dtype="Int64"),
                        "gpu_temp_c": 40.0, "power_mw": 300_000.0})
    starts = np.arange(n_steps) * 200.0
    steps = steps_frame(list(zip(starts, starts + 93)))
    t0 = time.perf_counter()
    out = join_steps(steps, tel)
    assert time.perf_counter() - t0 < 1.0
    assert (out["telemetry_samples"] == 5).all()  # 93 ms windows starting on a sample: 0, 20, 40, 60, 80


# --- block_energy --------------------------------------------------------------------------------------------------
def energy_samples(t_ms, energy_mj):
    return telemetry_frame([{"unix_ns": int(t * MS), "energy_mj": e} for t, e in zip(t_ms, energy_mj)])


def timed_steps(workload, arm, block, start_ms, n, step_ms):
    return [{"workload": workload, "arm": arm, "block": block, "phase": "warm" if block >= 0 else "warmup",
             "start_unix_ns": int((start_ms + i * step_ms) * MS),
             "end_unix_ns": int((start_ms + (i + 1) * step_ms) * MS)}
            for i in range(n)]


def test_block_energy_from_a_linear_counter():
    t = np.arange(0, 5000, 20.0)  # ms
    tel = energy_samples(t, 300.0 * t)  # 300 W = 300 mJ per ms
    steps = pd.DataFrame(
        timed_steps("train", "baseline", -1, 5, 3, 10)         # warm-up: left out
        + timed_steps("train", "baseline", 0, 100, 10, 100)    # 1.0 s
        + timed_steps("train", "patched", 0, 1105, 10, 50)     # 0.5 s, span ends off the sample grid
        + timed_steps("train", "patched", 1, 4900, 10, 50))    # runs past the last sample: not covered
    out = block_energy(steps, tel)
    assert list(zip(out["arm"], out["block"])) == [("baseline", 0), ("patched", 0), ("patched", 1)]
    base, patched, uncovered = out.iloc[0], out.iloc[1], out.iloc[2]
    assert base["steps"] == 10 and base["duration_s"] == pytest.approx(1.0)
    assert base["energy_j"] == pytest.approx(300.0)
    assert base["energy_per_step_j"] == pytest.approx(30.0)
    assert base["mean_power_w"] == pytest.approx(300.0)
    assert patched["energy_j"] == pytest.approx(150.0) and patched["mean_power_w"] == pytest.approx(300.0)
    assert base["energy_updates"] == 51
    assert math.isnan(uncovered["energy_j"])


def test_block_energy_from_a_staircase_counter():
    # The counter moves every 100 ms while we sample every 10 ms: the change points recover the slope.
    t = np.arange(0, 5000, 10.0)
    counter = 300.0 * (np.floor(t / 100) * 100)
    steps = pd.DataFrame(timed_steps("infer", "baseline", 0, 1234, 20, 100))  # 2.0 s
    out = block_energy(steps, energy_samples(t, counter))
    assert out["energy_j"][0] == pytest.approx(600.0, rel=0.02)


# --- arm_balance ---------------------------------------------------------------------------------------------------
def joined(workload, arm, clock, temp, throttled, n=20, phase="warm"):
    return pd.DataFrame({"workload": workload, "arm": arm, "phase": phase, "block": 0 if phase == "warm" else -1,
                         "sm_clock_median_mhz": [clock] * n, "gpu_temp_c": [temp] * n,
                         "throttled": pd.array([i < throttled for i in range(n)], dtype="boolean")})


def test_arm_balance_flags_clock_temperature_and_throttling():
    frame = pd.concat([
        joined("train", "baseline", 1980.0, 50.0, 0),
        joined("train", "baseline", 1000.0, 90.0, 20, phase="warmup"),  # not warm: ignored
        joined("train", "patched", 1980.0 * 0.97, 56.0, 2),   # 3% slower clock, 6 C hotter
        joined("train", "sdpa", 1980.0 * 1.01, 53.0, 0),      # 1% faster clock, 3 C hotter
    ], ignore_index=True)
    rows = {r["arm"]: r for r in arm_balance(frame, clock_tolerance=0.02, temp_tolerance_c=5.0)}
    assert set(rows) == {"baseline", "patched", "sdpa"}
    base, patched, sdpa = rows["baseline"], rows["patched"], rows["sdpa"]
    assert base["steps"] == 20 and base["sm_clock_median_mhz"] == 1980.0
    assert base["clock_imbalance"] is False and base["throttled"] is False
    assert patched["clock_diff_rel"] == pytest.approx(-0.03) and patched["clock_imbalance"] is True
    assert patched["temp_diff_c"] == pytest.approx(6.0) and patched["temp_imbalance"] is True
    assert patched["throttled_share"] == pytest.approx(0.1) and patched["throttled"] is True
    assert sdpa["clock_imbalance"] is False and sdpa["temp_imbalance"] is False and sdpa["throttled"] is False
    assert all(r["clock_tolerance"] == 0.02 and r["temp_tolerance_c"] == 5.0 for r in rows.values())


def test_arm_balance_without_baseline_or_telemetry_cannot_judge():
    frame = joined("train", "patched", math.nan, math.nan, 0)
    frame["throttled"] = pd.array([pd.NA] * len(frame), dtype="boolean")
    (row,) = arm_balance(frame)
    assert row["clock_imbalance"] is None and row["temp_imbalance"] is None and row["throttled"] is None
    assert row["steps_with_telemetry"] == 0


def test_join_then_balance_end_to_end_on_sampler_rows():
    """The sampler's own rows feed the joins (types line up)."""
    with TelemetrySampler(CountingSource(), interval_s=0.01) as sampler:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    steps = pd.DataFrame([{"workload": "train", "arm": "baseline", "block": 0, "phase": "warm",
                           "start_unix_ns": t0, "end_unix_ns": t1}])
    out = join_steps(steps, pd.DataFrame(sampler.rows()))
    assert out["sm_clock_median_mhz"][0] == 1980 and out["throttled"][0] == False  # noqa: E712
    energy = block_energy(steps, sampler.frame())
    assert energy["energy_j"][0] > 0
    (row,) = arm_balance(out)
    assert row["clock_imbalance"] is False


def test_arm_balance_of_a_run_whose_arms_all_failed_before_timing_is_empty():
    # The H200's first decode runs: every arm failed in its cold step, the steps table had no columns, and the
    # balance raised KeyError 'block' after everything measured had been written.
    import pandas as pd

    assert arm_balance(pd.DataFrame([])) == []
