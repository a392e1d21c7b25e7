"""e2eprof microbench: shape capture from gpt2-tiny, honest rows, wrong and lazy replacements caught, the CLI.

Everything runs on the CPU with the patches' CPU implementations (what the model itself runs there).
"""

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from e2eprof.microbench import capture_shapes, run_microbench
from e2eprof.microbench.bench import add_derived, poisoned_allocations
from e2eprof.microbench.capture import TensorSpec
from e2eprof.microbench.plausibility import judge_bandwidth
from e2eprof.registry import load_patch
from e2eprof.workloads.models import PRESETS

BATCH, SEQ = 2, 16
TINY = PRESETS["gpt2-tiny"]


@pytest.fixture(scope="module")
def softmax_specs():
    patch = load_patch("fastsoftmax").patch
    return capture_shapes(patch, "gpt2-tiny", device="cpu", precision="fp32", batch=BATCH, seq=SEQ)


@pytest.fixture(scope="module")
def softmax_table(softmax_specs):
    return run_microbench(load_patch("fastsoftmax").patch, softmax_specs, "cpu", use_compile=False)


def test_capture_finds_the_attention_scores_once_per_layer_and_step(softmax_specs):
    by_workload = {spec.workload: spec for spec in softmax_specs}
    assert sorted(by_workload) == ["infer", "train"]  # one distinct call each: every layer calls the same shape
    for workload, spec in by_workload.items():
        scores = spec.primary
        assert scores.shape == (BATCH, TINY["n_head"], SEQ, SEQ)  # (B, nh, T, T)
        assert scores.dtype == torch.float32 and scores.contiguous
        assert spec.kwargs == {"dim": -1}
        assert spec.calls_per_step == TINY["n_layer"]
        assert spec.autocast is False
    assert by_workload["train"].needs_grad and by_workload["train"].primary.requires_grad
    assert not by_workload["infer"].grad_enabled and not by_workload["infer"].needs_grad


def test_rows_bytes_and_bandwidth_follow_from_shape_and_time(softmax_table):
    timed = softmax_table[softmax_table.median_us.notna()]
    assert set(timed.impl) == {"replacement", "eager"}
    assert set(softmax_table[softmax_table.impl == "compile"].detail.str.startswith("not run")) == {True}
    assert set(timed["pass"]) == {"fwd", "fwd+bwd"}
    for _, row in timed.iterrows():
        n = BATCH * TINY["n_head"] * SEQ * SEQ
        size_in = torch.empty(0, dtype=getattr(torch, row.dtype_in)).element_size()
        size_out = torch.empty(0, dtype=getattr(torch, row.dtype_out)).element_size()
        forward = n * (size_in + size_out)  # x read, y written
        # backward: dy read, dx written, and the smaller of x / y re-read
        expected = forward if row["pass"] == "fwd" else forward + n * (size_out + size_in + min(size_in, size_out))
        assert row.bytes == expected, row
        assert row.bandwidth_gbs == pytest.approx(row.bytes / (row.median_us * 1e-6) / 1e9)
        assert row.roofline_share == pytest.approx(row.bandwidth_gbs / row.copy_gbs)
        assert row.trials == 30 and len(row.samples_us) == 30
        assert row.p10_us <= row.median_us <= row.p90_us
        assert row.passed
    repl = timed[timed.impl == "replacement"].set_index(["workload", "pass"])
    eager = timed[timed.impl == "eager"].set_index(["workload", "pass"])
    assert (repl.speedup_vs_eager == eager.median_us / repl.median_us).all()
    assert (repl.error <= repl.tolerance).all()
    assert softmax_table.copy_gbs.nunique() == 1 and softmax_table.copy_gbs.iloc[0] > 0


WRONG = {
    "half": "return F.softmax(input, dim=dim) * 0.5",
    # leaves the last row of every matrix unwritten: uninitialised memory
    "skip_row": textwrap.dedent("""\
        out = torch.empty_like(input)
        out[..., :-1, :] = F.softmax(input[..., :-1, :], dim=dim)
        return out"""),
    "lazy": "return torch.empty_like(input)",
}


