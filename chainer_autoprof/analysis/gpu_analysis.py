"""One GPU analysis of a run: ranges and CUPTI activity in, figures and trace records out.

:class:`GpuAnalysis` composes :class:`~.gpu_attribution.LaunchAttributor` (which range
launched each operation), :class:`~.gpu_figures.GpuFigureBuilder` (the figures) and a
bounded keeper of attributed operations for the trace (the newest ``record_limit``, as
the recorder keeps ranges).  The same object serves the live agent (fed from the
recorder's blocks and the collector's buffers) and a replay of a recording (fed from a
saved trace and the recording's batches): one code path.

Feeding: :meth:`add_name` for each range name (as the recorder's ``prepare``),
:meth:`feed_ranges` with each thread's blocks of rows ``(name index, t0, t1, depth)``
in end order, :meth:`feed_activity` with each :class:`~..common.gpu_records.ActivityBatch`,
:meth:`map_thread` where the agent knows CUPTI's id of a thread; then :meth:`finish`.
Not thread-safe: one caller at a time (the live agent takes a lock).

Memory, bounded by the limits (defaults in brackets): the newest ``max_api`` API calls
[2**18] at 48 bytes; operations waiting for their call, their thread's map or their
thread's ranges, at most ``max_pending`` [2**16] per waiting thread, at 320 bytes;
per thread the newest ``max_ranges`` ranges [2**17] at 40 bytes; per device a reorder
pool of ``max_pool`` operations [2**16] at 56 bytes; the ``record_limit`` operations
kept for the trace [50,000] at 320 bytes; the figures' per-iteration lists as the
aggregator's.  About 60 MB at most with the defaults for one training thread on one
GPU, whatever the length of the run
(``tests/test_gpu_bounded.py``: a million kernels in the memory of 100,000).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..common.gpu_records import ActivityBatch, NameTable
from .gpu_attribution import AttributedOps, LaunchAttributor
from .gpu_clock import ClockMap
from .gpu_figures import GpuFigureBuilder, GpuFigures
from .stats import MAX_KEPT_ITERATIONS

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows


@dataclass(frozen=True)
class Limits:
    """The bounds of the analysis' state (see the module docstring)."""

    max_pending: int = 1 << 16
    max_api: int = 1 << 18
    max_ranges: int = 1 << 17
    max_pool: int = 1 << 16
    max_kept: int = MAX_KEPT_ITERATIONS


class AttributedKeeper:
    """The newest ``limit`` attributed operations (older ones dropped and counted)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.blocks: deque[AttributedOps] = deque()
        self.kept = 0
        self.dropped = 0

    def add(self, items: AttributedOps) -> None:
        if not len(items):
            return
        if not self.limit:
            self.dropped += len(items)
            return
        if len(items) > self.limit:  # only its newest can stay: copied, not a view of all
            self.dropped += len(items) - self.limit
            items = _copy_from(items, len(items) - self.limit)
        self.blocks.append(items)
        self.kept += len(items)
        excess = self.kept - self.limit
        while excess > 0 and self.blocks:
            oldest = self.blocks[0]
            if len(oldest) <= excess:
                self.blocks.popleft()
                drop = len(oldest)
            else:
                self.blocks[0] = _copy_from(oldest, excess)  # a view would keep all alive
                drop = excess
            self.kept -= drop
            self.dropped += drop
            excess -= drop

    def records(self) -> AttributedOps:
        return AttributedOps.concat(list(self.blocks))


def _copy_from(items: AttributedOps, start: int) -> AttributedOps:
    """Rows ``start:`` of ``items``, copied (a slice's view would keep every row's memory)."""
    return items.take(np.arange(start, len(items)))


class GpuAnalysis:
    """Attribution + figures + what the trace keeps, for one process."""

    def __init__(self, clock: ClockMap, names: NameTable, warmup_skip: int = 0, *,
                 record_limit: int = 50_000, identity_threads: bool = False,
                 loop_tid: int | None = None, limits: Limits | None = None,
                 keep_outside: bool = True) -> None:
        lim = limits if limits is not None else Limits()
        #: Whether the trace keeps operations launched outside any iteration (a capture
        #: window keeps only its iterations': what runs after it would push them out).
        self.keep_outside = keep_outside
        self.names = names
        self.attributor = LaunchAttributor(
            clock, warmup_skip, identity_threads=identity_threads,
            max_pending=lim.max_pending, max_api=lim.max_api, max_ranges=lim.max_ranges)
        self.builder = GpuFigureBuilder(self.attributor.link_keys, names, warmup_skip,
                                        loop_tid=loop_tid, max_pool=lim.max_pool,
                                        max_kept=lim.max_kept)
        self.keeper = AttributedKeeper(record_limit)
        self.finished = False

    def _take(self, items: AttributedOps) -> None:
        if len(items):
            self.builder.add(items)
            self.keeper.add(items if self.keep_outside else items.take(items.attr.iteration >= 0))

    def add_name(self, index: int, name: str, category: str) -> None:
        self.attributor.add_name(index, name, category)

    def set_clock(self, clock: ClockMap) -> None:
        """The clock map for the activity fed from now on (live: refitted as pairs come)."""
        self.attributor.clock = clock

    def map_thread(self, cupti_thread: int, tid: int) -> None:
        self._take(self.attributor.map_thread(cupti_thread, tid))

    def feed_ranges(self, tid: int, rows: RangeRows) -> None:
        self._take(self.attributor.feed_ranges(tid, rows))

    def thread_finished(self, tid: int) -> None:
        self._take(self.attributor.thread_finished(tid))

    def feed_activity(self, batch: ActivityBatch) -> None:
        self._take(self.attributor.feed_activity(batch))

    def advance(self, watermark_ns: int) -> None:
        """No operation starting before ``watermark_ns`` (agent ns) will arrive any more."""
        self.builder.advance(watermark_ns)

    def finish(self) -> GpuFigures:
        """Attribute what still waits and return the figures (once; later calls repeat)."""
        if not self.finished:
            self._take(self.attributor.finish())
            self.finished = True
            self._figures = self.builder.result(self.attributor.statuses(),
                                                self.attributor.clock.to_dict())
        return self._figures

    def records(self) -> AttributedOps:
        """The attributed operations kept for the trace (the newest ``record_limit``)."""
        return self.keeper.records()

    @property
    def link_keys(self) -> list[str]:
        return self.attributor.link_keys

    @property
    def range_names(self) -> list[str]:
        return self.attributor.range_names
