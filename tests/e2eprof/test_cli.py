"""The real entry point (`python -m e2eprof`) in a subprocess: bad input is one line on stderr and exit code 2.

Each case passes tiny, fast settings apart from the one bad value, so if validation ever let a case through, the
test would fail on the exit code after a short run instead of hanging on a full GPT-2 comparison.
"""

import json
import os
import subprocess
import sys

import pytest

TIMEOUT_S = 300


def e2eprof(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"}  # tracebacks must not be switched on
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def compare_args(report_dir, **options) -> list[str]:
    """`compare` with small CPU settings; `options` (name without dashes -> value) override them."""
    settings = {"model": "gpt2-tiny", "patch": "fastsoftmax", "workload": "infer", "device": "cpu", "batch": "1",
                "seq": "8", "steps": "2", "block-steps": "1", "out": str(report_dir)}
    settings |= options
    return ["compare"] + [part for name, value in settings.items() for part in ("--" + name, value)]


def no_safetensors_folder(tmp_path):
    folder = tmp_path / "pickled-gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    return str(folder)


def exiting_patch(tmp_path):
    """A patch file that ends the interpreter at import: was exit code 0 and no output."""
    path = tmp_path / "exits.py"
    path.write_text("raise SystemExit\n")
    return str(path)


def truncated_safetensors_folder(tmp_path):
    """A model folder whose weights file was cut short: was found only after three workers had started (exit 4)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "truncated-gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=64, bos_token_id=63,
                               eos_token_id=63)).save_pretrained(folder, safe_serialization=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return str(folder)


def policy_file(text):
    def write(tmp_path):
        path = tmp_path / "policy.toml"
        path.write_text(text)
        return str(path)
    return write


def full_out_dir(tmp_path):
    out = tmp_path / "old-report"
    out.mkdir()
    (out / "run.parquet").write_bytes(b"an earlier run")
    return str(out)


# (id, options given to compare_args or a raw argv, what the message must say)
CASES = [
    ("unknown-model", {"model": "gpt2-tinny"}, ["--model", "unknown model 'gpt2-tinny'", "did you mean 'gpt2-tiny'"]),
    ("unknown-patch", {"patch": "fastsoftmx"}, ["unknown patch 'fastsoftmx'", "did you mean 'fastsoftmax'"]),
    ("unknown-workload", {"workload": "trian"}, ["--workload", "did you mean 'train'"]),
    ("batch-not-int", {"batch": "abc"}, ["--batch", "integer"]),
    ("batch-zero", {"batch": "0"}, ["--batch: must be an integer >= 1, got 0"]),
    ("steps-negative", {"steps": "-1"}, ["--steps: must be an integer >= 2, got -1"]),
    ("unknown-option", ["compare", "--bogus", "1"], ["No such option: --bogus"]),
    ("out-not-empty", {"out": full_out_dir}, ["--out", "already holds a report", "--force"]),
    ("no-safetensors", {"model": no_safetensors_folder}, ["--model", "no *.safetensors weights", "pytorch_model.bin"]),
    ("policy-unknown-key", {"policy": policy_file("min_speedp = 0.02\n")}, ["--policy: unknown key 'min_speedp'", "did you mean 'min_speedup'"]),
    ("policy-missing", {"policy": lambda tmp_path: str(tmp_path / "none.toml")}, ["--policy: cannot read"]),
    ("policy-bad-value", {"policy": policy_file("confidence = 3\n")}, ["--confidence: must be between 0.5 and 1"]),
    ("unknown-reference", {"reference": "sdpaa"}, ["--reference", "did you mean 'sdpa'"]),
    ("budget-negative", {"budget": "-5"}, ["--budget: must be between 0 and 86400"]),
    ("target-ci-too-wide", {"target-ci": "0.9"}, ["--target-ci: must be a fraction"]),
    ("patch-exits-at-import", {"patch": exiting_patch}, ["exits.py failed to import: SystemExit"]),
    ("out-unwritable", {"out": "/proc/e2eprof-test/report"}, ["--out: cannot write reports to /proc/e2eprof-test/report"]),
    ("truncated-weights", {"model": truncated_safetensors_folder}, ["--model", "model.safetensors", "is not valid safetensors"]),
]


@pytest.mark.parametrize("options, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, options, expected):
    out = tmp_path / "report"
    if isinstance(options, list):
        argv = options
    else:
        options = {k: v(tmp_path) if callable(v) else v for k, v in options.items()}
        argv = compare_args(out, **options)
    old_report = tmp_path / "old-report"
    before = {p.name: p.read_bytes() for p in old_report.iterdir()} if old_report.exists() else {}

    result = e2eprof(argv, cwd=tmp_path)

    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("e2eprof: error: "), lines[0]
    for fragment in expected:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    # Rejected before measuring: no report directory, nothing overwritten, nothing written in the working dir.
    assert not out.exists()
    if before:
        assert {p.name: p.read_bytes() for p in old_report.iterdir()} == before
    assert not (tmp_path / "e2eprof-runs").exists() and not (tmp_path / "reports").exists()


def test_list(tmp_path):
    result = e2eprof(["list"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "fastsoftmax" in result.stdout and "builtin" in result.stdout
    assert "gpt2-tiny" in result.stdout
    assert "train, infer, decode, generate" in result.stdout


def test_default_seq_shrinks_to_a_model_with_fewer_positions_but_a_given_seq_is_kept(tmp_path, capsys):
    # BERT-base has 512 positions and the GPU default is 1024 tokens: a user who did not ask for a length gets the
    # model's longest, on any device. Here a folder model with 32 positions against the CPU default of 64.
    from transformers import GPT2Config, GPT2LMHeadModel

    from e2eprof.cli import _config
    from e2eprof.config import DeviceDefaults

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=64)).save_pretrained(
        tmp_path, safe_serialization=True)
    assert DeviceDefaults.for_device("cpu").seq > 32
    assert _config(None, model=str(tmp_path), patch="fastsoftmax", device="cpu", seq=None).seq == 32
    assert "32 tokens" in capsys.readouterr().err
    assert _config(None, model=str(tmp_path), patch="fastsoftmax", device="cpu", seq=16).seq == 16
    assert _config(None, model="gpt2-tiny", patch="fastsoftmax", device="cpu", seq=None).seq == DeviceDefaults.for_device("cpu").seq


def test_an_in_process_call_records_its_own_command_line(monkeypatch):
    """A program calling main() (the self-benchmark does) records e2eprof's arguments, not its own sys.argv."""
    from e2eprof import cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda config, resume=False, outputs=None: seen.append(config) or 0)
    monkeypatch.setattr(sys, "argv", ["self_benchmark.py", "--part", "aa"])
    assert cli.main(["calibrate", "--model", "gpt2-tiny", "--device", "cpu", "--seed", "3"]) == 0
    assert seen[0].command_line == "e2eprof calibrate --model gpt2-tiny --device cpu --seed 3"


