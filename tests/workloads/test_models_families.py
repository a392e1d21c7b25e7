"""Llama and BERT presets and folders, and the workloads each family runs (causal LM vs masked-LM encoder)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.presets import PRESETS
from e2eprof.workloads.loops import (
    IGNORE_INDEX,
    check_workloads,
    make_workload,
    mlm_mask,
    supported_workloads,
)
from e2eprof.workloads.models import (
    ModelLoadError,
    ModelSource,
    build_model,
    describe,
    max_positions,
    objective,
    resolve_model,
)

CPU = torch.device("cpu")
B, T = 2, 20
TINY = ("llama-tiny", "bert-tiny")


def build(name, seed=0, attn="eager"):
    return build_model(resolve_model(name), attn_implementation=attn, seed=seed)


def batch(vocab=512, seq=T, seed=0):
    return synthetic_token_batches(1, batch=B, seq=seq, vocab_size=vocab, seed=seed, pin=False)[0]


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- presets ---


@pytest.mark.parametrize("name,arch", [("llama-1b", "llama"), ("llama-tiny", "llama"), ("bert-base", "bert"),
                                       ("bert-tiny", "bert")])
def test_resolve_family_presets(name, arch):
    assert resolve_model(name) == ModelSource(kind="preset", name=name, path=None, architecture=arch)


@pytest.mark.parametrize("name,expected", [
    # TinyLlama-1.1B's published count; BERT-base with its masked-LM head (decoder tied to the word embeddings).
    ("llama-1b", {"n_params": 1_100_048_384, "architecture": "llama", "vocab_size": 32000, "max_positions": 2048,
                  "n_layer": 22}),
    ("bert-base", {"n_params": 109_514_298, "architecture": "bert", "vocab_size": 30522, "max_positions": 512,
                   "n_layer": 12}),
])
def test_full_size_presets(name, expected):
    # On the meta device: the real shapes and parameter count without allocating gigabytes.
    with torch.device("meta"):
        model = build(name, attn="sdpa")
    assert describe(model) == expected


def test_llama_1b_shape_is_tinyllama():
    with torch.device("meta"):
        model = build("llama-1b", attn="sdpa")
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads) == (2048, 5632, 32, 4)
    attn = model.model.layers[0].self_attn
    # Grouped-query attention: keys and values have 4 heads of 64, queries 32.
    assert attn.q_proj.out_features == 2048 and attn.k_proj.out_features == attn.v_proj.out_features == 256
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied, as in TinyLlama


@pytest.mark.parametrize("name,expected", [
    # embed 512*64 + 2 layers * (attn 64*64*2 + 64*32*2, mlp 3*64*176, 2 norms of 64) + final norm 64 + head 512*64
    ("llama-tiny", {"n_params": 158_016, "architecture": "llama", "vocab_size": 512, "max_positions": 256,
                    "n_layer": 2}),
    ("bert-tiny", {"n_params": 154_176, "architecture": "bert", "vocab_size": 512, "max_positions": 256,
                   "n_layer": 2}),
])
def test_tiny_presets(name, expected):
    model = build(name)
    assert describe(model) == expected
    assert next(model.parameters()).dtype == torch.float32 and not model.training


def test_llama_tiny_keeps_grouped_query_attention():
    c = build("llama-tiny").config
    assert c.num_key_value_heads < c.num_attention_heads


def test_model_classes_follow_the_objective():
    assert type(build("llama-tiny")).__name__ == "LlamaForCausalLM"
    assert type(build("bert-tiny")).__name__ == "BertForMaskedLM"
    assert objective("llama") == "causal-lm" and objective("gpt2") == "causal-lm" and objective("bert") == "masked-lm"


@pytest.mark.parametrize("name", TINY)
def test_seeded_weights(name):
    assert same_weights(build(name, seed=0), build(name, seed=0))
    assert not same_weights(build(name, seed=0), build(name, seed=1))


@pytest.mark.parametrize("name", TINY)
def test_eager_and_sdpa_agree(name):
    eager, sdpa = build(name, attn="eager"), build(name, attn="sdpa")
    assert same_weights(eager, sdpa)
    ids = batch()
    with torch.no_grad():
        a, b = eager(input_ids=ids).logits, sdpa(input_ids=ids).logits
    assert torch.linalg.norm(a - b) / torch.linalg.norm(a) < 1e-5


def test_unknown_name_suggests_the_new_presets():
    with pytest.raises(ModelLoadError, match=r"did you mean 'llama-tiny'\?"):
        resolve_model("llama-tinny")
    with pytest.raises(ModelLoadError, match=r"did you mean 'bert-base'\?"):
        resolve_model("bert-bse")


# --- workloads per family ---


def test_supported_workloads():
    assert supported_workloads("llama") == ("train", "infer", "decode", "generate")
    assert supported_workloads("gpt2") == ("train", "infer", "decode", "generate")
    assert supported_workloads("bert") == ("train", "infer")


@pytest.mark.parametrize("name", TINY)
def test_each_workload_runs_one_step(name):
    model = build(name)
    for workload in supported_workloads(model.config.model_type):
        options = {"new_tokens": 3} if workload in ("decode", "generate") else {}
        w = make_workload(workload, model, CPU, "fp32", **options)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        metrics = w.step(batch())
        changed = not all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert changed == (workload == "train")  # only training updates weights
        out = w.capture(batch())
        for key, value in out.items():
            if value.is_floating_point():
                assert torch.isfinite(value).all(), (workload, key)
        if workload in ("decode", "generate"):
            assert set(metrics) == {"ttft_ms", "tpot_ms"} and out["tokens"].shape == (B, 3)
        else:
            assert out["loss"].shape == () and out["logits"].shape == (T, 512)


def test_generate_on_bert_is_refused_naming_what_it_runs():
    with pytest.raises(ValueError, match=r"needs a causal LM.*'bert'.*runs train, infer"):
        make_workload("generate", build("bert-tiny"), CPU, "fp32")
    with pytest.raises(ValueError, match=r"^--workload: 'bert-tiny' is an encoder .*runs train, infer; generate"):
        check_workloads(resolve_model("bert-tiny"), ("train", "generate"), 16)
    check_workloads(resolve_model("bert-tiny"), ("train", "infer"), 16)
    check_workloads(resolve_model("llama-tiny"), ("train", "infer", "generate"), 16)


def test_sequence_longer_than_the_position_table_is_refused():
    with pytest.raises(ValueError, match=r"^--seq: 1024 tokens is more than 'bert-base' has positions for \(512\)"):
        check_workloads(resolve_model("bert-base"), ("infer",), 1024)
    check_workloads(resolve_model("bert-base"), ("infer",), 512)
    assert max_positions(resolve_model("gpt2")) == 1024 and max_positions(resolve_model("llama-1b")) == 2048


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_presets_position_count_read_from_its_entry_is_its_configs(name):
    """max_positions reads a preset's entry instead of building its config (start-up time): the two must agree."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**PRESETS[name])
    assert max_positions(resolve_model(name)) == config.max_position_embeddings


