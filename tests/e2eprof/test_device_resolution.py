"""--device without importing torch where NVML can answer (a GPU host's command line starts its workers before the
parent imports torch), and torch's own check before anything is measured."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from e2eprof import config as config_module
from e2eprof.config import check_torch_device, resolve_device
from e2eprof.errors import UsageError

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks behaviour on a machine without CUDA")


def _fake_nvml(count: int, calls: list) -> types.ModuleType:
    """Stands in for pynvml where no NVIDIA driver is installed (this CPU machine): reports `count` GPUs."""
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: calls.append("init")
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlShutdown = lambda: calls.append("shutdown")
    return module


def test_nvml_counts_the_gpus_that_cuda_visible_devices_leaves(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(4, calls))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert config_module._nvml_gpu_count() == 4 and calls == ["init", "shutdown"]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(0, calls))
    assert config_module._nvml_gpu_count() is None  # none seen: another vendor's GPU is torch's to find
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(4, calls))
    for listed, seen in (("1", 1), ("3,0", 2), (" 2, 1 ", 2)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
        assert config_module._nvml_gpu_count() == seen
    # What NVML cannot read the way CUDA does is left to torch: none, UUIDs, MIG, repeats, an index past the last GPU
    for unread in ("", "-1", "GPU-0f1e2d3c", "MIG-4a5b", "1,1", "0,4"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", unread)
        assert config_module._nvml_gpu_count() is None, unread


@needs_no_cuda
def test_without_nvml_torch_answers_as_before():
    assert config_module._nvml_gpu_count() is None  # no NVIDIA driver on this machine
    assert resolve_device("auto") == "cpu"
    with pytest.raises(UsageError, match="no CUDA device is visible"):
        resolve_device("cuda")
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@needs_no_cuda
def test_a_device_nvml_accepted_is_refused_by_torchs_check_in_one_line():
    check_torch_device("cpu")
    with pytest.raises(UsageError, match=r"NVML sees an NVIDIA GPU, but torch .* cannot use it"):
        check_torch_device("cuda")


def test_where_nvml_sees_gpus_the_config_resolves_without_importing_torch():
    script = (
        "import sys\n"
        "from e2eprof import config\n"
        "from e2eprof.errors import UsageError\n"
        "config._nvml_gpu_count = lambda: 2\n"
        "c = config.CompareConfig(model='gpt2-tiny', patch='fastsoftmax')\n"
        "print(c.device, c.replicas, c.reference_arms, config.resolve_device('cuda:1'))\n"
        "try:\n"
        "    config.resolve_device('cuda:2')\n"
        "except UsageError as e:\n"
        "    print(e)\n"
        "print('torch imported:', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"})
    lines = out.stdout.splitlines()
    assert lines == ["cuda 2 ('sdpa', 'compile') cuda:1",
                     "--device: 'cuda:2' does not exist; 2 CUDA device(s) visible to NVML",
                     "torch imported: False"], out.stdout + out.stderr


@needs_no_cuda
def test_the_command_refuses_a_gpu_its_torch_cannot_use_before_measuring(tmp_path):
    script = (
        "import sys\n"
        "from e2eprof import config\n"
        "config._nvml_gpu_count = lambda: 1\n"
        "from e2eprof.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    out = subprocess.run([sys.executable, "-c", script, "compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("e2eprof: error: --device: 'cuda': NVML sees an NVIDIA GPU")
    assert "Traceback" not in out.stderr and not (tmp_path / "run" / "steps.parquet").exists()
