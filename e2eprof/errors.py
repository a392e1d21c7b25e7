"""Domain exceptions. The library raises these; only cli.py turns them into messages and exit codes."""


class E2EProfError(Exception):
    """Base class for every error e2eprof reports to a user as one line."""

    exit_code = 4


class UsageError(E2EProfError, ValueError):
    """Bad input from the user (unknown name, bad number, unreadable file): exit code 2, nothing measured."""

    exit_code = 2


class PatchError(UsageError):
    """A patch cannot be loaded or applied to this model (missing target, wrong architecture, zero sites)."""


class RunError(E2EProfError):
    """The run itself failed (a worker crashed, the output directory vanished): exit code 4."""

    exit_code = 4