def wrong_patch(tmp_path, kind):
    body = textwrap.indent(WRONG[kind], "    ")
    path = tmp_path / f"wrong_{kind}.py"
    path.write_text(textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        from e2eprof.kernels.fastsoftmax.patch import softmax_reference
        from e2eprof.patch import Patch

        def wrong(input, dim=None, _stacklevel=3, dtype=None):
        {body}

        PATCH = Patch(name="wrong", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
                      replacement=wrong, reference=softmax_reference, architectures=("gpt2",),
                      attn_implementation="eager")
        """).format(body=body))
    return load_patch(str(path)).patch


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_wrong_replacement_is_failed_and_claims_no_speedup(tmp_path, softmax_specs, kind):
    table = run_microbench(wrong_patch(tmp_path, kind), softmax_specs, "cpu", use_compile=False)
    repl = table[table.impl == "replacement"]
    assert len(repl) == 3  # train fwd, train fwd+bwd, infer fwd
    assert not repl.passed.any()
    assert repl.median_us.isna().all() and repl.speedup_vs_eager.isna().all()
    assert (repl.detail.str.len() > 0).all()
    if kind != "half":
        # Only the poison can make these fail every time: unwritten memory shows up as NaN.
        assert repl.detail.str.contains("NaN/Inf positions differ").all(), repl.detail.tolist()
    eager = table[table.impl == "eager"]
    assert eager.passed.all() and eager.median_us.notna().all()  # the stock op is still measured


def test_poisoned_allocations_fill_fresh_memory_with_nan_and_restore_torch_state():
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with poisoned_allocations():
        assert torch.isnan(torch.empty(1000)).all()
        assert torch.isnan(torch.empty_like(torch.ones(7, dtype=torch.bfloat16))).all()
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before


def test_class_target_layernorm_is_captured_with_its_module_and_passes():
    patch = load_patch("fastlayernorm").patch
    specs = capture_shapes(patch, "gpt2-tiny", device="cpu", precision="fp32", batch=1, seq=8, workloads=("train",))
    assert len(specs) == 1
    spec = specs[0]
    assert spec.kind == "class" and type(spec.module) is torch.nn.LayerNorm  # a stock copy, patch reverted
    assert spec.calls_per_step == 2 * TINY["n_layer"] + 1  # ln_1, ln_2 per block, ln_f
    table = run_microbench(patch, specs, "cpu", use_compile=False)
    repl = table[table.impl == "replacement"]
    assert list(repl["pass"]) == ["fwd", "fwd+bwd"] and repl.passed.all(), repl.detail.tolist()


def test_compile_row_times_the_compiled_stock_op_with_compile_time_apart(softmax_specs):
    infer = [s for s in softmax_specs if s.workload == "infer"]
    table = run_microbench(load_patch("fastsoftmax").patch, infer, "cpu", use_compile=True)
    compiled = table[table.impl == "compile"].iloc[0]
    if not compiled.passed and "compile failed" in str(compiled.detail):
        pytest.skip(f"torch.compile unavailable here: {compiled.detail}")
    assert compiled.passed and compiled.trials == 30
    assert compiled.compile_s > compiled.median_us / 1e6  # the first call compiled; the timed ones did not
    repl = table[table.impl == "replacement"].iloc[0]
    assert repl.speedup_vs_compile == pytest.approx(compiled.median_us / repl.median_us)


# ---- the real entry point ---------------------------------------------------------------------------------------

def e2eprof(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"}
    return subprocess.run([sys.executable, "-m", "e2eprof", "microbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


SMALL = ["--model", "gpt2-tiny", "--device", "cpu", "--batch", "1", "--seq", "8", "--no-sweep"]


def test_cli_writes_microbench_parquet(tmp_path):
    out = tmp_path / "mb"
    done = e2eprof([*SMALL, "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(out / "microbench.parquet")
    for column in ("patch", "impl", "source", "signature", "shape", "dtype_in", "dtype_out", "pass", "calls_per_step",
                   "median_us", "p10_us", "p90_us", "bytes", "bandwidth_gbs", "roofline_share", "copy_gbs", "error",
                   "tolerance", "passed", "speedup_vs_eager", "speedup_vs_compile", "compile_s", "device", "run_id",
                   "torch_version", "patch_source_sha256"):
        assert column in table.columns, column
    assert set(table.source) == {"model"} and table.model.iloc[0] == "gpt2-tiny"
    assert "fastsoftmax on gpt2-tiny" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--trials", "5"], "--trials: must be an integer >= 30, got 5"),
    (["--patch", "fastsoftmx"], "did you mean 'fastsoftmax'"),
    (["--dtype", "fp16"], "--dtype: fp16 autocast needs a CUDA device"),
    (["--model", "gpt2-tinny"], "--model: unknown model 'gpt2-tinny'"),
    (["--patch", "rmsnorm"], "applies to llama"),
    (["--seq", "100000"], "--seq"),
], ids=["trials", "patch", "dtype", "model", "wrong-architecture", "seq"])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = e2eprof([*SMALL, "--out", str(tmp_path / "mb"), *args], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "mb").exists()


def test_cli_refuses_an_existing_report_without_force(tmp_path):
    out = tmp_path / "mb"
    out.mkdir()
    (out / "microbench.parquet").write_bytes(b"earlier")
    done = e2eprof([*SMALL, "--out", str(out)], tmp_path)
    assert done.returncode == 2 and "--force" in done.stderr


# ---- the bandwidth floor ----------------------------------------------------------------------------------------
GIB = 2**30


@pytest.mark.parametrize("slow_us, expected", [
    (1e6 / 100, True),  # 1 GiB in 10 ms against a 100 GiB/s-ish copy: at the ceiling, within the margin
    (1e6 / 100 * 0.9, False),  # 11% faster than the fastest copy: skipped work or a wrong byte count
    (1e6 / 100 * 0.97, True),  # 3% over: measurement jitter, inside the 5% margin
])
def test_bandwidth_floor_judges_the_slow_trials_against_the_fast_copies(slow_us, expected):
    ceiling = GIB / 1e4 / 1e3 * 1.0  # GB/s at which 1 GiB takes exactly 1e4 us
    judged = judge_bandwidth(GIB, slow_us, ceiling, cache_bytes=64 << 20)
    assert judged.plausible is expected, judged
    assert judged.share == pytest.approx(1e4 / slow_us)
    if not expected:
        assert "faster than the bandwidth floor" in judged.reason


def test_bandwidth_floor_leaves_cache_sized_and_untimed_ops_unjudged():
    small = judge_bandwidth(1 << 20, 1.0, 10.0, cache_bytes=32 << 20)  # 100x the ceiling, but 1 MiB fits in cache
    assert small.plausible is None and small.share > 50 and "cache" in small.reason
    assert judge_bandwidth(GIB, float("nan"), 10.0, cache_bytes=0).plausible is None


def test_an_implausible_row_fails_and_claims_no_speedup(softmax_table):
    """The real table's timings against a copy ceiling set just under what its replacement rows achieved."""
    timed = softmax_table[(softmax_table.impl == "replacement") & softmax_table.median_us.notna()].iloc[0]
    ceiling = timed.bytes / timed.p90_us / 1e3 / 1.5  # the replacement looks 1.5x faster than any copy
    raw = softmax_table.drop(columns=["bandwidth_gbs", "copy_gbs", "roofline_share", "floor_share", "plausible",
                                      "plausibility", "speedup_vs_eager", "speedup_vs_compile"])
    frame = add_derived(raw, ceiling, ceiling, cache_bytes=0)
    row = frame.loc[timed.name]
    assert row.plausible is not pd.NA and not row.plausible
    assert not row.passed and "faster than the bandwidth floor" in row.detail
    assert pd.isna(row.speedup_vs_eager)
    # The same table judged against its own measured copy: every replacement row that was timed stays plausible,
    # or is left unjudged because gpt2-tiny's tensors fit in a CPU cache.
    assert not softmax_table.plausible.eq(False).fillna(False).any()
    assert (softmax_table.loc[softmax_table.median_us.notna(), "plausibility"] != "not timed").all()


def test_broadcast_inputs_count_their_memory_once():
    expanded = torch.zeros(16, 16).expand(8, 1, 16, 16)  # (B, 1, T, S) mask, stride 0 over the batch
    spec = TensorSpec.of(expanded)
    assert spec.nbytes == 16 * 16 * 4
    assert TensorSpec.of(torch.zeros(8, 1, 16, 16)).nbytes == 8 * 16 * 16 * 4


def test_the_gpu_cushion_grows_past_a_slow_host_dispatch_and_only_then():
    from e2eprof.microbench.timing import cushion_for

    assert cushion_for(host_us=100.0, cushion_us=500.0) is None
    assert cushion_for(host_us=399.0, cushion_us=500.0) is None
    assert cushion_for(host_us=450.0, cushion_us=500.0) == 900.0  # queueing took 90% of the spin: double it
    assert cushion_for(host_us=700.0, cushion_us=500.0) == 1400.0
    grown = cushion_for(host_us=700.0, cushion_us=500.0)
    assert cushion_for(host_us=700.0, cushion_us=grown) is None  # the grown cushion holds for the same dispatch


def test_default_out_is_under_the_ignored_runs_folder(tmp_path, monkeypatch):
    """Without --out, microbench writes under e2eprof-runs/ (as compare does), never into a tracked reports/."""
    from types import SimpleNamespace

    from e2eprof.microbench.command import _out_dir

    monkeypatch.chdir(tmp_path)
    out = _out_dir(SimpleNamespace(out=None, force=False), "my:softmax")
    assert out.parent == tmp_path / "e2eprof-runs" and out.name.endswith("-microbench-my_softmax") and out.is_dir()
    assert not (tmp_path / "reports").exists()