def test_reading_a_presets_position_count_imports_no_transformers():
    code = ("import sys; from e2eprof.workloads.models import max_positions, resolve_model; "
            "print(max_positions(resolve_model('gpt2')), any(m.startswith('transformers') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1024", "False"]


def test_mlm_mask_is_fixed_and_covers_15_percent():
    mask = mlm_mask(3, 40)
    assert mask.dtype == torch.bool and mask.shape == (3, 40)
    assert mask.sum(dim=1).tolist() == [6, 6, 6]  # round(0.15 * 40)
    assert torch.equal(mask, mlm_mask(3, 40))  # the same in every call (and process: fixed seed)
    assert mlm_mask(2, 3).sum(dim=1).tolist() == [1, 1]  # at least one position, so the loss is defined


def test_bert_train_loss_is_the_masked_lm_loss():
    model = build("bert-tiny")
    ids = batch()
    w = make_workload("infer", model, CPU, "fp32")
    out = w.capture(ids)
    mask = mlm_mask(B, T)
    masked = ids.masked_fill(mask, 103)  # BERT's [MASK] id, inside the 512-token vocabulary
    with torch.no_grad():
        logits = model(input_ids=masked).logits  # (B, T, V)
    labels = ids.masked_fill(~mask, IGNORE_INDEX)
    expected = F.cross_entropy(logits.reshape(-1, 512), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(out["logits"], logits[0], rtol=0, atol=0)


def test_bert_fp64_reference_matches_fp32():
    model = build("bert-tiny")
    ref = make_workload("train", build("bert-tiny").double(), CPU, "fp64").capture(batch())
    got = make_workload("train", model, CPU, "fp32").capture(batch())
    assert set(ref) == set(got)
    for key in ref:
        assert ref[key].dtype == torch.float64
        ref_norm, diff_norm = torch.linalg.norm(ref[key]), torch.linalg.norm((got[key] - ref[key]).double())
        if ref_norm < 1e-12:
            # The attention key bias's gradient is exactly zero (softmax ignores a constant added to a row of
            # scores): both runs give rounding noise, fp32's just larger.
            assert key.endswith("key.bias") and diff_norm < 1e-6, key
        else:
            assert diff_norm / ref_norm < 1e-4, key


# --- folders ---


@pytest.mark.parametrize("name", TINY)
def test_folder_round_trip(name, tmp_path):
    original = build(name, seed=3)
    original.save_pretrained(tmp_path, safe_serialization=True)
    source = resolve_model(str(tmp_path))
    assert source == ModelSource(kind="folder", name=tmp_path.name, path=str(tmp_path.resolve()),
                                 architecture=original.config.model_type)
    loaded = build_model(source, attn_implementation="sdpa", seed=0)
    assert type(loaded) is type(original) and same_weights(original, loaded)
    assert describe(loaded) == describe(original)
    assert max_positions(source) == 256
    ids = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, original(input_ids=ids).logits)


def test_bert_folder_without_its_masked_lm_head_is_refused(tmp_path):
    from transformers import AutoConfig, BertModel

    from e2eprof.workloads.models import PRESETS

    BertModel(AutoConfig.for_model(**PRESETS["bert-tiny"])).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ModelLoadError, match=r"missing: cls\.predictions.*masked-LM head"):
        build_model(resolve_model(str(tmp_path)), attn_implementation="eager", seed=0)


# --- the real entry point refuses before measuring ---


@pytest.mark.parametrize("args,message", [
    (["--model", "bert-tiny", "--workload", "generate"], "--workload: 'bert-tiny' is an encoder"),
    (["--model", "bert-tiny", "--workload", "infer", "--seq", "300"], "--seq: 300 tokens is more than"),
])
def test_cli_refuses_before_measuring(tmp_path, args, message):
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"}
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", *args, "--patch", "fastsoftmax",
                             "--device", "cpu", "--steps", "2", "--block-steps", "1", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not out.exists()  # nothing was measured or written
