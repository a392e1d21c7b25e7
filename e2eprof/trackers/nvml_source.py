"""Where telemetry rows come from: any object with ``read() -> dict``. `FieldSource` reads independent groups of
fields and retires a group whose reader raises; `NvmlSource` is the real one, a GPU read through nvidia-ml-py.

`NvmlSource.for_torch_device` asks torch for the device's UUID, which initialises CUDA (not a context) in the calling
process; arm workers are spawned, so that is harmless.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from typing import Any, Protocol


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
            # Last: this call is by far the slowest, so the row's timestamp (taken before the read) is the fast
            # fields' time; the counter itself moves far less often than it takes, so its own time matters little.
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
