"""One frozen, validated configuration per run. The CLI builds it; `e2eprof.compare` consumes it."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from e2eprof.harness import isolation
from e2eprof.distributed.options import DISTRIBUTED_WORKLOAD_NAMES, LaunchSpec, check_launch, is_distributed
from e2eprof.errors import UsageError
from e2eprof.suggest import suggest
from e2eprof.sweep import SweepPoint, as_tuple, grid

# A single-process run's workloads. The default decodes as serving stacks do (static cache, CUDA graphs); "generate"
# is Hugging Face's dynamic-cache decoding, host-bound, for comparison with what notebooks run.
DEFAULT_WORKLOADS = ("train", "infer", "decode")
WORKLOAD_NAMES = DEFAULT_WORKLOADS + ("generate",)
DECODING_WORKLOADS = ("decode", "generate")  # they take --new-tokens and report TTFT and TPOT
KNOWN_WORKLOADS = WORKLOAD_NAMES + DISTRIBUTED_WORKLOAD_NAMES
PRECISIONS = ("bf16", "fp16", "fp32")


# How far two identical processes' step times differ beyond their own intervals (relative SD of the A/A log-ratio;
# stats.with_process_noise): the floor under each run's own estimate. Measured with A/A runs
# (benchmarks/self_benchmark.py --part aa), not assumed: H200 from gpt2 train (reports/self-benchmark-h200/aa.md).
# What moves between processes is the GPU's idle time between kernels: how fast the host keeps the queue fed.
H200_PROCESS_NOISE = 0.0044
# Workloads whose identical processes differ more than training's, each measured by its own A/A runs: a floor of its
# own under the device's. Decode (gpt2, 16 tokens in CUDA graphs): 13 A/A runs imply 0.67% for one process against
# one (reports/self-benchmark-h200-decode/aa.md); judged with 0.44%, 3 of the 13 were false alarms, with 0.67% none.
# Set from those runs, so only A/A runs made after it can show whether it holds.
H200_WORKLOAD_PROCESS_NOISE = (("decode", 0.0067),)


def noise_floor(process_noise: float, workload_floors, workload: str) -> float:
    """The process noise a workload's intervals carry at least: PROCESS_NOISE, or the workload's own floor in
    WORKLOAD_FLOORS ((workload, floor) pairs) where it is higher."""
    return max(process_noise, float(dict(workload_floors or ()).get(workload, 0.0)))
# CPU: one process per arm cannot show its own spread, so a CPU verdict must not claim less than identical CPU
# processes differ by (reports/self-benchmark-cpu/aa.md).
CPU_PROCESS_NOISE = 0.11
# Processes per compared arm (baseline and candidate). One process per arm cannot resolve less than z x process
# noise; two per arm divide it by sqrt(2) (stats.replicated_process_noise) for a few seconds more of start-up, as JMH
# runs several forks of a JVM benchmark (reports/self-benchmark-h200/sensitivity.md). CPU: one, its cores are few.
H200_REPLICAS = 2
CPU_REPLICAS = 1
MAX_REPLICAS = 8


@dataclass(frozen=True)
class DeviceDefaults:
    """Sizes that fit the device: full GPT-2 batches on a GPU, a few seconds per step on a laptop CPU."""

    batch: int
    seq: int
    steps: int
    block_steps: int
    new_tokens: int
    precision: str
    max_warmup_steps: int
    reference_arms: tuple[str, ...]
    budget_seconds: float
    profile_warmup: int
    profile_steps: int
    process_noise: float
    replicas: int
    workload_process_noise: tuple[tuple[str, float], ...] = ()  # (workload, floor) above process_noise

    def noise_floor(self, workload: str) -> float:
        return noise_floor(self.process_noise, self.workload_process_noise, workload)

    @staticmethod
    def for_device(device: str) -> "DeviceDefaults":
        if device.startswith("cuda"):
            # torch.compile is the strongest stock path on a GPU; on a CPU its compile alone takes minutes.
            # 16 new tokens: decoding is host-bound, so a longer decode adds samples of the same per-token cost and
            # most of a run's time (reports/2026-12-02-h200-gpt2-fastsoftmax-default/summary.md).
            return DeviceDefaults(batch=8, seq=1024, steps=40, block_steps=5, new_tokens=16, precision="bf16",
                                  max_warmup_steps=50, reference_arms=("sdpa", "compile"), budget_seconds=60.0,
                                  profile_warmup=2, profile_steps=3, process_noise=H200_PROCESS_NOISE,
                                  replicas=H200_REPLICAS, workload_process_noise=H200_WORKLOAD_PROCESS_NOISE)
        # CPU step times are noisy (2-core laptops, shared CI): windows rarely agree within 2%, so cap warm-up low,
        # and spend no extra time chasing a 1% interval that a CPU will not give in minutes.
        # GPT-2's 50k-token LM head makes a CPU train step cost ~0.2 s per 32 tokens on two cores: one 64-token
        # sequence keeps the whole default job in a few minutes.
        return DeviceDefaults(batch=1, seq=64, steps=6, block_steps=2, new_tokens=8, precision="fp32",
                              max_warmup_steps=6, reference_arms=("sdpa",), budget_seconds=0.0,
                              # The CPU profiler records every op with shapes: a gpt2 train step costs ~3x under it.
                              profile_warmup=1, profile_steps=2, process_noise=CPU_PROCESS_NOISE,
                              replicas=CPU_REPLICAS)


@dataclass(frozen=True)
class CompareConfig:
    """Everything that defines one `compare` run; validated on construction, errors name the field."""

    model: str
    patch: str
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    device: str = "auto"
    # batch, seq and precision take one value or a list: a list of any of them makes a sweep over their grid
    batch: int | tuple[int, ...] | None = None
    seq: int | tuple[int, ...] | None = None
    steps: int | None = None  # timed warm steps per arm and workload
    block_steps: int | None = None  # steps per interleaved block
    precision: str | tuple[str, ...] | None = None
    new_tokens: int | None = None
    seed: int = 0
    reference_arms: tuple[str, ...] | None = None  # stock arms to compare with (default by device)
    min_speedup: float = 0.01  # PASS needs the interval's lower bound above 1 + this
    confidence: float = 0.95  # of every interval; 1 - confidence is the significance level
    correction: str = "holm"  # across workloads: holm (family-wise), bh (false discovery rate) or none
    aa: bool = False  # A/A calibration: the baseline against a second, identical baseline process
    process_noise: float | None = None  # between-process spread folded into every interval (default by device)
    # Workloads' own floors above process_noise, from the device defaults; none when --process-noise is given.
    workload_process_noise: tuple[tuple[str, float], ...] | None = None
    replicas: int | None = None  # identical processes for the baseline and the candidate arm each (default by device)
    target_half_width: float = 0.01  # adaptive length: add blocks until the speedup interval is this tight...
    budget_seconds: float | None = None  # ...or this much more timed time per workload is spent (default by device)
    max_blocks: int = 400  # and never more blocks than this per arm
    clock_tolerance: float = 0.02  # arms whose median SM clocks differ by more than this cannot PASS
    temp_tolerance_c: float = 5.0  # nor arms whose median GPU temperatures differ by more than this
    policy: str | None = None  # the TOML file thresholds came from, recorded for the report
    max_warmup_steps: int | None = None  # cap on warm-up steps per arm and workload (default by device)
    max_warmup_seconds: float = 60.0  # and on warm-up time per arm and workload
    warmup_tolerance: float = 0.02  # warm-up ends when consecutive window medians differ by less than this
    profile: bool = True  # per-op profiling phase after timing
    profile_warmup: int | None = None  # default by device
    profile_steps: int | None = None
    trace: bool = False  # also export gzipped Chrome traces (size-capped)
    find_max_batch: bool = False  # instead of timing: the largest batch each arm runs without running out of memory
    microbench: bool = False  # after timing: the replaced op alone on the shapes the model called it with
    max_batch: int = 1024  # where that search stops
    out: Path | None = None
    force: bool = False
    command_line: str = ""
    nproc: int = 1  # ranks per arm on this node: > 1 (or a train-ddp/train-fsdp workload) launches each arm with torchrun
    nnodes: int = 1  # passed through to torchrun, with rdzv_endpoint (HOST:PORT)
    rdzv_endpoint: str | None = None
    isolate: str | tuple[str, ...] | None = None  # worker isolation parts (e2eprof.harness.isolation); None: all of them
    extra: dict = field(default_factory=dict)
    # Several --patch options: each spec (a patch, or "a+b" stacked in one arm) is a candidate arm of its own,
    # judged against the one baseline and against each other (e2eprof.candidates). Empty: `patch` is the only one.
    candidates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model:
            raise UsageError("--model: must name a preset or a folder")
        if self.candidates:
            from e2eprof.candidates import check_specs
            object.__setattr__(self, "candidates", check_specs(self.candidates, aa=self.aa))
            if len(self.candidates) > 1 and (self.microbench or self.find_max_batch):
                raise UsageError("--patch: several candidates cannot be combined with --microbench or --find-max-batch; "
                                 "run those for one patch")
            if len(self.candidates) > 1:  # what names the run (its folder, run.parquet's patch_spec)
                object.__setattr__(self, "patch", ",".join(self.candidates))
            else:
                object.__setattr__(self, "patch", self.candidates[0])
        elif self.patch:
            from e2eprof.candidates import check_specs
            check_specs((self.patch,), aa=self.aa)  # a stack of one --patch: no patch twice
        if not self.patch:
            raise UsageError("--patch: must name a patch")
        # A single name is one workload (tuple('train') would be five one-letter ones).
        workloads = (self.workloads,) if isinstance(self.workloads, str) else tuple(self.workloads)
        if not workloads:
            raise UsageError("--workload: give at least one of " + ", ".join(WORKLOAD_NAMES))
        for w in workloads:
            if w not in KNOWN_WORKLOADS:
                raise UsageError(f"--workload: unknown workload '{w}'{suggest(w, KNOWN_WORKLOADS)}; known: {', '.join(KNOWN_WORKLOADS)}")
        if len(set(workloads)) != len(workloads):
            raise UsageError("--workload: each workload at most once")
        object.__setattr__(self, "workloads", workloads)
        device = resolve_device(self.device)
        object.__setattr__(self, "device", device)
        check_launch(workloads=workloads, device=device, nproc=self.nproc, nnodes=self.nnodes,
                     rdzv_endpoint=self.rdzv_endpoint, find_max_batch=self.find_max_batch)
        defaults = DeviceDefaults.for_device(device)
        if self.workload_process_noise is None:  # a --process-noise of the user's is the noise of every workload
            object.__setattr__(self, "workload_process_noise",
                               defaults.workload_process_noise if self.process_noise is None else ())
        for name in ("batch", "seq", "steps", "block_steps", "new_tokens", "precision", "max_warmup_steps",
                     "reference_arms", "budget_seconds", "profile_warmup", "profile_steps", "process_noise"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(defaults, name))
        distributed = is_distributed(workloads, self.nproc, self.nnodes)
        if self.replicas is None:  # a data-parallel arm is a torchrun group: one group per arm
            object.__setattr__(self, "replicas", 1 if distributed else defaults.replicas)
        for name, low in (("batch", 1), ("seq", 2)):
            object.__setattr__(self, name, _one_or_tuple(name, [_checked_int(name, v, low) for v in as_tuple(getattr(self, name))]))
        for name, low in (("steps", 2), ("block_steps", 1), ("new_tokens", 2), ("max_warmup_steps", 0),
                          ("profile_warmup", 0), ("profile_steps", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UsageError(f"--{name.replace('_', '-')}: must be an integer >= {low}, got {value!r}")
        if self.block_steps > self.steps:
            raise UsageError(f"--block-steps: {self.block_steps} is more than --steps {self.steps}")
        for precision in as_tuple(self.precision):
            if precision not in PRECISIONS:
                raise UsageError(f"--dtype: unknown dtype '{precision}'{suggest(str(precision), PRECISIONS)}; known: {', '.join(PRECISIONS)}")
            if not device.startswith("cuda") and precision == "fp16":
                raise UsageError("--dtype: fp16 autocast needs a CUDA device; use fp32 or bf16 on the CPU")
        object.__setattr__(self, "precision", _one_or_tuple("dtype", as_tuple(self.precision)))
        _checked_int("max_batch", self.max_batch, 1)
        if not 0.5 < self.confidence < 1:
            raise UsageError(f"--confidence: must be between 0.5 and 1, got {self.confidence}")
        if not -0.5 < self.min_speedup < 1:
            raise UsageError(f"--min-speedup: must be a fraction such as 0.01, got {self.min_speedup}")
        if not 0 < self.warmup_tolerance < 1:
            raise UsageError(f"warmup_tolerance: must be a fraction, got {self.warmup_tolerance}")
        object.__setattr__(self, "reference_arms", tuple(self.reference_arms))
        for arm in self.reference_arms:
            if arm not in REFERENCE_ARMS:
                raise UsageError(f"--reference: unknown reference arm '{arm}'{suggest(arm, REFERENCE_ARMS)}; known: {', '.join(REFERENCE_ARMS)}")
        if self.aa:
            object.__setattr__(self, "reference_arms", ())  # an A/A run times the baseline against itself only
        if self.correction not in CORRECTIONS:
            raise UsageError(f"correction: unknown method '{self.correction}'{suggest(self.correction, CORRECTIONS)}; known: {', '.join(CORRECTIONS)}")
        if not 0 < self.clock_tolerance < 1:
            raise UsageError(f"clock_tolerance: must be a fraction such as 0.02, got {self.clock_tolerance}")
        if not 0 < self.temp_tolerance_c < 100:
            raise UsageError(f"temp_tolerance_c: must be in degrees C, got {self.temp_tolerance_c}")
        if not (isinstance(self.process_noise, (int, float)) and 0 <= self.process_noise < 0.5):
            raise UsageError(f"--process-noise: must be a fraction such as 0.004 (0 to switch it off), got {self.process_noise}")
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool) or not 1 <= self.replicas <= MAX_REPLICAS:
            raise UsageError(f"--replicas: must be an integer from 1 to {MAX_REPLICAS}, got {self.replicas!r}")
        if self.replicas > 1 and distributed:
            raise UsageError("--replicas: a data-parallel run (--nproc, train-ddp, train-fsdp) runs one worker group per arm; use --replicas 1")
        if not 0 < self.target_half_width < 0.5:
            raise UsageError(f"--target-ci: must be a fraction such as 0.01, got {self.target_half_width}")
        if not 0 <= self.budget_seconds <= 86400:
            raise UsageError(f"--budget: must be between 0 and 86400 seconds, got {self.budget_seconds}")
        try:
            object.__setattr__(self, "isolate", isolation.parse(self.isolate, self.device))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not isinstance(self.max_blocks, int) or self.max_blocks < self.n_blocks:
            raise UsageError(f"max_blocks: must be an integer >= the {self.n_blocks} blocks --steps asks for, got {self.max_blocks!r}")

    @property
    def points(self) -> tuple[SweepPoint, ...]:
        """The (batch, seq, precision) points of this run: one, or the grid of a sweep."""
        return grid(as_tuple(self.batch), as_tuple(self.seq), as_tuple(self.precision))

    @property
    def is_sweep(self) -> bool:
        return len(self.points) > 1

    def at(self, point: SweepPoint) -> "CompareConfig":
        """This run's settings at one point of its sweep: batch, seq and precision single values."""
        # Not validated again: this config was, and a recorded one re-judged by `gate` may name a device not here.
        return CompareConfig.from_record(self.to_record() | {"batch": point.batch, "seq": point.seq,
                                                             "precision": point.precision})

    @property
    def launch(self) -> LaunchSpec | None:
        """How each arm's torchrun worker group starts; None when each arm is one process."""
        if not is_distributed(self.workloads, self.nproc, self.nnodes):
            return None
        return LaunchSpec(nproc=self.nproc, nnodes=self.nnodes, rdzv_endpoint=self.rdzv_endpoint)

    @property
    def n_blocks(self) -> int:
        """Timed blocks per arm: steps rounded up to whole blocks."""
        return -(-self.steps // self.block_steps)

    @classmethod
    def from_record(cls, record: dict) -> "CompareConfig":
        """The configuration a run recorded (to_record), as it was: validated when that run started, and not resolved
        again (a CUDA run is re-judged on a machine without a GPU). Unknown keys of another version are dropped."""
        config = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in record:
                value = record[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                raise UsageError(f"the recorded configuration has no '{f.name}'")
            if isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            object.__setattr__(config, f.name, Path(value) if f.name == "out" and value else value)
        # Recorded by an e2eprof from before these options: what such a run did (no process noise, one process each).
        for name, before in (("process_noise", 0.0), ("replicas", 1), ("isolate", isolation.parse(None)),
                             ("workload_process_noise", ())):
            if record.get(name) is None:
                object.__setattr__(config, name, before)
        return config

    def noise_floor(self, workload: str) -> float:
        return noise_floor(self.process_noise or 0.0, self.workload_process_noise, workload)

    def to_record(self) -> dict:
        """Flat, JSON-friendly view for run.parquet."""
        record = dataclasses.asdict(self)
        record["out"] = str(self.out) if self.out else None
        record["workloads"] = list(self.workloads)
        record["reference_arms"] = list(self.reference_arms)
        record["isolate"] = list(self.isolate)
        record["workload_process_noise"] = [list(pair) for pair in self.workload_process_noise or ()]
        if self.candidates:  # absent in a run of one --patch, as before candidates existed (resume compares records)
            record["candidates"] = list(self.candidates)
        else:
            record.pop("candidates")
        return record


def _checked_int(name: str, value, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"--{name.replace('_', '-')}: must be an integer >= {low}, got {value!r}")
    return value


def _one_or_tuple(name: str, values) -> object:
    """A single value stays a value (the common, non-sweep case); several become a tuple, each at most once."""
    values = tuple(values)
    if not values:
        raise UsageError(f"--{name}: give at least one value")
    if len(set(values)) != len(values):
        raise UsageError(f"--{name}: each value at most once, got {', '.join(map(str, values))}")
    return values[0] if len(values) == 1 else values


REFERENCE_ARMS = ("sdpa", "compile")
CORRECTIONS = ("holm", "bh", "none")
AA_ARM = "baseline-aa"  # the second baseline process of an A/A run


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; rejects devices that are not there.

    Where NVML sees NVIDIA GPUs and CUDA_VISIBLE_DEVICES does not narrow them, NVML answers and torch is not
    imported: that import is seconds of a GPU host's start-up, and the command line starts its workers before it
    (harness/prestart.py). Whether torch can use the device is then checked by `check_torch_device` before anything
    is measured. Everywhere else torch answers: once it is imported, without NVML, or where NVML sees no NVIDIA GPU
    (torch may still see another vendor's).
    """
    if device == "cpu":
        return "cpu"
    if device != "auto" and not device.startswith("cuda"):
        raise UsageError(f"--device: unknown device '{device}'; use auto, cpu, cuda or cuda:N")
    count = None if "torch" in sys.modules else _nvml_gpu_count()
    if count is None:
        return _torch_device(device)
    if device == "auto":
        return "cuda"
    _check_index(device, count, "visible to NVML")
    return device


def check_torch_device(device: str) -> None:
    """Raise UsageError if torch cannot use `device`, a device resolve_device may have accepted from NVML alone."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device: '{device}': NVML sees an NVIDIA GPU, but torch {torch.__version__} cannot use "
                             f"it (a build without CUDA?); install a CUDA build of torch, or pass --device cpu")
        _check_index(device, torch.cuda.device_count(), "visible")


def _torch_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise UsageError(f"--device: '{device}' asked for, but no CUDA device is visible")
    _check_index(device, torch.cuda.device_count(), "visible")
    return device


def _check_index(device: str, count: int, seen: str) -> None:
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= count):
        raise UsageError(f"--device: '{device}' does not exist; {count} CUDA device(s) {seen}")


def _nvml_gpu_count() -> int | None:
    """How many GPUs torch will see, as far as NVML can tell: every NVIDIA GPU, or those a CUDA_VISIBLE_DEVICES list
    of distinct indices names. None where NVML cannot tell: no NVML, no GPU, or another CUDA_VISIBLE_DEVICES (UUIDs,
    MIG instances, an empty or invalid list: torch's reading of those is the one that counts)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = None if visible is None else [part.strip() for part in visible.split(",")]
    if indices is not None and not (all(i.isdigit() for i in indices) and len(set(map(int, indices))) == len(indices)):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: torch answers
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        return None
    finally:
        pynvml.nvmlShutdown()
    if indices is not None:
        return len(indices) if all(int(i) < count for i in indices) else None
    return count or None


# Where runs go without --out: a folder of the working directory that .gitignore lists, so a run never dirties a
# checkout (reports/ holds the curated runs the README cites).
RUNS_DIR = "e2eprof-runs"


def default_out_dir(model: str, patch: str, now_utc: str) -> Path:
    """e2eprof-runs/<UTC timestamp>-<model>-<patch>/ under the working directory, path-unsafe characters replaced."""
    safe = lambda s: "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(s).name or s)  # noqa: E731
    return Path(os.getcwd()) / RUNS_DIR / f"{now_utc}-{safe(model)}-{safe(patch)}"
