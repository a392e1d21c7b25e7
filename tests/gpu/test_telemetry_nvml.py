"""e2eprof.trackers.telemetry against real NVML: the torch device maps to its NVML handle, and readings move under load."""

import time

import pytest
import torch

from e2eprof.trackers.telemetry import NvmlSource, _normalise_uuid, block_energy, join_steps, open_sampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def busy(seconds: float) -> tuple[int, int]:
    """bf16 matmuls for about `seconds`; returns (start, end) unix ns around the synchronised work."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.time_ns()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    return start, time.time_ns()


def test_uuid_mapping_finds_the_torch_device():
    source = NvmlSource.for_torch_device("cuda:0")
    try:
        import pynvml

        torch_uuid = torch.cuda.get_device_properties(0).uuid
        assert _normalise_uuid(source.uuid) == _normalise_uuid(torch_uuid)
        assert pynvml.nvmlDeviceGetUUID(source.handle) == source.uuid
    finally:
        source.close()


def test_readings_are_plausible_and_energy_rises_under_load():
    source = NvmlSource.for_torch_device("cuda:0")
    try:
        first = source.read()
        busy(0.5)
        second = source.read()
    finally:
        source.close()
    assert first["sm_clock_mhz"] > 0 and first["mem_clock_mhz"] > 0
    assert 0 < first["gpu_temp_c"] < 110
    assert first["power_kind"] in ("instant", "average") and first["power_mw"] > 0
    assert second["energy_mj"] > first["energy_mj"]
    assert second["sm_clock_mhz"] > 0


def test_sampler_on_the_gpu_feeds_the_joins():
    import pandas as pd

    with open_sampler("cuda:0", interval_s=0.02) as sampler:
        assert sampler.available, sampler.unavailable_reason
        start, end = busy(0.5)
    rows = sampler.rows()
    assert len(rows) >= 15 and sampler.failures == 0
    steps = pd.DataFrame([{"workload": "w", "arm": "baseline", "block": 0, "phase": "warm",
                           "start_unix_ns": start, "end_unix_ns": end}])
    joined = join_steps(steps, sampler.frame())
    assert joined["telemetry_samples"][0] >= 15 and joined["sm_clock_median_mhz"][0] > 0
    energy = block_energy(steps, sampler.frame())
    assert 50 < energy["mean_power_w"][0] < 1500, energy.to_dict("records")
