"""benchmarks/host_overhead.py on the CPU: per-call host cost, and --layers' split of a forward call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "host_overhead.py"


def test_layers_split_the_forward_call_into_routing_dispatcher_wrapper_and_device_code(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--kernels", "fastsoftmax,fastgelu",
                           "--layers", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = pd.read_parquet(tmp_path / "host_overhead.parquet")
    arms = raw.groupby("kernel").arm.agg(set)
    assert arms["fastsoftmax"] == {"kernel", "stock", "op", "impl", "launch"}
    assert arms["fastgelu"] == {"kernel", "stock", "op", "impl", "launch"}
    text = (tmp_path / "host_overhead.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fastsoftmax |") and line.count("|") == 9)
    call, routing, op, dispatcher, wrapper, device_code = (float(v) for v in row.strip("|").split("|")[1:7])
    assert abs(call - (routing + wrapper + device_code)) < 0.2  # the layers add up to the public function's call
    assert abs(op - (dispatcher + wrapper + device_code)) < 0.2  # and to the call through torch.ops


def test_the_split_layers_compute_what_the_op_computes():
    # The layers time the op's own code, not stand-ins: same result as the op on the same input.
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import host_overhead
    finally:
        sys.path.remove(str(SCRIPT.parent))
    ops = host_overhead.cases("cpu")
    for kernel, (op, impl, launch, make) in host_overhead.layers("cpu").items():
        args = make()
        expected = ops[kernel][0](*args)
        torch.testing.assert_close(op(*args), expected, rtol=0, atol=0)
        torch.testing.assert_close(impl(*args), expected, rtol=0, atol=0)
        torch.testing.assert_close(launch(*args).reshape(expected.shape), expected, rtol=0, atol=0)
