"""Microbenchmark of a patch's replaced op alone, on the exact calls the model makes plus a sweep around them.

capture.py   which calls the op gets (shapes, dtypes, strides, arguments, autocast state, calls per step)
timing.py    CUDA events with an L2 flush (perf_counter_ns on CPU), raw samples, the copy roofline
bench.py     correctness before timing, then replacement vs eager vs torch.compile: `run_microbench`
command.py   `e2eprof microbench`: config, report directory, microbench.parquet
"""

from e2eprof.microbench.bench import run_microbench
from e2eprof.microbench.capture import CallSpec, TensorSpec, capture_shapes, sweep_shapes
from e2eprof.microbench.command import MicrobenchConfig, microbench

__all__ = ["CallSpec", "MicrobenchConfig", "TensorSpec", "capture_shapes", "microbench", "run_microbench",
           "sweep_shapes"]
