"""The run's compile-cache folder: where it is, how it is turned off, and that a second process loads what the first
compiled (a repeat run, the compile arm's second replica), counted in jit_events."""

import json
import os
import subprocess
import sys

from e2eprof.harness import compile_cache

PROGRAM = """
import json, torch
from e2eprof.trackers import jit_events
jit_events.install()
f = torch.compile(lambda x: torch.softmax(x * 2.0, dim=-1) + 1.0)
f(torch.randn(4, 8))
print(json.dumps(jit_events.snapshot()))
"""


def _compile_in_fresh_process(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


INDUCTOR_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE",
                      "TORCHINDUCTOR_AUTOGRAD_CACHE")


def _without_inductor_variables(monkeypatch):
    # Inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ when a test compiles in-process; that would read as
    # a user's own setting here.
    for name in INDUCTOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_folder_follows_the_variable_and_can_be_turned_off(tmp_path, monkeypatch):
    _without_inductor_variables(monkeypatch)
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "mine"))
    assert compile_cache.folder() == tmp_path / "mine"
    assert compile_cache.environment()["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "mine"))
    assert compile_cache.describe() == {"compile_cache_dir": str(tmp_path / "mine"), "compile_cache_warm": False}
    (tmp_path / "mine" / "inductor").mkdir()
    (tmp_path / "mine" / "inductor" / "artifact").write_text("x")
    assert compile_cache.describe()["compile_cache_warm"] is True
    monkeypatch.setenv(compile_cache.VARIABLE, "off")
    assert compile_cache.folder() is None and compile_cache.environment() == {}
    monkeypatch.delenv(compile_cache.VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.folder() == tmp_path / "xdg" / "e2eprof" / "compile"


def test_a_users_own_inductor_folder_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "ours"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert "TORCHINDUCTOR_CACHE_DIR" not in compile_cache.environment()
    # The run says which folder is really used, and reads its warmth from there: an earlier run's graphs in the
    # user's folder make a "cold" first step a cache load, even though e2eprof's own folder is empty.
    (tmp_path / "users" / "fxgraph").mkdir(parents=True)
    (tmp_path / "users" / "fxgraph" / "entry").write_text("x")
    described = compile_cache.describe()
    assert described["compile_cache_warm"] is True
    assert f"inductor: {tmp_path / 'users'}" in described["compile_cache_dir"]
    assert described["compile_cache_dir"].startswith(str(tmp_path / "ours"))


def test_inductors_own_default_in_the_environment_is_not_a_users_choice(tmp_path):
    """Importing transformers' modeling code asks Inductor for its cache folder, and Inductor writes its default into
    TORCHINDUCTOR_CACHE_DIR: the workers a run starts after its checks must still get the run's folder, and the run
    must say so (it said the default was "set in the environment, and used instead")."""
    script = ("import json, os\n"
              "import transformers.modeling_utils\n"
              "from e2eprof.harness import compile_cache\n"
              "print(json.dumps([os.environ.get('TORCHINDUCTOR_CACHE_DIR'), compile_cache._inductor_default(),\n"
              "                  compile_cache.environment().get('TORCHINDUCTOR_CACHE_DIR'),\n"
              "                  compile_cache.describe()['compile_cache_dir']]))\n")
    env = {k: v for k, v in os.environ.items() if k not in INDUCTOR_VARIABLES}
    env[compile_cache.VARIABLE] = str(tmp_path / "ours")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    written, default, given, described = json.loads(done.stdout.strip().splitlines()[-1])
    assert written == default  # what this test is about: the import really writes it (else it proves nothing)
    assert given == str(tmp_path / "ours" / "inductor") and described == str(tmp_path / "ours")


def test_turned_off_reads_the_warmth_of_torchs_own_folders(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.VARIABLE, "off")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    assert compile_cache.describe() == {"compile_cache_dir": None, "compile_cache_warm": False}
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "kernel.cubin").write_text("x")
    assert compile_cache.describe() == {"compile_cache_dir": None, "compile_cache_warm": True}


def test_second_process_loads_the_first_ones_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "cache"))
    _without_inductor_variables(monkeypatch)
    env = {**os.environ, **compile_cache.environment(), "PYTHONPATH": os.getcwd()}
    first = _compile_in_fresh_process(env)
    assert first["fxgraph_cache_misses"] >= 1 and first["fxgraph_cache_hits"] == 0
    assert compile_cache.describe()["compile_cache_warm"] is True
    second = _compile_in_fresh_process(env)
    assert second["fxgraph_cache_hits"] >= 1 and second["fxgraph_cache_misses"] == 0
