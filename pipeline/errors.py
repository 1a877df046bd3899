"""Exit statuses of the CLI contract (DESIGN.md) and the errors that map onto them."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1        # a failure during an operation
EXIT_REFUSED = 2       # usage errors and refusals before anything was written
EXIT_INTERRUPTED = 130


class Refusal(Exception):
    """A check failed before anything was written: exit 2, nothing touched."""


class UsageError(Refusal):
    pass
