"""Garbage collections as ``gc gen N`` ranges, on the thread that ran them.

Python's collector calls the functions in ``gc.callbacks`` when a collection
starts and when it stops, on the thread whose allocation triggered it.
:class:`GcRanges` opens a range of category ``gc`` at the start and closes it
at the stop, through the tracer, so NVTX and the recorder see it like any
other range, nested where it happened (``backward > gc gen 2``).  Only a
thread already inside a recorded range gets one: start-up imports collect
thousands of times and belong to no range.  Every collection is counted per
generation in any case (collections, objects collected, time), in
``tracer.facts["gc"]``.

A collection can start wherever a container is allocated, the agent's own
code included: between pushing a range on the stack and calling the sinks,
or in the recorder while it holds a thread's buffer.  A range opened there
would nest wrongly in NVTX or lose a recorded row, so a collection that
starts in a frame of the tracer or of a sink gets no range (it is counted,
as ``unranged``).
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from threading import get_ident, get_native_id
from time import perf_counter_ns
from typing import TYPE_CHECKING

from ..common import names
from ..common.typedefs import GcTotals

if TYPE_CHECKING:
    from .events import RangeInfo, ThreadState, Tracer

#: Modules whose frames may hold a range half begun or half ended.
AGENT_INTERNALS = ("chainer_autoprof.runtime.", "chainer_autoprof.sinks.")
#: Per-range details kept for the trace (the newest; older ones are dropped): about
#: 150 bytes each.
KEEP_DETAILS = 10_000


class GcRanges:
    """The ``gc.callbacks`` entry of one tracer: ranges and per-generation counts."""

    def __init__(self, tracer: Tracer, keep: int = KEEP_DETAILS) -> None:
        self.tracer = tracer
        self.infos = [tracer.info(names.gc_text(g), names.GC) for g in range(3)]
        for info in self.infos:  # never wait for a GPU inside the collector
            info.sync = False
        #: (serial, tid, t0 ns as recorded, collected, uncollectable) of each range emitted
        self.details: deque[tuple[int, int, int, int, int]] = deque(maxlen=keep)
        self.totals: GcTotals = {"collections": [0, 0, 0], "collected": [0, 0, 0],
                       "uncollectable": [0, 0, 0], "ms": [0.0, 0.0, 0.0],
                       "ranges": [0, 0, 0], "unranged": 0}
        self.emitted = 0  # details ever appended (the deque keeps the newest)
        # token, state, thread, start ns
        self._open: tuple[RangeInfo | None, ThreadState | None, int, int] | None = None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
            self.tracer.facts["gc"] = self.totals

    def remove(self) -> None:
        """Stop (at exit, before the tracer closes; on uninstall)."""
        self._installed = False
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        try:
            if phase == "start":
                self._start(info)
            else:
                self._stop(info)
        except Exception:  # noqa: BLE001
            self._open = None  # never let an error of ours reach the collector

    def _start(self, info: dict[str, int]) -> None:
        now = perf_counter_ns()
        thread = get_ident()
        ts = self.tracer.states.get(get_native_id())
        if ts is None or not ts.stack:
            self._open = (None, None, thread, now)
            return
        caller = sys._getframe(2)  # the frame whose allocation started the collection
        if caller.f_globals.get("__name__", "").startswith(AGENT_INTERNALS):
            self.totals["unranged"] += 1
            self._open = (None, None, thread, now)
            return
        token = self.tracer.begin(self.infos[info["generation"]], ts)
        self._open = (token, ts, thread, now)

    def _stop(self, info: dict[str, int]) -> None:
        opened = self._open
        self._open = None
        generation = info["generation"]
        totals = self.totals
        totals["collections"][generation] += 1
        collected = info["collected"]
        uncollectable = info["uncollectable"]
        totals["collected"][generation] += collected
        totals["uncollectable"][generation] += uncollectable
        if opened is None or opened[2] != get_ident():
            return
        token, ts, _thread, start = opened
        totals["ms"][generation] += (perf_counter_ns() - start) / 1e6
        if token is None or ts is None:  # no range was opened (then there is no state either)
            return
        stack = ts.stack
        if stack and stack[-1][0] is token:
            t0 = stack[-1][1]
            self.tracer.end(token, ts)
        else:  # a finalizer run by the collection left a range open above ours
            t0 = None
            if any(entry[0] is token for entry in list(stack)):
                self.tracer.end_block(token, ts)
        totals["ranges"][generation] += 1
        if t0:
            self.emitted += 1
            self.details.append((self.emitted, ts.tid, t0, collected, uncollectable))

    def details_since(self, mark: int) -> tuple[list[tuple[int, int, int, int]], int]:
        """``(tid, t0, collected, uncollectable)`` appended after ``mark`` (0 at first), and the
        next mark.  Safe from another thread."""
        new = [d for d in list(self.details) if d[0] > mark]
        return [d[1:] for d in new], (new[-1][0] if new else mark)

    def args_by_range(self) -> dict[tuple[int, int], dict[str, int]]:
        """Trace-event ``args`` of the kept gc ranges, by (thread id, start ns)."""
        return {(tid, t0): {"collected": collected, "uncollectable": uncollectable}
                for _serial, tid, t0, collected, uncollectable in list(self.details)}
