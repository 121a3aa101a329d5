"""The in-process recorder: every emitted range, kept cheaply, summarized at exit.

Hot path (:meth:`Recorder.end`): one tuple ``(name index, t0 ns, t1 ns,
depth)`` appended to the thread's list (``ThreadState.record``), the cheapest
append CPython has.  When a thread's list holds :data:`CHUNK_RANGES` ranges
it becomes an ``(n, 4)`` int64 block (32 bytes per range), handed to the
:class:`~..stats.Aggregator` (running totals, per-iteration lists, all
vectorized) and, when a trace is wanted, kept for the timeline.

Memory bound: at most ``record_limit`` ranges are kept for the trace (the
newest; older ones are dropped and counted) at 32 bytes each, plus one list
per thread being filled (at most :data:`CHUNK_RANGES` tuples, about 140 bytes
each while in the list): ``32 B x record_limit + threads x 4096 x 140 B``
(6.4 MB + 0.6 MB per thread at the default limit).  Without a trace nothing
but the lists in flight and the aggregates is kept.  The aggregates are
bounded too (see :mod:`..stats`).

GPU: once the model's arrays are seen on a GPU, a :class:`GpuPhaseTimer` sink
also times the iteration and its phases with CUDA events on the loop thread,
read back without blocking (polled at each iteration end, drained at exit).

Overhead: at exit the cost of one recorded range (tracer begin/end plus this
sink) and of one instrumented call that emits nothing (the wrapper) are
calibrated on a scratch tracer; the estimate is ``ranges x range cost +
wrapper calls x wrapper cost + the aggregation time actually measured``.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections import deque
from itertools import chain
from time import perf_counter_ns, time_ns
from typing import Any, Callable

from .. import log, names
from ..processes import child_trace_template, is_child
from ..processes import metadata as process_metadata
from ..settings import SETTINGS, Config, SettingsError, to_environ_value
from ..stats import DEPTH_BITS, MAX_KEPT_ITERATIONS, PHASE_KEYS, Aggregator, RunStats, _Series

#: Ranges a thread buffers before they are aggregated.
CHUNK_RANGES = 4096
#: Test-only: time phases with the backend's event timer even without a GPU
#: (the counting backend's host timer), to exercise the GPU-timing path on CPU.
ENV_TEST_EVENTS = "CHAINER_AUTOPROF_TEST_EVENTS"


class Recorder:
    """Sink that records ranges in memory and writes the summary and trace at exit."""

    def __init__(self, cfg: Config, tracer: Any, chunk_ranges: int = CHUNK_RANGES,
                 max_kept: int = MAX_KEPT_ITERATIONS, scratch: bool = False) -> None:
        self.trace_path: str | None = cfg.trace
        if self.trace_path and not scratch:
            from ..trace import check_writable
            try:
                check_writable(self.trace_path)
            except ValueError as exc:
                raise SettingsError(f"CHAINER_PROF_TRACE={self.trace_path!r} is not valid: "
                                    f"{exc}") from None
        self.cfg = cfg
        self.tracer = tracer
        self.chunk_ranges = max(1, chunk_ranges)
        self.record_limit = int(cfg.record_limit)
        self.max_kept = max_kept
        self.window = cfg.iterations
        self.warm_skip = max(0, int(cfg.warmup) - (self.window[0] if self.window else 0))
        self.infos: list[tuple[str, str, int]] = []
        self.scratch = scratch
        self._iter_info = tracer.info(names.ITERATION, names.ITERATION)
        self._test_events = os.environ.get(ENV_TEST_EVENTS, "") == "1"
        self._reset(tracer.start_ns)
        self.end = self._make_end()

    def _reset(self, start_ns: int) -> None:
        self.start_ns = start_ns
        # re-entrant: a signal handler may close the recorder between our acquiring the
        # lock and marking busy_thread (flushing_here() covers the rest)
        self._lock = threading.RLock()
        self.agg = Aggregator(start_ns, self.warm_skip, self.window, self.max_kept)
        for index, (name, category, _color) in enumerate(self.infos):
            self.agg.add_name(index, name, category)
        self.retained: deque[tuple[int, Any]] = deque()
        self.retained_ranges = 0
        self.dropped = 0
        self.flush_ns = 0
        self.iterations_ended = 0
        self.busy_thread: int | None = None
        self.deferred: Callable[[], None] | None = None
        self.closed = False
        self.gpu: GpuPhaseTimer | None = None
        self.gpu_checked = False
        self.fork_child = False
        self.stats: RunStats | None = None

    # -- sink protocol ------------------------------------------------------
    def prepare(self, info: Any) -> None:
        while len(self.infos) <= info.index:
            self.infos.append(("", "", 0))
        self.infos[info.index] = (info.name, info.category, info.color)
        self.agg.add_name(info.index, info.name, info.category)

    def _make_end(self) -> Callable[[Any, int, int, Any], None]:
        iter_info = self._iter_info
        limit = self.chunk_ranges
        flush = self._flush_thread
        iteration_ended = self._iteration_ended

        def end(info: Any, t0: int, t1: int, ts: Any) -> None:
            buf = ts.record
            if buf is None:
                buf = ts.record = []
            if info is iter_info:
                iteration_ended(buf, t0, t1, ts)
                return
            buf.append((info.index, t0, t1, len(ts.stack)))
            if len(buf) >= limit:
                flush(ts)

        return end

    def _iteration_ended(self, buf: list, t0: int, t1: int, ts: Any) -> None:
        number = self.tracer.iterations  # this iteration's number + 1
        buf.append((self._iter_info.index, t0, t1, len(ts.stack) | (number << DEPTH_BITS)))
        self.iterations_ended += 1
        if not self.gpu_checked and (self.tracer.sync.devices or self._test_events):
            self._start_gpu_timer(ts)
        if len(buf) >= self.chunk_ranges:
            self._flush_thread(ts)

    # -- aggregation ----------------------------------------------------------
    def _flush_thread(self, ts: Any) -> None:
        buf = ts.record
        ts.record = []
        if buf:
            self._absorb(ts.tid, buf)

    def _absorb(self, tid: int, buf: list) -> None:
        import numpy as np

        with self._lock:
            self.busy_thread = threading.get_ident()
            t_start = perf_counter_ns()
            try:
                block = np.fromiter(chain.from_iterable(buf), dtype=np.int64,
                                    count=4 * len(buf)).reshape(-1, 4)
                self.agg.feed(tid, block)
                if self.trace_path:
                    self._retain(tid, block)
            except Exception as exc:  # our bug must not reach the training's call stack
                log.error(f"recorder: {type(exc).__name__}: {exc}; some ranges are missing "
                          "from the summary and the trace")
            finally:
                self.flush_ns += perf_counter_ns() - t_start
                self.busy_thread = None
        deferred = self.deferred
        if deferred is not None and threading.get_ident() == threading.main_thread().ident:
            self.deferred = None
            deferred()

    def _retain(self, tid: int, block: Any) -> None:
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

    def flush_all(self) -> None:
        """Aggregate every thread's buffered ranges (at exit)."""
        for ts in list(self.tracer.states.values()):
            if ts.record:
                self._flush_thread(ts)

    def flushing_here(self) -> bool:
        """Whether this thread is in the middle of aggregating (signal handlers ask)."""
        return self.busy_thread == threading.get_ident()

    # -- GPU ------------------------------------------------------------------
    def _start_gpu_timer(self, ts: Any) -> None:
        self.gpu_checked = True
        try:
            skip = max(0, self.warm_skip - self.iterations_ended)
            timer = self.tracer.sync.backend.event_timer()
            self.gpu = GpuPhaseTimer(timer, ts.tid, self._iter_info, skip, self.max_kept)
            self.tracer.add_sink(self.gpu)
        except Exception as exc:
            self.gpu = None
            log.warning(f"no GPU phase timing ({type(exc).__name__}: {exc})")

    # -- results ----------------------------------------------------------------
    def run_stats(self, end_ns: int, overhead: tuple[float, str] = (0.0, "")) -> RunStats:
        """The statistics of everything aggregated so far."""
        tracer = self.tracer
        main_tid = threading.main_thread().native_id
        gpu = self.gpu.result() if self.gpu is not None else None
        return self.agg.result(
            end_ns, main_tid,
            batch_size=tracer.facts.get("batch_size"),
            sync_level=tracer.sync.level, sync_calls=tracer.sync.calls,
            overhead_ms=overhead[0], overhead_method=overhead[1],
            gpu_phase_ms=gpu, meta=self.metadata(end_ns),
            dropped_ranges=self.dropped)

    def metadata(self, end_ns: int) -> dict[str, Any]:
        """Run metadata for the trace and the summary."""
        from .. import __version__
        from ..trace import mpi_rank

        cfg = self.cfg
        settings: dict[str, Any] = {}
        for s in SETTINGS:
            value = getattr(cfg, s.name)
            if isinstance(value, (tuple, frozenset, set)):
                value = sorted(value) if not isinstance(value, tuple) else list(value)
            settings[s.name] = value
        settings["effective_sync_level"] = cfg.effective_sync_level
        versions = {"python": sys.version.split()[0], "chainer_autoprof": __version__}
        for module in ("chainer", "cupy", "numpy"):
            mod = sys.modules.get(module)
            if mod is not None:
                versions[module] = str(getattr(mod, "__version__", "?"))
        argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
        return {
            "version": __version__,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": mpi_rank(),
            "command": " ".join(argv),
            "settings": settings,
            "env": {s.env: to_environ_value(s, getattr(cfg, s.name))
                    for s in SETTINGS if s.name in cfg.explicit},
            "versions": versions,
            "devices": _devices(self.tracer.sync.devices),
            "clock": {"perf_counter_ns_at_start": self.start_ns,
                      "unix_time_ns_at_start": time_ns() - (perf_counter_ns() - self.start_ns),
                      "duration_ns": end_ns - self.start_ns},
            "warmup_skip": self.warm_skip,
            "granularity": cfg.granularity,
            "sync_ms": round(self.tracer.sync.seconds * 1e3, 3),
            "facts": {k: v for k, v in self.tracer.facts.items()
                      if isinstance(v, (int, float, str, bool, dict, list))},
            "process": process_metadata(),  # MPI job, parent, clock reference
        }

    # -- end of the process ---------------------------------------------------------
    def close(self, tracer: Any) -> None:
        """Aggregate what is left, write the trace, print the summary (once)."""
        if self.closed or self.scratch:
            return
        self.closed = True
        self.flush_all()
        end_ns = tracer.clock()
        if self.gpu is not None:
            try:
                self.gpu.finish()
            except Exception as exc:
                log.warning(f"GPU phase times incomplete ({type(exc).__name__}: {exc})")
        if self.fork_child and self.agg.seen == 0:
            return  # a worker process that did no training: nothing to say
        if self.agg.ranges == 0 and is_child():
            return  # a helper interpreter (resource tracker, ...) that recorded nothing
        overhead = self.estimate_overhead()
        stats = self.stats = self.run_stats(end_ns, overhead)
        if self.trace_path:
            stats.meta["trace_path"] = self.write_trace(stats, end_ns)
        if self.cfg.summary:
            try:
                from ..summary import format_summary
                text = format_summary(stats, advice=bool(getattr(self.cfg, "advice", True)))
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
            except Exception as exc:
                log.error(f"no summary ({type(exc).__name__}: {exc})")

    def write_trace(self, stats: RunStats, end_ns: int) -> str | None:
        """Write the trace file; returns its path (``None`` on failure, said once)."""
        from ..trace import ThreadRanges, expand_path, write_trace

        assert self.trace_path is not None
        path = expand_path(child_trace_template(self.trace_path))
        other = dict(stats.meta)
        other.update(dropped_ranges=self.dropped, main_tid=threading.main_thread().native_id,
                     batch_size=stats.batch_size, sync_level=stats.sync_level,
                     sync_calls=stats.sync_calls, overhead_ms=stats.overhead_ms,
                     overhead_method=stats.overhead_method, gpu_phase_ms=stats.gpu_phase_ms,
                     ranges=stats.ranges)
        if self.dropped:
            other["run_stats"] = stats.to_dict()
            other["run_stats"]["meta"] = {}
        per_thread: dict[int, list] = {}
        for tid, block in self.retained:
            per_thread.setdefault(tid, []).append(block)
        thread_names = {ts.tid: ts.thread_name for ts in list(self.tracer.states.values())}
        threads = [ThreadRanges(tid, thread_names.get(tid, f"thread {tid}"), blocks)
                   for tid, blocks in per_thread.items()]
        rank = other.get("rank", 0)
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        process = f"{script} (pid {os.getpid()}" + (f", rank {rank})" if rank else ")")
        try:
            write_trace(path, pid=os.getpid(), start_ns=self.start_ns, infos=self.infos,
                        threads=threads, other=other, process_name=process,
                        main_tid=other["main_tid"])
        except Exception as exc:
            log.error(f"could not write the trace {path}: {type(exc).__name__}: {exc}")
            return None
        return path

    def estimate_overhead(self) -> tuple[float, str]:
        """(milliseconds, method) of the agent's own time; see the module docstring."""
        try:
            range_ns, call_ns = calibrate(self.tracer.granularity_level)
        except Exception as exc:
            return 0.0, f"not measured ({type(exc).__name__}: {exc})"
        ranges = self.agg.ranges
        hits = 0
        try:
            from ..agent import current
            agent = current()
            if agent is not None and agent.patches is not None:
                hits = sum(p.hits for p in agent.patches.patches)
        except Exception:
            pass
        quiet_calls = max(0, hits - ranges)
        total_ns = ranges * range_ns + quiet_calls * call_ns + self.flush_ns
        method = (f"calibrated at exit: {ranges:,} ranges x {range_ns / 1000:.2f} us"
                  f" + {quiet_calls:,} other instrumented calls x {call_ns / 1000:.2f} us"
                  f" + {self.flush_ns / 1e6:.1f} ms aggregation")
        return total_ns / 1e6, method

    def reset_after_fork(self, tracer: Any) -> None:
        """A forked child starts empty; it reports only if it trains."""
        self._reset(tracer.clock())
        self.fork_child = True


