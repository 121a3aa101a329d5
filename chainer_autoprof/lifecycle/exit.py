"""The ways a program ends, and the summary and trace written once for each.

* Normal end, ``sys.exit``, an uncaught exception, Ctrl-C (KeyboardInterrupt):
  the interpreter runs its ``atexit`` functions, where the agent closes.
  After an uncaught KeyboardInterrupt CPython then dies by SIGINT (status 130)
  on a flag that running source text resets (``namedtuple``, ``dataclass``
  and the imports that use them do): :func:`keep_interrupt_status` puts it
  back after the agent's exit-time work.
* SIGTERM with no handler of the user's: the default action would kill the
  process without ``atexit``.  :func:`install` sets a handler that runs the
  agent's ``finish`` (close the open ranges, write the summary and the
  trace), then restores the default action and sends SIGTERM again, so the
  exit status still says "killed by SIGTERM" to the caller (a shell, a
  scheduler, ``Popen``).

If the signal arrives while the agent is already finishing (or while this
thread is in the middle of aggregating ranges), the handler only notes it;
the kill follows as soon as that work is done.  A handler the user installs
later simply replaces ours.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import ctypes
    from types import FrameType

    from ..sinks.recorder import Recorder

_finish: Callable[[], None] | None = None    # the agent's end: summary and trace
_finished: Callable[[], bool] | None = None  # whether that end has begun
_recorder: Recorder | None = None                        # its aggregation must not be cut in half
_installed = False
_finishing = False
_kill_pending = False
_closed = False  # the agent's atexit work is over


def install(finish: Callable[[], None], finished: Callable[[], bool],
            recorder: Recorder | None = None) -> bool:
    """Take over SIGTERM for the agent when nobody else handles it (main thread only).

    ``finish`` ends the agent (idempotent), ``finished`` says whether that has
    begun, ``recorder`` (optional) is asked whether a signal interrupted its
    aggregation.  Call before the agent registers its own ``atexit``
    function: the check registered here then runs after the agent has closed.
    """
    global _finish, _finished, _recorder, _installed
    _finish, _finished, _recorder = finish, finished, recorder
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False  # the program (or its launcher) handles SIGTERM itself
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):
        return False
    atexit.register(_after_close)
    _installed = True
    return True


def uninstall() -> None:
    """Give SIGTERM back to the default action, if the handler is still ours."""
    global _installed, _finish, _finished, _recorder
    _finish = _finished = _recorder = None
    if not _installed:
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        pass
    _installed = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _kill_pending
    if _finish is None or _closed:
        _die()
        return
    if _finishing or (_finished is not None and _finished()):
        _kill_pending = True  # the summary and trace are being written: kill after
        return
    recorder = _recorder
    if recorder is not None and recorder.flushing_here():
        recorder.deferred = _finish_and_die  # interrupted mid-aggregation: finish it first
        return
    _finish_and_die()


def _finish_and_die() -> None:
    global _finishing
    _finishing = True
    try:
        if _finish is not None:
            _finish()  # closes this (the main) thread's open ranges, summary, trace
    except Exception:  # never the program's exit status  # noqa: BLE001
        pass
    finally:
        _die()


def _after_close() -> None:
    """Runs after the agent's own ``atexit`` function: a SIGTERM noted meanwhile kills now."""
    global _closed
    _closed = True
    if _kill_pending:
        _die()


def _die() -> None:
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the signal is normally delivered before kill() returns
    except Exception:  # re-raising SIGTERM: its default action follows anyway  # noqa: BLE001
        pass
    os._exit(128 + signal.SIGTERM)


# -- Ctrl-C: the interpreter's record of an uncaught KeyboardInterrupt --------------------------
def keep_interrupt_status() -> Callable[[], None]:
    """Note whether the program is ending by an uncaught KeyboardInterrupt (call at exit).

    Returns the function that puts that record back once the agent's exit-time
    work is done, so that the process still dies by SIGINT as it would without
    the agent.
    """
    if not isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
        return _nothing  # no KeyboardInterrupt reached the top level
    flag = _interrupt_flag()
    if flag is None:
        return mark_interrupted
    if not flag.value:
        return _nothing  # reported, but not how the program ends (an interactive session)

    def restore() -> None:
        flag.value = 1

    return restore


def _interrupt_flag() -> ctypes.c_int | None:
    """CPython's ``_Py_UnhandledKeyboardInterrupt`` (``None`` where it cannot be reached)."""
    try:
        import ctypes  # only at exit after a KeyboardInterrupt: never loaded otherwise

        return ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except Exception:  # an interpreter without the flag  # noqa: BLE001
        return None


def mark_interrupted() -> None:
    """Set the flag the way the interpreter does: source text that raises KeyboardInterrupt."""
    try:
        exec("raise KeyboardInterrupt")  # constant text: the interpreter notes the interrupt
    except KeyboardInterrupt:
        pass


def _nothing() -> None:
    pass
