"""What one telemetry row holds: its columns, the value of a field that could not be read, and the clock-event
("throttle") reason bits NVML reports, with the mask of those that mean the GPU ran slower than it could.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


# One telemetry row. Units are in the names; unix_ns is int64 time.time_ns() just before the read.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "unix_ns", "sm_clock_mhz", "mem_clock_mhz", "gpu_temp_c", "mem_temp_c", "power_mw", "power_kind", "energy_mj",
    "clock_event_reasons", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
)
# What a field is when its source could not read it: None for the label and the bitmask, NaN for measurements.
_MISSING: dict[str, Any] = {c: math.nan for c in TELEMETRY_COLUMNS if c != "unix_ns"}
_MISSING["power_kind"] = None
_MISSING["clock_event_reasons"] = None

# Clock event ("throttle") reasons: nvmlClocksEventReason* bits.
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
