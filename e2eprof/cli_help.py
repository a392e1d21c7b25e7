"""Help texts of the command line's options, built from the same catalog `e2eprof list` reads and from the defaults
a run really uses, so a new preset, patch or default shows up in `--help` without anyone editing a string."""

from __future__ import annotations

import dataclasses

from e2eprof import catalog
from e2eprof.config import CompareConfig, DeviceDefaults

_GPU, _CPU = DeviceDefaults.for_device("cuda"), DeviceDefaults.for_device("cpu")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CompareConfig)}


def by_device(field: str, show=str) -> str:
    """'(default: 40 on GPU, 6 on CPU)' for a default that depends on the device."""
    gpu, cpu = show(getattr(_GPU, field)), show(getattr(_CPU, field))
    return f"(default: {gpu})" if gpu == cpu else f"(default: {gpu} on GPU, {cpu} on CPU)"


def arms_text(arms) -> str:
    return ",".join(arms) or "none"


def listed(names) -> str:
    return ", ".join(names)


MODEL_HELP = f"Preset ({listed(catalog.model_presets())}) or a local Hugging Face folder (config.json + *.safetensors)."
PATCH_HELP = ("Patch: built-in (" + listed(catalog.builtin_patches() + catalog.installed_patches())
              + "), file.py[:NAME] or package.module:NAME.")
WORKLOAD_HELP = f"{listed(catalog.workloads())} (repeat or comma-separate)."
DEVICE_HELP = "auto (a GPU when one is visible), cpu, cuda or cuda:N."
BATCH_HELP = f"Batch size, or a list such as 1,8,32 to sweep {by_device('batch')}."
SEQ_HELP = (f"Sequence length, or a list such as 128,512 to sweep {by_device('seq')}; never longer than the "
            f"model's position table.")
STEPS_HELP = f"Timed warm steps per arm and workload before adaptive extension {by_device('steps')}."
BLOCK_STEPS_HELP = f"Steps per interleaved block {by_device('block_steps')}."
DTYPE_HELP = f"Autocast dtype: {listed(catalog.precisions())}, or a list to sweep {by_device('precision')}."
NEW_TOKENS_HELP = f"Tokens to generate per step in the decode and generate workloads {by_device('new_tokens')}."
REFERENCE_HELP = (f"Stock reference arms: {listed(catalog.reference_arms())}, or none "
                  f"{by_device('reference_arms', arms_text)}.")
MIN_SPEEDUP_HELP = f"PASS needs the speedup interval's lower bound above 1 + this (default: {_DEFAULTS['min_speedup']})."
BUDGET_HELP = (f"Adaptive length: seconds of timed steps per workload to spend reaching --target-ci; 0 = fixed --steps "
               f"{by_device('budget_seconds', lambda v: f'{v:g}')}.")
TARGET_CI_HELP = (f"Stop adding blocks once the speedup interval's half-width is under this fraction "
                  f"(default: {_DEFAULTS['target_half_width']}).")
PROCESS_NOISE_HELP = ("Between-process spread (relative SD of an A/A ratio beyond its interval) folded into every "
                      f"interval, 0 = off {by_device('process_noise', lambda v: f'{v:g}')}; on a GPU "
                      + ", ".join(f"{w} {v:g}" for w, v in _GPU.workload_process_noise)
                      + " (their own A/A runs); given, it is every workload's. benchmarks/self_benchmark.py --part aa "
                      "measures yours.")
REPLICAS_HELP = ("Identical worker processes for the baseline and the candidate arm each "
                 f"{by_device('replicas')}; each process has its own step-time offset, and N per arm shrink that "
                 "part of the interval by sqrt(N).")
ISOLATE_HELP = ("Worker isolation: all, none, or a comma list of cores (own CPU cores per worker), threads (intra-op "
                "threads sized to them), passive (idle OpenMP threads sleep), gc (no garbage collection inside timed "
                "steps), malloc (freed host blocks stay with the process between steps) (default: threads,passive,gc; "
                "on a CPU also malloc).")
OUT_HELP = "Report directory (default: e2eprof-runs/<UTC time>-<model>-<patch>/ under the working directory)."
