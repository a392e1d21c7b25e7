"""GPU tests share one process: what a test leaves on the device (models, CUDA graphs and their memory pools,
torch.compile's cudagraph trees) must not crowd out the worker processes a later test starts. On the H200 on
2026-12-03 a compare started after the decode and memory tests could not build its baseline: CUDA out of memory."""

import gc

import pytest
import torch


@pytest.fixture(autouse=True)
def _free_the_device_after_each_test():
    yield
    if not torch.cuda.is_available():
        return
    if "torch._dynamo" in __import__("sys").modules:
        torch._dynamo.reset()
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()
        except ImportError:
            pass
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
