"""The pure-Python twin's recorder hook (twin of ``record.c``): one row per range that ends.

A row is ``(name index, t0 ns, t1 ns, depth)``, appended to the thread's
buffer ``ts.record`` (here a list of tuples, the cheapest append CPython has;
the native hook appends four int64 to a ``RecordBuffer``).  The iteration's
range goes to ``iteration_ended(buf, t0, t1, ts)`` instead (its row carries
the iteration's number), and a buffer holding ``capacity`` rows to
``flush(ts)``.  The recorder reads a buffer through the hook alone
(:meth:`RecorderHook.take`, :meth:`RecorderHook.copy`), whichever twin made it.
"""

from __future__ import annotations

from array import array
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..ranges import RangeInfo, ThreadState


class RecorderHook:
    """``RecorderHook(capacity, iter_info, iteration_ended, flush)``: ``end`` is the append."""

    __slots__ = ("capacity", "end", "flush", "iter_info", "iteration_ended")

    def __init__(self, capacity: int, iter_info: RangeInfo,
                 iteration_ended: Callable[[Any, int, int, ThreadState], None],
                 flush: Callable[[ThreadState], None]) -> None:
        self.capacity = limit = max(1, capacity)
        self.iter_info = iter_info
        self.iteration_ended = iteration_ended
        self.flush = flush

        def end(info: RangeInfo, t0: int, t1: int, ts: ThreadState) -> None:
            buf = ts.record
            if buf is None:
                buf = ts.record = []
            if info is iter_info:
                iteration_ended(buf, t0, t1, ts)
                return
            buf.append((info.index, t0, t1, len(ts.stack)))
            if len(buf) >= limit:
                flush(ts)

        self.end = end

    @staticmethod
    def take(ts: ThreadState) -> array[int]:
        """The rows ``ts`` buffered, as int64 (four a row), its buffer started anew (a new
        list: its thread may be appending to the old one)."""
        rows = ts.record
        if not rows:
            return array("q")
        ts.record = []
        return array("q", chain.from_iterable(rows))

    @staticmethod
    def copy(ts: ThreadState) -> array[int]:
        """The rows ``ts`` buffered, as int64 (four a row); nothing consumed (a snapshot, taken
        in one step while the owning thread may be appending)."""
        rows = ts.record
        return array("q", chain.from_iterable(rows[:])) if rows else array("q")
