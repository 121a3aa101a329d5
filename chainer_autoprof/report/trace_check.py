"""What a trace file must hold to be read back: every field the readers use, checked once.

Trace files are the agent's own, but they are read back later (``report``,
``report --html``, ``merge``), perhaps truncated, edited or damaged.  The
readers check each event and metadata field here, at the boundary, so that a
damaged file gives one line naming the event or the field and what it should
be (:class:`MalformedError`), never a traceback from deeper in, and so that no
``NaN`` or ``Infinity`` reaches a figure or a merged file.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..analysis.stats import DEPTH_MASK

#: Bounds of a time in a trace (microseconds): 31 years; beyond, the nanosecond
#: values would not fit the int64 arithmetic of the aggregation.
MAX_US = 1e15
#: Bound of any count or nanosecond figure (int64).
MAX_INT = (1 << 62) - 1


class MalformedError(ValueError):
    """A field that is not what the agent writes: ``str(err)`` is the one line to show."""


# -- values -----------------------------------------------------------------------------------
def number(value: Any, where: str, lo: float = -MAX_INT, hi: float = MAX_INT) -> float:
    """A finite JSON number in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedError(f"{where} is {_shown(value)}, not a number")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise MalformedError(f"{where} is {_shown(value)}, out of range")
    return value


