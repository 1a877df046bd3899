"""Exit statuses of the command line, the errors that map onto them, and the one-line cause.

0 success; 2 a usage error or a refusal before anything was written (bad arguments, a bad
image, an unusable audit database, no such board, a busy board, a protected target);
1 a failure during an operation; 130 interrupted (Ctrl-C, SIGTERM).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1        # a failure during an operation
EXIT_REFUSED = 2       # usage errors and refusals before anything was written
EXIT_INTERRUPTED = 130


class Refusal(Exception):
    """A check failed before anything was written: exit 2, nothing touched."""


class UsageError(Refusal):
    """The command line itself is wrong (unknown option, a value out of range)."""


def leaves(raised: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order; the exception itself otherwise."""
    if not isinstance(raised, BaseExceptionGroup):
        return [raised]
    found: list[BaseException] = []
    for sub in raised.exceptions:
        found += leaves(sub)
    return found


def one_line(e: BaseException) -> str:
    """The message of `e` on one line: what an operator reads after 'error: '. An OS error
    names its file and says its cause in words ("[Errno 30] …" says neither well)."""
    if isinstance(e, OSError) and e.strerror and type(e).__str__ is OSError.__str__:
        from amdflash.stages.files import reason

        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        text = f"{where}: {reason(e)}" if where else reason(e)
    else:
        text = str(e)
    return " ".join(text.split()) or type(e).__name__
