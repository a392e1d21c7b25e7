"""Bring-your-own kernels: the copyable examples, the CUDA/C++ load_inline recipe, entry points, and the precise
errors a broken patch gets before anything is measured (through the real `python -m e2eprof` entry point)."""

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from e2eprof.errors import PatchError
from e2eprof.patch import Patch
from e2eprof.patching import check_model_fits, signature_mismatch
from e2eprof.registry import load_patch

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "my_softmax.py"
CUDA_EXAMPLE = REPO / "examples" / "cuda_softmax" / "patch.py"
TARGET = "transformers.models.gpt2.modeling_gpt2:nn.functional.softmax"
TYPO = TARGET.replace(".softmax", ".softmx")
TIMEOUT_S = 600
# The small CPU comparison: long enough for every phase (cold, warm-up, blocks, correctness) to run.
SMALL_RUN = ["--model", "gpt2-tiny", "--workload", "infer", "--steps", "6", "--block-steps", "2", "--batch", "1",
             "--seq", "16", "--no-profile", "--device", "cpu"]


def e2eprof(args: list[str], cwd, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"} | (env_extra or {})
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=env, capture_output=True, check=False,
                          text=True, timeout=TIMEOUT_S)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ---- the copyable example, end to end ------------------------------------------------------------------------

@pytest.mark.slow
def test_example_file_runs_a_real_compare(tmp_path):
    out = tmp_path / "run"
    result = e2eprof(["compare", "--patch", str(EXAMPLE), *SMALL_RUN, "--out", str(out)], cwd=tmp_path)
    # Any timing verdict may come out of 3 blocks per arm on a shared CPU, a real SLOWER among them (the example's
    # three-op softmax against one fused op); what must not happen is a failure for any other reason.
    assert result.returncode in (0, 1, 3), result.stderr[-3000:]
    summary = pd.read_parquet(out / "summary.parquet")
    signed = summary[summary["verdict"].notna()].iloc[0]
    if result.returncode == 1:
        assert signed["reasons"] == "SLOWER", signed.to_dict()
    run = pd.read_parquet(out / "run.parquet").iloc[0]
    assert run["status"] == "complete" and run["patch_origin"] == "file"
    correctness = pd.read_parquet(out / "correctness.parquet")
    patched = correctness[correctness["arm"] == "patched"]
    assert patched["passed"].all(), patched[~patched["passed"]].to_dict("records")
    ran = patched[patched["metric"] == "custom_kernel_calls"]
    assert len(ran) and (ran["value"] > 0).all()  # the example's own counter: its code, not torch's, ran
    assert "cpu.fwd" in ran["detail"].iloc[0]
    stock = correctness[(correctness["arm"] != "patched") & (correctness["metric"] == "custom_kernel_calls")]
    assert len(stock) and (stock["value"] == 0).all()


