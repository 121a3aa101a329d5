"""The stall watchdog's last resort: every thread's stack when no Python thread can run.

The watchdog and the dump server are Python threads: while C code holds the
GIL (an extension that neither returns nor releases it) they cannot run.
Python's :mod:`faulthandler` has a thread of its own, in C, that writes every
thread's stack without the GIL once a timer expires
(``faulthandler.dump_traceback_later``).  A small thread of ours (it does
nothing else, so nothing but the GIL can hold it up) sets that timer again
every second (or quarter of its length) while the watchdog watches, so it
expires only when no Python thread could run for that long.  faulthandler then writes
``Timeout (H:MM:SS)!`` and each thread's stack, innermost call first, on
stderr (descriptor 2); the watchdog, once it runs again, says in one line
what that was.

* **Only when nothing runs.**  faulthandler reads the threads' frames
  without the GIL, safe only while no Python code runs: the timer is set
  by a thread that needs nothing but the GIL (never by the watchdog, which
  may wait for a slow disk or a full stderr while the program runs on), and
  not while stderr is a pipe with too little room for the stacks (a write
  that blocks would let the program run on under the reader).
* **One timer per process.**  A program that uses it itself keeps it: its
  calls go through the module's functions, wrapped while the agent watches,
  and from the first one on the agent leaves the timer alone.  A timer set
  before the agent could see it (``install(stall=...)`` in a program that
  imported faulthandler first; faulthandler cannot say whether one is set)
  is taken to be the program's: the agent never sets the timer then.
* **Asleep until asked.**  The thread waits without a timeout while the
  watchdog wants no timer (before the first iteration, after training).
* **fork.**  A child inherits the timer's state but not its thread, and
  cancelling it there (at the child's normal exit) would wait forever: the
  timer is cancelled before every ``os.fork()``, set again after it.
* **stderr.**  Written only while descriptor 2 is the file it was when the
  watch started (a program that closed it and opened a file of its own there
  must not get stacks in that file).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from time import monotonic
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

#: Whether the program may have used faulthandler's timer unseen: it imported the module
#: before this one (the interpreter's own -X faulthandler sets no timer); after the agent
#: unwraps the functions (uninstall), the same.
_unseen = "faulthandler" in sys.modules and not (
    "faulthandler" in getattr(sys, "_xoptions", {})
    or (os.environ.get("PYTHONFAULTHANDLER") and not sys.flags.ignore_environment))

import faulthandler  # noqa: E402 - after the look above

try:  # the room left in a pipe (Linux)
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not on this platform
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from typing import ParamSpec

    P = ParamSpec("P")

R = TypeVar("R")


class _SetTimer(Protocol):
    """``faulthandler.dump_traceback_later``'s signature."""

    def __call__(self, timeout: float, repeat: bool = ..., file: int = ...,
                 exit: bool = ...) -> None: ...


#: Bytes a pipe on stderr must have free for the stacks to be written without blocking.
PIPE_ROOM = 32 << 10
_F_GETPIPE_SZ = 1032  # fcntl.F_GETPIPE_SZ (Python 3.10+), the same number on Linux

_hooks_lock = threading.Lock()
_hooks_registered = False
_current: LastResort | None = None  # the one that sets the timer in this process


def _stderr_identity() -> tuple[int, int] | None:
    try:
        st = os.fstat(2)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _stderr_has_room() -> bool:
    """Whether the stacks can be written on stderr now without blocking (pipes: room)."""
    try:
        mode = os.fstat(2).st_mode
    except OSError:
        return False
    if not stat.S_ISFIFO(mode) or fcntl is None:
        return True
    try:
        size = fcntl.fcntl(2, _F_GETPIPE_SZ)
        pending = bytearray(4)
        fcntl.ioctl(2, termios.FIONREAD, pending)
        used = int.from_bytes(pending, "little")
    except OSError:
        return True  # not measurable: as any file
    return size - used >= PIPE_ROOM


