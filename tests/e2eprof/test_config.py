"""CompareConfig: device defaults, and one UsageError naming the option for each bad value."""

import pytest
import torch

from e2eprof.config import DEFAULT_WORKLOADS, PRECISIONS, WORKLOAD_NAMES, CompareConfig, DeviceDefaults, resolve_device, suggest
from e2eprof.errors import UsageError

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks behaviour on a machine without CUDA")


def config(**kwargs) -> CompareConfig:
    return CompareConfig(**({"model": "gpt2-tiny", "patch": "fastsoftmax", "device": "cpu"} | kwargs))


class TestDefaults:
    def test_cpu_defaults_fill_unset_fields(self):
        c = config()
        assert c.device == "cpu"
        assert (c.batch, c.seq, c.steps, c.block_steps, c.new_tokens, c.precision) == (1, 64, 6, 2, 8, "fp32")
        assert c.reference_arms == ("sdpa",) and c.budget_seconds == 0  # no compile arm, no adaptive length on CPU
        assert c.workloads == DEFAULT_WORKLOADS == ("train", "infer", "decode")
        assert c.n_blocks == 3

    def test_cuda_defaults(self):
        d = DeviceDefaults.for_device("cuda:1")
        assert (d.batch, d.seq, d.steps, d.block_steps, d.new_tokens, d.precision) == (8, 1024, 40, 5, 16, "bf16")

    def test_explicit_values_win(self):
        c = config(batch=3, seq=16, steps=5, block_steps=2, precision="bf16", new_tokens=4, workloads=("infer",))
        assert (c.batch, c.seq, c.steps, c.block_steps, c.precision, c.new_tokens) == (3, 16, 5, 2, "bf16", 4)
        assert c.n_blocks == 3  # 5 steps in blocks of 2: rounded up

    @needs_no_cuda
    def test_auto_is_cpu_here(self):
        assert config(device="auto").device == "cpu"
        assert resolve_device("auto") == "cpu"

    def test_single_workload_string(self):
        assert config(workloads="train").workloads == ("train",)

    def test_record_is_flat(self):
        record = config(workloads=("train", "infer")).to_record()
        assert record["workloads"] == ["train", "infer"] and record["out"] is None and record["device"] == "cpu"

    def test_frozen(self):
        with pytest.raises(AttributeError):
            config().batch = 4


@pytest.mark.parametrize(
    "kwargs, option, detail",
    [
        ({"batch": 0}, "--batch", ">= 1, got 0"),
        ({"batch": 2.5}, "--batch", "integer"),
        ({"batch": True}, "--batch", "integer"),
        ({"seq": 1}, "--seq", ">= 2"),
        ({"steps": 1}, "--steps", ">= 2, got 1"),
        ({"block_steps": 0}, "--block-steps", ">= 1"),
        ({"steps": 4, "block_steps": 5}, "--block-steps", "5 is more than --steps 4"),
        ({"new_tokens": 1}, "--new-tokens", ">= 2"),
        ({"workloads": ("trian",)}, "--workload", "did you mean 'train'"),
        ({"workloads": ()}, "--workload", "at least one"),
        ({"workloads": ("train", "train")}, "--workload", "at most once"),
        ({"precision": "bf32"}, "--dtype", "unknown dtype 'bf32'"),
        ({"precision": "fp16"}, "--dtype", "CUDA"),
        ({"device": "tpu"}, "--device", "unknown device 'tpu'"),
        ({"confidence": 1.0}, "--confidence", "between"),
        ({"min_speedup": 2.0}, "--min-speedup", "fraction"),
        ({"reference_arms": ("spda",)}, "--reference", "did you mean 'sdpa'"),
        ({"model": ""}, "--model", "preset"),
        ({"patch": ""}, "--patch", "patch"),
    ],
)
def test_bad_value_names_the_option(kwargs, option, detail):
    with pytest.raises(UsageError) as info:
        config(**kwargs)
    message = str(info.value)
    assert message.startswith(option + ":"), message
    assert detail in message
    assert "\n" not in message


def test_bad_dtype_suggests_and_lists():
    with pytest.raises(UsageError) as info:
        config(precision="bf32")
    # 'bf32' is one edit from both bf16 and fp32: either is a fair suggestion.
    assert "did you mean 'bf16'" in str(info.value) or "did you mean 'fp32'" in str(info.value)
    assert all(p in str(info.value) for p in PRECISIONS)


@needs_no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_on_a_cpu_machine(device):
    with pytest.raises(UsageError, match=rf"^--device: '{device}' asked for, but no CUDA device is visible"):
        config(device=device)


def test_usage_error_is_a_value_error_with_exit_code_2():
    with pytest.raises(ValueError) as info:
        config(batch=0)
    assert info.value.exit_code == 2


def test_suggest():
    assert suggest("trian", WORKLOAD_NAMES) == " (did you mean 'train'?)"
    assert suggest("zzzz", WORKLOAD_NAMES) == ""


def test_decoding_is_profiled_over_one_step_after_one_warm_up_step():
    from e2eprof.phases.profile import profile_steps_for

    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", profile_warmup=2, profile_steps=3)
    assert profile_steps_for(config, "train") == (2, 3)
    assert profile_steps_for(config, "infer") == (2, 3)
    assert profile_steps_for(config, "generate") == (1, 1)
    none = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", profile_warmup=0, profile_steps=1)
    assert profile_steps_for(none, "generate") == (0, 1)


def test_default_out_dir_is_an_ignored_folder_of_the_working_directory(tmp_path, monkeypatch):
    """A run without --out never writes into a tracked folder: e2eprof-runs/ is listed in .gitignore."""
    from pathlib import Path

    from e2eprof.config import RUNS_DIR, default_out_dir

    monkeypatch.chdir(tmp_path)
    out = default_out_dir("models/my gpt2", "fast:softmax", "20261204T003000Z")
    assert out == tmp_path / "e2eprof-runs" / "20261204T003000Z-my_gpt2-fast_softmax"
    gitignore = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert f"/{RUNS_DIR}/" in gitignore
