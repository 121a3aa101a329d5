"""The pure-Python twin's core (twin of ``core.c``): a tracer's ranges and their sinks.

``begin`` pushes ``(info, t0)`` on the thread's ``ts.stack`` and calls the
``begin`` of every sink whose category mask has the range's bit; ``end``
pops it and calls their ``end``.  The sinks come as entries ``(native,
begin, end, mask)`` (:data:`.protocol.SinkEntry`); this core ignores the
native parts (the native core's own kind) and calls every sink in Python.
Per category (``info.category_index``), the sinks' calls are kept as a
tuple built when the sinks change: a range costs one list index, never a
test per sink.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import TYPE_CHECKING, Callable, Sequence

from .protocol import BeginFn, EndFn, SinkEntry

if TYPE_CHECKING:
    from ..policies import CaptureWindow
    from ..ranges import RangeInfo, ThreadState

#: Categories a mask can hold (the native core's masks are 64-bit).
MASK_BITS = 64


class Core:
    """``Core(state_cls, info_cls, new_state, sync, window=None, clock=None)``: a tracer's ranges.

    ``new_state()`` makes (and registers) a thread's state on its first use;
    ``sync()`` synchronizes the devices at the boundaries of a range whose
    ``sync`` is set; ``window`` (its ``open``) says whether to emit at all;
    ``clock`` (default ``time.perf_counter_ns``) times a range when a sink
    reads the times.
    """

    __slots__ = ("_begins", "_clock", "_ends", "_entries", "_local", "_new_state", "_sync",
                 "_timed", "_window")

    def __init__(self, state_cls: type, info_cls: type, new_state: Callable[[], ThreadState],
                 sync: Callable[[], None], window: CaptureWindow | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self._local = threading.local()  # never replaced: the wrappers read it inline
        self._new_state = new_state
        self._sync = sync
        self._window = window
        self._clock = clock if clock is not None else perf_counter_ns
        self._timed = False
        self._entries: tuple[SinkEntry, ...] = ()
        self._begins: list[tuple[BeginFn, ...]] = []
        self._ends: list[tuple[EndFn, ...]] = []
        self.set_sinks((), False)

    # -- this thread's state ------------------------------------------------
    def state(self) -> ThreadState:
        """This thread's state (created on first use)."""
        try:
            return self._local.state  # type: ignore[no-any-return]
        except AttributeError:
            ts = self._local.state = self._new_state()
            return ts

    def current(self) -> ThreadState | None:
        """This thread's state, if it has one (none is created)."""
        return getattr(self._local, "state", None)

    def forget(self) -> None:
        """Nothing to drop: the thread-local state goes with its thread."""

    # -- sinks ----------------------------------------------------------------
    def set_sinks(self, entries: Sequence[SinkEntry], timed: bool) -> None:
        """The sinks, in order: ``(native, begin, end, mask)`` each (``native`` unused here)."""
        entries = tuple(entries)
        begins: list[tuple[BeginFn, ...]] = []
        ends: list[tuple[EndFn, ...]] = []
        for i in range(MASK_BITS):  # per category: the calls of the sinks that want it
            begins.append(tuple(b for _, b, _, mask in entries if b is not None and mask >> i & 1))
            ends.append(tuple(e for _, _, e, mask in entries if e is not None and mask >> i & 1))
        # replaced, never changed in place: a range being begun or ended goes on with the old
        self._entries, self._begins, self._ends, self._timed = entries, begins, ends, timed

    # -- ranges ---------------------------------------------------------------
    def begin(self, info: RangeInfo, ts: ThreadState | None = None) -> RangeInfo | None:
        """Open ``info`` on this thread; returns the token for :meth:`end`."""
        if not info.emit:
            return None
        window = self._window
        if window is not None and not window.open:
            return None
        if ts is None:
            ts = self.state()
        if info.sync:
            self._sync()
        ts.stack.append((info, self._clock()) if self._timed else info.stack_entry)
        try:
            for fn in self._begins[info.category_index]:
                fn(info, ts)
        except Exception:
            self._undo_begin(info, ts, fn)
            raise
        return info

    def _undo_begin(self, info: RangeInfo, ts: ThreadState, failed: object) -> None:
        """A sink failed to begin ``info``: end it in the sinks that began it, and forget it.

        The caller gets the error (its hook turns off) and never ends this range,
        so nothing of it may stay open: not in NVTX, not on the stack.
        """
        if not ts.stack or ts.stack[-1][0] is not info:
            return
        _, t0 = ts.stack.pop()
        category = info.category_index
        for _, begin, end, mask in self._entries:
            if begin is None or not mask >> category & 1:
                continue
            if begin == failed:
                break
            if end is not None:
                try:
                    end(info, t0, t0, ts)
                except Exception:  # noqa: BLE001
                    pass  # already failing: the first error is the one reported

    def end(self, token: RangeInfo | None, ts: ThreadState | None = None) -> None:
        """Close the range opened by :meth:`begin` (no-op for ``None``)."""
        if token is None:
            return
        if ts is None:
            ts = self.state()
        if not ts.stack or ts.stack[-1][0] is not token:
            return  # opened before a fork or a reset: nothing of ours to close
        if token.sync:
            self._sync()
        info, t0 = ts.stack.pop()
        t1 = self._clock() if self._timed else 0
        for fn in self._ends[info.category_index]:
            fn(info, t0, t1, ts)
