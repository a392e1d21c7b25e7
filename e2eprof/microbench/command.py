"""`e2eprof microbench`: validated config, capture + sweep + run_microbench, microbench.parquet, a short table."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from e2eprof.config import PRECISIONS, RUNS_DIR, DeviceDefaults, resolve_device
from e2eprof.errors import UsageError
from e2eprof.microbench.bench import MIN_TRIALS, run_microbench
from e2eprof.microbench.capture import AUTOCAST_DTYPES, capture_shapes, sweep_shapes
from e2eprof.patching import check_model_fits
from e2eprof.registry import load_patch
from e2eprof.tables.reports import check_writable, to_json, write_table
from e2eprof.suggest import suggest
from e2eprof.workloads.loops import check_workloads
from e2eprof.workloads.models import PRESETS, ModelLoadError, resolve_model

# Default model per architecture a patch declares: (on a GPU, on a CPU). GPT-2 small runs on a CPU at the small
# CPU batch; the 1B Llama and BERT-base would take minutes there, so CPUs get the tiny presets of those families.
DEFAULT_MODELS = {"gpt2": ("gpt2", "gpt2"), "llama": ("llama-1b", "llama-tiny"), "bert": ("bert-base", "bert-tiny")}
SWEEP_DTYPES = {"cuda": (torch.bfloat16, torch.float16, torch.float32), "cpu": (torch.float32, torch.bfloat16)}
CPU_COMPILE_OFF = "off by default on CPU (inductor compiles C++ for seconds per shape); pass --compile"


@dataclass(frozen=True)
class MicrobenchConfig:
    """One `microbench` run; validated on construction, errors name the option."""

    patch: str
    model: str | None = None  # default: from the patch's architectures
    device: str = "auto"
    precision: str | None = None  # autocast dtype of the captured model steps
    batch: int | None = None
    seq: int | None = None
    trials: int = MIN_TRIALS
    sweep: bool = True
    compile: bool | None = None  # default: on for CUDA, off on CPU
    seed: int = 0
    out: Path | None = None
    force: bool = False
    command_line: str = ""

    def __post_init__(self) -> None:
        if not self.patch:
            raise UsageError("--patch: must name a patch")
        device = resolve_device(self.device)
        object.__setattr__(self, "device", device)
        defaults = DeviceDefaults.for_device(device)
        for name, default in (("batch", defaults.batch), ("seq", defaults.seq), ("precision", defaults.precision),
                              ("compile", device.startswith("cuda"))):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        for name, low in (("batch", 1), ("seq", 2), ("trials", MIN_TRIALS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UsageError(f"--{name}: must be an integer >= {low}, got {value!r}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--dtype: unknown dtype '{self.precision}'{suggest(self.precision, PRECISIONS)}; "
                             f"known: {', '.join(PRECISIONS)}")
        if not device.startswith("cuda") and self.precision == "fp16":
            raise UsageError("--dtype: fp16 autocast needs a CUDA device; use fp32 or bf16 on the CPU")


def default_model(patch, device: str) -> str:
    """The preset to capture shapes from: the first architecture the patch declares, sized for the device."""
    if not patch.architectures:
        raise UsageError(f"--model: patch '{patch.name}' declares no architectures; name a model with --model")
    arch = patch.architectures[0]
    gpu, cpu = DEFAULT_MODELS.get(arch, (None, None))
    name = gpu if device.startswith("cuda") else cpu
    if name is None:
        name = next((p for p, kw in PRESETS.items() if kw["model_type"] == arch), None)
    if name is None:
        raise UsageError(f"--model: no preset for architecture '{arch}' (patch '{patch.name}'); name a model folder")
    return name


def _out_dir(config: MicrobenchConfig, patch_name: str) -> Path:
    if config.out is not None:
        out = Path(config.out)
    else:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in patch_name)
        out = Path(os.getcwd()) / RUNS_DIR / f"{stamp}-microbench-{safe}"
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out: {out} is a file, not a directory")
        if out.is_dir() and any(out.iterdir()) and not config.force:
            raise UsageError(f"--out: {out} already holds a report; use --force to overwrite it")
        out.mkdir(parents=True, exist_ok=True)
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"--out: cannot write reports to {out}: {exc.strerror or exc}") from None
    return out


def _versions() -> dict:
    found = {}
    for dist in ("torch", "transformers", "triton"):
        try:
            found[f"{dist}_version"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[f"{dist}_version"] = None
    return found


@dataclass
class MicrobenchResult:
    table: pd.DataFrame
    path: Path


def microbench(config: MicrobenchConfig, progress=None) -> MicrobenchResult:
    """Capture the model's calls of the patched op, add the sweep, check and time them, write microbench.parquet."""
    loaded = load_patch(config.patch)
    patch = loaded.patch
    model = config.model or default_model(patch, config.device)
    try:
        source = resolve_model(model)
        check_workloads(source, ("train", "infer"), config.seq)
    except (ModelLoadError, ValueError) as exc:
        message = str(exc) if str(exc).startswith("--") else f"--model: {exc}"
        raise UsageError(message) from None
    check_model_fits(patch, source.architecture, patch.model_attention)  # before any work
    out = _out_dir(config, patch.name)
    started = time.time_ns()
    say = progress or (lambda line: None)
    say(f"capturing {patch.name} calls from one train and one infer step of {model} "
        f"(batch {config.batch}, seq {config.seq}, {config.precision})")
    shapes = capture_shapes(patch, model, device=config.device, precision=config.precision, batch=config.batch,
                            seq=config.seq, seed=config.seed)
    if not shapes:
        raise UsageError(f"--patch: '{patch.name}' was never called by {model}'s train or infer step")
    if config.sweep:
        shapes += sweep_shapes(shapes, SWEEP_DTYPES["cuda" if config.device.startswith("cuda") else "cpu"])
    table = run_microbench(patch, shapes, config.device, trials=config.trials, use_compile=config.compile,
                           compile_off_reason=CPU_COMPILE_OFF if not config.device.startswith("cuda")
                           else "--no-compile", seed=config.seed, progress=say)
    device_name = torch.cuda.get_device_name(config.device) if config.device.startswith("cuda") else "cpu"
    meta = {"run_id": uuid.uuid4().hex, "started_unix_ns": started, "ended_unix_ns": time.time_ns(),
            "model": model, "batch": config.batch, "seq": config.seq, "precision": config.precision,
            "device_name": device_name, "patch_spec": loaded.spec, "patch_source_sha256": loaded.source_hash,
            "command_line": config.command_line, "autocast_dtype": str(AUTOCAST_DTYPES[config.precision]),
            "config_json": to_json({k: str(v) for k, v in vars(config).items()}), **_versions()}
    for key, value in meta.items():
        table[key] = value
    path = write_table(out, "microbench", table)
    return MicrobenchResult(table, path)