class LastResort:
    """faulthandler's timer, kept set by a thread of its own while the watchdog watches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.wanted: int | None = None      # the timeout the watchdog asks for (None: off)
        self.armed_at: float | None = None  # monotonic time the timer was last set
        self.timeout = 0
        self.fired: tuple[int, float] | None = None  # (timeout, seconds): it went off
        self.forking = False
        self.program_uses = False           # the program called the timer's functions
        self._stderr: tuple[int, int] | None = None
        self._set: _SetTimer = faulthandler.dump_traceback_later
        self._cancel: Callable[[], None] = faulthandler.cancel_dump_traceback_later
        # faulthandler's timer functions, by name: ours (noting the program's calls), its own
        self._wrappers: dict[str, object] = {}
        self._originals: dict[str, object] = {}

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> None:
        """Be ready: the thread, the program's own use seen, forks taken care of."""
        global _current, _hooks_registered
        self._stderr = _stderr_identity()
        if _unseen:
            self.program_uses = True  # a timer of the program's may be set: never replaced
        self._wrap()
        with _hooks_lock:
            _current = self
            if not _hooks_registered and hasattr(os, "register_at_fork"):
                os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                    after_in_child=_after_fork_in_child)
                _hooks_registered = True
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name="chainer_autoprof last resort",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more watching: the thread ends, the timer is cancelled, the functions restored."""
        global _current, _unseen
        self.wanted = None
        thread, self._thread = self._thread, None
        if thread is not None:
            self._wake.set()
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
        self.disarm()
        with _hooks_lock:
            if _current is self:
                _current = None
        for name, wrapper in self._wrappers.items():
            if getattr(faulthandler, name, None) is wrapper:
                setattr(faulthandler, name, self._originals[name])
                _unseen = True  # the program's calls go unseen from now on
        self._wrappers, self._originals = {}, {}

    def _wrap(self) -> None:
        """Wrap the timer's functions so the program's own use is seen (and wins)."""
        if self._wrappers:
            return
        for name in ("dump_traceback_later", "cancel_dump_traceback_later"):
            original = getattr(faulthandler, name)
            if hasattr(original, "__wrapped__"):  # another agent's wrapper: keep it
                continue
            wrapper = _seen(original, self._program_took_timer)
            setattr(faulthandler, name, wrapper)
            self._wrappers[name], self._originals[name] = wrapper, original

    def _program_took_timer(self) -> None:
        with self._lock:
            self.program_uses = True
            self.armed_at = None  # its call replaced or cancelled ours

    # -- what the watchdog asks ------------------------------------------------------------
    def want(self, timeout: int | None) -> None:
        """Keep the timer at ``timeout`` s (``None``: off), from the watchdog's looks."""
        if timeout != self.wanted:
            self.wanted = timeout
            self._wake.set()

    def take_fired(self) -> tuple[int, float] | None:
        """``(timeout, seconds)`` once after the timer went off: the stacks were written."""
        with self._lock:
            fired, self.fired = self.fired, None
        return fired

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        wake = self._wake
        while self._thread is not None:
            wanted = self.wanted
            wake.wait(min(1.0, wanted / 4) if wanted else None)  # unasked: until want()
            wake.clear()
            if self._thread is None:
                return
            try:
                self.keep(self.wanted, monotonic())
            except Exception:  # never the program's problem  # noqa: BLE001
                pass

    def keep(self, timeout: int | None, now: float) -> None:
        """Set the timer to ``timeout`` s from ``now`` (monotonic), or cancel it (``None``)."""
        with self._lock:
            if self.program_uses or self.forking:
                return
            if self.armed_at is not None and now - self.armed_at >= self.timeout + 0.5:
                self.fired = (self.timeout, now - self.armed_at)  # it went off, once
                self.armed_at = None
            if timeout is None or _stderr_identity() != self._stderr or \
                    self._stderr is None or not _stderr_has_room():
                self._disarm_locked()
                return
            try:
                self._set(timeout, repeat=False, file=2, exit=False)
            except (OSError, ValueError, RuntimeError):
                self.armed_at = None
                return
            self.armed_at, self.timeout = now, timeout

    def disarm(self) -> None:
        """Cancel the timer if it is ours."""
        with self._lock:
            self._disarm_locked()

    def _disarm_locked(self) -> None:
        if self.armed_at is not None and not self.program_uses:
            self._cancel()
        self.armed_at = None

    # -- fork -----------------------------------------------------------------------------------
    def before_fork(self) -> None:
        with self._lock:
            self.forking = True
            self._disarm_locked()

    def after_fork_in_parent(self) -> None:
        with self._lock:
            self.forking = False
        self._wake.set()  # set again now

    def after_fork(self) -> None:
        """In a forked child: nothing set, no thread (the parent's are not here)."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self.forking = False
        self.armed_at = None
        self.wanted = None
        self.fired = None


def _seen(original: Callable[P, R], note: Callable[[], None]) -> Callable[P, R]:
    """``original``, noting each call (the program's own use of the timer)."""

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        note()
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    return wrapper


def _before_fork() -> None:
    current = _current
    if current is not None:
        current.before_fork()


def _after_fork_in_parent() -> None:
    current = _current
    if current is not None:
        current.after_fork_in_parent()


def _after_fork_in_child() -> None:
    current = _current
    if current is not None:
        current.after_fork()
