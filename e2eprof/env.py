"""Record the environment a run measured: versions, device, and a fixed list of environment variables.

Only the variables named in RECORDED_ENV_VARS and e2eprof's own E2EPROF_* switches (implementation overrides,
the planted delay) are stored, never the whole environment, so reports can be shared without leaking tokens
or paths.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

import torch

RECORDED_ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TRITON_INTERPRET",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NCCL_NVLS_ENABLE",
)
OWN_ENV_PREFIX = "E2EPROF_"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else version
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML (CPU machine, old driver): the run goes on without it
        return None


def capture_environment(device: str) -> dict:
    """Flat dict of what was measured on: versions, device name/UUID, thread counts, chosen env vars."""
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
        "e2eprof": _version("e2eprof"),
        "numpy": _version("numpy"),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "gpu_name": None,
        "gpu_uuid": None,
        "gpu_capability": None,
        "gpu_memory_bytes": None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "driver": None,
        "env_vars": {name: value for name, value in sorted(os.environ.items())
                     if name in RECORDED_ENV_VARS or name.startswith(OWN_ENV_PREFIX)},
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env["gpu_name"] = props.name
        env["gpu_uuid"] = str(getattr(props, "uuid", "")) or None
        env["gpu_capability"] = f"{props.major}.{props.minor}"
        env["gpu_memory_bytes"] = int(props.total_memory)
        env["driver"] = _driver_version()
    else:
        env["gpu_name"] = None
        env["cpu_model"] = _cpu_model()
    return env


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
