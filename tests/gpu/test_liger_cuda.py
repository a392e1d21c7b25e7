"""Liger-Kernel's patches compiled on CUDA, through the gate: every call of a bf16 training step verified (stock op
and fp64 reference, the anti-cheat checks), and for liger-flce a whole `e2eprof compare` of the train workload.

The CPU suite (tests/kernels/liger) runs the kernels the Triton interpreter can run and the adapter logic; RMSNorm,
LayerNorm and SwiGLU only run here. RoPE and cross entropy write their inputs in place by design (input_mutated).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
pytest.importorskip("liger_kernel")

from e2eprof.patching import apply_patch  # noqa: E402
from e2eprof.registry import LIGER_PATCHES, load_patch  # noqa: E402
from e2eprof.workloads.models import build_model, resolve_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = {
    "liger-rmsnorm": "llama-tiny", "liger-layernorm": "gpt2-tiny", "liger-swiglu": "llama-tiny",
    "liger-softmax": "gpt2-tiny", "liger-rope": "llama-tiny", "liger-cross-entropy": "llama-tiny",
    "liger-flce": "llama-tiny", "liger-flce-gpt2": "gpt2-tiny",
}
MUTATE_INPUTS = {"liger-rope", "liger-cross-entropy"}  # Liger writes q/k (RoPE) and the logits' gradient (CE) in place
# What the gate finds in Liger-Kernel 0.8.5 on the H200 (reports/2026-12-04-h200-gpu-tests): (patch, dtype) -> the
# check it fails and a phrase of its detail. A change in Liger, or in the gate, shows here as a failing test.
KNOWN_FINDINGS = {
    # Both overflow at |x| near fp32's largest / 4; Liger's backward gives NaN/Inf where the stock op's stays finite.
    ("liger-rmsnorm", "fp32"): ("stress", "near the dtype's largest, backward"),
    ("liger-rmsnorm", "bf16"): ("stress", "near the dtype's largest, backward"),
    # Under autocast Llama's cos/sin are fp32 and q/k bf16: the stock rotation promotes to fp32, Liger's returns bf16
    # (as Liger's own apply_liger_kernel_to_llama deploys it).
    ("liger-rope", "bf16"): ("output", "dtype bfloat16 != "),
}


def _checks(name: str, dtype: torch.dtype):
    patch = load_patch(name).patch
    model = build_model(resolve_model(MODELS[name]), attn_implementation=patch.model_attention, seed=0).cuda().eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    applied = apply_patch(patch, model)
    try:
        applied.set_verify(True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return applied.checks()
    finally:
        applied.revert()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(LIGER_PATCHES))
def test_liger_patch_through_the_per_call_gate(name, dtype):
    checks = _checks(name, dtype)
    assert checks, "the patch was never called"
    known = KNOWN_FINDINGS.get((name, "fp32" if dtype == torch.float32 else "bf16"))
    problems = [p for c in checks for p in c.problems]
    # An in-place kernel's other findings follow from its writes (a refilled input no longer matches: stale_output;
    # RoPE returns views of q and k with their strides): the mutation itself is what is asserted below.
    findings = {} if name in MUTATE_INPUTS else {m: v for c in checks for m, v in c.findings.items() if v[0]}
    if known is None:
        assert not problems, [(c.signature, c.problems) for c in checks]
        assert not findings, findings
    elif known[0] == "output":  # a per-call comparison with the stock op fails
        assert any(known[1] in p for p in problems), problems
    else:
        assert not problems, problems
        assert known[0] in findings and known[1] in findings[known[0]][1], findings
    if name in MUTATE_INPUTS and known is None:
        mutated = {c.signature: c.findings.get("input_mutated", [0])[0] for c in checks}
        assert all(mutated[c.signature] == c.calls for c in checks), mutated


def test_liger_flce_compare_passes_the_gate_and_saves_memory(tmp_path):
    out = tmp_path / "flce"
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "gpt2", "--patch", "liger-flce-gpt2",
                             "--batch", "8", "--seq", "1024", "--steps", "12", "--block-steps", "3", "--out", str(out)],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])},
                            timeout=1200)
    assert result.returncode in (0, 1, 3), result.stderr
    assert "not running infer, decode" in result.stderr + result.stdout
    correctness = pd.read_parquet(out / "correctness.parquet")
    patched = correctness[correctness.arm == "patched"]
    assert (patched.metric == "omitted_outputs").any()
    assert patched[patched.metric == "rel_error_vs_fp64"].passed.all()
    summary = pd.read_parquet(out / "summary.parquet")
    ratio = summary[summary.arm == "patched"].peak_memory_vs_baseline.iloc[0]
    assert ratio < 1.0, f"FLCE did not lower the peak: {ratio:.3f}x the baseline's"
    env = json.loads(pd.read_parquet(out / "run.parquet").environment_json.iloc[0])
    assert env["liger_kernel"]
