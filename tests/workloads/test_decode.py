"""The decode workload (static KV cache; CUDA graphs on a GPU, tests/gpu/test_decode_cuda.py) on the CPU: the same
greedy tokens as Hugging Face's dynamic-cache decoding, a cache rewound for every step, clear refusals."""

from __future__ import annotations

import pytest
import torch

from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.loops import check_workloads, make_workload
from e2eprof.workloads.models import build_model, resolve_model


@pytest.mark.parametrize("name, attn", [("gpt2-tiny", "eager"), ("gpt2-tiny", "sdpa"), ("llama-tiny", "sdpa"),
                                        ("llama-tiny", "eager")])
def test_static_cache_decoding_gives_dynamic_cache_tokens(name, attn):
    model = build_model(resolve_model(name), attn_implementation=attn, seed=0)
    batches = synthetic_token_batches(2, 2, 32, model.config.vocab_size, seed=1, pin=False)
    decode = make_workload("decode", model, "cpu", "fp32", new_tokens=6)
    generate = make_workload("generate", model, "cpu", "fp32", new_tokens=6)
    ours, theirs = decode.capture(batches[0]), generate.capture(batches[0])
    assert torch.equal(ours["tokens"], theirs["tokens"])
    assert torch.allclose(ours["prefill_logits"], theirs["prefill_logits"], rtol=1e-5, atol=1e-5)
    # Steps rewind the cache: decoding another batch and then this one again gives the same tokens.
    metrics = decode.step(batches[1])
    assert metrics["ttft_ms"] > 0 and metrics["tpot_ms"] > 0
    assert torch.equal(decode.capture(batches[0])["tokens"], ours["tokens"])
    assert decode.captures == 0 and not decode.use_graphs  # no CUDA graphs on a CPU


def test_a_prompt_of_another_shape_is_refused():
    model = build_model(resolve_model("gpt2-tiny"), attn_implementation="sdpa", seed=0)
    decode = make_workload("decode", model, "cpu", "fp32", new_tokens=4)
    decode.step(synthetic_token_batches(1, 2, 16, 512, seed=1, pin=False)[0])
    with pytest.raises(ValueError, match="prompt shape"):
        decode.step(synthetic_token_batches(1, 2, 24, 512, seed=1, pin=False)[0])


def test_an_encoder_cannot_decode():
    with pytest.raises(ValueError, match="needs a causal LM"):
        check_workloads(resolve_model("bert-tiny"), ["decode"], 16)
    with pytest.raises(ValueError, match="new_tokens"):
        make_workload("decode", build_model(resolve_model("gpt2-tiny"), attn_implementation="sdpa", seed=0), "cpu",
                      "fp32", new_tokens=1)


@pytest.mark.slow
def test_the_compile_arms_decoder_gives_the_same_tokens():
    model = build_model(resolve_model("gpt2-tiny"), attn_implementation="sdpa", seed=0)
    batch = synthetic_token_batches(1, 2, 32, model.config.vocab_size, seed=1, pin=False)[0]
    eager = make_workload("decode", model, "cpu", "fp32", new_tokens=6).capture(batch)["tokens"]
    compiled = make_workload("decode", torch.compile(model), "cpu", "fp32", new_tokens=6)
    assert compiled.compiled
    assert torch.equal(compiled.capture(batch)["tokens"], eager)
    assert compiled.step(batch)["tpot_ms"] > 0
