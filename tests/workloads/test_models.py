"""Presets, folders and the errors users see; weights are reproducible from the seed across processes."""

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from e2eprof.workloads.models import PRESETS, ModelLoadError, ModelSource, build_model, describe, resolve_model

TINY = resolve_model("gpt2-tiny")


def tiny(seed=0, attn="eager"):
    return build_model(TINY, attn_implementation=attn, seed=seed)


def state_hash(model) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- presets ---


def test_resolve_presets():
    for name in PRESETS:
        assert resolve_model(name) == ModelSource(kind="preset", name=name, path=None, architecture=PRESETS[name]["model_type"])


def test_gpt2_preset_is_gpt2_small():
    model = build_model(resolve_model("gpt2"), attn_implementation="sdpa", seed=0)
    info = describe(model)
    # The published GPT-2 small count: 124,439,808 with the LM head tied to the token embedding.
    assert info == {"n_params": 124_439_808, "architecture": "gpt2", "vocab_size": 50257, "max_positions": 1024,
                    "n_layer": 12}
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert model.config.n_head == 12 and model.config.n_embd == 768


def test_tiny_preset():
    info = describe(tiny())
    # wte 512*64 + wpe 256*64 + 2 blocks * 49,984 + final LayerNorm 128
    assert info == {"n_params": 149_248, "architecture": "gpt2", "vocab_size": 512, "max_positions": 256,
                    "n_layer": 2}


def test_same_seed_same_weights_other_seed_different():
    assert same_weights(tiny(seed=0), tiny(seed=0))
    assert not same_weights(tiny(seed=0), tiny(seed=1))


def test_a_cpu_device_builds_as_the_default_does():
    # Only a CUDA device draws the weights elsewhere (tests/gpu/test_models_cuda.py); "cpu" is the default build.
    assert same_weights(tiny(seed=0), build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0,
                                                  device="cpu"))


def test_build_leaves_global_rng_alone():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    tiny(seed=0)
    assert torch.equal(torch.get_rng_state(), before)


def test_same_seed_same_weights_in_another_process():
    code = (
        "import hashlib, torch\n"
        "from e2eprof.workloads.models import build_model, resolve_model\n"
        "torch.manual_seed(999)  # the caller's RNG state must not matter\n"
        "m = build_model(resolve_model('gpt2-tiny'), attn_implementation='eager', seed=0)\n"
        "h = hashlib.sha256()\n"
        "for n, t in m.state_dict().items():\n"
        "    h.update(n.encode()); h.update(t.contiguous().numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == state_hash(tiny(seed=0))


@pytest.mark.parametrize(
    "bad,suggestion", [("gtp2", "gpt2"), ("gpt2-tinny", "gpt2-tiny"), ("gpt2-meduim", "gpt2-medium")]
)
def test_unknown_name_suggests_close_match(bad, suggestion):
    with pytest.raises(ModelLoadError) as e:
        resolve_model(bad)
    msg = str(e.value)
    assert f"did you mean '{suggestion}'?" in msg and "known: gpt2, gpt2-medium, gpt2-tiny" in msg
    assert "\n" not in msg


def test_unknown_name_without_close_match():
    with pytest.raises(ModelLoadError, match="unknown model 'resnet'; known:"):
        resolve_model("resnet")


# --- attention implementations ---


def test_eager_and_sdpa_agree():
    eager, sdpa = tiny(attn="eager"), tiny(attn="sdpa")
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    assert same_weights(eager, sdpa)
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = eager(ids).logits, sdpa(ids).logits
    assert torch.linalg.norm(a - b) / torch.linalg.norm(a) < 1e-5


def test_second_build_does_not_change_first_models_attention():
    # from_config writes _attn_implementation into the config object it is given; presets use a fresh one each time.
    eager = tiny(attn="eager")
    tiny(attn="sdpa")
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("attn", ["bogus", "flash_attention_2", "kernels-community/flash-attn"])
def test_unusable_attention_is_model_load_error(attn):
    with pytest.raises(ModelLoadError) as e:
        tiny(attn=attn)
    assert "\n" not in str(e.value)


def test_attention_mismatch_after_build_is_caught(monkeypatch):
    import transformers

    real = transformers.AutoModelForCausalLM.from_config

    def ignores_request(config, **kwargs):
        kwargs["attn_implementation"] = "eager"
        return real(config, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", ignores_request)
    with pytest.raises(ModelLoadError, match="asked for attn_implementation='sdpa'"):
        tiny(attn="sdpa")


# --- folders ---


def test_folder_round_trip(tmp_path):
    original = tiny(seed=3)
    original.save_pretrained(tmp_path, safe_serialization=True)
    source = resolve_model(str(tmp_path))
    assert source == ModelSource(kind="folder", name=tmp_path.name, path=str(tmp_path.resolve()), architecture="gpt2")
    loaded = build_model(source, attn_implementation="sdpa", seed=0)
    assert same_weights(original, loaded)
    assert loaded.config._attn_implementation == "sdpa"
    assert next(loaded.parameters()).dtype == torch.float32 and not loaded.training
    assert describe(loaded) == describe(original)


def test_folder_saved_in_bf16_loads_as_fp32(tmp_path):
    tiny().to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    loaded = build_model(resolve_model(str(tmp_path)), attn_implementation="eager", seed=0)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


def write_config(folder, text=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text if text is not None else json.dumps(tiny().config.to_dict()))


def test_folder_without_safetensors(tmp_path):
    write_config(tmp_path)
    with pytest.raises(ModelLoadError, match=r"has no \*\.safetensors weights$"):
        resolve_model(str(tmp_path))


def test_folder_with_only_a_pickle_checkpoint(tmp_path):
    write_config(tmp_path)
    torch.save(tiny().state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors.*found pytorch_model\.bin.*never loaded"):
        resolve_model(str(tmp_path))


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))


def test_path_is_a_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is not a folder"):
        resolve_model(str(tmp_path / "model.safetensors"))


def test_folder_without_config(tmp_path):
    tiny().save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("text,match", [("{not json", "not readable JSON"), ("[1, 2]", "no \"model_type\""),
                                        ('{"model_type": "resnet"}', "no causal-LM class")])
def test_bad_config(tmp_path, text, match):
    tiny().save_pretrained(tmp_path, safe_serialization=True)
    write_config(tmp_path, text)
    with pytest.raises(ModelLoadError, match=match) as e:
        resolve_model(str(tmp_path))
    assert "\n" not in str(e.value)


def test_weights_that_do_not_cover_the_model(tmp_path):
    from safetensors.torch import save_file

    write_config(tmp_path)
    # lm_head.weight is tied to wte (save_pretrained drops it too); safetensors refuses shared tensors.
    dropped = {"transformer.h.1.mlp.c_fc.weight", "lm_head.weight"}
    state = {k: v.clone() for k, v in tiny().state_dict().items() if k not in dropped}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing: .*h\.1\.mlp\.c_fc\.weight"):
        build_model(resolve_model(str(tmp_path)), attn_implementation="eager", seed=0)
