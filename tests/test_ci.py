"""CI runs what README tells a newcomer to run, in a fresh environment."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    """The bash blocks under README's 'Two commands' heading: the main job's install, then the tests'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_ci_runs_the_readme_test_command_verbatim_in_a_fresh_venv():
    main_job, tests = _readme_commands()
    assert "pytest" in tests and "e2eprof compare" in main_job
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), "README's test command must appear in .ci/run as one line, as written"
    assert "python3 -m venv" in ci and "--upgrade-strategy eager" in ci
