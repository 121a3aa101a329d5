"""Timeline traces: Chrome trace-event JSON files (Perfetto UI, chrome://tracing).

File layout (a JSON object)::

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "otherData": {"chainer_autoprof": {
         "version", "pid", "host", "rank", "command", "settings", "versions",
         "devices", "clock": {"perf_counter_ns_at_start", "unix_time_ns_at_start",
                              "duration_ns"},
         "dropped_ranges", "main_tid", "warmup_skip", "batch_size", "sync_level",
         "sync_calls", "overhead_ms", "overhead_method", "gpu_phase_ms",
         "run_stats" (only when ranges were dropped), "facts"}}}

Events:

* metadata ``{"ph": "M", "name": "process_name" | "thread_name" |
  "thread_sort_index", "pid", "tid", "args": {...}}``: one track per thread;
* ranges as complete events ``{"ph": "X", "name", "cat", "cname", "ts",
  "dur", "pid", "tid", "args": {"depth": d, "color": "0xAARRGGBB"}}``
  (iteration ranges also carry ``"iteration": n``, counted from 0), written
  per thread in begin order (ties: outer range first).  ``ts`` is in
  microseconds since the agent started (3 decimals: nanosecond exact),
  ``dur`` likewise; ``cat`` is the range category (names.CATEGORIES).

Colours: Chrome's trace viewer knows only its named colours, so each category
maps to the closest ``cname`` (:data:`CNAMES`); the NVTX ARGB colour is in
``args.color``.

The file is written to a temporary name beside the target and renamed, so a
crash never leaves half a file; only a regular file is replaced, a symlink is
written through to its target (path templates and kinds: :mod:`..common.paths`).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..analysis.aggregate import Aggregator
from ..analysis.stats import DEPTH_BITS, DEPTH_MASK, SHUTDOWN, UNFINISHED, RunStats
from ..common import names
from ..common.paths import output_target
from . import trace_check

#: category -> Chrome trace-viewer colour name (closest to the NVTX colour)
CNAMES: dict[str, str] = {
    names.ITERATION: "yellow",
    names.DATA: "detailed_memory_dump",
    names.FORWARD: "cq_build_attempt_passed",
    names.BACKWARD: "rail_response",
    names.UPDATE: "rail_animation",
    names.EXTENSION: "thread_state_iowait",
    names.INFERENCE: "background_memory_dump",
    names.COMM: "bad",
    names.USER: "cq_build_failed",
    names.GC: "terrible",
    names.LINK: "cq_build_passed",
    names.LINK_BACKWARD: "thread_state_runnable",
    names.FUNCTION: "grey",
}

# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

@dataclass
class ThreadRanges:
    """One thread's recorded ranges: int64 blocks of rows ``(index, t0, t1, depth)``."""

    tid: int
    name: str
    blocks: list[Any]


def _argb_hex(color: int) -> str:
    return f"0x{color & 0xFFFFFFFF:08X}"


def _fixed3(ns: int) -> str:
    """Nanoseconds as microseconds with 3 decimals, exactly."""
    if ns < 0:
        return f"{ns / 1000:.3f}"
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def _rows_in_begin_order(blocks: list[Any]) -> list[list[int]]:
    if not blocks:
        return []
    rows = np.concatenate([np.asarray(b, dtype=np.int64).reshape(-1, 4) for b in blocks])
    order = np.lexsort((rows[:, 3] & DEPTH_MASK, rows[:, 1]))
    return rows[order].tolist()


