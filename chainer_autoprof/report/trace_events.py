"""The trace-event codec: every kind of event a trace holds, written and read back here only.

A trace is a Chrome trace-event JSON object (Perfetto UI, chrome://tracing)::

    {"displayTimeUnit": "ms", "otherData": {"chainer_autoprof": RECORD},
     "traceEvents": [EVENT, ...]}

``RECORD`` is the run record (:mod:`..analysis.record`).  Each kind of
``EVENT`` is an :class:`EventKind` in :data:`KINDS`: how its events are told
apart (``ph``, and the metadata event's ``name`` or the category it claims),
how they are written (:meth:`EventKind.encode`: one JSON text per event, with
times in microseconds since the agent started, 3 decimals: nanosecond exact),
how they are checked and read back (:meth:`EventKind.decode`), and how
``merge`` moves them onto another process track and clock
(:meth:`EventKind.move`).  The final trace, the trace so far, ``merge``, the
HTML report (through :func:`~.tracefile.read_trace`) and anything new write
and read events through this module; the table of kinds in
``docs/trace_format.md`` is generated from :data:`KINDS`.

A new kind of event (GPU kernels, memory copies, CUDA runtime calls, flow
events linking a launch to its kernel) is one more subclass, registered::

    class Kernels(EventKind[Kernel]):          # ph "X", cat "kernel"
        name, ph, key, doc = "kernel", "X", "kernel", "a GPU kernel, on its stream's track"
        def encode(self, items, timeline): ...  # yields one JSON text per kernel
        def decode(self, ev, where): ...        # -> Kernel, or MalformedError
    KERNELS = register(Kernels())

then written as one more track (``write_trace(..., tracks=[(KERNELS, kernels)])``)
and read back in ``Trace.events["kernel"]``.

The GPU activity's events (:mod:`.gpu_events` builds them, after the PyTorch profiler's
conventions so that HolisticTraceAnalysis reads them) are such kinds: kernels, copies and
memsets on a track per device and stream (:func:`gpu_pid`: a process of its own per GPU,
derived from the process's pid), the launching CUDA runtime and driver calls on the
launching thread's track, ``ac2g`` flows from each call to its GPU operation, and
``ProfilerStep#N`` over each iteration.  Readers take them apart from the ranges (they
never count as ranges); ``merge`` moves a GPU's tracks with its process and keeps flow
ids apart across processes.  Top-level members beside ``traceEvents`` (Kineto's
``deviceProperties``, ``distributedInfo``, ...) are written by :func:`write_container`
(``top``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import islice
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Generic,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    TextIO,
    Tuple,
    TypeVar,
)

import numpy as np

from ..analysis.iteration_figures import FIGURES
from ..analysis.per_iteration import Samples
from ..analysis.shapes import (
    INT,
    MAX_US,
    TEXT,
    Int,
    MalformedError,
    Number,
    Object,
)
from ..analysis.stats import DEPTH_BITS, DEPTH_MASK
from ..common import names

if TYPE_CHECKING:
    from typing import TypeGuard

    from ..common.typedefs import JsonObject, JsonValue, RangeArgs, RangeRows

#: What a kind reads back (covariant: ``EventKind[object]`` holds every kind).
T = TypeVar("T", covariant=True)

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
#: The colour name of a category without one.
DEFAULT_CNAME = "generic_work"

_TS = Number(-MAX_US, MAX_US)
_DUR = Number(0, MAX_US)
_DEPTH = Int(0, DEPTH_MASK)
_ARGS = Object()


@dataclass(frozen=True)
class Timeline:
    """What events are written against: their process track and the time zero (ns)."""

    pid: int
    start_ns: int


def fixed3(ns: int) -> str:
    """Nanoseconds as microseconds with 3 decimals, exactly."""
    if ns < 0:
        return f"{ns / 1000:.3f}"
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def argb_hex(color: int) -> str:
    """An NVTX ARGB colour as the trace's ``args.color`` (``0xAARRGGBB``)."""
    return f"0x{color & 0xFFFFFFFF:08X}"


