"""Command line: parse options, build a config, call the library. Errors become one line and an exit code.

Exit codes: 0 PASS, 1 FAIL, 3 INCONCLUSIVE (worst over workloads), 2 bad usage, 4 the run itself failed,
130 interrupted (143 on SIGTERM). `diff`: 0 nothing got worse, 1 something got significantly worse, 2 bad usage.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from e2eprof import catalog, interrupt, startup
from e2eprof.cli_help import (
    BATCH_HELP, BLOCK_STEPS_HELP, BUDGET_HELP, DEVICE_HELP, DTYPE_HELP, ISOLATE_HELP, MIN_SPEEDUP_HELP, MODEL_HELP,
    NEW_TOKENS_HELP, OUT_HELP, PATCH_HELP, PROCESS_NOISE_HELP, REFERENCE_HELP, REPLICAS_HELP, SEQ_HELP, STEPS_HELP,
    TARGET_CI_HELP, WORKLOAD_HELP, by_device, listed,
)
from e2eprof.config import DEFAULT_WORKLOADS
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


def _values(option: str, value: str | None, kind: type = str):
    """'1,8,32' -> (1, 8, 32) for a sweep; one value stays one value; None (not given) stays None."""
    if value is None:
        return None
    from e2eprof.errors import UsageError

    parts = [part.strip() for part in value.split(",")]
    if not all(parts):
        raise UsageError(f"{option}: empty value in '{value}'; give a comma-separated list such as 1,8,32")
    try:
        values = tuple(kind(part) for part in parts)
    except ValueError:
        raise UsageError(f"{option}: '{value}' is not a comma-separated list of integers") from None
    return values[0] if len(values) == 1 else values


@app.command()
def compare(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "gpt2",
    patch: Annotated[Optional[list[str]], typer.Option(help=PATCH_HELP + " Repeat it to compare several candidates in one run (each its own arm, one baseline, ranked); a+b stacks patches of different sites in one arm (default: fastsoftmax).")] = None,
    workload: Annotated[Optional[list[str]], typer.Option(help=WORKLOAD_HELP + f" decode: static KV cache, one-token step in a CUDA graph, as served; generate: Hugging Face's dynamic cache (default: {','.join(DEFAULT_WORKLOADS)})")] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    batch: Annotated[Optional[str], typer.Option(help=BATCH_HELP)] = None,
    seq: Annotated[Optional[str], typer.Option(help=SEQ_HELP)] = None,
    steps: Annotated[Optional[int], typer.Option(help=STEPS_HELP)] = None,
    block_steps: Annotated[Optional[int], typer.Option(help=BLOCK_STEPS_HELP)] = None,
    dtype: Annotated[Optional[str], typer.Option(help=DTYPE_HELP)] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help=NEW_TOKENS_HELP)] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights and batches.")] = 0,
    reference: Annotated[Optional[list[str]], typer.Option(help=REFERENCE_HELP)] = None,
    min_speedup: Annotated[Optional[float], typer.Option(help=MIN_SPEEDUP_HELP)] = None,
    budget: Annotated[Optional[float], typer.Option(help=BUDGET_HELP)] = None,
    target_ci: Annotated[Optional[float], typer.Option(help=TARGET_CI_HELP)] = None,
    process_noise: Annotated[Optional[float], typer.Option(help=PROCESS_NOISE_HELP)] = None,
    replicas: Annotated[Optional[int], typer.Option(help=REPLICAS_HELP)] = None,
    isolate: Annotated[Optional[str], typer.Option(help=ISOLATE_HELP)] = None,
    policy: Annotated[Optional[Path], typer.Option(help="TOML file with sign-off thresholds (min_speedup, confidence, correction, target_ci, budget, ...); options given here win (default: none, the built-in thresholds).")] = None,
    aa: Annotated[bool, typer.Option("--aa", help="A/A calibration: time the baseline against a second identical baseline; must show no difference (default: off).")] = False,
    out: Annotated[Optional[Path], typer.Option(help=OUT_HELP)] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing report directory.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out with the same options: finished (point, workload) units are kept, the rest run again from their start (default: off).")] = False,
    profile: Annotated[bool, typer.Option(help="Per-op profiling phase after timing.")] = True,
    trace: Annotated[bool, typer.Option(help="Also write a gzipped Chrome trace per arm and workload (size-capped).")] = False,
    microbench: Annotated[bool, typer.Option(help="After timing, microbenchmark the replaced op alone on the shapes the model called it with (microbench/<point>/microbench.parquet).")] = False,
    find_max_batch: Annotated[bool, typer.Option("--find-max-batch", help="Instead of timing: the largest batch each arm runs (one train and infer step) without running out of memory, per --seq and --dtype (default: off).")] = False,
    max_batch: Annotated[int, typer.Option(help="Largest batch --find-max-batch tries.")] = 1024,
    nproc: Annotated[int, typer.Option(help="Ranks per arm: > 1 launches each arm with torchrun for --workload train-ddp or train-fsdp (--batch is per rank).")] = 1,
    nnodes: Annotated[int, typer.Option(help="Nodes of a data-parallel run (passed to torchrun; needs --rdzv-endpoint).")] = 1,
    rdzv_endpoint: Annotated[Optional[str], typer.Option(help="HOST:PORT where a data-parallel run's ranks meet (arm i uses PORT+i; default: a free local port).")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="Also write the verdicts as JUnit XML to this file (one test case per point and workload; default: none).")] = None,
    summary_md: Annotated[Optional[Path], typer.Option(help="Also write the markdown summary to this file (appended to $GITHUB_STEP_SUMMARY whenever that is set; default: none).")] = None,
) -> int:
    """Time baseline, patched and stock-reference arms of a model's real loops; check correctness; sign off."""
    references = _split(reference)
    patches = patch or ["fastsoftmax"]
    config = _config(
        policy, model=model, patch=patches[0], candidates=tuple(patches) if len(patches) > 1 else None, device=device,
        workloads=_split(workload) or (("train-ddp",) if nproc > 1 or nnodes > 1 else DEFAULT_WORKLOADS),
        batch=_values("--batch", batch, int), seq=_values("--seq", seq, int), steps=steps, block_steps=block_steps,
        precision=_values("--dtype", dtype), new_tokens=new_tokens, seed=seed, find_max_batch=find_max_batch,
        max_batch=max_batch,
        reference_arms=() if references == ("none",) else references, min_speedup=min_speedup,
        budget_seconds=budget, target_half_width=target_ci, aa=aa, process_noise=process_noise, replicas=replicas,
        isolate=isolate, out=out, force=force, profile=profile, trace=trace, microbench=microbench,
        nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
    )
    return _run(config, resume=resume, outputs=_outputs(junit, summary_md))


