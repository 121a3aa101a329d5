"""The end of a run: pull the statistics from the recorder, write the trace, print the summary.

Measuring never pushes into reporting: the recorder only buffers and
aggregates.  At exit the agent closes the tracer (every sink flushes) and
calls :func:`report_run`, which asks the recorder for its statistics and its
retained ranges and hands them to :mod:`..report`.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from time import perf_counter_ns, time_ns
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ..analysis import record
from ..analysis.findings import find
from ..analysis.record import By
from ..analysis.stats import RunStats
from ..common import log, rank
from ..common.one_line import command_line, write
from ..common.readable import readable
from ..common.settings import SETTINGS, Config, to_environ_value
from ..common.version import __version__
from ..report.summary import format_summary
from ..report.trace_events import COUNTERS, Track
from ..report.tracefile import ThreadRanges, write_trace
from ..runtime.device import device_names
from ..sinks.recorder import Recorder
from . import overhead, processes

if TYPE_CHECKING:
    from ..common.typedefs import JsonObject, RangeArgs, RangeRows
    from ..runtime.events import Tracer
    from .gpu_session import GpuOutcome


def report_run(recorder: Recorder, tracer: Tracer, cfg: Config, hits: int,
               trace_path: Callable[[], str] | None = None,
               extra_meta: Mapping[str, object] | None = None,
               event_args: RangeArgs | None = None,
               gpu: GpuOutcome | None = None) -> RunStats | None:
    """Statistics, trace file and summary of the run, once the tracer is closed.

    ``hits`` counts the instrumented calls (for the overhead estimate);
    ``trace_path`` gives the file the trace goes to (:func:`.processes.trace_path`;
    ``None``: no trace); ``extra_meta`` goes into the run record (e.g. the
    stall reports); ``event_args`` adds arguments to ranges of the trace (by
    thread id and start ns).  Returns the statistics, or ``None`` for a
    process with nothing to say: one that never reached an instrumented call
    nor recorded a range (``python -c 'import json'`` with a ``CHAINER_PROF_*``
    variable exported: no summary, and no trace to replace the training's), a
    forked worker that did no training, or a helper interpreter (a resource
    tracker, ...) that recorded nothing.  ``gpu``: the run's GPU activity
    (:mod:`.gpu_session`): its figures go into the statistics and the run record, its
    events into the trace.
    """
    if hits == 0 and recorder.agg.ranges == 0:
        return None
    if recorder.fork_child and recorder.agg.seen == 0:
        return None
    if recorder.agg.ranges == 0 and processes.is_child():
        return None
    end_ns = recorder.end_ns if recorder.end_ns is not None else tracer.clock()
    cost = overhead.estimate(recorder, tracer.granularity_level, hits, tracer.hotpath)
    wall_ms = max(0, end_ns - recorder.start_ns) / 1e6
    if cost[0] > wall_ms:  # threads share one interpreter: the agent's time fits in the wall's
        cost = (wall_ms, cost[1] + "; capped at the wall time")
    meta = metadata(cfg, tracer, recorder, end_ns, extra_meta)
    stats = recorder.run_stats(end_ns, cost, meta)
    if gpu is not None:
        stats.gpu_activity = gpu.record
    if cfg.trace and trace_path is not None:
        record.add(stats.meta, By.LIVE,
                   trace_path=_write_trace(recorder, tracer, trace_path(), stats, event_args,
                                           gpu))
    if cfg.summary:
        try:
            findings = find(stats, advice=bool(cfg.advice))  # once: the summary renders them
            write(sys.stderr, readable(format_summary(findings, advice=bool(cfg.advice)),
                                       stats.meta) + "\n")
            sys.stderr.flush()
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"no summary ({type(exc).__name__}: {exc})")
    return stats


def metadata(cfg: Config, tracer: Tracer, recorder: Recorder, end_ns: int,
             extra: Mapping[str, object] | None = None) -> dict[str, Any]:
    """The run record at exit, but for the statistics' figures (the summary's ``meta``)."""
    values = _run_values(cfg, tracer, recorder, _clock(recorder.start_ns, end_ns))
    values.update(extra or {})
    return record.build(By.EXIT, values, complete=False)


def partial_metadata(cfg: Config, tracer: Tracer, recorder: Recorder) -> dict[str, Any]:
    """The run record of the trace so far, while the run goes on (its reader adds the rest)."""
    values = _run_values(cfg, tracer, recorder, _clock(recorder.start_ns, None))
    values.update(main_tid=threading.main_thread().native_id, process_name=process_name(),
                  batch_size=tracer.facts.get("batch_size"), sync_level=tracer.sync.level,
                  sync_calls=tracer.sync.calls)
    return record.build(By.SO_FAR, values)


def final_record(stats: RunStats, dropped: int) -> dict[str, Any]:
    """The run record of the final trace: the summary's, and the statistics' figures (the
    whole run's statistics too when ``dropped`` ranges are not in the trace)."""
    values = dict(stats.meta)
    values.update(record.from_stats(stats))
    values.update(main_tid=threading.main_thread().native_id, ranges=stats.ranges)
    if dropped:
        values["run_stats"] = dict(stats.to_dict(), meta={})
    return record.build(By.EXIT, values)


def process_name() -> str:
    """The trace's name of this process: the script, the pid, the rank."""
    number = rank.number()
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{script} (pid {os.getpid()}" + (f", rank {number})" if number else ")")


