"""GPU phase timing: the iteration and its phases timed with CUDA events, as a sink.

Started by the recorder once the model's arrays are seen on a GPU; runs on
the loop thread only.  Events are recorded on the current stream and read
back without blocking (polled at each iteration end, drained at exit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..analysis.series import Series
from ..analysis.stats import PHASE_KEYS
from ..common import names

if TYPE_CHECKING:
    from ..runtime.device import EventTimer
    from ..runtime.events import RangeInfo, ThreadState, Tracer


class GpuPhaseTimer:
    """Sink timing the iteration and its phases on the GPU with CUDA events.

    Only on the loop thread; events are recorded on the current stream and
    polled without blocking at each iteration end (the backend's EventTimer).
    The core calls it for the iteration and its phases only (``categories``):
    never for a link or function range.
    """

    categories = frozenset({names.ITERATION, *names.PHASES})

    def __init__(self, timer: EventTimer, tid: int, iter_info: RangeInfo, skip: int,
                 max_kept: int) -> None:
        self.timer = timer
        self.tid = tid
        self.iter_info = iter_info
        self.skip = skip
        self.codes: list[int] = []     # per name index: 0 untimed, 1 iteration, 2+ phase
        self.stack: list[tuple[RangeInfo, object]] = []  # (range, its timer token)
        self.pending = [0.0] * 4
        self.series = Series(max_kept, 5)
        self.iterations = 0

    def prepare(self, info: RangeInfo) -> None:
        while len(self.codes) <= info.index:
            self.codes.append(0)
        if info.category == names.ITERATION:
            self.codes[info.index] = 1
        elif info.category in names.PHASES:
            self.codes[info.index] = 2 + names.PHASES.index(info.category)

    def begin(self, info: RangeInfo, ts: ThreadState) -> None:
        if ts.tid != self.tid:
            return
        index = info.index
        if index < len(self.codes) and self.codes[index]:
            self.stack.append((info, self.timer.begin(index)))

    def end(self, info: RangeInfo, t0: int, t1: int, ts: ThreadState) -> None:
        if ts.tid != self.tid:
            return
        stack = self.stack
        if stack and stack[-1][0] is info:
            self.timer.end(stack.pop()[1])
            if info is self.iter_info:
                self._take(self.timer.drain(False))

    def _take(self, results: list[tuple[Any, float]]) -> None:
        codes = self.codes
        for key, ms in results:
            code = codes[key]
            if code >= 2:
                self.pending[code - 2] += ms
            elif code == 1:
                p = self.pending
                self.pending = [0.0] * 4
                if self.skip:
                    self.skip -= 1
                    continue
                self.iterations += 1
                self.series.extend([(ms, p[0], p[1], p[2], p[3])])

    def finish(self) -> None:
        """Wait for the events still pending (at exit) and take them."""
        self.stack.clear()
        self._take(self.timer.drain(True))

    def result(self) -> dict[str, list[float]] | None:
        if not self.iterations:
            return None
        keys = ("iteration", *PHASE_KEYS[:4])
        return {key: self.series.values[i].tolist() for i, key in enumerate(keys)}

    def close(self, tracer: Tracer) -> None:
        pass

