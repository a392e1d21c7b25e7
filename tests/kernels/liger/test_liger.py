"""Liger-Kernel's patches: registry visibility, the adapters on tiny GPT-2/Llama/BERT, and Liger's kernels for real
under the Triton interpreter where they run there (softmax, RoPE, cross entropy, FLCE; RMSNorm, LayerNorm and
SwiGLU pass float arguments the interpreter rejects, so for those the adapter logic is tested)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("liger_kernel")

from e2eprof.env import capture_environment  # noqa: E402
from e2eprof.errors import PatchError  # noqa: E402
from e2eprof.patching import apply_patch  # noqa: E402
from e2eprof.patching.scope import check_device, fit_workloads  # noqa: E402
from e2eprof.registry import LIGER_PATCHES, known_patch_names, load_patch  # noqa: E402
from e2eprof.workloads.models import build_model, resolve_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Liger's kernels on the CPU need TRITON_INTERPRET=1")

# Where each patch applies, and the sites it replaces in the tiny presets (2 layers each).
SITES = {
    "liger-rmsnorm": ("llama-tiny", "eager", 2 * 2 + 1),
    "liger-layernorm": ("gpt2-tiny", "eager", 2 * 2 + 1),
    "liger-swiglu": ("llama-tiny", "eager", 2),
    "liger-softmax": ("bert-tiny", "eager", 3),  # a function target is one site in each modeling module
    "liger-rope": ("llama-tiny", "eager", 1),
    "liger-cross-entropy": ("gpt2-tiny", "eager", 1),
    "liger-flce": ("llama-tiny", "eager", 1),
    "liger-flce-gpt2": ("gpt2-tiny", "eager", 1),
}


def _model(preset: str, attn: str = "eager"):
    model = build_model(resolve_model(preset), attn_implementation=attn, seed=0)
    return model.eval()


def _ids(model, batch=2, seq=16) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))


def test_every_liger_patch_is_a_builtin_name_and_loads():
    assert set(SITES) == set(LIGER_PATCHES)
    for name in LIGER_PATCHES:
        loaded = load_patch(name)
        assert loaded.origin == "builtin" and loaded.patch.name == name and loaded.patch.requires_triton
        assert name in known_patch_names()


def test_list_shows_liger_patches_and_env_records_the_version():
    result = subprocess.run([sys.executable, "-m", "e2eprof", "list"], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in LIGER_PATCHES:
        assert f"  {name} " in result.stdout
    assert capture_environment("cpu")["liger_kernel"] == importlib.metadata.version("liger-kernel")


def test_without_liger_the_names_are_not_offered_and_asking_says_how_to_install():
    # sys.modules[name] = None is Python's own way to make a package unimportable.
    code = ("import sys; sys.modules['liger_kernel'] = None\n"
            "from e2eprof import catalog\nfrom e2eprof.registry import load_patch\n"
            "print(sorted(catalog.builtin_patches()))\n"
            "try:\n    load_patch('liger-flce')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "liger" not in result.stdout.splitlines()[0]
    assert "PatchError patch 'liger-flce' needs Liger-Kernel: pip install e2eprof[liger]" in result.stdout


@pytest.mark.parametrize("name", sorted(SITES))
def test_adapter_installs_on_its_model_and_reverts(name):
    preset, attn, sites = SITES[name]
    patch = load_patch(name).patch
    model = _model(preset, attn)
    classes = [type(m) for m in model.modules()]
    applied = apply_patch(patch, model)
    try:
        assert applied.n_sites == sites
        if isinstance(patch.replacement, type):
            assert sum(type(m) is patch.replacement for m in model.modules()) == sites
    finally:
        applied.revert()
    assert [type(m) for m in model.modules()] == classes
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize("name, preset", [("liger-rmsnorm", "gpt2-tiny"), ("liger-swiglu", "bert-tiny"),
                                          ("liger-layernorm", "llama-tiny"), ("liger-flce", "gpt2-tiny")])
def test_adapter_refuses_an_architecture_it_does_not_patch(name, preset):
    with pytest.raises(PatchError, match="applies to"):
        apply_patch(load_patch(name).patch, _model(preset))


def test_triton_only_patches_are_refused_on_a_cpu_without_the_interpreter(monkeypatch):
    patch = load_patch("liger-softmax").patch
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(PatchError, match="only Triton kernels"):
        check_device(patch, "cpu")
    check_device(patch, "cuda:0")  # nothing to refuse on a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_device(patch, "cpu")


def test_flce_runs_only_in_training():
    patch = load_patch("liger-flce").patch
    assert fit_workloads(patch, ("train",), defaulted=False) == (("train",), None)
    kept, note = fit_workloads(patch, ("train", "infer", "decode"), defaulted=True)
    assert kept == ("train",) and "not running infer, decode" in note
    with pytest.raises(PatchError, match="applies to the workloads train"):
        fit_workloads(patch, ("infer",), defaulted=False)
    assert fit_workloads(load_patch("liger-softmax").patch, ("infer",), defaulted=False) == (("infer",), None)


def test_cli_refuses_an_explicit_inference_workload_for_flce():
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "llama-tiny", "--patch", "liger-flce",
                             "--workload", "infer", "--device", "cpu"], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "applies to the workloads train" in result.stderr


# ---- Liger's kernels for real, under the interpreter, in fp32 ---------------------------------------------------

def _verified(patch, model, run):
    """run(model) once with every call of the patch verified; the per-call checks afterwards."""
    applied = apply_patch(patch, model)
    try:
        applied.set_verify(True, extended=False)
        run(model)
        return applied.checks()
    finally:
        applied.revert()


def _train(model):
    ids = _ids(model)
    model(input_ids=ids, labels=ids).loss.backward()


@needs_interpreter
def test_liger_softmax_passes_every_check_in_bert_training():
    checks = _verified(load_patch("liger-softmax").patch, _model("bert-tiny"), _train)
    assert checks and all(c.passed and not any(v[0] for v in c.findings.values()) for c in checks), \
        [(c.problems, c.findings) for c in checks]


@needs_interpreter
@pytest.mark.parametrize("name, preset", [("liger-rope", "llama-tiny"), ("liger-cross-entropy", "gpt2-tiny")])
def test_liger_ops_that_write_their_inputs_are_caught_but_right_in_value(name, preset):
    # The stock op gets copies of the inputs as they were, so the values agree; changing q/k (RoPE) or the logits
    # (cross entropy: the gradient is written into them) in place is what input_mutated reports.
    checks = _verified(load_patch(name).patch, _model(preset), _train)
    assert checks and all(c.passed for c in checks), [c.problems for c in checks]
    assert all(c.findings.get("input_mutated", [0])[0] == c.calls for c in checks)


@needs_interpreter
@pytest.mark.parametrize("name, preset", [("liger-flce", "llama-tiny"), ("liger-flce-gpt2", "gpt2-tiny")])
def test_flce_gives_the_stock_loss_and_gradients_without_logits(name, preset):
    model = _model(preset)
    ids = _ids(model)
    stock = model(input_ids=ids, labels=ids)
    stock.loss.backward()
    stock_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    applied = apply_patch(load_patch(name).patch, model)
    try:
        out = model(input_ids=ids, labels=ids)
        assert out.logits is None and applied.calls == 1
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():  # inference (no gradients): the stock head, logits and all
            assert model(input_ids=ids, labels=ids).logits is not None
        applied.set_verify(True, extended=False)
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids)
        checks = applied.checks()
    finally:
        applied.revert()
    torch.testing.assert_close(out.loss, stock.loss, rtol=1e-5, atol=0)
    assert grads.keys() == stock_grads.keys()
    for n, g in stock_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6)
    assert checks and all(c.passed and not any(v[0] for v in c.findings.values()) for c in checks), \
        [(c.problems, c.findings) for c in checks]


@needs_interpreter
def test_flce_without_declaring_omitted_logits_fails_the_check():
    from dataclasses import replace
    patch = replace(load_patch("liger-flce").patch, omitted_outputs=())
    checks = _verified(patch, _model("llama-tiny"), _train)
    assert checks and not all(c.passed for c in checks)
    assert any("output has no logits" in p for c in checks for p in c.problems)


def test_liger_cross_entropy_reference_is_fp64_cross_entropy():
    from e2eprof.kernels.liger.losses import cross_entropy_reference
    logits, labels = torch.randn(6, 10, dtype=torch.float64), torch.tensor([1, 2, -100, 3, 4, 5])
    torch.testing.assert_close(cross_entropy_reference(logits, labels), F.cross_entropy(logits, labels))


@needs_interpreter
def test_flce_compare_end_to_end_on_the_cpu(tmp_path):
    import json

    import pandas as pd

    out = tmp_path / "flce"
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "llama-tiny", "--patch", "liger-flce",
                             "--device", "cpu", "--steps", "6", "--block-steps", "2", "--out", str(out)],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            timeout=900)
    assert result.returncode in (0, 1, 3), result.stderr
    assert "not running infer, decode" in result.stderr + result.stdout
    assert "x baseline)" in result.stdout  # peak memory against the baseline's, in the console summary
    correctness = pd.read_parquet(out / "correctness.parquet")
    patched = correctness[correctness.arm == "patched"]
    omitted = patched[patched.metric == "omitted_outputs"]
    assert list(omitted.tensor) == ["logits"] and omitted.passed.all()
    assert not (patched.metric == "missing_outputs").any()
    grads = patched[(patched.metric == "rel_error_vs_fp64") & patched.tensor.str.startswith("grad/")]
    assert len(grads) > 1 and grads.passed.all()
    assert patched[patched.tensor == "loss"].passed.all()
    summary = pd.read_parquet(out / "summary.parquet")
    assert list(summary.workload.unique()) == ["train"]
    assert summary.set_index("arm").loc["patched", "peak_memory_vs_baseline"] > 0
    env = json.loads(pd.read_parquet(out / "run.parquet").environment_json.iloc[0])
    assert env["liger_kernel"] == importlib.metadata.version("liger-kernel")