@app.command()
def calibrate(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "gpt2",
    patch: Annotated[str, typer.Option(help="The comparison whose baseline is calibrated (its attention implementation is used). " + PATCH_HELP)] = "fastsoftmax",
    workload: Annotated[Optional[list[str]], typer.Option(help=WORKLOAD_HELP + " (default: train)")] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    batch: Annotated[Optional[int], typer.Option(help=f"Batch size {by_device('batch')}.")] = None,
    seq: Annotated[Optional[int], typer.Option(help=f"Sequence length {by_device('seq')}.")] = None,
    steps: Annotated[Optional[int], typer.Option(help=STEPS_HELP)] = None,
    block_steps: Annotated[Optional[int], typer.Option(help=BLOCK_STEPS_HELP)] = None,
    dtype: Annotated[Optional[str], typer.Option(help=f"Autocast dtype: {listed(catalog.precisions())} {by_device('precision')}.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights and batches.")] = 0,
    budget: Annotated[Optional[float], typer.Option(help=BUDGET_HELP)] = None,
    process_noise: Annotated[Optional[float], typer.Option(help=PROCESS_NOISE_HELP)] = None,
    replicas: Annotated[Optional[int], typer.Option(help=REPLICAS_HELP)] = None,
    isolate: Annotated[Optional[str], typer.Option(help=ISOLATE_HELP)] = None,
    policy: Annotated[Optional[Path], typer.Option(help="TOML file with sign-off thresholds (default: none, the built-in thresholds).")] = None,
    out: Annotated[Optional[Path], typer.Option(help=OUT_HELP)] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing report directory.")] = False,
    junit: Annotated[Optional[Path], typer.Option(help="Also write the verdicts as JUnit XML to this file (one test case per point and workload; default: none).")] = None,
    summary_md: Annotated[Optional[Path], typer.Option(help="Also write the markdown summary to this file (appended to $GITHUB_STEP_SUMMARY whenever that is set; default: none).")] = None,
) -> int:
    """A/A run (the same stock arm in two processes): PASS means no false difference; shows the noise floor."""
    config = _config(
        policy, model=model, patch=patch, workloads=_split(workload) or ("train",), device=device, batch=batch, seq=seq,
        steps=steps, block_steps=block_steps, precision=dtype, seed=seed, budget_seconds=budget, aa=True,
        process_noise=process_noise, replicas=replicas, isolate=isolate,
        out=out, force=force, profile=False,
    )
    return _run(config, outputs=_outputs(junit, summary_md))


