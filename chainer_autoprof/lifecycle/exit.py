"""The ways a program ends, and the summary and trace written once for each.

* Normal end, ``sys.exit``, an uncaught exception, Ctrl-C (KeyboardInterrupt):
  the interpreter runs its ``atexit`` functions, where the agent closes.
  After an uncaught KeyboardInterrupt CPython then dies by SIGINT (status 130)
  on a flag that running source text resets (``namedtuple``, ``dataclass``
  and the imports that use them do): :func:`keep_interrupt_status` puts it
  back after the agent's exit-time work.
* SIGTERM: the program's handlers and the default action stay the
  program's.  The agent never sets a Python handler on SIGTERM (one only runs
  when the main thread runs bytecode: a process blocked in C would no longer
  die), and nothing at all until the first iteration begins (:func:`arm`;
  before it there is nothing to save).  Then, where SIGTERM's action is still
  the default one, the native guard (``term_guard.c``) takes it in C:
  Python's own table still says ``SIG_DFL``, so a program that installs its
  handler "if default", or chains to the one it found, sees the default, and
  its ``signal.signal`` replaces the guard outright.  On SIGTERM the guard
  trips a private real-time signal whose Python handler (set only then, on
  the main thread) runs the agent's ``finish`` (close the open ranges, write
  the summary and the trace), then restores the default action and sends
  SIGTERM again: the exit status still says "killed by SIGTERM".  Where the
  main thread cannot begin that within :data:`GRACE_S` (C code holds it), or
  finish within :data:`LIMIT_S`, the guard's own thread restores the default
  action and kills: the kill is never held up.  A second SIGTERM kills at
  once; a forked child starts with the default action (reset inside
  ``fork()``).  Without the native extension there is no guard: SIGTERM
  kills as it would (the trace so far, if any, stays on disk).

If the signal arrives while the agent is already finishing (or while this
thread is in the middle of aggregating ranges), the handler only notes it;
the kill follows as soon as that work is done (within :data:`LIMIT_S`).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import typing
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    import ctypes
    from types import FrameType

    from ..sinks.recorder import Recorder

#: Seconds the main thread has, after SIGTERM, to begin the agent's end (else: killed now).
GRACE_S = 0.25
#: Seconds the agent's end may take after SIGTERM before the kill comes anyway.
LIMIT_S = 10.0

_finish: Callable[[], None] | None = None    # the agent's end: summary and trace
_finished: Callable[[], bool] | None = None  # whether that end has begun
_recorder: Recorder | None = None                        # its aggregation must not be cut in half
_installed = False
_armed = False
_finishing = False
_kill_pending = False
_closed = False  # the agent's atexit work is over
_chosen: int | None = None  # the private signal the guard trips (chosen when armed)
_notice: int | None = None  # that signal, once its handler is ours
_notice_previous: object = None  # what was there before ours


def install(finish: Callable[[], None], finished: Callable[[], bool],
            recorder: Recorder | None = None) -> bool:
    """Know the agent's end (nothing is set on any signal yet: see :func:`arm`).

    ``finish`` ends the agent (idempotent), ``finished`` says whether that has
    begun, ``recorder`` (optional) is asked whether a signal interrupted its
    aggregation.  Call before the agent registers its own ``atexit``
    function: the check registered here then runs after the agent has closed.
    """
    global _finish, _finished, _recorder, _installed, _closed
    _finish, _finished, _recorder = finish, finished, recorder
    if not _installed:
        atexit.register(_after_close)
        _installed = True
        _closed = False
    return True


def arm() -> bool:
    """The first iteration began: guard SIGTERM's default action (from any thread).

    ``False`` where the program (or its launcher) handles or ignores SIGTERM
    itself, or where the native guard is unavailable: the signal then does
    exactly what it would without the agent.
    """
    global _armed, _chosen
    if _armed or _finish is None or _closed:
        return _armed
    native = _native()
    if native is None:
        return False
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False  # the program's own handler, or SIG_IGN: left as it is
        _chosen = _notice_signal()
        if not native.term_arm(_chosen or 0, GRACE_S, LIMIT_S):
            return False
    except (ValueError, OSError, AttributeError):
        return False
    _armed = True
    if threading.current_thread() is threading.main_thread():
        _listen()
    else:  # signal.signal() runs on the main thread only: there, as soon as it runs Python
        native.call_on_main(_listen)
    return True


def uninstall() -> None:
    """Give SIGTERM back to the default action, if the guard is still there."""
    global _installed, _finish, _finished, _recorder
    _finish = _finished = _recorder = None
    _disarm()
    if _installed:
        try:
            atexit.unregister(_after_close)
        except Exception:  # uninstalling: best effort  # noqa: BLE001
            pass
        _installed = False


def after_fork() -> None:
    """In a forked child: no guard (reset inside ``fork()``), no handler of ours."""
    global _armed, _finishing, _kill_pending
    _armed = _finishing = _kill_pending = False
    _unlisten()


def _disarm() -> None:
    global _armed
    if _armed:
        native = _native()
        if native is not None:
            native.term_disarm()
        _armed = False
    _unlisten()


class _TermGuard(Protocol):
    """What the native extension holds of the guard (``term_guard.c``)."""

    def term_arm(self, notice: int, grace: float, limit: float, /) -> bool: ...
    def term_disarm(self) -> None: ...
    def term_fired(self) -> bool: ...
    def term_finishing(self) -> None: ...
    def call_on_main(self, call: Callable[[], None], /) -> bool: ...


def _native() -> _TermGuard | None:
    """The extension that holds the guard (``None``: not built here)."""
    try:  # the same extension as the native hot path, whichever hot path runs
        from ..runtime.hotpath import load_native

        module = load_native()
    except Exception:  # not built, or stale: no guard  # noqa: BLE001
        return None
    return typing.cast(_TermGuard, module) if hasattr(module, "term_arm") else None


def _notice_signal() -> int | None:
    """A real-time signal the program leaves alone (its action the default one)."""
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is None or high is None:
        return None
    for number in range(int(high) - 1, int(low) + 1, -1):
        try:
            if signal.getsignal(number) in (signal.SIG_DFL, None):
                return number
        except (ValueError, OSError):
            continue
    return None


def _listen() -> None:
    """On the main thread: the private signal's handler (runs the end at once if SIGTERM
    came before it was set)."""
    global _notice, _notice_previous
    number = _chosen
    if not _armed or _notice is not None or number is None:
        return
    try:
        if signal.getsignal(number) not in (signal.SIG_DFL, None):
            return  # the program took it meanwhile: the guard kills after its grace
        _notice_previous = signal.signal(number, _on_notice)
        _notice = number
    except (ValueError, OSError):
        return
    native = _native()
    if native is not None and native.term_fired():
        _on_notice(number, None)


def _unlisten() -> None:
    global _notice, _notice_previous
    number, _notice = _notice, None
    if number is None:
        return
    try:
        if signal.getsignal(number) is _on_notice:
            previous = _notice_previous
            signal.signal(number, previous if callable(previous) or
                          isinstance(previous, int) else signal.SIG_DFL)
    except (ValueError, OSError):
        pass  # not on the main thread: the handler stays, and ignores what is not SIGTERM
    _notice_previous = None


def _on_notice(signum: int, frame: FrameType | None) -> None:
    global _kill_pending
    native = _native()
    if native is None or not native.term_fired():
        return  # not SIGTERM (the private signal sent by someone else): nothing to do
    native.term_finishing()
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
    """Runs after the agent's own ``atexit`` function: a SIGTERM noted meanwhile kills now,
    and one after it gets the default action."""
    global _closed
    _closed = True
    if _kill_pending:
        _die()
    _disarm()


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