@pytest.mark.parametrize("command", ["compare", "calibrate", "microbench", "gate"])
def test_every_option_shows_its_default(command):
    """`--steps`, `--block-steps` and `--new-tokens` had no default in --help: they depend on the device, and the
    help now says both. An option typer cannot show a default for (None, or a one-name flag) must say it itself."""
    import typer

    from e2eprof.cli import app

    click_command = typer.main.get_command(app).commands[command]
    missing = []
    for param in click_command.params:
        if param.name == "help" or param.param_type_name == "argument" and param.required:
            continue  # a required argument has no default to show
        shown_by_typer = param.default is not None and not (param.is_flag and not param.secondary_opts)
        if not shown_by_typer and "default" not in (param.help or ""):
            missing.append(param.opts[0])
    assert not missing, missing


def test_help_names_every_model_patch_and_workload_e2eprof_list_shows(tmp_path):
    from e2eprof import catalog

    env = {k: v for k, v in os.environ.items()} | {"COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    listed = e2eprof(["list"], cwd=tmp_path)
    assert done.returncode == 0 and listed.returncode == 0, done.stderr + listed.stderr
    for name in catalog.model_presets() + catalog.builtin_patches() + catalog.workloads():
        assert name in done.stdout, name
        assert name in listed.stdout, name
    # the defaults of a GPU and of a CPU, as a run takes them
    from e2eprof.config import DeviceDefaults

    gpu, cpu = DeviceDefaults.for_device("cuda"), DeviceDefaults.for_device("cpu")
    for field in ("steps", "new_tokens", "block_steps", "replicas"):
        assert f"(default: {getattr(gpu, field)} on GPU, {getattr(cpu, field)} on CPU)" in done.stdout, field
