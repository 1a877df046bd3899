"""The console script's first module. From its first line on, Ctrl-C and SIGTERM end the
program with exit status 130 and one line, also while the rest of amdflash is still being
imported (nothing has been opened yet, so there is nothing to clean up). `main()` then takes
over Ctrl-C with its own handling, which stops a run at a safe point and restores the
registers; SIGTERM goes on doing whatever Ctrl-C does at that moment.

What runs before this module is the interpreter's own start-up (`site`, the `.pth` files of
the environment, `runpy` or the console script's wrapper): a signal that lands there ends
Python the way Python ends then, and no code of amdflash can change that."""
# `_signal` is built into the interpreter: importing it runs no Python code, so the handlers are
# in place before the first slow import (`signal` alone imports `enum`, long enough under load
# for a Ctrl-C to land in it). Before this line, the interpreter's own start-up is not ours.
import _signal
import os
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    line = b'{"event": "interrupted", "level": "error"}\n' if "--log-json" in sys.argv else b"error: interrupted\n"
    os.write(2, line)
    os._exit(130)


# Started ignoring Ctrl-C (a shell's background job): Ctrl-C stays ignored, but a SIGTERM is
# meant for this process all the same.
_CTRL_C_IGNORED = _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN
_main_began = False     # run() has handed over to main(), which turns Ctrl-C into KeyboardInterrupt


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM: what Ctrl-C does at this moment. Starting: the line and 130 at once; in
    `main()`: KeyboardInterrupt, handled as Ctrl-C is (also when Ctrl-C itself is ignored);
    once the runs are on record or the command has ended: nothing (Ctrl-C is then ignored).
    A board run takes SIGTERM over for its duration (engine/runner.py), and once its runs are
    on record engine/interrupts.py holds it back."""
    ctrl_c = _signal.getsignal(_signal.SIGINT)
    if _CTRL_C_IGNORED and ctrl_c == _signal.SIG_IGN:
        ctrl_c = _signal.default_int_handler if _main_began else _interrupted_while_starting
    if callable(ctrl_c):
        ctrl_c(_signal.SIGINT, frame)
    elif ctrl_c == _signal.SIG_DFL:     # Ctrl-C would end the process by the signal: so does SIGTERM
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGTERM)


if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:   # not when started ignoring Ctrl-C
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)
if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:   # not when started ignoring SIGTERM (nohup-like)
    _signal.signal(_signal.SIGTERM, _terminated)

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

# A Ctrl-C or SIGTERM sent while the interpreter started (held back by a blocked signal mask)
# counts now.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run() -> None:
    global _main_began
    from amdflash.pipeline.cli import output  # noqa: F401  (imported here: main's first line finds it)
    from amdflash.pipeline.cli.main import entry

    _main_began = True
    try:
        entry()
    except SystemExit:
        # The exit status is decided and Ctrl-C is ignored from here on (entry): so is SIGTERM.
        # Its handler would not outlive the interpreter's finalisation anyway, which puts a
        # signal's default back: a SIGTERM then ended the process by the signal, after the
        # command had printed its outcome.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise
    except KeyboardInterrupt:
        # A Ctrl-C or SIGTERM in the instant after main() returned, before entry ignores them
        # (or a SIGTERM then, Ctrl-C ignored from the start): interrupted, without a traceback.
        os.write(2, b'{"event": "interrupted", "level": "error"}\n' if "--log-json" in sys.argv
                 else b"error: interrupted\n")
        os._exit(130)