# -- event kinds ---------------------------------------------------------------------------------
class EventKind(Generic[T]):
    """One kind of trace event (the extension point: see the module docstring).

    ``ph`` is the trace-event phase; ``key`` tells kinds of one phase apart:
    a metadata event's ``name``, else the category (``cat``) the kind claims
    (``None``: every event of that phase no other kind claims).
    """

    name = ""
    ph = ""
    key: str | None = None
    #: One line for the documentation: what the event is.
    doc = ""
    #: Its ``args``, for the documentation.
    args_doc = ""
    #: Whether readers read it back (:meth:`decode`); others are carried as they are.
    read = False

    def encode(self, items: Any, timeline: Timeline) -> Iterator[str]:
        """The JSON text of each event for ``items`` (the kind's own data)."""
        raise NotImplementedError

    def decode(self, ev: dict[str, object], where: str) -> T:
        """What a reader takes from ``ev`` (checked: :class:`MalformedError` naming ``where``)."""
        raise NotImplementedError

    def move(self, ev: dict[str, object], where: str, pid: int,
             shift_us: float) -> dict[str, object]:
        """``ev`` on process track ``pid`` (a GPU's track: that GPU's of ``pid``), its times
        ``shift_us`` later (``merge``)."""
        ev = dict(ev)
        ev["pid"] = moved_pid(ev.get("pid"), pid)
        if "ts" in ev and ev.get("ph") != "M":
            ev["ts"] = round(_TS.check(ev["ts"], f"{where}: ts") + shift_us, 3)
        return ev

    def owned(self, ev_pid: object, pid: int) -> bool:
        """Whether an event on track ``ev_pid`` belongs to process ``pid`` (its own track)."""
        return bool(ev_pid == pid)


K = TypeVar("K", bound="EventKind[object]")

#: Every kind, by ``(ph, key)``.
KINDS: dict[tuple[str, str | None], EventKind[object]] = {}


def register(kind: K) -> K:
    """Add ``kind`` to :data:`KINDS` (one kind per ``(ph, key)``); returns it."""
    slot = (kind.ph, kind.key)
    if slot in KINDS:
        raise ValueError(f"an event kind for {slot} is registered already")
    KINDS[slot] = kind
    return kind


def kind_of(ev: Mapping[str, object]) -> EventKind[object] | None:
    """The kind of event ``ev`` (``None``: none the agent knows, carried as it is)."""
    ph = ev.get("ph")
    if not isinstance(ph, str):
        return None
    key = ev.get("name") if ph == "M" else ev.get("cat")
    kind = KINDS.get((ph, key)) if isinstance(key, str) else None
    return kind if kind is not None else KINDS.get((ph, None))


class MetadataKind(EventKind[object]):
    """A metadata event (``ph: "M"``): a name or an order for a process or thread track."""

    ph = "M"

    def __init__(self, name: str, arg: str, doc: str) -> None:
        self.name = self.key = name
        self.arg = arg
        self.doc = doc
        self.args_doc = f"`{arg}`"

    def event(self, pid: int, tid: int, value: JsonValue) -> JsonObject:
        return {"ph": "M", "name": self.name, "pid": pid, "tid": tid, "args": {self.arg: value}}

    def encode(self, items: Iterable[tuple[int, JsonValue] | tuple[int, int, JsonValue]],
               timeline: Timeline) -> Iterator[str]:
        """``items``: ``(tid, value)`` pairs on the timeline's process track, or ``(pid, tid,
        value)`` triples on a track of its own (a GPU's)."""
        for item in items:
            pid = timeline.pid if len(item) == 2 else item[0]
            yield json.dumps(self.event(pid, item[-2], item[-1]))


class ThreadName(MetadataKind):
    read = True

    def decode(self, ev: dict[str, object], where: str) -> tuple[int, str]:
        """``(tid, name)``."""
        tid = INT.check(ev.get("tid", 0), f"{where}: tid")
        args = _ARGS.check(ev.get("args") or {}, f"{where}: args")
        return tid, TEXT.check(args.get("name", ""), f"{where}: args.name")


PROCESS_NAME = register(MetadataKind("process_name", "name", "the process track's name"))
PROCESS_SORT_INDEX = register(MetadataKind(
    "process_sort_index", "sort_index", "the process track's place (merged traces)"))
PROCESS_LABELS = register(MetadataKind(
    "process_labels", "labels", "the process track's label (merged traces: its rank)"))
THREAD_NAME = register(ThreadName("thread_name", "name", "a thread track's name"))
THREAD_SORT_INDEX = register(MetadataKind(
    "thread_sort_index", "sort_index", "a thread track's place (the main thread first)"))


