"""benchmarks/host_overhead.py on the CPU: per-call host cost, and --layers' split of a forward call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "host_overhead.py"


def _benchmark_module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import host_overhead
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return host_overhead


def test_layers_split_the_forward_call_into_routing_dispatcher_wrapper_and_device_code(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--kernels", "fastsoftmax,fastgelu",
                           "--layers", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = pd.read_parquet(tmp_path / "host_overhead.parquet")
    arms = raw.groupby("kernel").arm.agg(set)
    assert arms["fastsoftmax"] == {"kernel", "stock", "op", "impl", "launch", "pynode"}
    assert arms["fastgelu"] == {"kernel", "stock", "op", "impl", "launch"}
    assert "nan" not in (tmp_path / "host_overhead.md").read_text()
    text = (tmp_path / "host_overhead.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fastsoftmax |") and line.count("|") == 9)
    call, routing, op, dispatcher, wrapper, device_code = (float(v) for v in row.strip("|").split("|")[1:7])
    assert abs(call - (routing + wrapper + device_code)) < 0.2  # the layers add up to the public function's call
    assert abs(op - (dispatcher + wrapper + device_code)) < 0.2  # and to the call through torch.ops


def test_the_split_layers_compute_what_the_op_computes():
    # The layers time the op's own code, not stand-ins: same result as the op on the same input.
    host_overhead = _benchmark_module()
    ops = host_overhead.cases("cpu")
    for kernel, (op, impl, launch, make) in host_overhead.layers("cpu").items():
        args = make()
        expected = ops[kernel][0](*args)
        torch.testing.assert_close(op(*args), expected, rtol=0, atol=0)
        torch.testing.assert_close(impl(*args), expected, rtol=0, atol=0)
        torch.testing.assert_close(launch(*args).reshape(expected.shape), expected, rtol=0, atol=0)


def test_the_backward_split_adds_up(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--kernels", "fastlayernorm",
                           "--layers", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = pd.read_parquet(tmp_path / "host_overhead.parquet")
    assert set(raw[raw.arm == "kernel"].kind) == {"fwd", "fwd-grad", "fwd+bwd", "bwd-body"}
    assert set(raw[raw.arm == "launch"].kind) == {"fwd", "bwd"}
    mins = raw.groupby(["arm", "kind"]).us_per_call.min()
    text = (tmp_path / "host_overhead.md").read_text().split("Forward + backward by part")[1]
    row = next(line for line in text.splitlines() if line.startswith("| fastlayernorm |"))
    total, recorded, backward, device_code, rest, body, outside, stock_recorded, stock_backward = (
        float(v) for v in row.strip("|").split("|")[1:10])
    assert abs(total - mins["kernel", "fwd+bwd"]) < 0.1 and abs(device_code - mins["launch", "bwd"]) < 0.1
    assert abs(backward - (total - recorded)) < 0.2 and abs(rest - (backward - device_code)) < 0.2
    assert abs(body - mins["kernel", "bwd-body"]) < 0.1 and abs(outside - (backward - body)) < 0.2
    assert abs(stock_backward - (mins["stock", "fwd+bwd"] - stock_recorded)) < 0.2
    assert 0 < body < total  # the body is timed inside the forward + backward it is part of
    for arm, label in (("pynode", "stock in a Python node"), ("bare", "its device code in a bare Python node")):
        node = next(line for line in text.splitlines() if line.startswith(f"| fastlayernorm: {label} |"))
        node_total, _, node_backward, _, _, node_body, node_outside = node.strip("|").split("|")[1:8]
        assert abs(float(node_total) - mins[arm, "fwd+bwd"]) < 0.1
        assert abs(float(node_body) - mins[arm, "bwd-body"]) < 0.1
        assert abs(float(node_outside) - (float(node_backward) - float(node_body))) < 0.2


def test_the_backward_device_code_computes_autograd_s_gradients():
    # What the split times as "device code" is each kernel's real backward: its gradients equal autograd's through
    # the stock math on the same inputs.
    host_overhead = _benchmark_module()
    import torch.nn.functional as F
    parts = host_overhead.backward_layers("cpu")
    assert set(parts) == set(host_overhead.cases("cpu"))

    def grads(f, inputs, dy):
        leaves = [t.detach().double().requires_grad_() for t in inputs]
        return torch.autograd.grad(f(*leaves), leaves, dy.double())

    close = dict(rtol=1e-4, atol=1e-5)
    call, make = parts["fastlayernorm"]
    dy, x, mean, rstd, w = make()
    dx, dw, db = call(dy, x, mean, rstd, w)
    c = x.shape[-1]
    bias = torch.zeros(c)
    ex, ew, eb = grads(lambda a, b, d: F.layer_norm(a, (c,), b, d), (x, w, bias), dy)
    torch.testing.assert_close(dx.double().reshape(ex.shape), ex, **close)
    torch.testing.assert_close(dw.double(), ew, **close)
    torch.testing.assert_close(db.double(), eb, **close)
    for kernel, scale in (("fastsoftmax", 1.0), ("fusedsoftmax", 0.5)):
        call, make = parts[kernel]
        dy, y = make()
        expected = scale * y * (dy - (dy * y).sum(-1, keepdim=True))
        torch.testing.assert_close(call(dy, y).reshape(y.shape), expected, **close)
    call, make = parts["fastgelu"]
    dy, x = make()
    (expected,) = grads(lambda a: F.gelu(a, approximate="tanh"), (x,), dy)
    torch.testing.assert_close(call(dy, x).double().reshape(x.shape), expected, **close)
    call, make = parts["swiglu"]
    dy, g, u = make()
    dg, du = call(dy, g, u)
    eg, eu = grads(lambda a, b: F.silu(a) * b, (g, u), dy)
    torch.testing.assert_close(dg.double().reshape(g.shape), eg, **close)
    torch.testing.assert_close(du.double().reshape(u.shape), eu, **close)
    call, make = parts["rmsnorm"]
    dy, x, w = make()
    dx, dw = call(dy, x, w)
    ex, ew = grads(lambda a, b: host_overhead._rms_stock(a, b), (x, w), dy)
    torch.testing.assert_close(dx.double().reshape(x.shape), ex, **close)
    torch.testing.assert_close(dw.double(), ew, **close)


def test_the_python_node_runs_the_stock_ops_forward_and_backward():
    # "stock in a Python node" must be the stock op's math exactly (same values, same gradients), or node / stock
    # would measure something else than a Python node's own cost.
    host_overhead = _benchmark_module()
    table = host_overhead.cases("cpu")
    for kernel, node in host_overhead.PYTHON_NODE.items():
        _ours, stock, make = table[kernel]
        out, expected = _same_values_and_gradients(node.apply, stock, make())
        assert out.grad_fn.name() != expected.grad_fn.name()  # a Python node, not aten's


def _same_values_and_gradients(call, expected_call, inputs):
    """Both calls on copies of `inputs`: equal outputs and equal gradients of every input, bit for bit; the outputs."""
    leaves = [[t.clone().requires_grad_() for t in inputs] for _ in range(2)]
    outs = [f(*args) for f, args in ((call, leaves[0]), (expected_call, leaves[1]))]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    dy = torch.randn_like(outs[0])
    for out in outs:
        out.backward(dy)
    for a, b in zip(*leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    return outs


def test_the_python_node_table_divides_the_measured_minima(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--kernels", "fastsoftmax",
                           "--layers", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    mins = pd.read_parquet(tmp_path / "host_overhead.parquet").groupby(["arm", "kind"]).us_per_call.min()
    text = (tmp_path / "host_overhead.md").read_text().split("in a Python autograd node")[1]
    row = next(line for line in text.splitlines() if line.startswith("| fastsoftmax | fwd+bwd |"))
    stock, node, node_ratio, ours, ours_ratio = (float(v) for v in row.strip("|").split("|")[2:7])
    assert abs(stock - mins["stock", "fwd+bwd"]) < 0.1 and abs(node - mins["pynode", "fwd+bwd"]) < 0.1
    assert abs(node_ratio - node / stock) < 0.01 and abs(ours_ratio - ours / node) < 0.01


def test_the_body_timer_times_the_backward_that_runs_and_puts_it_back():
    host_overhead = _benchmark_module()
    function = host_overhead.BACKWARD_FUNCTION["fastsoftmax"]
    original = function.__dict__["backward"]
    step = host_overhead.steps(*host_overhead.cases("cpu")["fastsoftmax"][::2])["fwd+bwd"]
    timed = host_overhead.BodyTimed(step, function)
    timed()
    assert timed.body_ns == 0  # not timing outside its context
    with timed.timing():
        timed()
        once = timed.body_ns
        timed()
    assert 0 < once < timed.body_ns  # each backward adds its body's time
    assert function.__dict__["backward"] is original


def test_the_bare_node_runs_the_kernels_own_code():
    # "its device code in a bare Python node" must compute exactly what fastlayernorm computes (the same device code),
    # or kernel - bare would not be op.py's own cost.
    host_overhead = _benchmark_module()
    ours, _stock, make = host_overhead.cases("cpu")["fastlayernorm"]
    bare = host_overhead.BARE_NODE["fastlayernorm"].apply
    out, _ = _same_values_and_gradients(bare, ours, make())
    assert "LayerNormKernelsInBareNode" in out.grad_fn.name()
