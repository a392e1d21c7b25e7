"""The decode workload on CUDA: the one-token step captured once in a CUDA graph and replayed, with every built-in
kernel patched in, giving the tokens eager decoding gives; the torch.compile arm's reduce-overhead decoder too."""

from __future__ import annotations

import pytest
import torch

from e2eprof.trackers import jit_events
from e2eprof.patching import apply_patch
from e2eprof.registry import load_patch
from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.loops import make_workload
from e2eprof.workloads.models import build_model, resolve_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CASES = [("gpt2", "eager", None), ("gpt2", "sdpa", None), ("gpt2", "eager", "fastsoftmax"),
         ("gpt2", "eager", "fusedsoftmax"), ("gpt2", "sdpa", "fastgelu"), ("gpt2", "sdpa", "fastlayernorm"),
         ("llama-tiny", "sdpa", "rmsnorm"), ("llama-tiny", "sdpa", "swiglu")]


@pytest.fixture
def patched_model():
    """Builds a model with a patch applied, and reverts the patch after the test: a patch replaces functions in
    shared modules (torch.nn.functional.softmax for GPT-2's attention), which would leak into later tests."""
    applied = []

    def build(name: str, attn: str, patch: str | None):
        model = build_model(resolve_model(name), attn_implementation=attn, seed=0)
        if patch:
            applied.append(apply_patch(load_patch(patch).patch, model))
        return model

    yield build
    for patch in applied:
        patch.revert()


def _model(name: str, attn: str, patch: str | None):
    assert patch is None
    return build_model(resolve_model(name), attn_implementation=attn, seed=0)


@pytest.mark.parametrize("name, attn, patch", CASES, ids=[f"{n}-{a}-{p or 'stock'}" for n, a, p in CASES])
def test_graph_replays_give_the_eager_tokens_and_capture_once(name, attn, patch, patched_model):
    jit_events.install()
    model = patched_model(name, attn, patch)
    batches = synthetic_token_batches(2, 4, 128, model.config.vocab_size, seed=1, pin=True)
    decode = make_workload("decode", model, "cuda", "fp32", new_tokens=8)
    eager = decode.capture(batches[0])["tokens"]
    before = jit_events.snapshot()["graph_captures"]
    metrics = [decode.step(batches[0]) for _ in range(3)]
    assert decode.captures == 1 and jit_events.snapshot()["graph_captures"] - before == 1
    replayed, _, _ = decode._decode(batches[0], replay=True)
    assert torch.equal(replayed, eager), "graph replays decoded other tokens than eager decoding"
    assert all(m["tpot_ms"] > 0 and m["ttft_ms"] > 0 for m in metrics)
    # another batch of the same shape: replays of the same graph, no new capture
    decode.step(batches[1])
    assert decode.captures == 1


def test_graphs_take_the_host_out_of_decoding():
    model = _model("gpt2", "sdpa", None)
    batches = synthetic_token_batches(1, 8, 1024, model.config.vocab_size, seed=1, pin=True)
    graphs = make_workload("decode", model, "cuda", "bf16", new_tokens=16)
    plain = make_workload("decode", model, "cuda", "bf16", new_tokens=16, graphs=False)
    for workload in (graphs, plain):
        workload.step(batches[0])
    tpot = {w: sorted(x.step(batches[0])["tpot_ms"] for _ in range(7))[3] for w, x in (("graphs", graphs), ("plain", plain))}
    print(f"gpt2 batch 8 decode TPOT, median of 7: {tpot}")
    assert tpot["graphs"] < tpot["plain"]


def test_the_compile_arm_decodes_with_reduce_overhead_and_the_same_tokens():
    jit_events.install()
    model = _model("gpt2", "sdpa", None)
    batches = synthetic_token_batches(1, 4, 128, model.config.vocab_size, seed=1, pin=True)
    eager = make_workload("decode", model, "cuda", "fp32", new_tokens=8).capture(batches[0])["tokens"]
    compiled = make_workload("decode", torch.compile(model), "cuda", "fp32", new_tokens=8)
    print(f"eager tokens {eager.tolist()}")
    compiled.step(batches[0])
    before = jit_events.snapshot()
    for _ in range(3):
        compiled.step(batches[0])
    after = jit_events.snapshot()
    assert after["compile_graphs"] == before["compile_graphs"], "recompiled on a later step"
    tokens = compiled.capture(batches[0])["tokens"]
    print(f"compiled tokens {tokens.tolist()}")
    # Inductor's kernels round differently from eager ones; a random-init model's logits are nearly flat, so the
    # decoders must agree on most tokens, not all (the gate judges agreement against fp64 the same way).
    assert (tokens == eager).float().mean() >= 0.75