@dataclass
class ThreadRanges:
    """One thread's recorded ranges: int64 blocks of rows ``(index, t0, t1, depth)``."""

    tid: int
    name: str
    blocks: list[RangeRows]


@dataclass
class RangeTrack:
    """What the range events of one process are written from."""

    #: ``infos[i]``: ``(name, category, ARGB colour)`` of name index ``i`` (``None``: unknown,
    #: its ranges left out).
    infos: Sequence[tuple[str, str, int] | None]
    #: Per thread, in track order.
    threads: Sequence[ThreadRanges]
    #: More arguments of the ranges they name by (thread id, start ns): what a collection freed.
    extra_args: RangeArgs | None = None
    #: Ranges written (set by the encoder).
    written: int = 0


@dataclass
class Range:
    """One range read back: times in ns since the agent started."""

    name: str
    category: str
    tid: int
    t0: int
    t1: int
    depth: int
    iteration: int | None = None


class Ranges(EventKind[Range]):
    """The agent's ranges: complete events, one per range, per thread in begin order (ties:
    outer range first)."""

    name = "range"
    ph = "X"
    key = None
    doc = ("a recorded range: `name`, `cat` its category, `cname` the closest Chrome colour "
           "name, `ts`/`dur` in us since the agent started")
    args_doc = ("`depth` (0: outermost), `color` the NVTX ARGB colour `0xAARRGGBB`, "
                "`iteration` (iteration ranges, from 0), `collected`/`uncollectable` (gc)")
    read = True

    def encode(self, items: RangeTrack, timeline: Timeline) -> Iterator[str]:
        pid, start_ns = json.dumps(timeline.pid), timeline.start_ns
        prefixes = ["" if info is None else
                    f'{{"ph":"X","name":{json.dumps(info[0])},"cat":{json.dumps(info[1])},'
                    f'"cname":{json.dumps(CNAMES.get(info[1], DEFAULT_CNAME))},"pid":{pid},'
                    '"tid":' for info in items.infos]
        colors = ["" if info is None else argb_hex(info[2]) for info in items.infos]
        known = np.array([bool(p) for p in prefixes], dtype=bool)
        extra_args = items.extra_args
        for thread in items.threads:
            tid = thread.tid
            rows = _rows_in_begin_order(thread.blocks)
            index = rows[:, 0]
            rows = rows[(index >= 0) & (index < len(known))]
            rows = rows[known[rows[:, 0]]]
            items.written += len(rows)
            t0, packed = rows[:, 1], rows[:, 3]
            # microseconds with 3 decimals, exactly: integer parts and remainders, per column
            ts_q, ts_r = np.divmod(t0 - start_ns, 1000)
            dur_q, dur_r = np.divmod(rows[:, 2] - t0, 1000)
            for index, begin, tq, tr, dq, dr, depth, iteration in zip(
                    rows[:, 0].tolist(), t0.tolist(), ts_q.tolist(), ts_r.tolist(),
                    dur_q.tolist(), dur_r.tolist(), (packed & DEPTH_MASK).tolist(),
                    ((packed >> DEPTH_BITS) - 1).tolist()):
                extra = f',"iteration":{iteration}' if iteration >= 0 else ""
                if extra_args:
                    more = extra_args.get((tid, begin))
                    if more:
                        extra += "," + json.dumps(more)[1:-1]
                ts = f"{tq}.{tr:03d}" if tq >= 0 else fixed3(tq * 1000 + tr)
                dur = f"{dq}.{dr:03d}" if dq >= 0 else fixed3(dq * 1000 + dr)
                yield (f'{prefixes[index]}{tid},"ts":{ts},"dur":{dur},"args":{{"depth":{depth},'
                       f'"color":"{colors[index]}"{extra}}}}}')

    def decode(self, ev: dict[str, object], where: str) -> Range:
        name = TEXT.check(ev.get("name", ""), f"{where}: name")
        category = TEXT.check(ev.get("cat", ""), f"{where}: cat")
        tid = INT.check(ev.get("tid", 0), f"{where}: tid")
        if "ts" not in ev or "dur" not in ev:
            raise MalformedError(f"{where} ({name!r}) has no {'ts' if 'ts' not in ev else 'dur'}")
        ts = _TS.check(ev["ts"], f"{where}: ts")
        dur = _DUR.check(ev["dur"], f"{where}: dur")
        args = _ARGS.check(ev.get("args") or {}, f"{where}: args")
        depth = _DEPTH.check(args.get("depth", 0), f"{where}: args.depth")
        iteration = args.get("iteration")
        if iteration is not None:
            iteration = INT.check(iteration, f"{where}: args.iteration")
        t0 = round(ts * 1000)
        return Range(name, category, tid, t0, t0 + round(dur * 1000), depth, iteration)


