"""Loading patches by built-in name, by file, and by module path, from files the tests write."""

import hashlib
import inspect
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from e2eprof.errors import PatchError
from e2eprof.kernels.fastsoftmax import patch as fastsoftmax_patch
from e2eprof.patch import Patch
from e2eprof.registry import load_patch, source_hash

HEADER = """\
import torch
from e2eprof.patch import Patch

TARGET = "transformers.models.gpt2.modeling_gpt2:nn.functional.softmax"
"""

ONE_PATCH = HEADER + """
def my_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return torch.softmax(input, dim, dtype=dtype)

PATCH = Patch(name="mysoftmax", targets=(TARGET,), replacement=my_softmax, architectures=("gpt2",))
"""

TWO_PATCHES = HEADER + """
def alpha_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return torch.softmax(input, dim, dtype=dtype)

def beta_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return torch.softmax(input, dim, dtype=dtype)

ALPHA = Patch(name="alpha", targets=(TARGET,), replacement=alpha_softmax)
BETA = Patch(name="beta", targets=(TARGET,), replacement=beta_softmax)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


class TestBuiltin:
    def test_fastsoftmax(self):
        loaded = load_patch("fastsoftmax")
        assert loaded.patch is fastsoftmax_patch.PATCH
        assert loaded.origin == "builtin" and loaded.spec == "fastsoftmax"
        assert len(loaded.source_hash) == 64 and int(loaded.source_hash, 16) > 0
        # The hash covers the kernel package beside the replacement.
        files = {p.name for p in loaded.patch.source_files()}
        assert {"patch.py", "op.py"} <= files

    def test_unknown_name_suggests(self):
        with pytest.raises(PatchError) as info:
            load_patch("fastsoftmx")
        message = str(info.value)
        assert "unknown patch 'fastsoftmx'" in message
        assert "did you mean 'fastsoftmax'" in message
        assert "\n" not in message


class TestFile:
    def test_one_patch(self, tmp_path):
        path = write(tmp_path / "mine.py", ONE_PATCH)
        loaded = load_patch(str(path))
        assert isinstance(loaded.patch, Patch)
        assert loaded.patch.name == "mysoftmax"
        assert loaded.origin == "file"
        assert loaded.patch.replacement.__name__ == "my_softmax"
        assert Path(inspect.getfile(loaded.patch.replacement)) == path
        assert loaded.patch.architectures == ("gpt2",)

    def test_pick_by_name(self, tmp_path):
        path = write(tmp_path / "two.py", TWO_PATCHES)
        assert load_patch(f"{path}:beta").patch.replacement.__name__ == "beta_softmax"
        assert load_patch(f"{path}:alpha").patch.replacement.__name__ == "alpha_softmax"

    def test_several_without_a_name_is_refused(self, tmp_path):
        path = write(tmp_path / "two.py", TWO_PATCHES)
        with pytest.raises(PatchError, match="several patches") as info:
            load_patch(str(path))
        assert "alpha" in str(info.value) and "beta" in str(info.value)

    def test_unknown_name_in_file_suggests(self, tmp_path):
        path = write(tmp_path / "two.py", TWO_PATCHES)
        with pytest.raises(PatchError, match="no patch named 'btea'.*did you mean 'beta'"):
            load_patch(f"{path}:btea")

    def test_file_declaring_nothing(self, tmp_path):
        path = write(tmp_path / "empty.py", "def softmax(x, dim=-1):\n    return x\n")
        with pytest.raises(PatchError, match="declares no e2eprof.patch.Patch"):
            load_patch(str(path))

    def test_missing_file(self, tmp_path):
        with pytest.raises(PatchError, match="does not exist"):
            load_patch(str(tmp_path / "nowhere.py"))

    def test_file_that_raises_gives_one_line(self, tmp_path):
        path = write(tmp_path / "broken.py", HEADER + 'raise RuntimeError("kernel build failed\\n  nvcc: exit 1\\n")\n')
        with pytest.raises(PatchError) as info:
            load_patch(str(path))
        message = str(info.value)
        assert "\n" not in message
        assert "failed to import" in message and str(path) in message
        assert "RuntimeError: kernel build failed nvcc: exit 1" in message
        assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback

    def test_syntax_error_gives_one_line(self, tmp_path):
        path = write(tmp_path / "typo.py", "def f(:\n")
        with pytest.raises(PatchError, match="SyntaxError") as info:
            load_patch(str(path))
        assert "\n" not in str(info.value)

    def test_source_hash_follows_the_file(self, tmp_path):
        path = write(tmp_path / "mine.py", ONE_PATCH)
        first = load_patch(str(path)).source_hash
        assert load_patch(str(path)).source_hash == first  # stable while nothing changes
        assert first == hashlib.sha256(b"mine.py" + path.read_bytes()).hexdigest()
        assert source_hash(load_patch(str(path)).patch) == first
        write(path, ONE_PATCH.replace("torch.softmax(input, dim", "torch.softmax(input, dim=dim"))
        second = load_patch(str(path)).source_hash
        assert second != first
        # A new helper file beside the replacement is part of the kernel too.
        write(tmp_path / "helper.py", "X = 1\n")
        assert load_patch(str(path)).source_hash not in (first, second)


class TestModule:
    @pytest.fixture
    def package(self, tmp_path, monkeypatch):
        """An importable package written into tmp_path; removed from sys.modules afterwards."""
        name = f"e2eprof_test_pkg_{uuid.uuid4().hex[:8]}"
        write(tmp_path / name / "__init__.py", "")
        write(tmp_path / name / "one.py", ONE_PATCH)
        write(tmp_path / name / "two.py", TWO_PATCHES)
        write(tmp_path / name / "broken.py", "raise ImportError('needs\\nlibfoo.so')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        yield name
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]

    def test_module_colon_name(self, package):
        loaded = load_patch(f"{package}.two:BETA")
        assert loaded.origin == "module"
        assert loaded.patch.name == "beta"
        assert loaded.patch is sys.modules[f"{package}.two"].BETA

    def test_module_without_name_takes_its_only_patch(self, package):
        assert load_patch(f"{package}.one").patch.name == "mysoftmax"

    def test_module_without_name_and_several_patches(self, package):
        with pytest.raises(PatchError, match="several patches"):
            load_patch(f"{package}.two")

    def test_missing_attribute(self, package):
        with pytest.raises(PatchError, match="has no attribute 'GAMMA'"):
            load_patch(f"{package}.two:GAMMA")

    def test_attribute_that_is_not_a_patch(self, package):
        with pytest.raises(PatchError, match="is a str, not an e2eprof.patch.Patch"):
            load_patch(f"{package}.two:TARGET")

    def test_module_that_raises_gives_one_line(self, package):
        with pytest.raises(PatchError) as info:
            load_patch(f"{package}.broken:PATCH")
        assert "\n" not in str(info.value)
        assert "ImportError: needs libfoo.so" in str(info.value)

    def test_missing_module(self, package):
        with pytest.raises(PatchError, match="failed to import"):
            load_patch(f"{package}.nothere:PATCH")