def _config(policy: Path | None, **options):
    """CompareConfig from: defaults, then the policy file, then the options the user gave (None = not given)."""
    from e2eprof.config import CompareConfig
    from e2eprof.analysis.policy import load_policy

    values = load_policy(policy) if policy is not None else {}
    values.update({k: v for k, v in options.items() if v is not None})
    if values.get("seq") is None:
        values["seq"] = _default_seq_that_fits(values.get("model"), values.get("device", "auto"))
    return CompareConfig(**values, policy=str(policy) if policy else None,
                         command_line=_command_line())


def _default_seq_that_fits(model: str | None, device: str) -> int | None:
    """The device's default sequence length, or the model's position count where that is shorter.

    The GPU default (1024 tokens) is GPT-2's context, but BERT has 512 positions: a user who did not ask for a length
    should get the longest one the model takes, not an error. A --seq the user gave is never changed.
    None: the default applies as it is (or the model cannot be read: the pre-measurement checks will say why).
    """
    from e2eprof.config import DeviceDefaults, resolve_device
    from e2eprof.errors import UsageError
    from e2eprof.workloads.models import ModelLoadError, max_positions, resolve_model

    if not model:
        return None
    try:
        default = DeviceDefaults.for_device(resolve_device(device)).seq
        source = resolve_model(model)
        limit = max_positions(source)
    except (UsageError, ModelLoadError, OSError, ValueError):
        return None
    if limit is None or limit >= default:
        return None
    err_console.print(f"· --seq not given: {limit} tokens, {source.name}'s position count (the device default is {default})")
    return limit


def _stop_once(signum, frame) -> None:
    """The first Ctrl-C or SIGTERM stops the run; later ones are ignored until it has written its tables.

    A second signal would land in the clean-up and cut the last writes short (GNU timeout sends SIGTERM to the
    command and then to its process group, so a run gets it twice): run.parquet was left saying "running".
    """
    for caught in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(caught) is _stop_once:
            signal.signal(caught, signal.SIG_IGN)
    interrupt.request(signum)  # raised again by the runner if this raise is swallowed (e2eprof.interrupt)
    raise interrupt.exception(signum)


def _outputs(junit: Path | None, summary_md: Path | None):
    """The CI files asked for, checked now: a bad path fails before anything is measured."""
    from e2eprof.signoff.publish import Outputs

    outputs = Outputs(junit=junit, summary_md=summary_md)
    outputs.check()
    return outputs