RANGES = register(Ranges())


def _rows_in_begin_order(blocks: list[RangeRows]) -> RangeRows:
    """One thread's rows as an ``(n, 4)`` int64 array, in begin order (ties: outer first)."""
    if not blocks:
        return np.empty((0, 4), dtype=np.int64)
    rows = np.concatenate([np.asarray(b, dtype=np.int64).reshape(-1, 4) for b in blocks])
    ordered: RangeRows = rows[np.lexsort((rows[:, 3] & DEPTH_MASK, rows[:, 1]))]
    return ordered


# -- GPU activity -----------------------------------------------------------------------------
#: A GPU's track: a process of its own, numbered above Linux's largest pid (2**22) so that it
#: never meets a real process, one per process and device (:func:`gpu_pid`).
GPU_PID_BASE = 1 << 22
MAX_DEVICES = 64
#: Flow ids moved by ``merge``: the merged process's number above a flow's own 32-bit id.
FLOW_ID_BITS = 32


def gpu_pid(pid: int, device: int) -> int:
    """The track (trace pid) of ``device``'s kernels and copies in process ``pid``."""
    return GPU_PID_BASE + pid * MAX_DEVICES + device % MAX_DEVICES


def is_gpu_pid(track: object) -> TypeGuard[int]:
    return isinstance(track, int) and not isinstance(track, bool) and track >= GPU_PID_BASE


def moved_pid(track: object, pid: int) -> int:
    """Track ``track`` of a process, when that process becomes ``pid`` (``merge``)."""
    if is_gpu_pid(track):
        return gpu_pid(pid, (track - GPU_PID_BASE) % MAX_DEVICES)
    return pid


class IterationCounters(EventKind[object]):
    """The figures read at each counted iteration's end (:mod:`..analysis.iteration_figures`):
    a counter track each under the process (Perfetto draws one chart per counter name, a
    series per ``args`` key)."""

    name = "counter"
    ph = "C"
    doc = ("a figure read at an iteration's end, on its counter track under the process (named "
           "after the figure: " + ", ".join(f"`{fig.name}`" for fig in FIGURES) + ")")
    args_doc = "each series in words, in the figure's counter unit: " + "; ".join(
        f"`{fig.name}` " + ", ".join(f"`{label}`" for label in fig.labels.values())
        + (f" ({fig.unit.counter_unit})" if fig.unit.counter_unit else "") for fig in FIGURES)

    def encode(self, items: Mapping[str, Samples], timeline: Timeline) -> Iterator[str]:
        """``items``: the run's samples, by figure name (one event per figure and sample)."""
        for fig in FIGURES:
            samples = items.get(fig.name)
            if samples is None:
                continue
            scale = fig.unit.counter_scale
            series = [(fig.labels.get(s, s), values) for s, values in samples.values.items()]
            for i, at_ns in enumerate(samples.at_ns):
                args = {label: round(values[i] / scale, 3) for label, values in series
                        if i < len(values) and values[i] >= 0}
                yield (f'{{"ph":"C","name":{json.dumps(fig.name)},"pid":{timeline.pid},'
                       f'"tid":0,"ts":{fixed3(at_ns - timeline.start_ns)},'
                       f'"args":{json.dumps(args)}}}')


COUNTERS = register(IterationCounters())


