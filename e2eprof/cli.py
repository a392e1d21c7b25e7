"""Command line: parse options, build a config, call the library. Errors become one line and an exit code.

Exit codes: 0 PASS, 1 FAIL, 3 INCONCLUSIVE (worst over workloads), 2 bad usage, 4 the run itself failed,
130 interrupted.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from e2eprof.errors import E2EProfError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Does a custom kernel's microbenchmark win survive inside a real training or inference loop?")
# Reports are read in CI logs as often as in terminals: don't squeeze tables into 80 columns there.
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
out_console = Console(width=None if sys.stdout.isatty() else 140)


def _split(values: list[str] | None) -> tuple[str, ...] | None:
    """Accept both --workload train --workload infer and --workload train,infer."""
    if not values:
        return None
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


@app.command()
def compare(
    model: Annotated[str, typer.Option(help="Preset (gpt2, gpt2-medium, gpt2-tiny) or a local Hugging Face folder.")] = "gpt2",
    patch: Annotated[str, typer.Option(help="Patch: built-in name, file.py[:NAME] or package.module:NAME.")] = "fastsoftmax",
    workload: Annotated[Optional[list[str]], typer.Option(help="train, infer, generate (repeat or comma-separate; default all).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    batch: Annotated[Optional[int], typer.Option(help="Batch size (default: 8 on GPU, 2 on CPU).")] = None,
    seq: Annotated[Optional[int], typer.Option(help="Sequence length (default: 1024 on GPU, 128 on CPU).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Timed warm steps per arm and workload.")] = None,
    block_steps: Annotated[Optional[int], typer.Option(help="Steps per interleaved block.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="Autocast dtype: bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU).")] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help="Tokens to generate in the generate workload.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights and batches.")] = 0,
    reference: Annotated[Optional[list[str]], typer.Option(help="Stock reference arms: sdpa, or none.")] = None,
    min_speedup: Annotated[float, typer.Option(help="PASS needs the speedup interval's lower bound above 1 + this.")] = 0.01,
    out: Annotated[Optional[Path], typer.Option(help="Report directory (default reports/<UTC time>-<model>-<patch>/).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing report directory.")] = False,
    profile: Annotated[bool, typer.Option(help="Per-op profiling phase after timing.")] = True,
    trace: Annotated[bool, typer.Option(help="Also write a gzipped Chrome trace per arm and workload (size-capped).")] = False,
) -> int:
    """Time baseline, patched and stock-reference arms of a model's real loops; check correctness; sign off."""
    from e2eprof.config import CompareConfig
    from e2eprof.console import ConsoleEvents, print_summary
    from e2eprof.runner import compare as run_compare

    references = _split(reference)
    config = CompareConfig(
        model=model, patch=patch, workloads=_split(workload) or ("train", "infer", "generate"), device=device,
        batch=batch, seq=seq, steps=steps, block_steps=block_steps, precision=dtype, new_tokens=new_tokens, seed=seed,
        reference_arms=() if references == ("none",) else (references or ("sdpa",)), min_speedup=min_speedup,
        out=out, force=force, profile=profile, trace=trace, command_line=shlex.join(["e2eprof", *sys.argv[1:]]),
    )
    events = ConsoleEvents(err_console)
    try:
        report = run_compare(config, events=events)
    finally:
        events.close()
    print_summary(out_console, report.summary, report.verdicts, report.run_dir)
    return report.exit_code


@app.command("list")
def list_things() -> int:
    """Show models, workloads and patches, with where each comes from."""
    from e2eprof.config import WORKLOAD_NAMES
    from e2eprof.registry import BUILTIN_PATCHES, _entry_points, load_patch
    from e2eprof.workloads.models import PRESETS

    out_console.print("models:    " + ", ".join(PRESETS) + ", or a local folder (config.json + *.safetensors)")
    out_console.print("workloads: " + ", ".join(WORKLOAD_NAMES))
    out_console.print("patches:")
    for name in BUILTIN_PATCHES:
        loaded = load_patch(name)
        out_console.print(f"  {name:<14} builtin      {loaded.patch.description}")
    for name, ep in _entry_points().items():
        out_console.print(f"  {name:<14} entry point  {ep.value}")
    return 0


def _error_line(message: str) -> None:
    # Plain print, not rich: rich would wrap a long message over several lines.
    print(" ".join(message.split()), file=sys.stderr)


def _click_exceptions(name: str) -> tuple[type, ...]:
    """The class `name` from click and from the copy of click that newer typer releases vendor."""
    found = []
    for module_name in ("click.exceptions", "typer._click.exceptions"):
        try:
            module = __import__(module_name, fromlist=[name])
        except ImportError:
            continue
        if hasattr(module, name):
            found.append(getattr(module, name))
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turn every failure into one line and an exit code."""
    try:
        code = app(args=argv, standalone_mode=False, prog_name="e2eprof")
    except _click_exceptions("NoArgsIsHelpError"):
        code = 0  # click printed the help already
    except _click_exceptions("UsageError") as exc:
        _error_line(f"e2eprof: error: {exc.format_message()}")
        code = 2
    except (*_click_exceptions("Abort"), KeyboardInterrupt):
        _error_line("e2eprof: interrupted; tables written so far are kept, the run is marked interrupted")
        code = 130
    except E2EProfError as exc:
        _error_line(f"e2eprof: error: {exc}")
        code = exc.exit_code
    except Exception as exc:  # an unexpected bug: still one line, with a way to see more
        if os.environ.get("E2EPROF_DEBUG"):
            raise
        _error_line(f"e2eprof: internal error: {type(exc).__name__}: {exc} (set E2EPROF_DEBUG=1 for the traceback)")
        code = 4
    if isinstance(code, int):
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console script: exit with main()'s code."""
    sys.exit(main())