class GpuPhaseTimer:
    """Sink timing the iteration and its phases on the GPU with CUDA events.

    Only on the loop thread; events are recorded on the current stream and
    polled without blocking at each iteration end (the backend's EventTimer).
    """

    def __init__(self, timer: Any, tid: int, iter_info: Any, skip: int, max_kept: int) -> None:
        self.timer = timer
        self.tid = tid
        self.iter_info = iter_info
        self.skip = skip
        self.codes: list[int] = []     # per name index: 0 untimed, 1 iteration, 2+ phase
        self.stack: list[tuple[Any, Any]] = []
        self.pending = [0.0] * 4
        self.series = _Series(max_kept, 5)
        self.iterations = 0

    def prepare(self, info: Any) -> None:
        while len(self.codes) <= info.index:
            self.codes.append(0)
        if info.category == names.ITERATION:
            self.codes[info.index] = 1
        elif info.category in names.PHASES:
            self.codes[info.index] = 2 + names.PHASES.index(info.category)

    def begin(self, info: Any, ts: Any) -> None:
        if ts.tid != self.tid:
            return
        index = info.index
        if index < len(self.codes) and self.codes[index]:
            self.stack.append((info, self.timer.begin(index)))

    def end(self, info: Any, t0: int, t1: int, ts: Any) -> None:
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

    def close(self, tracer: Any) -> None:
        pass


