"""Where a run's sign-off goes besides its directory: --junit FILE, --summary-md FILE and GitHub's step summary.

The paths are checked before anything is measured: a typo in --junit must not cost the run it was meant to report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from e2eprof.errors import UsageError
from e2eprof.signoff import junit, step_summary

# Set by GitHub Actions to a file whose markdown is shown on the job's page; e2eprof appends to it.
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


@dataclass(frozen=True)
class Outputs:
    """The CI files asked for; None = not asked for."""

    junit: Path | None = None
    summary_md: Path | None = None

    def check(self) -> None:
        """UsageError (exit 2) for a path that cannot be written; nothing is created."""
        for option, path in (("--junit", self.junit), ("--summary-md", self.summary_md)):
            if path is None:
                continue
            path = Path(path)
            if path.is_dir():
                raise UsageError(f"{option}: {path} is a directory; name a file")
            parent = path.parent if str(path.parent) else Path(".")
            if not parent.is_dir():
                raise UsageError(f"{option}: cannot write {path}: folder {parent} does not exist")
            if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise UsageError(f"{option}: cannot write {path}: permission denied")


def publish(document: dict, outputs: Outputs) -> list[Path]:
    """Write the JUnit file and the markdown summary asked for, and append the summary to GitHub's step summary
    when that variable is set. Returns the files written."""
    written = []
    if outputs.junit is not None:
        written.append(_write(outputs.junit, junit.to_xml(document)))
    text = step_summary.markdown(document)
    if outputs.summary_md is not None:
        written.append(_write(outputs.summary_md, text))
    target = os.environ.get(STEP_SUMMARY_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as handle:  # other steps write to it too: append, never replace
            handle.write(text + "\n")
        written.append(Path(target))
    return written


def publish_failure(message: str, outputs: Outputs) -> None:
    """A run that crashed: the JUnit file still says so (one RUN_FAILED error case), if one was asked for."""
    if outputs.junit is not None:
        _write(outputs.junit, junit.run_failed_xml(message))


def _write(path: Path, text: str) -> Path:
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path