def _fmt(value, spec: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, spec)


def _roofline(row) -> str:
    """The roofline share, marked when the row moves its bytes faster than a copy can (the bandwidth floor)."""
    text = _fmt(row.roofline_share, ".0%")
    flag = row.get("plausible")
    return text + " > copy!" if flag is not None and not pd.isna(flag) and not flag else text


def print_table(console, table: pd.DataFrame, path: Path) -> None:
    """One line per model call and pass (replacement vs eager vs compile); the sweep summarised in two lines."""
    from rich.table import Table

    def lines(rows: pd.DataFrame):
        keys = ["workload", "signature", "pass"]
        for (workload, _, pass_name), group in rows.groupby(keys, sort=False):
            medians = dict(zip(group["impl"], group["median_us"]))
            repl = group[group.impl == "replacement"].iloc[0]
            yield workload, pass_name, repl, medians

    model = table[table.source == "model"]
    out = Table(title=f"{table.patch.iloc[0]} on {table.model.iloc[0]} ({table.device.iloc[0]}, copy roofline "
                      f"{table.copy_gbs.iloc[0]:.1f} GB/s)", title_justify="left")
    for column in ("workload", "shape", "in/out", "pass", "calls", "repl us", "eager us", "compile us", "roofline",
                   "vs eager", "vs compile", "correct"):
        out.add_column(column, justify="left" if column in ("workload", "shape", "in/out", "pass", "correct") else "right")
    for workload, pass_name, row, medians in lines(model):
        correct = "-" if pd.isna(row.passed) else ("yes" if row.passed else "no: " + str(row.detail)[:60])
        out.add_row(workload, row["shape"], f"{row.dtype_in}->{row.dtype_out}", pass_name, str(row.calls_per_step),
                    _fmt(medians.get("replacement"), ".1f"), _fmt(medians.get("eager"), ".1f"),
                    _fmt(medians.get("compile"), ".1f"), _roofline(row),
                    _fmt(row.speedup_vs_eager, ".2f"), _fmt(row.speedup_vs_compile, ".2f"), correct)
    console.print(out)
    sweep = table[(table.source == "sweep") & (table.impl == "replacement")]
    if len(sweep):
        failed = sweep[sweep.passed.eq(False).fillna(False)]
        rejected = table[(table.source == "sweep") & table.passed.isna() & (table.impl == "eager")]
        ratio = sweep.speedup_vs_eager.dropna()
        spread = f"vs eager {ratio.min():.2f}x .. {ratio.median():.2f}x .. {ratio.max():.2f}x (min, median, max)" if len(ratio) else "no speedups"
        console.print(f"sweep: {sweep.signature.nunique()} shapes x passes {len(sweep)}, {len(failed)} failed, "
                      f"{rejected.signature.nunique()} rejected by the stock op; {spread}")
        for _, row in failed.head(3).iterrows():
            console.print(f"  failed: {row.shape} {row.dtype_in} {row['pass']}: {str(row.detail)[:100]}")
    console.print(f"table: {path}", soft_wrap=True)
