"""pyproject.toml lists e2eprof's packages by hand (package-dir remaps kernels/ and workloads/): a package folder
missing from the list is missing from every install, and the checkout hides it (the repo root is on sys.path)."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
# Where each installed package's files live in the checkout.
SOURCES = {"e2eprof": ROOT / "e2eprof", "e2eprof.kernels": ROOT / "kernels", "e2eprof.workloads": ROOT / "workloads"}


def packages_on_disk() -> set[str]:
    found = set()
    for name, folder in SOURCES.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(folder).parts
            # e2eprof/kernels and e2eprof/workloads are not folders of e2eprof: package-dir maps them elsewhere.
            found.add(".".join((name, *relative)))
    return found


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = packages_on_disk()
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "listed in pyproject.toml, but no such package folder"