class GpuEventKind(EventKind[Dict[str, object]]):
    """An event of the GPU activity (built by :mod:`.gpu_events`, written as it is): on a
    GPU's track (``on_gpu``) or on the launching thread's; read back as the checked event
    itself (``Trace.events[name]``)."""

    def __init__(self, name: str, ph: str, key: str, doc: str, args_doc: str,
                 on_gpu: bool, read: bool = True) -> None:
        self.name, self.ph, self.key = name, ph, key
        self.doc, self.args_doc = doc, args_doc
        self.on_gpu = on_gpu
        self.read = read

    def encode(self, items: Iterable[Mapping[str, object] | str],
               timeline: Timeline) -> Iterator[str]:
        """``items``: the events (``pid``, ``ts`` already on ``timeline``), each a dict or
        already its compact JSON text (the many per-operation ones: written as they are)."""
        for ev in items:
            yield ev if isinstance(ev, str) else dumps(ev)

    def decode(self, ev: dict[str, object], where: str) -> dict[str, object]:
        TEXT.check(ev.get("name", ""), f"{where}: name")
        INT.check(ev.get("tid", 0), f"{where}: tid")
        if "ts" not in ev:
            raise MalformedError(f"{where} ({self.name}) has no ts")
        _TS.check(ev["ts"], f"{where}: ts")
        if self.ph == "X":
            if "dur" not in ev:
                raise MalformedError(f"{where} ({self.name}) has no dur")
            _DUR.check(ev["dur"], f"{where}: dur")
        _ARGS.check(ev.get("args") or {}, f"{where}: args")
        return ev

    def owned(self, ev_pid: object, pid: int) -> bool:
        if not self.on_gpu:
            return bool(ev_pid == pid)
        return is_gpu_pid(ev_pid) and (ev_pid - GPU_PID_BASE) // MAX_DEVICES == pid


class FlowKind(GpuEventKind):
    """One end of a flow from a launching call to its GPU operation (``id``: the launch's
    correlation id; ``merge`` puts the process's number above it)."""

    def move(self, ev: dict[str, object], where: str, pid: int,
             shift_us: float) -> dict[str, object]:
        ev = super().move(ev, where, pid, shift_us)
        own = INT.check(ev.get("id", 0), f"{where}: id") & ((1 << FLOW_ID_BITS) - 1)
        ev["id"] = (pid << FLOW_ID_BITS) | own
        return ev


_GPU_OP_ARGS = ("`device`, `context`, `stream`, `correlation` (the launching call's), "
                "`External id` (the launching range's), `launched by` (that range), `link`")
KERNELS = register(GpuEventKind(
    "kernel", "X", "kernel", "a GPU kernel, on its device's and stream's track",
    _GPU_OP_ARGS + ", `grid`, `block`, `registers per thread`, `shared memory`", on_gpu=True))
GPU_MEMCPY = register(GpuEventKind(
    "gpu_memcpy", "X", "gpu_memcpy", "a memory copy (`Memcpy HtoD (Pageable -> Device)`), on "
    "its stream's track", _GPU_OP_ARGS + ", `bytes`, `memory bandwidth (GB/s)`", on_gpu=True))
GPU_MEMSET = register(GpuEventKind(
    "gpu_memset", "X", "gpu_memset", "a memset, on its stream's track",
    _GPU_OP_ARGS + ", `bytes`", on_gpu=True))
CUDA_RUNTIME = register(GpuEventKind(
    "cuda_runtime", "X", "cuda_runtime", "the CUDA runtime call that launched GPU work "
    "(`cudaLaunchKernel`, `cudaMemcpyAsync`, ...), on the launching thread's track",
    "`cbid`, `correlation`, `External id`", on_gpu=False))
CUDA_DRIVER = register(GpuEventKind(
    "cuda_driver", "X", "cuda_driver", "the CUDA driver call that launched GPU work "
    "(`cuLaunchKernel`, ...), on the launching thread's track",
    "`cbid`, `correlation`, `External id`", on_gpu=False))
FLOW_START = register(FlowKind(
    "launch flow start", "s", "ac2g", "a flow from a launching call (`id`: its correlation id)",
    "", on_gpu=False, read=False))
FLOW_END = register(FlowKind(
    "launch flow end", "f", "ac2g", "... to its GPU operation (`bp`: `e`)", "", on_gpu=True,
    read=False))
PROFILER_STEPS = register(GpuEventKind(
    "profiler step", "X", "user_annotation", "`ProfilerStep#N` over iteration N (how "
    "HolisticTraceAnalysis finds iterations), on the loop thread's track", "", on_gpu=False,
    read=False))
#: The kinds of the GPU activity's events.
GPU_KINDS: tuple[GpuEventKind, ...] = (KERNELS, GPU_MEMCPY, GPU_MEMSET, CUDA_RUNTIME,
                                       CUDA_DRIVER, FLOW_START, FLOW_END, PROFILER_STEPS)


# -- one process's events, and the file around them ------------------------------------------------
#: Another kind's events for one trace: the kind, and what its encoder takes.
Track = Tuple[EventKind[object], object]


