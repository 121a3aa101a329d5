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
from typing import Any

from ..analysis.stats import RunStats
from ..common import log, rank
from ..common.paths import trace_file
from ..common.settings import SETTINGS, Config, to_environ_value
from ..common.version import __version__
from ..report.summary import format_summary
from ..report.tracefile import ThreadRanges, write_trace
from ..runtime.device import device_names
from ..sinks.recorder import Recorder
from . import overhead, processes


def report_run(recorder: Recorder, tracer: Any, cfg: Config, hits: int,
               start_dir: str | None = None,
               extra_meta: dict[str, Any] | None = None,
               event_args: dict[tuple[int, int], dict[str, Any]] | None = None
               ) -> RunStats | None:
    """Statistics, trace file and summary of the run, once the tracer is closed.

    ``hits`` counts the instrumented calls (for the overhead estimate); a
    relative trace path is taken from ``start_dir``, the directory the run
    started in and the path was checked in (the program may have changed it);
    ``extra_meta`` goes into the metadata (e.g. the stall reports);
    ``event_args`` adds arguments to ranges of the trace (by thread id and
    start ns).  Returns the statistics, or ``None`` for a process with
    nothing to say: one that never reached an instrumented call nor recorded
    a range (``python -c 'import json'`` with a ``CHAINER_PROF_*`` variable
    exported: no summary, and no trace to replace the training's), a forked
    worker that did no training, or a helper interpreter (a resource
    tracker, ...) that recorded nothing.
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
    meta = metadata(cfg, tracer, recorder, end_ns)
    meta.update(extra_meta or {})
    stats = recorder.run_stats(end_ns, cost, meta)
    if cfg.trace:
        stats.meta["trace_path"] = _write_trace(recorder, tracer, cfg.trace, stats, start_dir,
                                                event_args)
    if cfg.summary:
        try:
            sys.stderr.write(format_summary(stats, advice=bool(cfg.advice)) + "\n")
            sys.stderr.flush()
        except Exception as exc:
            log.error(f"no summary ({type(exc).__name__}: {exc})")
    return stats


def partial_metadata(cfg: Config, tracer: Any, recorder: Recorder) -> dict[str, Any]:
    """The metadata of the trace so far, as the final trace will hold it (while the run goes on)."""
    meta = metadata(cfg, tracer, recorder, tracer.clock())
    meta["clock"].pop("duration_ns", None)  # the reader takes it from the last write
    meta.update(main_tid=threading.main_thread().native_id, process_name=process_name(),
                batch_size=tracer.facts.get("batch_size"), sync_level=tracer.sync.level,
                sync_calls=tracer.sync.calls)
    return meta


def process_name() -> str:
    """The trace's name of this process: the script, the pid, the rank."""
    number = rank.number()
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{script} (pid {os.getpid()}" + (f", rank {number})" if number else ")")


def metadata(cfg: Config, tracer: Any, recorder: Recorder, end_ns: int) -> dict[str, Any]:
    """Run metadata for the trace and the summary."""
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
    start_ns = recorder.start_ns
    return {
        "version": __version__,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": rank.number(),
        "command": " ".join(argv),
        "settings": settings,
        "env": {s.env: to_environ_value(s, getattr(cfg, s.name))
                for s in SETTINGS if s.name in cfg.explicit},
        "versions": versions,
        "devices": device_names(tracer.sync.devices),
        "clock": {"perf_counter_ns_at_start": start_ns,
                  "unix_time_ns_at_start": time_ns() - (perf_counter_ns() - start_ns),
                  "duration_ns": end_ns - start_ns},
        "warmup_skip": recorder.warm_skip,
        "granularity": cfg.granularity,
        "implementation": tracer.hotpath.as_dict(),  # the hot path: native, or python and why
        "sync_ms": round(tracer.sync.seconds * 1e3, 3),
        "facts": {k: v for k, v in tracer.facts.items()
                  if isinstance(v, (int, float, str, bool, dict, list))},
        "process": processes.metadata(),  # MPI job, parent, clock reference
    }


def _write_trace(recorder: Recorder, tracer: Any, template: str, stats: RunStats,
                 start_dir: str | None,
                 event_args: dict[tuple[int, int], dict[str, Any]] | None) -> str | None:
    """Write the trace file; returns its path (``None`` on failure, said once)."""
    path = trace_file(processes.child_trace_template(template), start_dir)
    other = dict(stats.meta)
    other.update(dropped_ranges=recorder.dropped, main_tid=threading.main_thread().native_id,
                 batch_size=stats.batch_size, sync_level=stats.sync_level,
                 sync_calls=stats.sync_calls, overhead_ms=stats.overhead_ms,
                 overhead_method=stats.overhead_method, gpu_phase_ms=stats.gpu_phase_ms,
                 ranges=stats.ranges)
    if recorder.dropped:
        other["run_stats"] = stats.to_dict()
        other["run_stats"]["meta"] = {}
    per_thread: dict[int, list] = {}
    for tid, block in recorder.retained:
        per_thread.setdefault(tid, []).append(block)
    thread_names = dict(tracer.ended_names)
    thread_names.update({ts.tid: ts.thread_name for ts in list(tracer.states.values())})
    threads = [ThreadRanges(tid, thread_names.get(tid, f"thread {tid}"), blocks)
               for tid, blocks in per_thread.items()]
    try:
        write_trace(path, pid=os.getpid(), start_ns=recorder.start_ns, infos=recorder.infos,
                    threads=threads, other=other, process_name=process_name(),
                    main_tid=other["main_tid"], event_args=event_args)
    except Exception as exc:
        log.error(f"could not write the trace {path}: {type(exc).__name__}: {exc}")
        return None
    return path
