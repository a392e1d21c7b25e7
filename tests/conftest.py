"""Session-wide test setup.

Without CUDA, Triton kernels can only run under the interpreter, and triton reads TRITON_INTERPRET when a kernel is
decorated, so it is set here, before any test module imports triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