def process_events(timeline: Timeline, process_name: str, ranges: RangeTrack,
                   tracks: Sequence[Track] = ()) -> Iterator[str]:
    """A process's events: its track's name, each thread's track (name, place), the ranges,
    then ``tracks`` (each kind's events in turn)."""
    yield from PROCESS_NAME.encode([(0, process_name)], timeline)
    for order, thread in enumerate(ranges.threads):
        yield from THREAD_NAME.encode([(thread.tid, thread.name)], timeline)
        yield from THREAD_SORT_INDEX.encode([(thread.tid, order)], timeline)
    yield from RANGES.encode(ranges, timeline)
    for kind, items in tracks:
        yield from kind.encode(items, timeline)


def in_track_order(threads: Iterable[ThreadRanges], main_tid: int | None) -> list[ThreadRanges]:
    """The threads as their tracks are shown: the main thread first, then by id."""
    return sorted(threads, key=lambda t: (t.tid != main_tid, t.tid))


def write_container(out: TextIO, record: Mapping[str, object], events: Iterable[str],
                    top: Mapping[str, object] | None = None) -> None:
    """The trace object: ``top``'s members (other readers' top-level fields, e.g. Kineto's
    ``deviceProperties``), ``record`` as ``otherData.chainer_autoprof`` (strict JSON: a
    number that is not finite becomes null), then ``events`` (JSON texts), one per line."""
    out.write('{"displayTimeUnit":"ms",')
    for key, value in (top or {}).items():
        if key in ("displayTimeUnit", "otherData", "traceEvents"):
            raise ValueError(f"{key} is the container's own member")
        out.write(f"{json.dumps(key)}:{json.dumps(finite(value), allow_nan=False)},")
    out.write('"otherData":')
    out.write(json.dumps({"chainer_autoprof": finite(record)}, default=str, allow_nan=False))
    out.write(',"traceEvents":[\n')
    events = iter(events)
    batch = list(islice(events, _BATCH))
    while batch:
        out.write(",\n".join(batch))
        batch = list(islice(events, _BATCH))
        if batch:
            out.write(",\n")
    out.write("\n]}\n")


#: Events joined per write.
_BATCH = 4096


def finite(value: object) -> object:
    """``value`` with every float that is not finite replaced by ``None`` (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(ev: Mapping[str, object]) -> str:
    """One event as compact strict JSON (``ValueError`` for NaN or Infinity)."""
    return json.dumps(ev, separators=(",", ":"), allow_nan=False)


# -- reading -------------------------------------------------------------------------------------
@dataclass
class Decoded:
    """The events of one process read back, checked."""

    ranges: list[Range] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)
    #: What every other kind read back gave, by kind name.
    events: dict[str, list[object]] = field(default_factory=dict)


def decode(events: Sequence[object], pid: int | None = None) -> Decoded:
    """Every event of process ``pid`` (all: ``None``) that readers read, checked
    (:class:`MalformedError` naming the event); other events and non-objects are skipped."""
    out = Decoded()
    for n, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        kind = kind_of(ev)
        if kind is None or not kind.read:
            continue
        if pid is not None and not kind.owned(ev.get("pid"), pid):
            continue
        where = f"event {n}"
        if kind is RANGES:
            out.ranges.append(RANGES.decode(ev, where))
        elif kind is THREAD_NAME:
            tid, name = THREAD_NAME.decode(ev, where)
            out.thread_names[tid] = name
        else:
            out.events.setdefault(kind.name, []).append(kind.decode(ev, where))
    return out


def move(ev: dict[str, object], n: int, pid: int, shift_us: float) -> dict[str, object]:
    """Event ``n`` of an input on merged process track ``pid``, ``shift_us`` later."""
    kind = kind_of(ev) or _ANY_KIND
    return kind.move(ev, f"event {n}", pid, shift_us)


_ANY_KIND: EventKind[object] = EventKind()


def markdown() -> str:
    """The table of event kinds for ``docs/trace_format.md``."""
    rows = ["| Kind | `ph` | Told apart by | Read back | Meaning | `args` |",
            "|---|---|---|---|---|---|"]
    for (ph, key), kind in KINDS.items():
        apart = (f"`name`: `{key}`" if ph == "M" else f"`cat`: `{key}`") if key else \
            "any other `cat`"
        rows.append(f"| {kind.name} | `{ph}` | {apart} | {'yes' if kind.read else 'no'} | "
                    f"{kind.doc} | {kind.args_doc} |")
    return "\n".join(rows) + "\n"
