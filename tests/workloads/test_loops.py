"""Workloads on gpt2-tiny on the CPU: steps run and do what a real loop does; capture is deterministic and harmless."""

import copy

import pytest
import torch

from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.loops import (
    MAX_CAPTURED_LOGITS,
    PRECISIONS,
    WORKLOADS,
    GenerateWorkload,
    logit_positions,
    make_workload,
)
from e2eprof.workloads.models import build_model, resolve_model

CPU = torch.device("cpu")
B, T, V = 2, 32, 512


def tiny(attn="eager"):
    return build_model(resolve_model("gpt2-tiny"), attn_implementation=attn, seed=0)


def batches(n=2, seq=T):
    return synthetic_token_batches(n, batch=B, seq=seq, vocab_size=V, seed=0, pin=False)


def rel_err(a, b):
    return (torch.linalg.norm((a - b).double()) / torch.linalg.norm(b.double()).clamp_min(1e-30)).item()


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def unchanged(model, snap):
    return all(torch.equal(v, snap[k]) for k, v in model.state_dict().items())


def expected_keys(workload):
    if workload.name == "train":
        return {"loss", "logits"} | {f"grad/{n}" for n, _ in workload.model.named_parameters()}
    return {"infer": {"logits", "loss"}, "decode": {"tokens", "prefill_logits"},
            "generate": {"tokens", "prefill_logits"}}[workload.name]


# --- step ---


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_step_runs(name, precision):
    w = make_workload(name, tiny(), CPU, precision)
    for b in batches():
        metrics = w.step(b)
    if name in ("decode", "generate"):
        assert set(metrics) == {"ttft_ms", "tpot_ms"} and metrics["ttft_ms"] > 0 and metrics["tpot_ms"] > 0
    else:
        assert metrics == {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_train_step_changes_weights_and_keeps_train_mode(precision):
    w = make_workload("train", tiny(), CPU, precision)
    assert w.model.training
    before = snapshot(w.model)
    w.step(batches()[0])
    assert not unchanged(w.model, before)
    assert w.model.training and len(w.optimizer.state) == len(list(w.model.parameters()))


def test_infer_and_generate_steps_leave_weights_alone():
    for name in ("infer", "decode", "generate"):
        w = make_workload(name, tiny(), CPU, "fp32")
        before = snapshot(w.model)
        w.step(batches()[0])
        assert unchanged(w.model, before) and not w.model.training


# --- capture ---


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_capture_keys_values_and_no_side_effects(name, precision):
    w = make_workload(name, tiny(), CPU, precision)
    b = batches()[0]
    w.step(b)  # so there are stale grads / optimizer state to preserve
    w.model.transformer.h[0].training = not w.model.transformer.h[0].training  # an odd per-module flag
    modes = [m.training for m in w.model.modules()]
    weights = snapshot(w.model)
    grads = [p.grad for p in w.model.parameters()]
    opt_state = copy.deepcopy(w.optimizer.state_dict()) if name == "train" else None

    out = w.capture(b)

    assert set(out) == expected_keys(w)
    for k, v in out.items():
        assert v.device.type == "cpu"
        assert v.dtype == (torch.int64 if k == "tokens" else torch.float32), k
        if v.is_floating_point():
            assert torch.isfinite(v).all(), k
    assert [m.training for m in w.model.modules()] == modes
    assert unchanged(w.model, weights)
    assert all(g is h for g, h in zip((p.grad for p in w.model.parameters()), grads))
    if name == "train":
        after = w.optimizer.state_dict()
        for i, s in opt_state["state"].items():
            assert all(torch.equal(s[k], after["state"][i][k]) for k in s)
    # Deterministic: eval mode, no dropout, so a second capture is bit-identical.
    again = w.capture(b)
    assert all(torch.equal(out[k], again[k]) for k in out)


def test_capture_shapes():
    b = batches()[0]
    train = make_workload("train", tiny(), CPU, "fp32").capture(b)
    assert train["loss"].shape == () and train["logits"].shape == (T, V)  # T * V < 4M: every position kept
    assert train["grad/transformer.wte.weight"].shape == (V, 64)
    gen = make_workload("generate", tiny(), CPU, "fp32", new_tokens=5).capture(b)
    assert gen["tokens"].shape == (B, 5) and gen["prefill_logits"].shape == (B, V)
    assert int(gen["tokens"].min()) >= 0 and int(gen["tokens"].max()) < V


def test_capture_logits_are_the_models_logits():
    model, b = tiny(), batches()[0]
    with torch.no_grad():
        full = model(b).logits  # (B, T, V)
    out = make_workload("infer", model, CPU, "fp32").capture(b)
    assert torch.equal(out["logits"], full[0])
    gen = make_workload("generate", model, CPU, "fp32").capture(b)
    assert torch.equal(gen["prefill_logits"], full[:, -1])
    assert torch.equal(gen["tokens"][:, 0], full[:, -1].argmax(-1))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_fp64_reference_matches_fp32(name):
    model, b = tiny(), batches()[0]
    ref = make_workload(name, copy.deepcopy(model).double(), CPU, "fp64").capture(b)
    got = make_workload(name, model, CPU, "fp32").capture(b)
    assert set(ref) == set(got)
    for k in ref:
        if k == "tokens":
            assert torch.equal(ref[k], got[k])
        else:
            assert ref[k].dtype == torch.float64
            assert rel_err(got[k], ref[k]) < 1e-4, k


def test_sdpa_and_eager_captures_agree():
    b = batches()[0]
    a = make_workload("train", tiny("eager"), CPU, "fp32").capture(b)
    s = make_workload("train", tiny("sdpa"), CPU, "fp32").capture(b)
    for k in a:
        assert rel_err(s[k], a[k]) < 1e-5, k


# --- generate ---


def test_generate_matches_full_forward_greedy():
    # The hand-written KV-cache loop must produce what re-running the whole sequence would.
    model, b = tiny(), batches()[0]
    tokens = make_workload("generate", model, CPU, "fp32", new_tokens=6).capture(b)["tokens"]
    seq = b.clone()
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, seq[:, T:])


