"""The trained-like model (workloads.trained_like): the transform gives the statistics it claims, on every family,
and the gate's capture on it checks the patched calls and puts the pristine weights back."""

import pytest
import torch

from e2eprof.checks.correctness import op_check_rows
from e2eprof.patching import call_check_rows
from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker
from e2eprof.workloads import trained_like
from e2eprof.workloads.models import build_model, resolve_model


def model_and_batch(name: str, batch: int = 4, seq: int = 64):
    model = build_model(resolve_model(name), attn_implementation="eager", seed=0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "bert-tiny"])
def test_the_transform_gives_trained_checkpoint_statistics(name):
    model, ids = model_and_batch(name)
    before = trained_like.statistics(model, ids, None)
    # Random init: logits near zero, channels alike, rows centred. The thresholds below are what the transform
    # must clear, so a transform that did nothing would fail them.
    assert before["logit_max"] < 1 and before["outlier_ratio"] < 3 and before["row_mean_ratio"] < 1, before
    padded_ids, mask = trained_like.padded(ids, trained_like.pad_token_id(model.config))
    moved = trained_like.transform(model, padded_ids, mask, seed=0)
    after = trained_like.statistics(model, padded_ids, mask)
    assert 10 <= after["logit_max"] <= 100, after  # "in the tens"
    assert 0.5 * trained_like.LOGIT_STD <= after["logit_std"] <= 2 * trained_like.LOGIT_STD, after
    assert 20 <= after["outlier_ratio"] <= 100, after  # LLM.int8()'s 20-100x
    assert after["row_mean_ratio"] >= 5, after
    assert len(moved.outlier_channels) == 2 and len(moved.logit_gains) == model.config.num_hidden_layers
    if name == "bert-tiny":  # an encoder's pad keys are hidden from every query, but no query sees nothing
        assert after["masked_rows"] == 0
    else:  # a decoder's left-padded rows: each pad query sees only pad keys
        heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
        pad = int(ids.shape[1] * trained_like.PAD_FRACTION)
        assert after["masked_rows"] == (ids.shape[0] // 2) * pad * heads * layers, after


def test_the_padded_batch_pads_the_first_half_of_the_rows_on_the_left():
    ids = torch.arange(24).reshape(4, 6)
    padded, mask = trained_like.padded(ids, pad_token_id=99)
    assert mask.tolist() == [[0, 1, 1, 1, 1, 1]] * 2 + [[1] * 6] * 2
    assert padded[:2, 0].tolist() == [99, 99] and torch.equal(padded[:, 1:], ids[:, 1:]) and torch.equal(padded[2:], ids[2:])
    assert trained_like.padded(torch.zeros(1, 2, dtype=torch.long), 0)[1].tolist() == [[0, 1]]  # one row, one pad


def test_the_pad_token_is_one_the_vocabulary_has():
    class Config:
        vocab_size, pad_token_id, eos_token_id = 512, None, 50256  # gpt2-tiny keeps GPT-2's eos id
    assert trained_like.pad_token_id(Config) == 0
    Config.eos_token_id = [7, 8]
    assert trained_like.pad_token_id(Config) == 7


def test_a_model_without_query_and_key_projections_is_refused():
    class Bare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)

        def get_input_embeddings(self):
            return self.embed

    with pytest.raises(trained_like.NotTransformable, match="no query and key projections"):
        trained_like.transform(Bare(), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3), seed=0)


def trained_like_rows(tmp_path, model: str, patch: str, workload: str):
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("patched", "eager", True), model=model, patch_spec=patch, device="cpu",
                                precision="fp32", seed=0, batch=2, seq=32, new_tokens=4, scratch_dir=str(tmp_path)))
    arm.build()
    try:
        arm.cold(workload)
        grads = [None if p.grad is None else p.grad.clone() for p in arm.model.parameters()]
        result = arm.trained_like(workload)
        # As after the gate's capture: the weights as built (the timed phases start from them, in every arm).
        assert all(torch.equal(v.cpu(), arm.pristine[k]) for k, v in arm.model.state_dict().items()), "weights moved"
        assert all((g is None and p.grad is None) or torch.equal(g, p.grad) for g, p in zip(grads, arm.model.parameters())), \
            "the step's gradients were not put back"
    finally:
        arm.revert()
    checks = result["op_checks"]
    return checks, op_check_rows(workload, "patched", checks) + call_check_rows(workload, "patched", checks)


@pytest.mark.parametrize("workload", ["infer", "train"])
def test_a_genuine_kernel_passes_on_the_trained_like_model(tmp_path, workload):
    checks, rows = trained_like_rows(tmp_path, "gpt2-tiny", "fastsoftmax", workload)
    assert sum(c["calls"] for c in checks) == 2  # one softmax per layer
    assert all(c["stress_points"] == 1 for c in checks)  # its gradients on these values, once per signature
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]


def test_fully_masked_rows_of_a_padded_batch_catch_a_kernel_that_zeroes_them(tmp_path):
    # The same rogue passes every per-call check on the random-init model's unpadded batch (tests/e2eprof/test_rogues.py).
    _, rows = trained_like_rows(tmp_path, "gpt2-tiny", "tests/rogues/masked_rows_zeroed.py", "infer")
    assert "op_rel_error_vs_fp64" in {r["metric"] for r in rows if not r["passed"]}
