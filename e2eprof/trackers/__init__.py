"""What a run records beside step times: NVML telemetry, torch.profiler tables, memory peaks, just-in-time compilation events."""