def test_generate_truncates_prompt_to_fit():
    w = make_workload("generate", tiny(), CPU, "fp32", new_tokens=4)
    long = synthetic_token_batches(1, B, 300, V, seed=1, pin=False)[0]  # longer than n_positions=256
    assert w.capture(long)["tokens"].shape == (B, 4)
    assert set(w.step(long)) == {"ttft_ms", "tpot_ms"}


def test_generate_option_validation():
    with pytest.raises(ValueError, match="new_tokens"):
        GenerateWorkload(tiny(), CPU, "fp32", new_tokens=1)
    with pytest.raises(ValueError, match="no room"):
        GenerateWorkload(tiny(), CPU, "fp32", new_tokens=256)


# --- construction errors ---


def test_unknown_workload_suggests():
    with pytest.raises(ValueError, match=r"unknown workload 'trian' \(did you mean 'train'\?\); known: train, infer"):
        make_workload("trian", tiny(), CPU, "fp32")


def test_unknown_precision_and_option():
    with pytest.raises(ValueError, match=r"unknown precision 'bf61' \(did you mean 'bf16'\?\)"):
        make_workload("infer", tiny(), CPU, "bf61")
    with pytest.raises(ValueError, match=r"no option 'new_token' \(did you mean 'new_tokens'\?\)"):
        make_workload("generate", tiny(), CPU, "fp32", new_token=3)
    with pytest.raises(ValueError, match="no option 'lr'"):
        make_workload("infer", tiny(), CPU, "fp32", lr=1.0)


def test_precision_must_match_weights():
    with pytest.raises(ValueError, match=r"needs float64 weights.*model.double\(\)"):
        make_workload("infer", tiny(), CPU, "fp64")
    with pytest.raises(ValueError, match="needs float32 weights, model has float64"):
        make_workload("infer", tiny().double(), CPU, "fp32")


def test_logit_positions():
    assert logit_positions(32, V).tolist() == list(range(32))
    pos = logit_positions(1024, 50257)  # gpt2: 83 rows of 50257
    assert len(pos) * 50257 <= MAX_CAPTURED_LOGITS < (len(pos) + 1) * 50257
    assert pos[0] == 0 and pos[-1] == 1023 and bool((pos.diff() > 0).all())
    assert PRECISIONS == ("fp32", "bf16", "fp16", "fp64")


@pytest.mark.parametrize("model_name", ["gpt2-tiny", "bert-tiny"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_infer_capture_loss_is_the_models_own(model_name, precision):
    # The capture calls the forward without labels (as the step does) and takes the loss with the model's loss
    # function: the same value the model's forward gives when it is handed the labels.
    model = build_model(resolve_model(model_name), attn_implementation="eager", seed=0)
    workload = make_workload("infer", model, CPU, precision)
    b = batches()[0]
    with torch.no_grad(), workload._autocast():
        own = model(**workload._model_inputs(b, labels=True)).loss
    assert torch.equal(workload.capture(b)["loss"], own.float())


def test_infer_capture_reuses_the_compiled_steps_graph():
    # A compiled arm's capture must not compile another graph (on the H200 that was 10-17 s of every default run).
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    workload = make_workload("infer", torch.compile(tiny(), backend=counter), CPU, "fp32")
    b = batches()[0]
    workload.step(b)
    compiled = counter.frame_count
    assert compiled >= 1
    out = workload.capture(b)
    assert counter.frame_count == compiled
    assert torch.isfinite(out["loss"]) and out["logits"].shape == (T, V)
    torch._dynamo.reset()
