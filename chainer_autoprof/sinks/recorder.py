"""The in-process recorder: every emitted range, kept cheaply, summarized at exit.

Hot path (:attr:`Recorder.end`): the hot path's recorder hook appends one row
``(name index, t0 ns, t1 ns, depth)`` to the thread's buffer
(``ThreadState.record``): a tuple to a list in the pure-Python twin, the
cheapest append CPython has; four int64 to a ``RecordBuffer``, in C, run by
the native core itself (``native``).  When
a thread's buffer holds :data:`CHUNK_RANGES` ranges
it becomes an ``(n, 4)`` int64 block (32 bytes per range), handed to the
:class:`~..analysis.aggregate.Aggregator` (running totals, per-iteration
lists, all vectorized) and, when a trace is wanted, kept for the timeline.

Memory bound: at most ``record_limit`` ranges are kept for the trace (the
newest; older ones are dropped and counted) at 32 bytes each, plus one list
per thread being filled (at most :data:`CHUNK_RANGES` tuples, about 140 bytes
each while in the list): ``32 B x record_limit + threads x 4096 x 140 B``
(6.4 MB + 0.6 MB per thread at the default limit).  Without a trace nothing
but the lists in flight and the aggregates is kept.  The aggregates are
bounded too (see :mod:`..analysis.aggregate`).

GPU: once the model's arrays are seen on a GPU, a
:class:`~.gpu_phases.GpuPhaseTimer` sink also times the iteration and its
phases with CUDA events on the loop thread, and each wait of the agent's own
synchronization (sync level 1 and above) becomes a row of its own, a
``wait for GPU (<place>)`` range of category ``gpu_wait`` nested where the
wait happened (:meth:`Recorder._make_waited`), so the summary can tell the waits
from the work.  They are not NVTX ranges: Nsight shows the synchronize call
on its CUDA API row already, and the NVTX stream stays the program's.

The recorder never reports: at exit it flushes, and the agent pulls
:meth:`Recorder.run_stats` and the retained ranges from it
(:mod:`..lifecycle.finish`).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..analysis.aggregate import Aggregator
from ..analysis.iteration_figures import FIGURES
from ..analysis.per_iteration import SampleTrack
from ..analysis.stats import DEPTH_BITS, MAX_KEPT_ITERATIONS, RunStats
from ..common import log, names
from ..common.settings import Config
from .gpu_phases import GpuPhaseTimer

if TYPE_CHECKING:
    from array import array

    from ..common.typedefs import RangeRows
    from ..runtime.events import RangeInfo, ThreadState, Tracer

#: Ranges a thread buffers before they are aggregated.
CHUNK_RANGES = 4096
#: Test-only: time phases with the backend's event timer even without a GPU
#: (the counting backend's host timer), to exercise the GPU-timing path on CPU.
ENV_TEST_EVENTS = "CHAINER_AUTOPROF_TEST_EVENTS"


class Recorder:
    """Sink that records ranges in memory: running aggregates, and the newest for the trace."""

    def __init__(self, cfg: Config, tracer: Tracer, chunk_ranges: int = CHUNK_RANGES,
                 max_kept: int = MAX_KEPT_ITERATIONS) -> None:
        self.keep = bool(cfg.trace)  # keep ranges for a trace file
        self.tracer = tracer
        self.chunk_ranges = max(1, chunk_ranges)
        self.record_limit = int(cfg.record_limit)
        self.max_kept = max_kept
        self.window = cfg.iterations
        self.warm_skip = max(0, int(cfg.warmup) - (self.window[0] if self.window else 0))
        self.infos: list[tuple[str, str, int]] = []
        self._iter_info = tracer.info(names.ITERATION, names.ITERATION)
        self._test_events = os.environ.get(ENV_TEST_EVENTS, "") == "1"
        self._reset(tracer.start_ns)
        #: The per-range append (the native core runs it in C), calling back at iteration ends
        #: and full buffers.
        self.native = tracer.hotpath.recorder_hook(
            self.chunk_ranges, self._iter_info, self._iteration_ended, self._flush_thread)
        self.end = self.native.end
        #: Told of each block ``(tid, rows)`` once aggregated, and ``(tid, None)`` when a thread
        #: ended (the GPU activity's queue: one append, the analysis runs on its own thread).
        self.gpu_handover: Callable[[tuple[int, RangeRows | None]], None] | None = None
        #: the wait rows' names, by the category of the range they lie in (made at the first
        #: wait on a GPU, so that a CPU run registers no name it never uses)
        self._wait_infos: dict[str, RangeInfo] | None = None
        self._own_info: RangeInfo | None = None  # the agent's own checks (made at the first)
        self._wait_outside: Any = None
        sync = getattr(tracer, "sync", None)
        # (the waits are timed with perf_counter_ns: the tracer's clock, unless a test's own)
        if sync is not None and sync.level >= 1 and getattr(tracer, "clock", None) \
                is perf_counter_ns:
            sync.watch(self._make_waited())

    def _reset(self, start_ns: int) -> None:
        self.start_ns = start_ns
        # re-entrant: a signal handler may close the recorder between our acquiring the
        # lock and marking busy_thread (flushing_here() covers the rest)
        self._lock = threading.RLock()
        self.agg = Aggregator(start_ns, self.warm_skip, self.window, self.max_kept)
        for index, (name, category, _color) in enumerate(self.infos):
            self.agg.add_name(index, name, category)
        self.retained: deque[tuple[int, RangeRows]] = deque()
        self.retained_ranges = 0
        self.dropped = 0
        self.flush_ns = 0
        self.iterations_ended = 0
        self.busy_thread: int | None = None
        self.deferred: Callable[[], None] | None = None
        self.closed = False
        self.end_ns: int | None = None  # when it closed
        self.gpu: GpuPhaseTimer | None = None
        self.gpu_checked = False
        self.fork_child = False
        self.own_ns = 0  # the agent's own work on the program's threads (own_work)
        #: The figures read at each iteration's end, each with its samples.
        self.figure_tracks = [SampleTrack(fig, self.warm_skip, self.max_kept) for fig in FIGURES]
        self.figures_ns = 0

    # -- sink protocol ------------------------------------------------------
    def prepare(self, info: RangeInfo) -> None:
        while len(self.infos) <= info.index:
            self.infos.append(("", "", 0))
        self.infos[info.index] = (info.name, info.category, info.color)
        self.agg.add_name(info.index, info.name, info.category)

    def _iteration_ended(self, buf: list[tuple[int, int, int, int]], t0: int, t1: int,
                         ts: ThreadState) -> None:
        number = self.tracer.iterations  # this iteration's number + 1
        samples = ts.iter_samples or ts.iter_converted  # the iterator's count, else the converter's
        if samples:
            pending = ts.record_samples
            if pending is None:
                pending = ts.record_samples = []
            pending.append((t1, samples))  # before the row: a flush taking the row finds it
        buf.append((self._iter_info.index, t0, t1, len(ts.stack) | (number << DEPTH_BITS)))
        self.iterations_ended += 1
        if self.figure_tracks:
            self._read_figures(number - 1, t1)
        if not self.gpu_checked and (self.tracer.sync.devices or self._test_events):
            self._start_gpu_timer(ts)
        if len(buf) >= self.chunk_ranges:
            self._flush_thread(ts)

    def _read_figures(self, iteration: int, at_ns: int) -> None:
        """The figures read at each iteration's end (:mod:`..analysis.iteration_figures`).
        A figure that raises (our error) is not read any more, with one line; the training
        goes on.  Their time is the agent's (``figures_ns``, this thread's CPU: not the waits
        for the GIL another thread may take during a read; in the overhead estimate)."""
        start = thread_time_ns()
        for track in self.figure_tracks:
            try:
                track.add(iteration, at_ns, track.figure.read())
            except Exception as exc:  # our error: that figure stops, the run goes on  # noqa: BLE001
                self.figure_tracks = [t for t in self.figure_tracks if t is not track]
                log.error(f"recorder: {type(exc).__name__}: {exc}; {track.figure.name} is not "
                          "read any more")
        self.figures_ns += thread_time_ns() - start

    # -- the agent's own waits for the GPU -------------------------------------------
    def _make_waited(self) -> Callable[[int, int], None]:
        """The sync policy's watcher: each wait, ``t0..t1`` on this thread (inside the tracer's
        begin or end), becomes a ``gpu_wait`` row under the innermost open range, named after
        the phase it lies in.

        Nothing on a CPU run (no GPU in use: the call waited for nothing).  Never raises: an
        error of ours stops the recording of waits, the training goes on.
        """
        tracer = self.tracer
        sync = tracer.sync
        state = tracer.state
        test_events = self._test_events
        append = self.native.end  # the row appended as any range's (depth: len(ts.stack))

        def waited(t0: int, t1: int) -> None:
            if self.closed or not (sync.devices or test_events):
                return
            try:
                infos = self._wait_infos
                if infos is None:
                    infos = self._wait_infos = self._wait_names()
                ts = state()
                info = self._wait_outside
                for entry in reversed(ts.stack):
                    found = infos.get(entry[0].category)
                    if found is not None:
                        info = found
                        break
                append(info, t0, t1, ts)
            except Exception as exc:  # our error: the watch stops, reported below  # noqa: BLE001
                sync.watch(None)
                log.error(f"recorder: {type(exc).__name__}: {exc}; the agent's waits for the "
                          "GPU are not recorded")

        return waited

    def _wait_names(self) -> dict[str, RangeInfo]:
        tracer = self.tracer
        infos = {}
        for place in names.WAIT_PLACES:
            info = tracer.info(names.gpu_wait_text(place), names.GPU_WAIT)
            info.sync = False
            infos[place] = info
        outside = tracer.info(names.gpu_wait_text(None), names.GPU_WAIT)
        outside.sync = False
        self._wait_outside = outside
        return infos

    # -- the agent's own work on a program's thread ---------------------------------
    def own_work(self, t0: int, t1: int) -> None:
        """The agent worked on this thread from ``t0`` to ``t1`` (the tracer's clock): its
        run-time checks after the first updates.  A row of its own (category ``agent``)
        under the innermost open range, so that the summary shows it as the agent's time
        (and the overhead figure counts it), never as the program's idle time between
        iterations; never NVTX.  Never raises."""
        if self.closed or t1 <= t0:
            return
        self.own_ns += t1 - t0
        window = self.tracer.window
        if window is not None and not window.open:
            return  # outside the capture window nothing is recorded, the agent's work neither
        try:
            info = self._own_info
            if info is None:
                info = self._own_info = self.tracer.info(names.AGENT_CHECKS, names.AGENT)
                info.sync = False
            self.native.end(info, t0, t1, self.tracer.state())
        except Exception as exc:  # our error: the row is missing, the training goes on  # noqa: BLE001
            log.error(f"recorder: {type(exc).__name__}: {exc}; the agent's own checks are "
                      "not recorded")

    # -- aggregation ----------------------------------------------------------
    def _flush_thread(self, ts: ThreadState) -> None:
        if ts.record:
            self._absorb(ts.tid, None, ts)

    def _absorb(self, tid: int, block: RangeRows | None, ts: ThreadState | None = None,
                samples: list[tuple[int, int]] | None = None) -> None:
        """Aggregate ``block``, or the buffer of ``ts`` taken under the lock: a thread that
        waits for the lock keeps its rows where another's flush (the exit's) finds them.
        ``samples``: ``(t1, samples)`` of iterations among the rows (else ``ts``'s)."""
        with self._lock:
            if ts is not None and not ts.record:
                return
            self.busy_thread = threading.get_ident()
            t_start = thread_time_ns()  # this thread's CPU: not the waits for the GIL
            try:
                if ts is not None:  # the rows, the thread's buffer emptied
                    block = _rows(self.native.take(ts))
                    if ts.record_samples:  # (taken after the rows: see feed)
                        samples, ts.record_samples = ts.record_samples, []
                assert block is not None
                self.agg.feed(tid, block, samples)
                if self.keep:
                    self._retain(tid, block)
                handover = self.gpu_handover
                if handover is not None:
                    handover((tid, block))
            except Exception as exc:  # our bug must not reach the training's call stack  # noqa: BLE001
                log.error(f"recorder: {type(exc).__name__}: {exc}; some ranges are missing "
                          "from the summary and the trace")
            finally:
                self.flush_ns += thread_time_ns() - t_start
                self.busy_thread = None
        deferred = self.deferred
        if deferred is not None and threading.get_ident() == threading.main_thread().ident:
            self.deferred = None
            deferred()

    def _retain(self, tid: int, block: RangeRows) -> None:
        self.retained.append((tid, block))
        self.retained_ranges += len(block)
        excess = self.retained_ranges - self.record_limit
        while excess > 0 and self.retained:
            old_tid, oldest = self.retained[0]
            n = len(oldest)
            if n <= excess:
                self.retained.popleft()
                drop = n
            else:
                self.retained[0] = (old_tid, oldest[excess:].copy())
                drop = excess
            self.retained_ranges -= drop
            self.dropped += drop
            excess -= drop

    def abandon(self, ts: ThreadState, entries: list[tuple[RangeInfo, int]], end_ns: int) -> None:
        """Ranges ``ts``'s thread will never end (it ended, or the process is ending):
        recorded as ending at ``end_ns``, innermost first (any thread may call this)."""
        if self.closed:
            return
        self._flush_thread(ts)
        rows = np.array([(info.index, t0, max(t0, end_ns), depth)
                         for depth, (info, t0) in reversed(list(enumerate(entries)))],
                        dtype=np.int64).reshape(-1, 4)
        samples = ts.iter_samples or ts.iter_converted  # an iteration cut short: its samples
        ended = rows[rows[:, 0] == self._iter_info.index, 2].tolist() if samples else []
        self._absorb(ts.tid, rows, samples=[(t1, samples) for t1 in ended] or None)

    def thread_ended(self, ts: ThreadState) -> None:
        """``ts``'s thread has ended: aggregate what it buffered; its figures may go."""
        if self.closed:
            return
        self._flush_thread(ts)
        with self._lock:
            self.agg.thread_ended(ts.tid)
            handover = self.gpu_handover
            if handover is not None:
                handover((ts.tid, None))

    def flush_all(self) -> None:
        """Aggregate every thread's buffered ranges (at exit)."""
        for ts in list(self.tracer.states.values()):
            if ts.record:
                self._flush_thread(ts)

    def pending_blocks(self) -> list[tuple[int, RangeRows]]:
        """Per thread, a copy ``(n, 4)`` int64 of the ranges buffered, not yet aggregated.

        Nothing is consumed, and any thread may ask (a copy is taken in one step
        under the GIL while the owning thread appends).  A buffer being
        aggregated at that moment may show up both here and in
        :meth:`retained_since`; a thread's rows end in order (``t1`` never
        decreases), so readers drop the repeats.
        """
        blocks = []
        for ts in list(self.tracer.states.values()):
            if ts.record:
                block = _rows(self.native.copy(ts))
                if len(block):
                    blocks.append((ts.tid, block))
        return blocks

    def retained_since(self, mark: int) -> tuple[list[tuple[int, RangeRows]], int]:
        """The blocks kept for the trace after ``mark``, and the mark to pass next time.

        ``mark`` counts the ranges ever kept (0 at first); blocks kept since
        then, in the order they were kept.  Ranges the record limit dropped
        before they were asked for are not returned.  Safe from another thread.
        """
        with self._lock:
            total = self.retained_ranges + self.dropped
            wanted = total - mark
            blocks: list[tuple[int, RangeRows]] = []
            for tid, block in reversed(self.retained):
                if wanted <= 0:
                    break
                if len(block) > wanted:
                    block = block[len(block) - wanted:]
                blocks.append((tid, block))
                wanted -= len(block)
        blocks.reverse()
        return blocks, total

    def stats_now(self, end_ns: int, meta: dict[str, object] | None = None,
                  sample: int | None = None) -> RunStats:
        """The statistics aggregated so far, asked from another thread while the program runs
        (``sample``: at most that many values per per-iteration list)."""
        with self._lock:
            return self._result(end_ns, meta, sample=sample)

    def flushing_here(self) -> bool:
        """Whether this thread is in the middle of aggregating (signal handlers ask)."""
        return self.busy_thread == threading.get_ident()

    # -- GPU ------------------------------------------------------------------
    def _start_gpu_timer(self, ts: ThreadState) -> None:
        self.gpu_checked = True
        try:
            skip = max(0, self.warm_skip - self.iterations_ended)
            timer = self.tracer.sync.backend.event_timer()
            self.gpu = GpuPhaseTimer(timer, ts.tid, self._iter_info, skip, self.max_kept)
            self.tracer.add_sink(self.gpu)
        except Exception as exc:  # no GPU phase timer: the run goes on without it  # noqa: BLE001
            self.gpu = None
            log.warning(f"no GPU phase timing ({type(exc).__name__}: {exc})")

    # -- results ----------------------------------------------------------------
    def run_stats(self, end_ns: int, overhead: tuple[float, str] = (0.0, ""),
                  meta: dict[str, object] | None = None) -> RunStats:
        """The statistics of everything aggregated so far."""
        return self._result(end_ns, meta, overhead_ms=overhead[0], overhead_method=overhead[1],
                            gpu_phase_ms=self.gpu.result() if self.gpu is not None else None)

    def _result(self, end_ns: int, meta: dict[str, object] | None, sample: int | None = None,
                **figures: object) -> RunStats:
        """RunStats of what is aggregated: the run record's figures (:mod:`..analysis.record`)
        as this run has them, the rest (``figures``) at their defaults unless given."""
        # the record's declaration loads when statistics are first asked for: start-up stays
        # as light as it was (the program's own allocations, its gc timing, unchanged)
        from ..analysis import record

        tracer = self.tracer
        figures.update(batch_size=tracer.facts.get("batch_size"), sync_level=tracer.sync.level,
                       sync_calls=tracer.sync.calls, dropped_ranges=self.dropped,
                       **self.agg.samples_of(threading.main_thread().native_id),
                       per_iteration={t.figure.name: r for t in self.figure_tracks
                                      if (r := t.result()) is not None})
        return self.agg.result(end_ns, threading.main_thread().native_id, sample,
                               meta=meta if meta is not None else {},
                               **record.stats_fields(figures))

    # -- end of the process ---------------------------------------------------------
    def close(self, tracer: Tracer) -> None:
        """Aggregate what is left (once): the agent then pulls the results."""
        if self.closed:
            return
        self.closed = True
        self.flush_all()
        self.end_ns = tracer.clock()
        if self.gpu is not None:
            try:
                self.gpu.finish()
            except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
                log.warning(f"GPU phase times incomplete ({type(exc).__name__}: {exc})")

    def reset_after_fork(self, tracer: Tracer) -> None:
        """A forked child starts empty; it reports only if it trains."""
        self._reset(tracer.clock())
        self.fork_child = True


def _rows(data: bytearray | array[int]) -> RangeRows:
    """Rows taken from a thread's buffer (int64, four a row) as an ``(n, 4)`` array."""
    return np.frombuffer(data, dtype=np.int64).reshape(-1, 4)