def _clock(start_ns: int, end_ns: int | None) -> dict[str, int]:
    clock = {"perf_counter_ns_at_start": start_ns,
             "unix_time_ns_at_start": time_ns() - (perf_counter_ns() - start_ns)}
    if end_ns is not None:
        clock["duration_ns"] = end_ns - start_ns
    return clock


def _run_values(cfg: Config, tracer: Tracer, recorder: Recorder,
                clock: dict[str, int]) -> dict[str, object]:
    """The run's own fields of the record, as the final trace and the trace so far hold them."""
    settings: dict[str, object] = {}
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
        "rank": rank.number(),
        "command": command_line(argv),  # one line, as a shell reads it back
        "settings": settings,
        "env": {s.env: to_environ_value(s, getattr(cfg, s.name))
                for s in SETTINGS if s.name in cfg.explicit},
        "versions": versions,
        "devices": device_names(tracer.sync.devices),
        "clock": clock,
        "warmup_skip": recorder.warm_skip,
        "granularity": cfg.granularity,
        "implementation": tracer.hotpath.as_dict(),  # the hot path: native, or python and why
        "sync_ms": round(tracer.sync.seconds * 1e3, 3),
        "facts": {k: v for k, v in tracer.facts.items()
                  if isinstance(v, (int, float, str, bool, dict, list))},
        "process": processes.metadata(),  # MPI job, parent, clock reference
    }


def _write_trace(recorder: Recorder, tracer: Tracer, path: str, stats: RunStats,
                 event_args: RangeArgs | None,
                 gpu: GpuOutcome | None = None) -> str | None:
    """Write the trace file at ``path``; returns it (``None`` on failure, said once)."""
    try:
        other = final_record(stats, recorder.dropped)
        per_thread: dict[int, list[RangeRows]] = {}
        for tid, block in recorder.retained:
            per_thread.setdefault(tid, []).append(block)
        thread_names = dict(tracer.ended_names)
        thread_names.update({ts.tid: ts.thread_name for ts in list(tracer.states.values())})
        threads = [ThreadRanges(tid, thread_names.get(tid, f"thread {tid}"), blocks)
                   for tid, blocks in per_thread.items()]
        tracks: list[Track] = []
        if stats.per_iteration:
            tracks.append((COUNTERS, stats.per_iteration))
        top: JsonObject | None = None
        if gpu is not None:
            # GPU activity's encoding loads only in a run that has it (every process exits here)
            from ..report import gpu_events

            built = gpu_events.for_trace(
                gpu.analysis, other, pid=os.getpid(), start_ns=recorder.start_ns,
                rows_by_thread={tid: np.concatenate(blocks) for tid, blocks in per_thread.items()},
                loop_tid=None)  # the thread with the most iterations
            tracks, top = tracks + list(built.tracks), built.top
            event_args = _joined(event_args, built.range_args)
        write_trace(path, pid=os.getpid(), start_ns=recorder.start_ns, infos=recorder.infos,
                    threads=threads, other=other, process_name=process_name(),
                    main_tid=other["main_tid"], event_args=event_args, tracks=tracks, top=top)
    except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
        log.error(f"could not write the trace {path}: {type(exc).__name__}: {exc}")
        return None
    return path


def _joined(a: RangeArgs | None, b: RangeArgs) -> dict[tuple[int, int], dict[str, object]]:
    """Two sets of extra range arguments in one (a range named in both gets both's)."""
    out = {key: dict(args) for key, args in (a or {}).items()}
    for key, args in b.items():
        out.setdefault(key, {}).update(args)
    return out