def _run(config, resume: bool = False, outputs=None) -> int:
    from e2eprof.harness import prestart

    # First, before the imports below (torch, pandas: seconds on a GPU host): the workers' own imports then overlap
    # them, and the parent's checks too. Handed to the run, which stops any it does not use.
    prestarted = prestart.for_config(config)
    from e2eprof.console import ConsoleEvents, print_outcome, print_summary
    from e2eprof.errors import RunError
    from e2eprof.runner import compare as run_compare
    from e2eprof.signoff import document, publish

    events = ConsoleEvents(err_console)
    if config.find_max_batch:
        from e2eprof.maxbatch import find_max_batch, print_max_batch

        result = find_max_batch(config, events=events)
        events.close()
        print_max_batch(out_console, result)
        return 0
    # SIGTERM (a CI timeout, a job scheduler) stops the run like Ctrl-C: tables flushed, run marked interrupted.
    # Ctrl-C is taken over only where Python's own handler is in place (a background job keeps ignoring it).
    previous = {}
    interrupt.clear()  # a stop asked of an earlier run in this process (main() called in-process) is not this one's
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _stop_once)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _stop_once)
    try:
        report = run_compare(config, events=events, resume=resume, prestarted=prestarted)
    except RunError as exc:
        if outputs is not None:
            publish.publish_failure(f"the run failed: {exc}", outputs)
        raise
    except KeyboardInterrupt as exc:
        # Handled here, not left to main(): typer turns an escaping KeyboardInterrupt into a bare exit code 130.
        events.close()
        interrupt.clear()
        _error_line("e2eprof: interrupted; tables written so far are kept, the run is marked interrupted")
        return 143 if isinstance(exc, interrupt.Terminated) else 130  # the shell's 128 + signal number
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        events.close()
    if report.nothing_to_do:
        _error_line(f"e2eprof: run {report.run_id} in {report.run_dir} is already complete (verdict {report.overall}); "
                    f"nothing to resume")
        return report.exit_code
    print_summary(out_console, report.summary, report.verdicts, report.run_dir)
    print_outcome(out_console, report.overall, report.exit_code, config.device)
    if outputs is not None:
        publish.publish(document.read(report.run_dir / document.FILE), outputs)
    return report.exit_code


@app.command("gate")
def gate(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A finished run's report directory.")],
    policy: Annotated[Optional[Path], typer.Option(help="TOML policy file (as compare's --policy) whose thresholds replace the run's (default: none, the run's own).")] = None,
    min_speedup: Annotated[Optional[float], typer.Option(help="PASS needs the interval's lower bound above 1 + this (default: the run's).")] = None,
    confidence: Annotated[Optional[float], typer.Option(help="Level of every interval, recomputed from the raw steps (default: the run's).")] = None,
    correction: Annotated[Optional[str], typer.Option(help="Multiple-comparison correction: holm, bh or none (default: the run's).")] = None,
    process_noise: Annotated[Optional[float], typer.Option(help="Between-process spread folded into every interval (default: the run's).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the re-judged verdict.json document instead of the table (default: off).")] = False,
    junit: Annotated[Optional[Path], typer.Option(help="Write the re-judged verdicts as JUnit XML to this file (default: none).")] = None,
    summary_md: Annotated[Optional[Path], typer.Option(help="Write the markdown summary to this file (and append it to $GITHUB_STEP_SUMMARY when set; default: none).")] = None,
) -> int:
    """Re-judge a finished run under another policy without measuring again; exit code as compare's."""
    import json

    import pandas as pd

    from e2eprof.console import print_outcome, print_summary
    from e2eprof.signoff import publish
    from e2eprof.signoff.regate import regate

    outputs = _outputs(junit, summary_md)
    result = regate(run_dir, policy, min_speedup=min_speedup, confidence=confidence, correction=correction,
                    process_noise=process_noise)
    if json_out:
        print(json.dumps(result.document, indent=2))
    else:
        print_summary(out_console, pd.DataFrame(result.judgement.summary), result.judgement.verdicts, run_dir,
                      result.judgement.ranking)
        print_outcome(out_console, result.judgement.overall, result.exit_code, result.config.device)
        _error_line("e2eprof gate: " + ("; ".join(result.changed) if result.changed else "no verdict changed"))
    publish.publish(result.document, outputs)
    return result.exit_code


