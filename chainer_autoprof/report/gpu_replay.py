"""A CUPTI recording replayed beside the agent's trace of the same process, through the
path live activity takes: the trace's ranges and the recording's batches fed to one
:class:`~..analysis.gpu_analysis.GpuAnalysis`, then the trace written again with the
GPU events (:mod:`.gpu_events`) beside its ranges.

The recordings (``tests/data/gpu/cupti``) hold no thread map: the attribution ties
CUPTI's threads to the trace's by containment.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable, Mapping

import numpy as np
import numpy.typing as npt

from ..analysis.gpu_analysis import GpuAnalysis, Limits
from ..analysis.gpu_clock import ClockMap, fit
from ..analysis.stats import DEPTH_BITS
from ..common.gpu_records import ActivityBatch, NameTable, Recording
from . import gpu_events
from .trace_events import Timeline
from .tracefile import Trace

Int64Array = npt.NDArray[np.int64]


def trace_rows(trace: Trace) -> tuple[list[tuple[str, str]], dict[int, Int64Array]]:
    """A saved trace's ranges as the recorder holds them: the names (name, category) by
    index, and per thread the rows ``(index, t0, t1, depth)`` in end order, on the
    agent's clock (``perf_counter_ns``)."""
    start = int((trace.meta.get("clock") or {}).get("perf_counter_ns_at_start") or 0)
    index: dict[tuple[str, str], int] = {}
    rows: dict[int, Int64Array] = {}
    for tid, ranges in trace.by_thread().items():
        out = []
        for r in ranges:
            key = (r.name, r.category)
            i = index.setdefault(key, len(index))
            depth = r.depth if r.iteration is None else r.depth | (
                (int(r.iteration) + 1) << DEPTH_BITS)
            out.append((i, r.t0 + start, r.t1 + start, depth))
        rows[tid] = np.asarray(out, dtype=np.int64).reshape(-1, 4)
    return list(index), rows


def analyse(trace: Trace, batches: Iterable[ActivityBatch], clock: ClockMap,
            names: NameTable, *, identity_threads: bool = False,
            record_limit: int | None = None, limits: Limits | None = None) -> GpuAnalysis:
    """Feed ``trace``'s ranges and the activity ``batches`` to a new analysis; finished."""
    meta = trace.meta
    settings = meta.get("settings") or {}
    limit = record_limit if record_limit is not None else int(
        settings.get("record_limit") or 200_000)
    analysis = GpuAnalysis(clock, names, int(meta.get("warmup_skip") or 0),
                           record_limit=limit, identity_threads=identity_threads,
                           loop_tid=meta.get("main_tid"), limits=limits)
    range_names, rows = trace_rows(trace)
    for i, (name, category) in enumerate(range_names):
        analysis.add_name(i, name, category)
    for tid, block in rows.items():
        analysis.feed_ranges(tid, block)
        analysis.thread_finished(tid)
    for batch in batches:
        analysis.feed_activity(batch)
    analysis.finish()
    return analysis


def replay(trace: Trace, recording: Recording, pieces: int = 8, *,
           record_limit: int | None = None, limits: Limits | None = None) -> GpuAnalysis:
    """The recording, cut into ``pieces`` batches as buffers would come, analysed."""
    return analyse(trace, recording.batch.split(pieces), fit(recording.clock),
                   recording.batch.names, record_limit=record_limit, limits=limits)


def counted_span(trace: Trace) -> tuple[int, int] | None:
    """Host start of the first counted iteration and end of the last (agent ns), on the
    loop thread."""
    start = int((trace.meta.get("clock") or {}).get("perf_counter_ns_at_start") or 0)
    skip = int(trace.meta.get("warmup_skip") or 0)
    main = trace.meta.get("main_tid")
    iters = sorted((r for r in trace.ranges if r.category == "iteration"
                    and (main is None or r.tid == main)), key=lambda r: r.t0)
    counted = iters[skip:]
    if not counted:
        return None
    return start + counted[0].t0, start + counted[-1].t1


def with_gpu_events(data: Mapping[str, Any], trace: Trace, analysis: GpuAnalysis, *,
                    span: tuple[int, int] | None = None) -> dict[str, Any]:
    """A copy of the trace JSON ``data`` with the GPU events of ``analysis`` (only the
    operations launched inside ``span``, agent ns, when given), ``ProfilerStep#N`` over
    the loop thread's iterations (those inside ``span``), the External ids on the
    launching ranges, and Kineto's top-level fields: what the live agent's trace holds
    (:func:`.gpu_events.for_trace`, the same events)."""
    out = copy.deepcopy(dict(data))
    meta = trace.meta
    pid = int(meta.get("pid") or trace.pid or 0)
    start = int((meta.get("clock") or {}).get("perf_counter_ns_at_start") or 0)
    _names, rows = trace_rows(trace)
    built = gpu_events.for_trace(analysis, meta, pid=pid, start_ns=start, rows_by_thread=rows,
                                 loop_tid=meta.get("main_tid"), span=span)
    events = out.setdefault("traceEvents", [])
    if built.range_args:
        for ev in events:
            if ev.get("ph") != "X" or ev.get("pid") != pid:
                continue
            key = (int(ev.get("tid", 0)), start + round(float(ev["ts"]) * 1000))
            more = built.range_args.get(key)
            if more:
                ev["args"] = {**(ev.get("args") or {}), **more}
    for kind, items in built.tracks:
        events.extend(json.loads(text) for text in kind.encode(items, Timeline(pid, start)))
    out.update(built.top)
    return out