def _devices(ids: set[int]) -> list[dict[str, Any]]:
    """The GPUs in use: id and name (CuPy, only if the program imported it)."""
    out: list[dict[str, Any]] = []
    cupy = sys.modules.get("cupy")
    for dev in sorted(ids):
        entry: dict[str, Any] = {"id": dev}
        if cupy is not None:
            try:
                props = cupy.cuda.runtime.getDeviceProperties(dev)
                name = props.get("name", b"")
                entry["name"] = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:
                pass
        out.append(entry)
    return out


_calibration: tuple[float, float] | None = None


def calibrate(granularity_level: int, pairs: int = 4000) -> tuple[float, float]:
    """(ns per recorded range, ns per instrumented call emitting nothing), measured once.

    A scratch tracer with a scratch recorder (no NVTX, no sync) times
    ``pairs`` begin/end pairs; a wrapt wrapper shaped like the patches' times
    the cost of a call that emits nothing, against the bare call.
    """
    global _calibration
    if _calibration is not None:
        return _calibration
    import wrapt

    from ..device import NullBackend
    from ..events import Tracer
    from ..policies import SyncPolicy

    tracer = Tracer(granularity_level, SyncPolicy(0, NullBackend()))
    cfg = Config({"summary": False, "trace": None})
    tracer.add_sink(Recorder(cfg, tracer, chunk_ranges=pairs + 1, scratch=True))
    # iteration-level names: emitted at every granularity
    outer = tracer.info("calibration", names.ITERATION)
    info = tracer.info("calibration range", names.ITERATION)
    ts = tracer.state()
    begin, end = tracer.begin, tracer.end
    begin(outer, ts)
    best_range = float("inf")
    for _ in range(3):
        t0 = perf_counter_ns()
        for _ in range(pairs):
            tok = begin(info, ts)
            end(tok, ts)
        best_range = min(best_range, (perf_counter_ns() - t0) / pairs)
        ts.record = None
    end(outer, ts)

    class _Switch:
        on = True
        hits = 0

    patch = _Switch()
    state = tracer.state

    def wrapper(wrapped, instance, args, kwargs):
        patch.hits += 1
        if not patch.on:
            return wrapped(*args, **kwargs)
        st = state()
        if st.quiet:
            return wrapped(*args, **kwargs)
        return wrapped(*args, **kwargs)

    def bare(x):
        return x

    wrapped = wrapt.FunctionWrapper(bare, wrapper)
    best_call = float("inf")
    for _ in range(3):
        t0 = perf_counter_ns()
        for i in range(pairs):
            wrapped(i)
        t1 = perf_counter_ns()
        for i in range(pairs):
            bare(i)
        t2 = perf_counter_ns()
        best_call = min(best_call, max(0.0, ((t1 - t0) - (t2 - t1)) / pairs))
    _calibration = (best_range, best_call)
    return _calibration
