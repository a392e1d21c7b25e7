"""The checkout's top-level `kernels/` and `workloads/` never take those names from other distributions.

On 2026-12-03 transformers 5.25 began to require PyPI's `kernels` (the Hugging Face kernel hub) and to import it from
`transformers.activations`; from the repo root our empty `kernels/__init__.py` was found first, and every import of
a model failed (ImportError: cannot import name 'CUDAProperties' from 'kernels'). Each case below runs a fresh
interpreter the way users start one: from the repo root, where the checkout is the first entry of sys.path.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, cwd: Path, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def other_kernels(tmp_path) -> Path:
    """A site folder holding a regular package named `kernels`, as PyPI's is."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("OWNER = 'the other distribution'\nfrom .sub import VALUE\n")
    (site / "kernels" / "sub.py").write_text("VALUE = 42\n")
    return site


@pytest.mark.parametrize("pythonpath_is_root", [False, True], ids=["cwd", "PYTHONPATH=$PWD"])
def test_from_the_repo_root_kernels_is_the_other_distribution(other_kernels, pythonpath_is_root):
    path = [ROOT, other_kernels] if pythonpath_is_root else [other_kernels]
    done = python("""
        import kernels, kernels.sub
        print(kernels.OWNER, kernels.VALUE, kernels.sub.__name__, kernels.__file__)
        """, cwd=ROOT, pythonpath=path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the other distribution 42 kernels.sub ")
    assert str(other_kernels) in done.stdout


def test_with_no_other_kernels_the_name_reads_as_not_installed():
    """Nothing of ours is importable as `kernels.*`, and the probes libraries use (a file, a version) find none.
    site-packages is left off sys.path, so PyPI's kernels is not found even where it is installed."""
    done = python("""
        import sys
        sys.path = [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]
        import kernels
        print('file', kernels.__file__, 'path', list(kernels.__path__), 'version', getattr(kernels, '__version__', None))
        try:
            import kernels.fastsoftmax
        except ModuleNotFoundError:
            print('no kernels.fastsoftmax')
        """, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "file None path [] version None" in done.stdout
    assert "no kernels.fastsoftmax" in done.stdout


def _pypi_kernels() -> bool:
    try:
        importlib.metadata.distribution("kernels")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_transformers_models_import_from_the_repo_root():
    """The failure of 2026-12-03: with PyPI's kernels installed (transformers >= 5.25 requires it), importing the
    model code from the repo root raised ImportError. Without it, transformers must not mistake ours for it."""
    done = python("""
        import transformers.activations, transformers.models.llama.modeling_llama, transformers.models.gpt2.modeling_gpt2
        from transformers.utils.import_utils import is_kernels_available
        import kernels
        print('kernels from', kernels.__file__, 'available', is_kernels_available())
        """, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    if _pypi_kernels():
        assert str(ROOT) not in done.stdout.split("kernels from ")[1].split(" available")[0]
    else:
        assert "kernels from None available False" in done.stdout


def test_python_m_e2eprof_from_the_checkout_builds_a_model():
    done = subprocess.run([sys.executable, "-m", "e2eprof", "list"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    for name in ("fastsoftmax", "fastgelu", "rmsnorm", "swiglu"):
        assert f"  {name} " in done.stdout
    built = python("""
        from e2eprof.workloads.models import build_model, resolve_model
        model = build_model(resolve_model('llama-tiny'), attn_implementation='eager', seed=0)
        print(type(model).__name__)
        """, cwd=ROOT)
    assert built.returncode == 0, built.stderr
    assert "LlamaForCausalLM" in built.stdout


def test_workloads_is_no_top_level_package_either(other_kernels):
    site = other_kernels
    (site / "workloads").mkdir()
    (site / "workloads" / "__init__.py").write_text("OWNER = 'the other distribution'\n")
    done = python("import workloads; print(workloads.OWNER)", cwd=ROOT, pythonpath=[site])
    assert done.returncode == 0, done.stderr
    assert "the other distribution" in done.stdout
