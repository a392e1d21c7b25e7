"""Workers' stderr reaches the user through one filter: third-party chatter out, each warning once, the rest as is."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from e2eprof.harness.worker_output import LineFilter

KINETO = [
    "USDT:2026-12-03 20:11:57 3619:3619 SyncActivityProfilerHandler.cpp:52] profiler_start",
    "USDT:2026-12-03 20:11:57 3619:3619 SyncActivityProfilerHandler.cpp:59] profiler_stop",
    "STAGE:2026-12-03 20:12:23 3706:3706 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up",
    # triton 3.9's bindings at a worker's exit (a CPU A/A benchmark printed 270 such lines in five runs)
    "nanobind: leaked 4 instances!",
    ' - leaked instance 0x7f41a1320668 of type "triton._C.libtriton.ir.attribute"',
    'nanobind: leaked 64 types!',
    ' - leaked type "triton._C.libtriton.ir.location"',
    ' - leaked function "create_srem"',
    " - ... skipped remainder",
    "nanobind: this is likely caused by a reference counting issue in the binding code.",
    "See https://nanobind.readthedocs.io/en/latest/refleaks.html",
]


def test_kineto_markers_are_held_back_and_everything_else_passes():
    keep = LineFilter().keep
    assert not any(keep(line) for line in KINETO)
    for line in ("Traceback (most recent call last):", "  File \"x.py\", line 3, in f", "RuntimeError: boom",
                 "Fatal Python error: Segmentation fault", "my kernel says hello", "USDT: something else"):
        assert keep(line), line


def test_a_warning_from_every_worker_is_shown_once_with_its_source_line():
    keep = LineFilter().keep
    warning = "/opt/torch/_inductor/compile_fx.py:322: UserWarning: TensorFloat32 tensor cores available"
    config = "[transformers] Model config: bos_token_id must be `None` or an integer within the vocabulary"
    shown = [line for _ in range(3) for line in (warning, "  warnings.warn(", config, "a line of its own")
             if keep(line)]
    assert shown == [warning, "  warnings.warn(", config, "a line of its own", "a line of its own", "a line of its own"]


@pytest.mark.slow
def test_worker_processes_stderr_goes_through_the_filter(tmp_path):
    """Real workers: their kineto markers are gone, their warnings come once, their own lines all come through."""
    script = tmp_path / "spawn.py"
    script.write_text(textwrap.dedent('''
        import multiprocessing as mp, os, sys
        from e2eprof.harness import worker_output

        def child(index):
            os.write(2, b"USDT:2026-12-03 20:11:57 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
            os.write(2, b"[transformers] the same warning from every worker\\n")
            os.write(2, f"worker {index} says hello\\n".encode())

        def unfinished():
            os.write(2, b"a last line without its newline")

        if __name__ == "__main__":
            context = mp.get_context("spawn")
            processes = []
            for index in range(3):
                with worker_output.relayed():
                    process = context.Process(target=child, args=(index,))
                    process.start()
                processes.append(process)
            for process in processes:
                process.join()
            # Alone, after the others: a line left unfinished while another worker writes would run into its line.
            with worker_output.relayed():
                process = context.Process(target=unfinished)
                process.start()
            process.join()
            worker_output.drain()
            print("parent done", file=sys.stderr)
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "USDT" not in done.stderr
    assert lines.count("[transformers] the same warning from every worker") == 1
    assert sorted(line for line in lines if line.endswith("says hello")) == [f"worker {i} says hello" for i in range(3)]
    assert lines[-1] == "parent done", "the workers' lines come before what the parent prints after draining"
    # a worker's unfinished last line is shown whole, and the drain's own marker never is
    assert "a last line without its newline" in lines and "e2eprof-drain" not in done.stderr