def integer(value: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """A JSON integer in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedError(f"{where} is {_shown(value)}, not an integer")
    if not lo <= value <= hi:
        raise MalformedError(f"{where} is {_shown(value)}, out of range")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedError(f"{where} is {_shown(value)}, not a string")
    return value


def mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedError(f"{where} is {_shown(value)}, not an object")
    return value


def sequence(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedError(f"{where} is {_shown(value)}, not a list")
    return value


def numbers(value: Any, where: str, lo: float = -MAX_INT) -> list[float]:
    """A list of finite numbers."""
    return [number(v, f"{where}[{i}]", lo) for i, v in enumerate(sequence(value, where))]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _optional(meta: Mapping[str, Any], key: str, check: Any, where: str, *args: Any) -> None:
    value = meta.get(key)
    if value is not None:
        check(value, f"{where}.{key}", *args)


# -- events -----------------------------------------------------------------------------------
def complete_event(ev: dict[str, Any], n: int) -> tuple[str, str, int, int, int, int, int | None]:
    """A range (``ph: "X"``): ``(name, category, tid, t0 ns, t1 ns, depth, iteration)``."""
    where = f"event {n}"
    name = text(ev.get("name", ""), f"{where}: name")
    category = text(ev.get("cat", ""), f"{where}: cat")
    tid = integer(ev.get("tid", 0), f"{where}: tid")
    if "ts" not in ev or "dur" not in ev:
        raise MalformedError(f"{where} ({name!r}) has no {'ts' if 'ts' not in ev else 'dur'}")
    ts = number(ev["ts"], f"{where}: ts", -MAX_US, MAX_US)
    dur = number(ev["dur"], f"{where}: dur", 0, MAX_US)
    args = mapping(ev.get("args") or {}, f"{where}: args")
    depth = integer(args.get("depth", 0), f"{where}: args.depth", 0, DEPTH_MASK)
    iteration = args.get("iteration")
    if iteration is not None:
        integer(iteration, f"{where}: args.iteration")
    t0 = round(ts * 1000)
    return name, category, tid, t0, t0 + round(dur * 1000), depth, iteration


def thread_name_event(ev: dict[str, Any], n: int) -> tuple[int, str]:
    """A thread's name (``ph: "M"``, ``name: "thread_name"``): ``(tid, name)``."""
    where = f"event {n}"
    tid = integer(ev.get("tid", 0), f"{where}: tid")
    args = mapping(ev.get("args") or {}, f"{where}: args")
    return tid, text(args.get("name", ""), f"{where}: args.name")


def timestamp(ev: dict[str, Any], n: int) -> float:
    """The ``ts`` of any other event that has one (merge shifts it)."""
    return number(ev["ts"], f"event {n}: ts", -MAX_US, MAX_US)


# -- metadata ---------------------------------------------------------------------------------
#: Metadata fields a reader takes with a default: ``null`` there means the default.
_DEFAULTED = ("warmup_skip", "dropped_ranges", "sync_calls", "ranges", "sync_level",
              "overhead_ms", "overhead_method", "sync_ms")


def metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Check the fields of ``otherData.chainer_autoprof`` that the readers use; returns ``meta``.

    A field that a reader takes with a default and holds ``null`` is removed (in place).
    """
    where = "otherData.chainer_autoprof"
    for key in _DEFAULTED:
        if key in meta and meta[key] is None:
            del meta[key]
    for key in ("version", "host", "command", "granularity", "overhead_method", "trace_path"):
        _optional(meta, key, text, where)
    for key in ("warmup_skip", "dropped_ranges", "sync_calls", "ranges", "batch_size"):
        _optional(meta, key, integer, where)
    for key in ("pid", "main_tid", "rank"):
        _optional(meta, key, integer, where)
    _optional(meta, "sync_level", integer, where, 0, 3)
    for key in ("overhead_ms", "sync_ms"):
        _optional(meta, key, number, where, 0)
    for key in ("facts", "versions", "env", "run_stats"):
        _optional(meta, key, mapping, where)
    _optional(meta, "gpu_phase_ms", _series, where)
    _facts(meta.get("facts") or {}, f"{where}.facts")
    settings = _section(meta, "settings", where)
    if settings is not None:
        _optional(settings, "iterations", _window, f"{where}.settings")
    clock = _section(meta, "clock", where)
    for key in ("perf_counter_ns_at_start", "unix_time_ns_at_start", "duration_ns"):
        _optional(clock or {}, key, integer, f"{where}.clock")
    for i, device in enumerate(sequence(meta.get("devices") or [], f"{where}.devices")):
        mapping(device, f"{where}.devices[{i}]")
    for i, snap in enumerate(sequence(meta.get("stalls") or [], f"{where}.stalls")):
        snapshot(snap, f"{where}.stalls[{i}]")
    partial = _section(meta, "partial", where)
    if partial is not None:
        at = f"{where}.partial"
        for key in ("unix_ns", "perf_ns", "dropped"):
            _optional(partial, key, integer, at)
        _optional(partial, "path", text, at)
        _optional(partial, "where", snapshot, at)
        for i, snap in enumerate(sequence(partial.get("stalls") or [], f"{at}.stalls")):
            snapshot(snap, f"{at}.stalls[{i}]")
    process = _section(meta, "process", where)
    if process is not None:
        _optional(process, "mpi_rank", integer, f"{where}.process")
        reference = _section(process, "clock_reference", f"{where}.process")
        if reference is not None:
            integer(reference.get("perf_counter_ns"),
                    f"{where}.process.clock_reference.perf_counter_ns")
    return meta


def _facts(facts: dict[str, Any], where: str) -> None:
    """The facts the summary reads figures from: collections, input queues."""
    gc = _section(facts, "gc", where)
    if gc is not None:
        for key in ("collections", "collected", "uncollectable", "ms"):
            numbers(gc.get(key) or [], f"{where}.gc.{key}", 0)
    queues = _section(facts, "input_queue", where)
    for name, queue in (queues or {}).items():
        at = f"{where}.input_queue.{name}"
        mapping(queue, at)
        for key in ("fetches", "capacity"):
            _optional(queue, key, integer, at)
        for i, count in enumerate(sequence(queue.get("ready") or [], f"{at}.ready")):
            integer(count, f"{at}.ready[{i}]")


def snapshot(value: Any, where: str) -> None:
    """Where a process was (a stall report, a dump, a partial trace's last state)."""
    snap = mapping(value, where)
    for key in ("pid", "parent_pid", "rank", "world_size", "iteration", "unix_ns", "perf_ns"):
        _optional(snap, key, integer, where)
    for key in ("since_iteration_s", "since_progress_s", "threshold_s"):
        _optional(snap, key, number, where, 0)
    for key in ("reason", "host", "threshold_rule"):
        _optional(snap, key, text, where)
    sequence(snap.get("notes") or [], f"{where}.notes")
    for i, thread in enumerate(sequence(snap.get("threads") or [], f"{where}.threads")):
        at = f"{where}.threads[{i}]"
        mapping(thread, at)
        _optional(thread, "tid", integer, at)
        _optional(thread, "name", text, at)
        for j, opened in enumerate(sequence(thread.get("open") or [], f"{at}.open")):
            mapping(opened, f"{at}.open[{j}]")
            for key in ("name", "category"):
                _optional(opened, key, text, f"{at}.open[{j}]")
            _optional(opened, "open_s", number, f"{at}.open[{j}]", 0)
        for j, frame in enumerate(sequence(thread.get("stack") or [], f"{at}.stack")):
            mapping(frame, f"{at}.stack[{j}]")


def _section(meta: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    """``meta[key]``, an object or absent (``None``)."""
    value = meta.get(key)
    return None if value is None else mapping(value, f"{where}.{key}")


def _window(value: Any, where: str) -> None:
    pair = sequence(value, where)
    if len(pair) != 2:
        raise MalformedError(f"{where} is {_shown(value)}, not [START, STOP]")
    start, stop = integer(pair[0], f"{where}[0]"), integer(pair[1], f"{where}[1]")
    if stop <= start:
        raise MalformedError(f"{where} is {_shown(value)}: STOP is not after START")


def _series(value: Any, where: str) -> None:
    for key, values in mapping(value, where).items():
        numbers(values, f"{where}.{key}")


def _slowest(value: Any, where: str) -> None:
    """The slowest iterations kept with their details (:mod:`..analysis.outliers`)."""
    for i, item in enumerate(sequence(value, where)):
        at = f"{where}[{i}]"
        mapping(item, at)
        integer(item.get("iteration"), f"{at}.iteration")
        number(item.get("ms"), f"{at}.ms", 0)
        _optional(item, "gc_ms", number, at, 0)
        for key, ms in mapping(item.get("phases") or {}, f"{at}.phases").items():
            number(ms, f"{at}.phases.{key}")
        for key, first in (("gc", integer), ("ranges", text)):
            for j, row in enumerate(sequence(item.get(key) or [], f"{at}.{key}")):
                row_at = f"{at}.{key}[{j}]"
                if not isinstance(row, list) or len(row) != 3:
                    raise MalformedError(f"{row_at} is {_shown(row)}, not [{key}, ms, phase]")
                first(row[0], f"{row_at}[0]")
                number(row[1], f"{row_at}[1]", 0)
                text(row[2], f"{row_at}[2]")


#: The fields of a saved RunStats: checker and its arguments (``None``: may be null).
_RUN_STATS: dict[str, tuple[Any, ...]] = {
    "iterations": (integer,), "warmup": (integer,), "iteration_ms": (numbers, 0),
    "wall_ms": (number, 0), "sync_level": (integer, 0, 3), "sync_calls": (integer,),
    "overhead_ms": (number, 0), "meta": (mapping,), "iteration_total_ms": (number, 0),
    "sample_stride": (integer, 1), "ranges": (integer,), "dropped_ranges": (integer,),
    "other_thread_iterations": (integer,),
    "gc_ms": (numbers, 0), "gc_total_ms": (number, 0), "slowest": (_slowest,),
    "overhead_method": (text,),
}
_REQUIRED = ("iterations", "warmup", "iteration_ms", "phase_ms", "outside_ms", "wall_ms",
             "links", "sync_level", "sync_calls", "overhead_ms")


def run_stats(data: Any) -> dict[str, Any]:
    """Check a saved :class:`~..analysis.stats.RunStats` (``otherData...run_stats``).

    Returns it with each link reduced to the fields a ``LinkStat`` has.
    """
    where = "otherData.chainer_autoprof.run_stats"
    mapping(data, where)
    for key in _REQUIRED:
        if data.get(key) is None:
            raise MalformedError(f"{where} has no {key}")
    for key, (check, *args) in _RUN_STATS.items():
        if key in data:
            check(data[key], f"{where}.{key}", *args)
    for key in ("batch_size",):
        _optional(data, key, integer, where)
    _series(data["phase_ms"], f"{where}.phase_ms")
    _optional(data, "gpu_phase_ms", _series, where)
    for key in ("outside_ms", "phase_total_ms"):
        for name, value in mapping(data.get(key) or {}, f"{where}.{key}").items():
            number(value, f"{where}.{key}.{name}")
    if "has_phases" in data and not isinstance(data["has_phases"], bool):
        raise MalformedError(f"{where}.has_phases is {_shown(data['has_phases'])}, not true/false")
    links = []
    for i, link in enumerate(sequence(data["links"], f"{where}.links")):
        at = f"{where}.links[{i}]"
        mapping(link, at)
        links.append({"name": text(link.get("name"), f"{at}.name")})
        for key in ("calls", "bwd_calls"):
            links[-1][key] = integer(link.get(key), f"{at}.{key}")
        for key in ("incl_ms", "self_ms", "bwd_ms"):
            links[-1][key] = number(link.get(key), f"{at}.{key}")
    return dict(data, links=links)