def test_example_file_uses_only_the_public_api():
    imports = [line for line in EXAMPLE.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert [line for line in imports if "e2eprof" in line] == ["from e2eprof.patch import Patch"]
    loaded = load_patch(str(EXAMPLE))
    check_model_fits(loaded.patch, "gpt2", "eager")  # targets resolve, the signature fits
    x = torch.randn(2, 3, 5, 7)
    for dim in (-1, 1):
        torch.testing.assert_close(loaded.patch.replacement(x, dim=dim), torch.softmax(x, dim))


# ---- errors before any measurement, through the real entry point ------------------------------------------

PATCH_HEAD = """\
import torch
from e2eprof.patch import Patch

def good_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return torch.softmax(input, dim, dtype=dtype)
"""

# (id, patch file text, fragments the one-line message must contain)
BROKEN = [
    ("import-fails", "import torch\nraise ValueError('kernel table\\n has 3 entries, expected 4')\n",
     ["failed to import", "ValueError: kernel table has 3 entries, expected 4"]),
    ("syntax-error", "def softmax(input, dim:\n    return input\n", ["failed to import", "SyntaxError"]),
    ("declares-nothing", PATCH_HEAD, ["declares no e2eprof.patch.Patch"]),
    ("missing-attribute", PATCH_HEAD + f"PATCH = Patch(name='p', targets=('{TYPO}',), replacement=good_softmax)\n",
     ["has no attribute 'softmx'", "'transformers.models.gpt2.modeling_gpt2.nn.functional'", "nearby: softmax"]),
    ("missing-module", PATCH_HEAD + "PATCH = Patch(name='p', replacement=good_softmax, targets=("
     "'transformers.models.gpt2.modeling_gtp2:nn.functional.softmax',))\n",
     ["module 'transformers.models.gpt2.modeling_gtp2' cannot be imported", "ModuleNotFoundError",
      "nearby: modeling_gpt2"]),
    ("renamed-parameter", PATCH_HEAD + "def mine(x, dim=None, _stacklevel=3, dtype=None):\n    return x\n"
     f"PATCH = Patch(name='p', targets=('{TARGET}',), replacement=mine)\n",
     ["does not match the signature of " + TARGET, "parameter 1 is 'x' in the replacement but 'input'"]),
    ("missing-parameter", PATCH_HEAD + "def mine(input, dim=None):\n    return input\n"
     f"PATCH = Patch(name='p', targets=('{TARGET}',), replacement=mine)\n",
     ["parameter 3 '_stacklevel'", "missing from the replacement"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("text, fragments", [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN])
def test_broken_patch_file_is_one_line_and_exit_2_before_measuring(tmp_path, text, fragments):
    path = write(tmp_path / "user_patch.py", text)
    out = tmp_path / "run"
    result = e2eprof(["compare", "--patch", str(path), *SMALL_RUN, "--out", str(out)], cwd=tmp_path)
    message = result.stderr.strip()
    assert result.returncode == 2, message[-3000:]
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("e2eprof: error:")
    for fragment in fragments:
        assert fragment in message, message
    assert not out.exists()  # refused before the report directory, let alone a measurement


# ---- the signature check itself ----------------------------------------------------------------------------

def _softmax_like(input, dim=None, _stacklevel=3, dtype=None): ...
def _renamed(x, dim=None, _stacklevel=3, dtype=None): ...
def _no_default(input, dim, _stacklevel=3, dtype=None): ...
def _extra_required(input, dim=None, _stacklevel=3, dtype=None, *, scale): ...
def _extra_optional(input, dim=None, _stacklevel=3, dtype=None, *, scale=1.0): ...
def _anything(*args, **kwargs): ...
def _positional_only(input, dim=None, _stacklevel=3, dtype=None, /): ...
def _kw_stock(x, *, eps=1e-5): ...
def _kw_missing(x): ...
def _kw_as_positional(x, eps=1e-5): ...


@pytest.mark.parametrize("replaced, replacement, problem", [
    (F.softmax, _softmax_like, None),
    (F.softmax, _extra_optional, None),
    (F.softmax, _anything, None),  # a generic wrapper takes every call
    (F.softmax, _renamed, "parameter 1 is 'x' in the replacement but 'input'"),
    (F.softmax, _no_default, "parameter 'dim' has a default in the replaced function but none"),
    (F.softmax, _extra_required, "requires parameter 'scale'"),
    (F.softmax, _positional_only, "parameter 1 'input' is positional-only in the replacement"),
    (_kw_stock, _kw_missing, "keyword-only parameter 'eps'"),
    (_kw_stock, _kw_as_positional, None),  # callers pass eps=..., which a positional-or-keyword one takes
    (_softmax_like, torch.exp, None),  # no readable signature on one side: nothing to compare
])
def test_signature_mismatch(replaced, replacement, problem):
    found = signature_mismatch(replaced, replacement)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_class_target_compares_forward():
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    class WrongForward(GPT2MLP):
        def forward(self, x):  # GPT2MLP.forward takes hidden_states
            return super().forward(x)

    patch = Patch(name="wrongmlp", targets=("transformers.models.gpt2.modeling_gpt2:GPT2MLP",),
                  replacement=WrongForward)
    with pytest.raises(PatchError, match="forward of replacement.*parameter 2 is 'x'.*'hidden_states'"):
        check_model_fits(patch, "gpt2", "eager")


# ---- the CUDA example: C++ CPU path compiled with load_inline here, CUDA path only where it can run ---------

def _compiler_missing() -> str | None:
    from torch.utils.cpp_extension import is_ninja_available

    if not shutil.which(os.environ.get("CXX", "c++")):
        return "no C++ compiler (c++ or $CXX) on PATH"
    if not is_ninja_available():
        return "load_inline needs ninja, which is not installed"
    return None


@pytest.fixture(scope="module")
def cuda_example(tmp_path_factory):
    """The example's module, building into a fresh directory (so the test really compiles)."""
    build_dir = tmp_path_factory.mktemp("e2eprof-build")
    previous = os.environ.get("E2EPROF_BUILD_DIR")
    os.environ["E2EPROF_BUILD_DIR"] = str(build_dir)
    try:
        patch = load_patch(str(CUDA_EXAMPLE)).patch
        yield sys.modules[patch.replacement.__module__], build_dir
    finally:
        if previous is None:
            os.environ.pop("E2EPROF_BUILD_DIR", None)
        else:
            os.environ["E2EPROF_BUILD_DIR"] = previous


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))  # NaN rows exactly where the fp64 softmax has them
    diff = (out.double() - ref)[finite]
    return float(diff.norm() / ref[finite].norm().clamp_min(1e-300)) if diff.numel() else 0.0


def _rows_cases():
    g = torch.Generator().manual_seed(0)
    masked = torch.randn(5, 33, generator=g)
    masked[:, 20:] = float("-inf")  # causal-style -inf tail
    masked[2] = float("-inf")  # a fully masked row: NaN, as from torch.softmax
    return {
        "odd": torch.randn(7, 1023, generator=g),
        "one-column": torch.randn(4, 1, generator=g),
        "single-element": torch.randn(1, 1, generator=g),
        "no-rows": torch.randn(0, 17, generator=g),
        "empty-rows": torch.randn(3, 0, generator=g),
        "-inf-masks": masked,
        "large-magnitudes": torch.randn(6, 257, generator=g) * 1e4,
        "attention-row": torch.randn(12, 1024, generator=g),
    }


@pytest.mark.slow  # compiling torch/extension.h takes about a minute on two shared cores
def test_cpp_cpu_kernel_compiles_and_matches_fp64(cuda_example):
    reason = _compiler_missing()
    if reason:
        pytest.skip(reason)
    module, build_dir = cuda_example
    before = module.CALLS["cpu.fwd"]
    for name, x in _rows_cases().items():
        y = module.softmax_rows(x.contiguous())
        assert y.dtype == torch.float32 and y.shape == x.shape, name
        assert _rel_error(y, torch.softmax(x.double(), -1)) <= 1e-6, name
    assert module.CALLS["cpu.fwd"] - before == len(_rows_cases())
    assert any(build_dir.iterdir())  # built where E2EPROF_BUILD_DIR points, reused by later processes

    # Through the replacement: another dim, a non-contiguous view, bf16 in and out, and the backward.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 9, 16, generator=g).transpose(1, 3)  # (2, 16, 9, 3), non-contiguous
    for dim in (-1, 1):
        out = module.softmax(x, dim=dim)
        stock = torch.softmax(x, dim)
        assert out.stride() == stock.stride() and out.dtype == stock.dtype
        assert _rel_error(out, torch.softmax(x.double(), dim)) <= 1e-6
    half = module.softmax(x.bfloat16(), dim=-1)
    assert half.dtype == torch.bfloat16 and _rel_error(half, torch.softmax(x.bfloat16().double(), -1)) <= 1e-2
    leaf = x.clone().requires_grad_()
    weights = torch.randn(x.shape, generator=g)
    (module.softmax(leaf, dim=1) * weights).sum().backward()
    leaf64 = x.double().requires_grad_()
    (torch.softmax(leaf64, 1) * weights.double()).sum().backward()
    assert _rel_error(leaf.grad, leaf64.grad) <= 1e-5


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch has CUDA: tests/gpu/test_byo_cuda.py builds it")
def test_cuda_path_without_cuda_is_a_clear_error(cuda_example):
    module, _ = cuda_example
    module.cuda_extension.cache_clear()
    with pytest.raises(RuntimeError, match="this torch build has no CUDA support, so softmax.cu cannot be built"):
        module.cuda_extension()


def test_native_sources_are_part_of_the_source_hash(tmp_path):
    kernel = tmp_path / "kernel"
    shutil.copytree(CUDA_EXAMPLE.parent, kernel, ignore=shutil.ignore_patterns("__pycache__"))
    first = load_patch(str(kernel / "patch.py")).source_hash
    cu = kernel / "softmax.cu"
    cu.write_text(cu.read_text().replace("kThreads = 256", "kThreads = 128"))
    assert load_patch(str(kernel / "patch.py")).source_hash != first


# ---- entry points --------------------------------------------------------------------------------------------

@pytest.fixture
def installed_distribution(tmp_path, monkeypatch):
    """A package and its dist-info on sys.path, as `pip install` leaves them, registering two entry points."""
    package = f"byo_ep_{uuid.uuid4().hex[:8]}"
    write(tmp_path / package / "__init__.py", PATCH_HEAD + f"PATCH = Patch(name='epsoftmax', targets=('{TARGET}',), "
          "replacement=good_softmax, architectures=('gpt2',))\nNOT_A_PATCH = 3\n")
    dist_info = tmp_path / f"{package}-0.1.dist-info"
    write(dist_info / "METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    write(dist_info / "entry_points.txt",
          f"[e2eprof.patches]\nepsoftmax = {package}:PATCH\nepbroken = {package}:NOT_A_PATCH\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package, tmp_path
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def test_entry_point_patch_loads_with_its_distribution(installed_distribution):
    package, _ = installed_distribution
    loaded = load_patch("epsoftmax")
    assert loaded.patch.name == "epsoftmax" and loaded.origin == f"entry-point:{package}"
    assert loaded.patch is sys.modules[package].PATCH
    with pytest.raises(PatchError, match=r"entry point 'epbroken' \(.*NOT_A_PATCH\) is not an e2eprof.patch.Patch"):
        load_patch("epbroken")


@pytest.mark.slow
def test_entry_point_is_listed_by_the_cli(installed_distribution):
    package, path = installed_distribution
    result = e2eprof(["list"], cwd=path, env_extra={"PYTHONPATH": os.pathsep.join([str(path), str(REPO)])})
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if "epsoftmax" in line)
    assert "entry point" in line and f"{package}:PATCH" in line