@app.command("microbench")
def microbench(
    patch: Annotated[str, typer.Option(help=PATCH_HELP)] = "fastsoftmax",
    model: Annotated[Optional[str], typer.Option(help=f"Model whose calls are captured: {listed(catalog.model_presets())} or a local folder (default: the first preset of the patch's architectures, e.g. gpt2).")] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    batch: Annotated[Optional[int], typer.Option(help=f"Batch size of the captured steps {by_device('batch')}.")] = None,
    seq: Annotated[Optional[int], typer.Option(help=f"Sequence length of the captured steps {by_device('seq')}.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help=f"Autocast dtype of the captured steps: {listed(catalog.precisions())} {by_device('precision')}.")] = None,
    trials: Annotated[int, typer.Option(help="Timed calls per shape, impl and pass (>= 30).")] = 30,
    sweep: Annotated[bool, typer.Option(help="Also sweep sizes and dtypes around the model's shapes.")] = True,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="Time torch.compile of the stock op (default: --compile on GPU, --no-compile on CPU).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights, batches and random inputs.")] = 0,
    out: Annotated[Optional[Path], typer.Option(help="Report directory (default: e2eprof-runs/<UTC time>-microbench-<patch>/ under the working directory).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing report directory.")] = False,
) -> int:
    """The replaced op alone on the model's own calls (plus a sweep): replacement vs eager vs torch.compile."""
    from e2eprof.microbench.command import MicrobenchConfig, microbench as run_microbench, print_table

    config = MicrobenchConfig(patch=patch, model=model, device=device, precision=dtype, batch=batch, seq=seq,
                              trials=trials, sweep=sweep, compile=compile, seed=seed, out=out, force=force,
                              command_line=_command_line())
    result = run_microbench(config, progress=lambda line: err_console.print(f"[dim]·[/dim] {line}", highlight=False))
    print_table(out_console, result.table, result.path)
    return 0


@app.command("diff")
def diff(
    run_a: Annotated[Path, typer.Argument(metavar="RUN_A", help="Earlier report directory (the reference).")],
    run_b: Annotated[Path, typer.Argument(metavar="RUN_B", help="Later report directory of the same comparison.")],
    out: Annotated[Optional[Path], typer.Option(help="Where to write diff.parquet and diff.md (default RUN_B/diff-vs-<RUN_A name>/).")] = None,
    min_change: Annotated[float, typer.Option(help="A change counts when its whole interval is beyond this fraction (0.01 = 1%).")] = 0.01,
    metric: Annotated[str, typer.Option(help="wall (host wall time per step) or device (CUDA-event time).")] = "wall",
    allow_different: Annotated[bool, typer.Option(help="Diff runs of different comparisons anyway (the differences become flags).")] = False,
) -> int:
    """Compare two runs of the same comparison (e.g. before/after a driver or kernel change). Exit 1 if anything got worse."""
    from e2eprof.render.rundiff import DiffConfig, diff_runs, print_diff

    result = diff_runs(DiffConfig(run_a=run_a, run_b=run_b, out=out, min_change=min_change, metric=metric,
                                  allow_different=allow_different))
    print_diff(out_console, result)
    return result.exit_code


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="Report directory written by `e2eprof compare`.")],
    out: Annotated[Optional[Path], typer.Option(help="HTML file to write (default RUN_DIR/report.html); the markdown summary goes beside it as .md.")] = None,
) -> int:
    """Render RUN_DIR's Parquet tables as one self-contained HTML page and a markdown summary (nothing is re-run)."""
    from e2eprof.render import render_report

    written = render_report(run_dir, html_path=out)
    out_console.print(f"report: {written.html}\nsummary: {written.markdown}", soft_wrap=True)
    return 0


@app.command("list")
def list_things() -> int:
    """Show models, workloads and patches, with where each comes from."""
    from e2eprof.errors import PatchError
    from e2eprof.registry import LIGER_PATCHES, _entry_points, load_patch

    out_console.print("models:    " + ", ".join(catalog.model_presets()) + ", or a local folder (config.json + *.safetensors)")
    out_console.print("workloads: " + ", ".join(catalog.workloads()) + " (train-ddp, train-fsdp: with --nproc N)")
    out_console.print("patches:")
    for name in catalog.builtin_patches():
        try:
            loaded = load_patch(name)
        except PatchError:
            if name in LIGER_PATCHES:  # liger_kernel is installed but does not import here: its names are not offered
                continue
            raise
        out_console.print(f"  {name:<20} builtin      {loaded.patch.description}")
    for name, ep in _entry_points().items():
        out_console.print(f"  {name:<20} entry point  {ep.value}")
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


# The arguments main() was called with; None: the process's own (sys.argv), as from the console script.
_argv: list[str] | None = None


def _command_line() -> str:
    """The e2eprof command as given, for run.parquet: main()'s arguments when a program calls it in-process (the
    self-benchmark does), where sys.argv is that program's command, not e2eprof's."""
    return shlex.join(["e2eprof", *(sys.argv[1:] if _argv is None else _argv)])


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turn every failure into one line and an exit code."""
    global _argv
    _argv = None if argv is None else list(argv)
    startup.mark_entry()
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