def write_trace(path: str, *, pid: int, start_ns: int, infos: Sequence[tuple[str, str, int]],
                threads: Iterable[ThreadRanges], other: dict[str, Any],
                process_name: str, main_tid: int | None = None,
                event_args: Mapping[tuple[int, int], Mapping[str, Any]] | None = None) -> int:
    """Write the trace file atomically; returns the number of ranges written.

    ``infos[i]`` is ``(name, category, ARGB colour)`` of name index ``i``;
    ``event_args`` adds arguments to the ranges it names by (thread id,
    start ns), e.g. the objects a garbage collection freed.
    """
    prefixes: list[str] = []
    for name, category, _color in infos:
        cname = json.dumps(CNAMES.get(category, "generic_work"))
        prefixes.append(f'{{"ph":"X","name":{json.dumps(name)},"cat":{json.dumps(category)},'
                        f'"cname":{cname},"pid":{pid},"tid":')
    colors = [_argb_hex(color) for _n, _c, color in infos]
    path = output_target(path)  # never replace a device, a FIFO, ...; through a symlink
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".chainer_autoprof.", suffix=".tmp", dir=directory)
    written = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write('{"displayTimeUnit":"ms","otherData":')
            out.write(json.dumps({"chainer_autoprof": finite(other)}, default=str,
                                 allow_nan=False))
            out.write(',"traceEvents":[\n')
            meta = {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": process_name}}
            out.write(json.dumps(meta))
            threads = list(threads)
            threads.sort(key=lambda t: (t.tid != main_tid, t.tid))
            for order, thread in enumerate(threads):
                for event in (
                        {"ph": "M", "name": "thread_name", "pid": pid, "tid": thread.tid,
                         "args": {"name": thread.name}},
                        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": thread.tid,
                         "args": {"sort_index": order}}):
                    out.write(",\n" + json.dumps(event))
            n_infos = len(prefixes)
            for thread in threads:
                tid = thread.tid
                for index, t0, t1, packed in _rows_in_begin_order(thread.blocks):
                    if index >= n_infos:
                        continue
                    depth = packed & DEPTH_MASK
                    extra = (f',"iteration":{(packed >> DEPTH_BITS) - 1}'
                             if packed > DEPTH_MASK else "")
                    if event_args:
                        more = event_args.get((tid, t0))
                        if more:
                            extra += "," + json.dumps(more)[1:-1]
                    out.write(f',\n{prefixes[index]}{tid},"ts":{_fixed3(t0 - start_ns)},'
                              f'"dur":{_fixed3(t1 - t0)},"args":{{"depth":{depth},'
                              f'"color":"{colors[index]}"{extra}}}}}')
                    written += 1
            out.write("\n]}\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return written


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by ``None`` (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

@dataclass
class Range:
    """One complete event read back: times in ns since the agent started."""

    name: str
    category: str
    tid: int
    t0: int
    t1: int
    depth: int
    iteration: int | None = None


@dataclass
class Trace:
    """A trace file read back."""

    path: str
    meta: dict[str, Any]
    ranges: list[Range]
    thread_names: dict[int, str] = field(default_factory=dict)
    pid: int | None = None

    def by_thread(self) -> dict[int, list[Range]]:
        """Ranges per thread, in end order (inner range first on ties)."""
        out: dict[int, list[Range]] = {}
        for r in self.ranges:
            out.setdefault(r.tid, []).append(r)
        for rows in out.values():
            rows.sort(key=lambda r: (r.t1, -r.depth))
        return out

    def stats(self, from_events: bool = False):
        """The run's :class:`~chainer_autoprof.analysis.stats.RunStats`.

        Computed from the events, unless the recorder dropped ranges (the
        record limit) and saved the whole run's statistics in the metadata.
        """

        meta = self.meta
        if not from_events and meta.get("dropped_ranges") and meta.get("run_stats"):
            try:
                saved = trace_check.run_stats(meta["run_stats"])
            except trace_check.MalformedError as exc:
                raise TraceError(f"{self.path}: {exc}") from None
            stats = RunStats.from_dict(saved)
            stats.meta = {k: v for k, v in meta.items() if k != "run_stats"}
            return _unfinished(stats)
        settings = meta.get("settings") or {}
        window = settings.get("iterations")
        agg = Aggregator(0, int(meta.get("warmup_skip", 0)),
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
        clock = meta.get("clock") or {}
        end_ns = int(clock.get("duration_ns") or max((r.t1 for r in self.ranges), default=0))
        return _unfinished(agg.result(end_ns, meta.get("main_tid"), **stats_extras(meta)))


def _unfinished(stats: RunStats) -> RunStats:
    """A partial trace's run did not shut down: the time after its last iteration is unfinished."""
    if stats.meta.get("partial") and SHUTDOWN in stats.outside_ms:
        stats.outside_ms[UNFINISHED] = stats.outside_ms.pop(SHUTDOWN)
    return stats


def stats_extras(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The RunStats fields that come from the metadata rather than the ranges."""
    gpu = meta.get("gpu_phase_ms")
    return {
        "batch_size": meta.get("batch_size"),
        "sync_level": int(meta.get("sync_level", 0)),
        "sync_calls": int(meta.get("sync_calls", 0)),
        "overhead_ms": float(meta.get("overhead_ms", 0.0)),
        "overhead_method": str(meta.get("overhead_method", "")),
        "gpu_phase_ms": dict(gpu) if gpu else None,
        "dropped_ranges": int(meta.get("dropped_ranges", 0)),
        "meta": dict(meta),
    }


class TraceError(ValueError):
    """A file that is not a trace this tool can read (one-line message)."""


def load_trace_json(path: str) -> dict[str, Any]:
    """The JSON object of a trace-event file (a bare event list is wrapped); TraceError if not.

    A device is refused before it is read (``/dev/zero`` never ends); a pipe is
    read (``report <(zcat run.json.gz)``), once: the file's first bytes say
    whether it is a partial trace (the trace so far of a run that did not end
    normally), read into the same object.
    """
    # partial.py builds on this module's event layout: imported here, not at the top
    from .partial import MAGIC, read_partial

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
        except Exception as exc:  # a damaged record of any kind: one line
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
    """Read a trace written by :func:`write_trace` (or merged from several).

    Raises :class:`TraceError` (one line) for a file that is not such a trace,
    or holds an event or a metadata field that is not what the agent writes.
    """
    data = load_trace_json(path)
    other = data.get("otherData") or {}
    meta = other.get("chainer_autoprof") if isinstance(other, dict) else None
    meta = dict(meta) if isinstance(meta, dict) else {}
    ranges: list[Range] = []
    thread_names: dict[int, str] = {}
    try:
        trace_check.metadata(meta)
        pid = meta.get("pid")
        for n, ev in enumerate(data["traceEvents"]):
            if not isinstance(ev, dict):
                continue
            if pid is not None and ev.get("pid") != pid:
                continue
            ph = ev.get("ph")
            if ph == "X":
                ranges.append(Range(*trace_check.complete_event(ev, n)))
            elif ph == "M" and ev.get("name") == "thread_name":
                tid, name = trace_check.thread_name_event(ev, n)
                thread_names[tid] = name
    except trace_check.MalformedError as exc:
        raise TraceError(f"{path}: {exc}") from None
    return Trace(path, meta, ranges, thread_names, pid)


def stats_from_trace(path: str) -> RunStats:
    """The :class:`RunStats` of a trace file written by the agent."""
    return read_trace(path).stats()
