"""The console script's first module. From its first line on, Ctrl-C ends the program with
exit status 130 and one line, also while the rest of amdflash is still being imported
(nothing has been opened yet, so there is nothing to clean up). `main()` then takes over
with its own handling, which stops a run at a safe point and restores the registers."""
# `_signal` is built into the interpreter: importing it runs no Python code, so the handler is
# in place before the first slow import (`signal` alone imports `enum`, long enough under load
# for a Ctrl-C to land in it). Before this line, the interpreter's own start-up is not ours.
import _signal
import os
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    line = b'{"event": "interrupted", "level": "error"}\n' if "--log-json" in sys.argv else b"error: interrupted\n"
    os.write(2, line)
    os._exit(130)


if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:   # not when started ignoring Ctrl-C
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

import signal  # noqa: E402  (after the handler: see above)


def _unraisable(info: "sys.UnraisableHookArgs") -> None:
    # A Ctrl-C that lands while Python runs a finaliser cannot stop the program from there:
    # Python would print "Exception ignored in: ..." and go on as if it had not been pressed.
    # Press it again, from outside the finaliser, without the noise: from a new thread, which
    # runs once this one lets go of the interpreter, after this hook has returned. Not
    # threading.Thread: its start() waits here for the thread, which pressed at once, so the
    # Ctrl-C landed in that wait, inside this hook — "Exception ignored in
    # sys.unraisablehook", and lost (a run under load went on to succeed).
    if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
        import _thread

        _thread.start_new_thread(os.kill, (os.getpid(), signal.SIGINT))
        return
    sys.__unraisablehook__(info)


sys.unraisablehook = _unraisable

# A Ctrl-C pressed while the interpreter started (held back by a blocked signal mask) counts now.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run() -> None:
    from amdflash.pipeline.cli.main import entry

    entry()
