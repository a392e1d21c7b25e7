"""Policy files: thresholds from TOML, unknown keys and bad values refused with one line, options win."""

import pytest

from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.analysis.policy import POLICY_KEYS, load_policy


def write(tmp_path, text):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_every_key_maps_to_a_config_field(tmp_path):
    path = write(tmp_path, """
min_speedup = 0.02
confidence = 0.99
correction = "bh"
target_ci = 0.005
budget = 30
max_blocks = 100
clock_tolerance = 0.03
temp_tolerance_c = 4
warmup_tolerance = 0.05
max_warmup_seconds = 10
process_noise = 0.003
replicas = 3
""")
    overrides = load_policy(path)
    assert set(overrides) == {field for field, _ in POLICY_KEYS.values()}
    config = CompareConfig(model="gpt2", patch="fastsoftmax", device="cpu", **overrides)
    assert (config.min_speedup, config.confidence, config.correction, config.target_half_width) == (0.02, 0.99, "bh", 0.005)
    assert (config.budget_seconds, config.max_blocks, config.clock_tolerance, config.temp_tolerance_c) == (30.0, 100, 0.03, 4.0)
    assert (config.process_noise, config.replicas) == (0.003, 3)


@pytest.mark.parametrize("text, message", [
    ("min_speedp = 0.02", "unknown key 'min_speedp'"),
    ("min_speedp = 0.02", "did you mean 'min_speedup'"),
    ("min_speedup = 'two'", "'min_speedup'"),
    ("max_blocks = 1.5", "'max_blocks'"),
    ("budget = true", "'budget'"),
    ("min_speedup = = 1", "not valid TOML"),
])
def test_bad_files_are_usage_errors(tmp_path, text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        load_policy(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load_policy(tmp_path / "nope.toml")


def test_values_out_of_range_are_refused_by_the_config(tmp_path):
    overrides = load_policy(write(tmp_path, "correction = 'bonferoni'"))
    with pytest.raises(UsageError, match="did you mean 'none'|known: holm, bh, none"):
        CompareConfig(model="gpt2", patch="fastsoftmax", device="cpu", **overrides)


def test_options_given_on_the_command_line_win_over_the_file(tmp_path):
    from e2eprof.cli import _config

    path = write(tmp_path, "min_speedup = 0.02\nbudget = 30\n")
    from_file = _config(path, model="gpt2", patch="fastsoftmax", device="cpu", min_speedup=None, budget_seconds=None)
    assert (from_file.min_speedup, from_file.budget_seconds, from_file.policy) == (0.02, 30.0, str(path))
    given = _config(path, model="gpt2", patch="fastsoftmax", device="cpu", min_speedup=0.05, budget_seconds=None)
    assert (given.min_speedup, given.budget_seconds) == (0.05, 30.0)
    assert _config(None, model="gpt2", patch="fastsoftmax", device="cpu", min_speedup=None).min_speedup == 0.01
