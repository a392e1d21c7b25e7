"""e2eprof: does a custom kernel's microbenchmark win survive inside a real training or inference loop?"""

__version__ = "0.1.0"
