"""``report`` on a merged trace: each process's own summary, never one summary of them all.

A merged trace (``merge``) holds several processes -- the ranks of a job,
or runs that have nothing to do with each other -- on one timeline.  Read as
one run, the other processes' iterations looked like "more on other
threads", their warm-up was lost (the merged record has none of its own) and
the time between two unrelated runs became "after the last iteration".  So
each process is read back as the run it was: its own events (its track in
the merged file), on its own clock again (the shift ``merge`` applied taken
off), with its own run record (kept in the merged record's ``inputs``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..analysis import record
from ..analysis.shapes import MalformedError
from . import trace_events
from .tracefile import Trace, TraceError, open_trace


def is_merged(trace: Trace) -> bool:
    """Whether ``trace`` was written by ``merge``."""
    return bool(trace.meta.get("merged"))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shift_ns(meta: Mapping[str, object], merged: Mapping[str, object], path: str) -> int:
    """How much later than its own clock ``merge`` put the process of ``meta``."""
    summary = merged.get("summary")
    alignment = summary.get("alignment") if isinstance(summary, dict) else None
    offsets = {a.get("path"): a.get("offset_ns", 0)
               for a in alignment or () if isinstance(a, dict)}
    clock, own = merged.get("clock"), meta.get("clock")
    zero = _int(clock.get("zero_perf_counter_ns")) if isinstance(clock, dict) else None
    start = _int(own.get("perf_counter_ns_at_start")) if isinstance(own, dict) else None
    offset = _int(offsets.get(path, 0))
    if zero is None or start is None or offset is None:
        return 0  # the ranges stay where the merged file has them: only start-up moves
    return start + offset - zero


def process_traces(trace: Trace) -> list[tuple[str, Trace]]:
    """The processes of merged ``trace``, each as its own trace: ``(label, trace)``."""
    data = open_trace(trace.path)
    out: list[tuple[str, Trace]] = []
    for n, inp in enumerate(trace.meta.get("inputs") or ()):
        where = f"{trace.path}: inputs[{n}]"
        if not isinstance(inp, dict) or not isinstance(inp.get("meta"), dict) \
                or not isinstance(inp.get("merged_pid"), int):
            raise TraceError(f"{where} is not a merged input (its meta and merged_pid)")
        try:
            meta = record.check(inp["meta"])
            decoded = trace_events.decode(data["traceEvents"], inp["merged_pid"])
        except MalformedError as exc:
            raise TraceError(f"{where}: {exc}") from None
        path = str(inp.get("path", ""))
        shift = _shift_ns(meta, trace.meta, path)
        ranges = [replace(r, t0=r.t0 - shift, t1=r.t1 - shift) for r in decoded.ranges]
        label = f"{inp.get('label') or f'process {n + 1}'} ({path})"
        out.append((label, Trace(trace.path, meta, ranges, decoded.thread_names,
                                 meta.get("pid"), decoded.events)))
    return out
