"""GPU activity in a live run (``CHAINER_PROF_GPU_ACTIVITY=1``): CUPTI's records tied to the
agent's ranges off the training thread, and the figures at exit.

When: the collector (:mod:`..runtime.gpu_activity`) starts when CuPy is imported (the
agent's post-import hook; at once when CuPy was imported before the agent), before the
program can launch a kernel: nothing it runs on the GPU is missed.  Kernels launched
before CuPy's import (by another library) are not recorded.  A forked child records none
(CUPTI's state is its parent's).

Three queues, each filled by a single append and drained by the session's own thread
(``chainer_autoprof-gpu``), which alone runs the attribution
(:class:`~..analysis.gpu_analysis.GpuAnalysis`):

* the recorder's blocks ``(tid, rows)``, the very arrays it aggregates and keeps for the
  trace (:meth:`GpuSession.handover`, the agent's ``Recorder.gpu_handover``; ``(tid,
  None)``: the thread ended);
* the thread map: ``(threading.get_ident() & 0xFFFFFFFF, tid)`` told once per new thread
  state (:meth:`GpuSession.thread_started`, the agent's ``Tracer.on_new_thread``), for a
  CUPTI without system thread ids;
* CUPTI's buffers (``on_batch``): converted on CUPTI's thread by cupti-python's reader;
  walked in C on CUPTI's thread by the native reader and handed over by the drain itself
  (the collector's ``hand_over``: CUPTI's thread never takes the GIL).

Bounds: the drain keeps at most :data:`MAX_QUEUED_BLOCKS` blocks and
:data:`MAX_QUEUED_BATCHES` buffers waiting (the oldest blocks, the newest buffers are
dropped and counted: a drain that cannot keep up loses figures, never memory); the
analysis is bounded by its :class:`~..analysis.gpu_analysis.Limits`; the trace keeps at
most ``record_limit // 4`` operations, whole iterations first (each gives at most four
events: the GPU tracks add at most ``record_limit`` events), with a capture window only
those launched in its iterations.

Exit (:meth:`GpuSession.stop`, after the tracer closed): the collector stops with a bounded
wait, the drain thread is joined with a bounded wait, the last blocks and buffers are
drained on the exiting thread, and the analysis finishes (:meth:`GpuSession.outcome`).
Every fault is one line and the run goes on without GPU figures: never an exception in
the program, never a hang at exit.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Deque, Protocol, TypeVar

from ..analysis.gpu_analysis import GpuAnalysis, Limits
from ..analysis.gpu_attribution import LOCATE_KINDS
from ..analysis.gpu_clock import ClockMap, fit
from ..analysis.gpu_record import GpuActivity, GpuFigures, activity_record
from ..common import figures, log
from ..common.gpu_records import ActivityBatch, ClockPairs, LocateKernel, NameTable
from ..runtime import cupti_native, cupti_readers

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows
    from ..runtime.events import ThreadState

    #: What the queue holds: a thread's block of ranges (None: it finished), or a buffer.
    _Item = tuple[int, RangeRows | None] | ActivityBatch

#: Seconds between two drains of the queues.
DRAIN_INTERVAL_S = 0.25
#: At exit: how long CUPTI's last flush may take, and the drain thread's last drain.
STOP_WAIT_S = 5.0
#: Recorder blocks waiting at most (4,096 ranges each: 128 KiB).
MAX_QUEUED_BLOCKS = 256
#: CUPTI buffers waiting at most (each up to :data:`~..runtime.gpu_activity.BUFFER_BYTES`).
MAX_QUEUED_BATCHES = 16
#: GPU operations kept for the trace per range it keeps: each gives up to four events.
EVENTS_PER_OP = 4
#: The thread map's 32-bit ids (CUPTI's default thread id: ``pthread_self()`` cut to 32 bits).
THREAD_ID_MASK = 0xFFFFFFFF


class Collector(Protocol):
    """What the session asks of a collector (:class:`~..runtime.gpu_activity.CuptiCollector`)."""

    system_thread_ids: bool
    buffers: int
    records: int
    ops: int
    dropped_records: int
    incomplete: int
    callback_errors: int
    queue_dropped_ops: int
    last_error: str

    @property
    def clock_pairs(self) -> ClockPairs: ...
    @property
    def pair_count(self) -> int: ...
    def stop(self, timeout_s: float) -> str | None: ...
    def hand_over(self) -> None: ...
    def record(self, on: bool) -> None: ...
    def after_fork(self) -> None: ...


#: The clock map's fit in C: the pairs' rows -> ClockMap's fields, in order.
ClockFit = Callable[[list[tuple[int, ...]]], tuple[int, int, float, float, int, int, int, int, int]]
#: Starts a collector that hands its batches to the callable: the collector, or why not.
StartCollector = Callable[[Callable[[ActivityBatch], None], NameTable], "Collector | str"]


def start_cupti(on_batch: Callable[[ActivityBatch], None], names: NameTable) -> Collector | str:
    """The live collector: CUPTI read natively, else through cupti-python."""
    return cupti_readers.start(on_batch, names=names)


class Recorder(Protocol):
    """What the session reads of the recorder (:class:`~..sinks.recorder.Recorder`): the
    names of its ranges (the blocks come through :meth:`GpuSession.handover`)."""

    infos: list[tuple[str, str, int]]


@dataclass
class GpuOutcome:
    """The GPU activity of a finished run: its figures, the record of them, the analysis
    (what the trace keeps), and the lines saying what is missing."""

    figures: GpuFigures
    record: GpuActivity
    analysis: GpuAnalysis
    notes: list[str] = field(default_factory=list)


class GpuSession:
    """One run's GPU activity (see the module docstring)."""

    def __init__(self, recorder: Recorder, *, record_limit: int,
                 warmup_skip: int, window: bool, main_tid: int | None,
                 start_collector: StartCollector = start_cupti,
                 limits: Limits | None = None, recording: bool = True) -> None:
        self.recorder = recorder
        self.ops_limit = max(0, record_limit // EVENTS_PER_OP)
        self.warmup_skip = warmup_skip
        self.window = window
        #: Whether CUPTI records now (:meth:`record`: off outside a capture window).
        self.recording = recording
        self.main_tid = main_tid
        self.limits = limits
        self._start_collector = start_collector
        self.names = NameTable()
        self.collector: Collector | None = None
        #: Which reader of CUPTI's records runs (the collector's ``reader``).
        self.reader = ""
        #: waiting (CuPy not imported yet), running, finished, or off (with ``why_off``)
        self.state = "waiting"
        self.why_off = ""
        #: The recorder's blocks and CUPTI's batches, in the order they arrived (a buffer comes
        #: after the ranges its launches lie in: fed in this order, each finds them kept).
        self._queue: Deque[_Item] = deque()
        self._queued_batches = 0
        self._threads: Deque[tuple[int, int]] = deque()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.analysis: GpuAnalysis | None = None
        #: The attribution's range lookup in C where the CUPTI extension is built (set at
        #: start); ``None``: its NumPy twin.
        self.locate: LocateKernel | None = None
        #: The clock map's fit in C where the extension is built (``gpu_clock.fit``'s twin,
        #: one with each buffer): the pairs' rows -> ClockMap's fields.
        self._clock_fit: ClockFit | None = None
        self._names_known = 0
        self._pairs_seen = 0
        self.drains = 0  # drains that fed the analysis (the drain thread's and the exit's)
        #: The CPU time (ns) the drains took, on whichever thread ran them: what attributing
        #: and summing the records costs, said at exit beside the agent's overhead.
        self.drain_cpu_ns = 0
        self.ranges_received = 0
        self.dropped_ranges = 0
        self.dropped_ops = 0
        self.broken = ""
        self.notes: list[str] = []
        self._outcome: GpuOutcome | None = None

    # -- on the program's threads: one append each (the agent connects them) --------------
    def thread_started(self, ts: ThreadState) -> None:
        """A new thread state (told from before any exists): its entry in the thread map."""
        if self.state in ("waiting", "running"):
            self._threads.append((threading.get_ident() & THREAD_ID_MASK, ts.tid))

    def handover(self, block: tuple[int, RangeRows | None]) -> None:
        """A block the recorder aggregated, queued while collecting (else dropped)."""
        if self.state == "running":
            self._queue.append(block)

    def _on_batch(self, batch: ActivityBatch) -> None:
        """Queue a buffer's records (the newest are dropped when full): on CUPTI's thread
        (cupti-python), or on the drain's as it takes the native reader's (``hand_over``)."""
        with self._count_lock:
            if self._queued_batches >= MAX_QUEUED_BATCHES:
                self.dropped_ops += len(batch.ops)
                return
            self._queued_batches += 1
        self._queue.append(batch)

    # -- start -------------------------------------------------------------------------
    def start(self) -> None:
        """Start collecting (CuPy was imported); a fault is one line, the run goes on."""
        if self.state != "waiting":
            return
        try:
            got = self._start_collector(self._on_batch, self.names)
        except Exception as exc:  # a bug of ours: no GPU activity, the program runs  # noqa: BLE001
            got = f"could not start ({type(exc).__name__}: {exc})"
        if isinstance(got, str):
            self._off(got)
            log.warning(f"GPU activity off: {got}")
            return
        self.collector = got
        self.locate = cupti_native.locate_kernel(LOCATE_KINDS)
        self._clock_fit = getattr(getattr(self.locate, "__self__", None), "clock_fit", None)
        self.reader = str(getattr(got, "reader", "python"))
        log.info(f"GPU activity: CUPTI's records read by the {self.reader} reader")
        self.state = "running"
        if not self.recording:  # before the capture window: CUPTI off until it opens
            self._switch(False)
            if self.state != "running":
                return
        self._thread = threading.Thread(target=self._run, name="chainer_autoprof-gpu",
                                        daemon=True)
        self._thread.start()

    def record(self, on: bool) -> None:
        """The capture window opened (``on``) or closed (the caller synchronized the GPUs
        first, so that every operation launched in it has ended): CUPTI records only inside
        it, and outside it costs nothing.  Never raises: a fault is one line, and GPU
        activity is off from then on."""
        if on == self.recording:
            return
        self.recording = on
        if self.state == "running":
            self._switch(on)

    def _switch(self, on: bool) -> None:
        collector = self.collector
        assert collector is not None
        try:
            collector.record(on)
        except Exception as exc:  # CUPTI's error: no GPU figures, the run goes on  # noqa: BLE001
            why = f"CUPTI could not be switched {'on' if on else 'off'} ({exc})"
            log.warning(f"GPU activity off: {why}")
            self.state = "finished"
            try:
                collector.stop(STOP_WAIT_S)
            finally:
                self._stop.set()
                self._off(why)

    def _off(self, why: str) -> None:
        self.state = "off"
        self.why_off = why
        self._discard()
        self._threads.clear()

    # -- the drain thread --------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            self._drain_safely()

    def _drain_safely(self, timeout_s: float = -1) -> bool:
        """One drain under the lock (waiting ``timeout_s`` for it at most; -1: as long as it
        takes); ``False`` when the lock could not be had in time."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            if self.broken:
                self._discard()
                return True
            cpu = time.thread_time_ns()
            try:
                self._drain()
            except Exception as exc:  # our bug: no GPU figures, nothing else changes  # noqa: BLE001
                self.broken = f"the GPU analysis failed ({type(exc).__name__}: {exc})"
                self.analysis = None
                log.error(f"GPU activity: {self.broken}; no GPU figures")
            self.drain_cpu_ns += time.thread_time_ns() - cpu
            return True
        finally:
            self._lock.release()

    def _drain(self) -> None:
        """Hand what the queues hold to the analysis (under the lock, one thread at a time)."""
        collector = self.collector
        if collector is None:
            return
        collector.hand_over()  # buffers waiting in C (native): queued after the blocks so far
        analysis = self.analysis
        if analysis is None:
            if not collector.pair_count:
                return  # no clock pair yet: nothing can be placed
            analysis = self.analysis = GpuAnalysis(
                self._fit(collector), self.names, self.warmup_skip,
                record_limit=self.ops_limit, identity_threads=collector.system_thread_ids,
                loop_tid=self.main_tid, limits=self.limits, keep_outside=not self.window,
                locate=self.locate)
            self._pairs_seen = collector.pair_count
        self.drains += 1
        items = _take(self._queue)
        if len(items) > MAX_QUEUED_BLOCKS:  # (the usual drain takes a few: no block counted)
            self._drop_late_blocks(items)
        if self._names_known < len(self.recorder.infos):
            self._add_names(analysis)  # after the blocks were taken: their names are known
        if self._threads:
            for cupti_thread, tid in _take(self._threads):
                if not collector.system_thread_ids:
                    analysis.map_thread(cupti_thread, tid)
        refit = collector.pair_count != self._pairs_seen
        for item in items:
            if isinstance(item, tuple):
                tid, rows = item
                if rows is None:
                    analysis.thread_finished(tid)
                else:
                    self.ranges_received += len(rows)
                    analysis.feed_ranges(tid, rows)
                continue
            with self._count_lock:
                self._queued_batches -= 1
            if refit:  # the clock refitted with the pairs read since (one with each buffer)
                refit = False
                self._pairs_seen = collector.pair_count
                analysis.set_clock(self._fit(collector))
            analysis.feed_activity(item)

    def _drop_late_blocks(self, items: list[_Item]) -> None:
        """The drain fell behind: the oldest blocks of ranges beyond the bound go (``items``
        changed in place)."""
        blocks = [item for item in items if isinstance(item, tuple)]
        if len(blocks) <= MAX_QUEUED_BLOCKS:
            return
        late = {id(item) for item in blocks[:len(blocks) - MAX_QUEUED_BLOCKS]}
        for _tid, rows in blocks[:len(blocks) - MAX_QUEUED_BLOCKS]:
            self.dropped_ranges += len(rows) if rows is not None else 0
        items[:] = [item for item in items if id(item) not in late]

    def _fit(self, collector: Collector) -> ClockMap:
        """The clock map through the collector's pairs (in C where built)."""
        rows = getattr(collector, "pair_rows", None)
        if self._clock_fit is not None and rows is not None:
            return ClockMap(*self._clock_fit(rows()))
        return fit(collector.clock_pairs)

    @property
    def queued(self) -> int:
        """Blocks and buffers not yet fed to the analysis (a buffer counts until it is fed:
        the bound on buffers holds while a drain works through what it took)."""
        return max(len(self._queue), self._queued_batches)

    def _discard(self) -> None:
        self._queue.clear()
        with self._count_lock:
            self._queued_batches = 0

    def _add_names(self, analysis: GpuAnalysis) -> None:
        infos = self.recorder.infos
        while self._names_known < len(infos):
            name, category, _color = infos[self._names_known]
            if not category:  # a slot being filled right now: next time
                break
            analysis.add_name(self._names_known, name, category)
            self._names_known += 1

    # -- the end -------------------------------------------------------------------------
    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """At exit, after the tracer closed: stop collecting and finish the analysis, each
        wait bounded (idempotent)."""
        if self.state != "running":
            return
        self.state = "finished"
        collector = self.collector
        assert collector is not None
        try:
            late = collector.stop(timeout_s)
        except Exception as exc:  # CUPTI's error: said in the report  # noqa: BLE001
            late = f"CUPTI could not stop ({type(exc).__name__}: {exc})"
        if late:
            self.notes.append(late)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        # what came since the last drain, on this thread (a drain still running: given up)
        if (self._thread is not None and self._thread.is_alive()) or \
                not self._drain_safely(timeout_s):
            self.broken = f"the GPU analysis did not finish within {timeout_s:g} s at exit"
            log.warning(f"GPU activity: {self.broken}; no GPU figures")
            return
        self._discard()  # what no analysis could take (no clock pair ever came)
        if self.broken or self.analysis is None:
            if not self.broken:
                self.notes.append("CUPTI handed over nothing (no GPU work was recorded)")
            return
        try:
            analysis = self.analysis
            fig = analysis.finish()
            self._outcome = GpuOutcome(fig, activity_record(
                fig, self._source(fig), self._counts(), self._notes(fig)), analysis,
                list(self.notes))
        except Exception as exc:  # our error: GPU figures left out, the run goes on  # noqa: BLE001
            self.broken = f"the GPU analysis failed ({type(exc).__name__}: {exc})"
            log.error(f"GPU activity: {self.broken}; no GPU figures")

    def finish(self, timeout_s: float = STOP_WAIT_S) -> GpuOutcome | None:
        """The exit's part (after the tracer closed): :meth:`stop`, then the outcome, or one
        line saying why there is none.  Never raises."""
        try:
            self.stop(timeout_s)
            if self._outcome is None:
                self.say_why_not()
        except Exception as exc:  # our bug: the rest of the exit goes on  # noqa: BLE001
            log.error(f"GPU activity: {type(exc).__name__}: {exc}; no GPU figures")
            return None
        return self._outcome

    def outcome(self) -> GpuOutcome | None:
        """The finished run's GPU activity (``None``: none, and :meth:`say_why_not` says why)."""
        return self._outcome

    def say_why_not(self) -> None:
        """At exit without an outcome: one line saying why there are no GPU figures."""
        if self._outcome is not None or self.state == "off" or self.broken:
            return  # said already
        if self.state == "waiting":
            log.warning("GPU activity: CuPy was never imported, so no GPU was in use: no GPU "
                        "figures (CHAINER_PROF_GPU_ACTIVITY=1)")
        elif self.notes:
            log.warning("GPU activity: no GPU figures: " + "; ".join(self.notes))

    def after_fork(self) -> None:
        """A forked child: nothing of the parent's GPU activity is its (and none is recorded)."""
        if self.collector is not None:
            self.collector.after_fork()
        self._thread = None
        self.analysis = None
        self._off("a forked child process (CUPTI is its parent's)")

    def _source(self, fig: GpuFigures) -> str:
        kernels = sum(int(p["kernels"]) for p in fig.phases.values())
        where = " (CUPTI on in the capture window only)" if self.window else ""
        return (f"CUPTI kernel activity, {figures.count(kernels)} kernels over "
                f"{fig.iterations} counted iterations{where}, each tied to the range that "
                "launched it")

    def _counts(self) -> dict[str, int]:
        c = self.collector
        assert c is not None
        return {"buffers": c.buffers, "records": c.records, "dropped_records": c.dropped_records,
                "incomplete": c.incomplete, "callback_errors": c.callback_errors,
                "queue_dropped_ops": self.dropped_ops + c.queue_dropped_ops,
                "queue_dropped_ranges": self.dropped_ranges,
                "analysis_cpu_us": self.drain_cpu_ns // 1000}

    def _notes(self, fig: GpuFigures) -> list[str]:
        """What the figures miss, one line each (also printed at exit)."""
        c = self.collector
        assert c is not None
        out = list(self.notes)
        trace_note = self.analysis.trace_note() if self.analysis is not None else None
        if trace_note:
            out.append(trace_note)
        if c.dropped_records:
            out.append(f"CUPTI dropped {figures.count(c.dropped_records)} records (its buffers "
                       "were full): the GPU figures miss them")
        if c.callback_errors:
            out.append(f"{figures.count(c.callback_errors)} CUPTI buffer(s) could not be read "
                       f"({c.last_error}): the GPU figures miss their records")
        if self.dropped_ops:
            out.append(f"{figures.count(self.dropped_ops)} GPU operations dropped while the "
                       "analysis fell behind")
        if self.dropped_ranges:
            out.append(f"{figures.count(self.dropped_ranges)} ranges reached the GPU analysis "
                       "too late (it fell behind): their kernels count for the enclosing ranges")
        if c.incomplete:
            out.append(f"{figures.count(c.incomplete)} GPU operations were still running at "
                       "exit (left out)")
        unplaced = {k: v for k, v in fig.statuses.items() if k != "attributed"}
        if unplaced:
            out.append("GPU operations not tied to a range: " + ", ".join(
                f"{figures.count(int(v['ops']))} {k}" for k, v in unplaced.items()))
        for line in out:
            log.warning(f"GPU activity: {line}")
        return out


T = TypeVar("T")


def _take(queue: Deque[T]) -> list[T]:
    """What ``queue`` holds now (appends meanwhile stay for the next time)."""
    out: list[T] = []
    for _ in range(len(queue)):
        out.append(queue.popleft())
    return out
