"""Session-wide test setup.

Without CUDA, Triton kernels can only run under the interpreter, and triton reads TRITON_INTERPRET when a kernel is
decorated, so it is set here, before any test module imports triton.
"""

import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def temporary_files_under_pytest(tmp_path_factory):
    """Temporary files of the tests and of the runs they start go under pytest's own folder, which pytest prunes.

    Some tests kill a run on purpose (SIGKILL leaves no chance to clean up), and compile caches default to the
    machine's /tmp: on a machine that runs CI again and again, both used to pile up there.
    """
    folder = tmp_path_factory.mktemp("tmp")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    yield
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None
