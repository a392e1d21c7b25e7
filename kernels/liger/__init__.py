"""Liger-Kernel's Triton kernels as e2eprof patches (the optional extra `pip install e2eprof[liger]`).

Each module adapts one of Liger's public functions (liger_kernel.transformers.functional and model.loss_utils) to
the call it replaces in GPT-2, Llama or BERT, with that call's signature and output dtype; no Liger code is copied.
Importing this package needs liger_kernel; the registry lists these patches only when it imports.
"""
