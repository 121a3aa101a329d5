"""Trace files: the final trace written at exit, and any trace opened and read back.

The layout is the codec's: the events (:mod:`.trace_events`) and the run
record in ``otherData.chainer_autoprof`` (:mod:`..analysis.record`); both
are tabled in ``docs/trace_format.md``.  The final trace is written whole or
not at all (:func:`..common.outputs.atomic_text`: a temporary file beside the
target, renamed; only a regular file is replaced, a symlink written through).

:func:`open_trace` is the one way a trace is opened: a final trace, a trace
so far (``TRACE.partial``, known by its first bytes), a bare event list, or
a pipe; :func:`read_trace` checks it and reads it back (:class:`Trace`).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from ..analysis import record
from ..analysis.aggregate import Aggregator
from ..analysis.gpu_record import GpuActivity, activity_record
from ..analysis.shapes import MalformedError
from ..analysis.stats import DEPTH_BITS, SHUTDOWN, UNFINISHED, RunStats
from ..common.gpu_records import Int64Array
from ..common.outputs import atomic_text
from . import trace_events
from .partial import MAGIC, read_partial
from .trace_events import (
    CNAMES,
    Range,
    RangeTrack,
    ThreadRanges,
    Timeline,
    Track,
    in_track_order,
    process_events,
    write_container,
)

if TYPE_CHECKING:
    from ..common.typedefs import RangeArgs

__all__ = ["CNAMES", "Range", "ThreadRanges", "Trace", "TraceError", "open_trace", "read_trace",
           "stats_from_trace", "write_trace"]


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

def write_trace(path: str, *, pid: int, start_ns: int, infos: Sequence[tuple[str, str, int]],
                threads: Iterable[ThreadRanges], other: Mapping[str, object],
                process_name: str, main_tid: int | None = None,
                event_args: RangeArgs | None = None,
                tracks: Sequence[Track] = (), top: Mapping[str, object] | None = None) -> int:
    """Write the trace file atomically; returns the number of ranges written.

    ``infos[i]`` is ``(name, category, ARGB colour)`` of name index ``i``;
    ``other`` the run record; ``event_args`` adds arguments to the ranges it
    names by (thread id, start ns), e.g. the objects a garbage collection
    freed; ``tracks`` are more events (each ``(kind, what its encoder takes)``), ``top``
    more top-level members (Kineto's, for the GPU activity).
    """
    ranges = RangeTrack(infos, in_track_order(threads, main_tid), event_args)
    with atomic_text(path) as out:
        write_container(out, other, process_events(Timeline(pid, start_ns), process_name,
                                                   ranges, tracks), top)
    return ranges.written


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

@dataclass
class Trace:
    """A trace file read back."""

    path: str
    meta: dict[str, Any]
    ranges: list[Range]
    thread_names: dict[int, str] = field(default_factory=dict)
    pid: int | None = None
    #: What the other kinds of event read back gave, by kind name (:mod:`.trace_events`).
    events: dict[str, list[Any]] = field(default_factory=dict)

    def by_thread(self) -> dict[int, list[Range]]:
        """Ranges per thread, in end order (inner range first on ties)."""
        out: dict[int, list[Range]] = {}
        for r in self.ranges:
            out.setdefault(r.tid, []).append(r)
        for rows in out.values():
            rows.sort(key=lambda r: (r.t1, -r.depth))
        return out

    def range_rows(self) -> tuple[list[tuple[str, str]], dict[int, Int64Array]]:
        """This trace's ranges as the recorder holds them: the names (name, category) by
        index, and per thread the rows ``(index, t0, t1, depth)`` in end order, on the
        agent's clock (``perf_counter_ns``)."""
        start = int((self.meta.get("clock") or {}).get("perf_counter_ns_at_start") or 0)
        index: dict[tuple[str, str], int] = {}
        rows: dict[int, Int64Array] = {}
        for tid, ranges in self.by_thread().items():
            out = []
            for r in ranges:
                key = (r.name, r.category)
                i = index.setdefault(key, len(index))
                depth = r.depth if r.iteration is None else r.depth | (
                    (int(r.iteration) + 1) << DEPTH_BITS)
                out.append((i, r.t0 + start, r.t1 + start, depth))
            rows[tid] = np.asarray(out, dtype=np.int64).reshape(-1, 4)
        return list(index), rows

    def stats(self, from_events: bool = False) -> RunStats:
        """The run's :class:`~chainer_autoprof.analysis.stats.RunStats`.

        Computed from the events, unless the recorder dropped ranges (the
        record limit) and saved the whole run's statistics in the metadata.
        """
        meta = self.meta
        if not from_events and meta.get("dropped_ranges") and meta.get("run_stats"):
            try:
                saved = record.check_run_stats(meta["run_stats"])
            except MalformedError as exc:
                raise TraceError(f"{self.path}: {exc}") from None
            stats = RunStats.from_dict(saved)
            stats.meta = {k: v for k, v in meta.items() if k != "run_stats"}
            return _unfinished(stats)
        settings = meta.get("settings") or {}
        window = settings.get("iterations")
        agg = Aggregator(0, int(record.value(meta, "warmup_skip")),
                         tuple(window) if window else None)
        index: dict[tuple[str, str], int] = {}
        per_thread = self.by_thread()
        for rows in per_thread.values():
            for r in rows:
                key = (r.name, r.category)
                if key not in index:
                    index[key] = len(index)
                    agg.add_name(index[key], r.name, r.category)
        for tid, rows in per_thread.items():
            agg.feed(tid, [(index[(r.name, r.category)], r.t0, r.t1,
                            r.depth if r.iteration is None
                            else r.depth | ((int(r.iteration) + 1) << DEPTH_BITS))
                           for r in rows])
        end_ns = int(record.value(meta, "clock.duration_ns")
                     or max((r.t1 for r in self.ranges), default=0))
        stats = agg.result(end_ns, meta.get("main_tid"), meta=dict(meta),
                           **record.stats_fields(meta))
        if stats.gpu_activity is None and self.events.get("kernel"):
            stats.gpu_activity = self.gpu_activity()
        return _unfinished(stats)

    def gpu_activity(self) -> GpuActivity | None:
        """The GPU figures of a trace whose record holds none (written by another tool, or
        edited): its GPU events attributed again to its ranges."""
        from . import gpu_events  # loaded when needed

        fig = gpu_events.figures_from_events(self.events, self.range_rows(),
                                             self.meta)
        if fig is None:
            return None
        kernels = sum(int(p["kernels"]) for p in fig.phases.values())
        return activity_record(
            fig, f"the trace's GPU kernel events, {kernels} kernels over {fig.iterations} "
            "counted iterations, each tied again to the range that launched it", {}, [])


def _unfinished(stats: RunStats) -> RunStats:
    """A partial trace's run did not shut down: the time after its last iteration is unfinished."""
    if stats.meta.get("partial") and SHUTDOWN in stats.outside_ms:
        stats.outside_ms[UNFINISHED] = stats.outside_ms.pop(SHUTDOWN)
    return stats


class TraceError(ValueError):
    """A file that is not a trace this tool can read (one-line message)."""


def open_trace(path: str) -> dict[str, Any]:
    """The trace-event object of the trace at ``path``; :class:`TraceError` (one line) if none.

    A final trace, a trace so far (its first bytes say so: read into the same
    object a final trace holds), or a bare event list (wrapped).  A device is
    refused before it is read (``/dev/zero`` never ends); a pipe is read
    (``report <(zcat run.json.gz)``), once.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise TraceError(f"{path} is a device, not a trace file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if raw.startswith(MAGIC):
        try:
            return read_partial(path, data=raw)
        except Exception as exc:  # a damaged record of any kind: one line  # noqa: BLE001
            raise TraceError(f"cannot read the partial trace {path}: "
                             f"{exc if str(exc) else type(exc).__name__}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise TraceError(f"{path} is not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{path} is not a trace-event file (nested too deeply)") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path} is not a trace-event file (no traceEvents list)")
    return data


def read_trace(path: str) -> Trace:
    """Read a trace written by :func:`write_trace` (or merged from several, or the trace so far).

    Raises :class:`TraceError` (one line) for a file that is not such a trace,
    or holds an event or a metadata field that is not what the agent writes.
    """
    data = open_trace(path)
    other = data.get("otherData") or {}
    meta = other.get("chainer_autoprof") if isinstance(other, dict) else None
    try:
        meta = record.check(meta if isinstance(meta, dict) else {})
        pid = meta.get("pid")
        decoded = trace_events.decode(data["traceEvents"], pid)
    except MalformedError as exc:
        raise TraceError(f"{path}: {exc}") from None
    return Trace(path, meta, decoded.ranges, decoded.thread_names, pid, decoded.events)


def stats_from_trace(path: str) -> RunStats:
    """The :class:`RunStats` of a trace file written by the agent."""
    return read_trace(path).stats()
