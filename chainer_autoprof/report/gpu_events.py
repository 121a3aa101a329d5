"""GPU activity as trace events, after the PyTorch profiler's (Kineto's) conventions.

Records in, events out (each operation's as its JSON text, made directly; read back as
dicts): the trace codec places these events beside the
agent's ranges; HolisticTraceAnalysis reads such a trace as it reads a PyTorch profiler
trace (temporal and idle-time breakdowns, kernel breakdowns), Perfetto and
chrome://tracing show it.

Each kind of event is one of the codec's (:data:`.trace_events.GPU_KINDS`, and its
metadata kinds for the tracks' names): :func:`tracks` hands them to the trace writer, and
readers take them apart from the ranges.

Events (``ts``/``dur`` in microseconds since the agent started, 3 decimals, like the
ranges):

* per device a process ``GPU d`` (pid :func:`~.trace_events.gpu_pid`: above any real pid,
  so it never collides with a process of a merged trace) and per stream a thread
  ``stream s`` (tid = CUPTI's stream id);
* kernels ``{"ph": "X", "cat": "kernel", "name": <kernel>, "pid": <GPU>, "tid": <stream>,
  "args": {"device", "context", "stream", "correlation", "External id", "grid", "block",
  "registers per thread", "shared memory", "launched by", "link"}}``; copies
  ``cat "gpu_memcpy"``, named ``Memcpy HtoD (Pageable -> Device)``, with ``bytes`` and
  ``memory bandwidth (GB/s)``; memsets ``cat "gpu_memset"``, ``Memset (Device)``;
* the launching CUDA call on the launching thread's track (pid, tid of the agent's
  ranges): ``cat "cuda_runtime"`` or ``"cuda_driver"``, named after the function
  (``cudaLaunchKernel``, ``cuLaunchKernel``, ...), ``args {"cbid", "correlation",
  "External id"}``, inside the range that launched it (its end held inside that range,
  which the clock map's error could push out);
* a flow ``"ac2g"`` from each call (``ph "s"``) to its first GPU operation (``ph "f"``,
  ``bp "e"``), id = the correlation id;
* ``ProfilerStep#N`` (``cat "user_annotation"``) over each iteration range of the loop
  thread whose GPU operations the trace holds, all of them: how HolisticTraceAnalysis
  finds iterations (a step without its kernels breaks its temporal breakdown);
* ``External id``: one number per launching range, also given to that range's event
  (:attr:`GpuEvents.range_args`, for the writer's ``event_args``), as Kineto ties an
  operator to its kernels.

Top-level fields (:func:`trace_fields`): ``schemaVersion``, ``deviceProperties``,
``distributedInfo`` (the rank HolisticTraceAnalysis keys traces by),
``baseTimeNanoseconds`` (the Unix time of ``ts`` 0).

Bounded: the events come from the operations the analysis kept (at most
``record_limit``, whole iterations first:
:class:`~..analysis.gpu_analysis.AttributedKeeper`): at most four events per operation,
plus one per iteration and the metadata.  :func:`activity_from_events` reads them back as
an :class:`~..common.gpu_records.ActivityBatch` on the agent's clock, which the same
attribution turns into the same figures (``report`` on a saved trace).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from ..analysis.gpu_analysis import GpuAnalysis
from ..analysis.gpu_attribution import K_ITER, AttributedOps
from ..analysis.gpu_clock import fit
from ..analysis.gpu_figures import GpuFigures
from ..analysis.stats import DEPTH_BITS
from ..common.gpu_records import (
    COPY_KIND_NAMES,
    DRIVER,
    KERNEL,
    MEMCPY,
    MEMORY_KIND_NAMES,
    MEMSET,
    RUNTIME,
    ActivityBatch,
    ApiCalls,
    ClockPairs,
    ExternalIds,
    GpuOps,
    NameTable,
)
from ..common.names import link_range_text
from ..common.typedefs import JsonObject
from .trace_events import (
    CUDA_DRIVER,
    CUDA_RUNTIME,
    FLOW_END,
    FLOW_START,
    GPU_KINDS,
    GPU_MEMCPY,
    GPU_MEMSET,
    GPU_PID_BASE,
    KERNELS,
    MAX_DEVICES,
    PROFILER_STEPS,
    EventKind,
    GpuEventKind,
    MetadataKind,
    Track,
    gpu_pid,
    is_gpu_pid,
    kind_of,
)

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows

__all__ = ["GPU_PID_BASE", "MAX_DEVICES", "GpuEvents", "activity_from_events", "encode",
           "for_trace", "gpu_pid", "is_gpu_event", "profiler_steps", "trace_fields", "tracks"]



def _category(kind: GpuEventKind) -> str:
    """The category (``cat``) the codec's ``kind`` claims."""
    assert kind.key is not None
    return kind.key


CAT_KERNEL = _category(KERNELS)
CAT_MEMCPY = _category(GPU_MEMCPY)
CAT_MEMSET = _category(GPU_MEMSET)
CAT_RUNTIME = _category(CUDA_RUNTIME)
CAT_DRIVER = _category(CUDA_DRIVER)
CAT_FLOW = _category(FLOW_START)
CAT_STEP = _category(PROFILER_STEPS)
STEP_PREFIX = "ProfilerStep#"
_OP_CATS = {KERNEL: CAT_KERNEL, MEMCPY: CAT_MEMCPY, MEMSET: CAT_MEMSET}

#: CUPTI callback ids of the calls that launch work -> the function's name.
RUNTIME_NAMES = {
    13: "cudaLaunch", 31: "cudaMemcpy", 32: "cudaMemcpy2D", 41: "cudaMemcpyAsync",
    44: "cudaMemcpy2DAsync", 49: "cudaMemset", 51: "cudaMemsetAsync", 145: "cudaMemcpy3DAsync",
    161: "cudaMemcpyPeerAsync", 211: "cudaLaunchKernel", 214: "cudaLaunchKernel_ptsz",
    215: "cudaMemcpy_ptds", 225: "cudaMemcpyAsync_ptsz", 233: "cudaMemset_ptds",
    235: "cudaMemsetAsync_ptsz", 269: "cudaLaunchCooperativeKernel",
    311: "cudaGraphLaunch", 312: "cudaGraphLaunch_ptsz", 430: "cudaLaunchKernelExC",
    431: "cudaLaunchKernelExC_ptsz",
}
DRIVER_NAMES = {
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 477: "cuLaunchCooperativeKernel",
    514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz", 652: "cuLaunchKernelEx",
    653: "cuLaunchKernelEx_ptsz",
}


def api_name(domain: int, cbid: int) -> str:
    if domain == DRIVER:
        return DRIVER_NAMES.get(cbid, f"cuDriver#{cbid}")
    return RUNTIME_NAMES.get(cbid, f"cudaRuntime#{cbid}")


def _api_cbid(domain: int, name: str) -> int:
    table = DRIVER_NAMES if domain == DRIVER else RUNTIME_NAMES
    for cbid, known in table.items():
        if known == name:
            return cbid
    tail = name.rsplit("#", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else -1


def _us(ns: int) -> float:
    """Nanoseconds as microseconds, rounded to the nanosecond (JSON writes it exactly)."""
    return round(ns / 1000.0, 3)


def is_gpu_event(event: Mapping[str, object]) -> bool:
    """Whether a trace event is one of these (a reader of the agent's ranges skips it)."""
    return kind_of(event) in GPU_KINDS or is_gpu_pid(event.get("pid"))


def tracks(events: Iterable[Mapping[str, Any]]) -> list[Track]:
    """The encoded events as the trace writer's tracks: each through its kind of the codec
    (the GPU tracks' names as triples ``(pid, tid, value)`` of the metadata kinds)."""
    meta: dict[MetadataKind, list[tuple[int, int, Any]]] = {}
    rest: dict[EventKind[object], list[Mapping[str, Any]]] = {}
    for ev in events:
        kind = kind_of(ev)
        if isinstance(kind, MetadataKind):
            meta.setdefault(kind, []).append((int(ev["pid"]), int(ev["tid"]),
                                              (ev.get("args") or {})[kind.arg]))
        elif kind in GPU_KINDS:
            rest.setdefault(kind, []).append(ev)
        else:
            raise ValueError(f"not an event of the GPU activity: {dict(ev)!r:.80}")
    return [*meta.items(), *rest.items()]


@dataclass
class GpuEvents:
    """The encoded events, and the arguments they add to the agent's own range events."""

    #: The tracks' metadata events (a few per device and stream).
    events: list[JsonObject] = field(default_factory=list)
    #: The per-operation events (four at most each), already JSON texts by kind, in the
    #: order made: a trace holds up to ``record_limit`` of them, so each is written once,
    #: as compact JSON, without a dict made first (a tenth of the exit's time before).
    texts: dict[GpuEventKind, list[str]] = field(default_factory=dict)
    #: (tid, range start ns) -> {"External id": n}: the writer's ``event_args``.
    range_args: dict[tuple[int, int], JsonObject] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.events) + sum(len(t) for t in self.texts.values())


def op_name(ops: GpuOps, i: int, names: NameTable) -> str:
    kind = int(ops.kind[i])
    if kind == KERNEL:
        return names.name(int(ops.name[i]))
    if kind == MEMCPY:
        copy = COPY_KIND_NAMES.get(int(ops.copy_kind[i]), "Unknown")
        src = MEMORY_KIND_NAMES.get(int(ops.src_kind[i]), "Unknown")
        dst = MEMORY_KIND_NAMES.get(int(ops.dst_kind[i]), "Unknown")
        return f"Memcpy {copy} ({src} -> {dst})"
    return "Memset (Device)"


def _json(text: str) -> str:
    """A string as JSON (as the codec's ``dumps`` writes it)."""
    return json.dumps(text)


def _us_text(ns: int) -> str:
    """:func:`_us` as JSON writes it (``repr`` of the float)."""
    return repr(round(ns / 1000.0, 3))


def encode(records: AttributedOps, *, pid: int, start_ns: int, names: NameTable,
           range_names: Sequence[str] = (), link_keys: Sequence[str] = ()) -> GpuEvents:
    """Attributed operations -> trace events (see the module docstring).

    ``start_ns``: the agent's ``perf_counter_ns`` at ``ts`` 0; ``range_names`` and
    ``link_keys`` name the attribution's range indexes and link ids.  Each event's text is
    what ``json.dumps(event, separators=(",", ":"))`` gives for the event of the module
    docstring (its members in that order); the texts that repeat (names, categories,
    ranges, links) are made once each.
    """
    out = GpuEvents()
    if not len(records):
        return out
    ops, attr = records.ops, records.attr
    order = np.lexsort((ops.start, ops.stream, ops.device))
    col = {c: getattr(ops, c)[order].tolist() for c in (
        "kind", "device", "stream", "correlation", "start", "end", "context", "name",
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers",
        "static_smem", "dynamic_smem", "bytes", "copy_kind", "src_kind", "dst_kind")}
    acol = {c: getattr(attr, c)[order].tolist() for c in (
        "tid", "range", "range_t0", "range_t1", "link", "backward", "api_start", "api_end",
        "api_domain", "cbid")}
    ext_ids: dict[tuple[int, int], int] = {}
    tracks: dict[int, set[int]] = {}
    flows_started: set[int] = set()
    # the texts that repeat, made once: what names an operation -> '"cat":..,"name":..'
    heads: dict[tuple[int, ...], str] = {}
    launched_by: dict[int, str] = {}
    link_texts: dict[tuple[int, int], str] = {}
    call_heads: dict[tuple[int, int], str] = {}
    by_kind = {KERNEL: KERNELS, MEMCPY: GPU_MEMCPY, MEMSET: GPU_MEMSET}
    texts = out.texts
    api_texts: dict[GpuEventKind, list[str]] = {}
    flow_start: list[str] = []
    flow_end: list[str] = []
    flow_tail = f'"cat":{_json(CAT_FLOW)},"name":{_json(CAT_FLOW)}'
    for j in range(len(order)):
        kind = col["kind"][j]
        device, stream, corr = col["device"][j], col["stream"][j], col["correlation"][j]
        tracks.setdefault(device, set()).add(stream)
        t0, t1 = col["start"][j], col["end"][j]
        tid, r = acol["tid"][j], acol["range"][j]
        ext = -1
        if r >= 0 and tid >= 0:
            key = (tid, acol["range_t0"][j])
            ext = ext_ids.get(key, -1)
            if ext < 0:
                ext = ext_ids[key] = len(ext_ids) + 1
                out.range_args[key] = {"External id": ext}
        if kind == KERNEL:
            name_key = col["name"][j]
            smem = (col["static_smem"][j], col["dynamic_smem"][j])
            shared = sum(x for x in smem if x > 0) if max(smem) >= 0 else -1
            rest = (f',"grid":[{col["grid_x"][j]},{col["grid_y"][j]},{col["grid_z"][j]}],'
                    f'"block":[{col["block_x"][j]},{col["block_y"][j]},{col["block_z"][j]}],'
                    f'"registers per thread":{col["registers"][j]},"shared memory":{shared}')
        else:
            name_key = -1
            nbytes = col["bytes"][j]
            rest = f',"bytes":{nbytes}'
            if kind == MEMCPY:
                seconds = (t1 - t0) / 1e9
                bandwidth = (round(nbytes / seconds / 1e9, 3)
                             if seconds > 0 and nbytes > 0 else 0.0)
                rest += f',"memory bandwidth (GB/s)":{bandwidth!r}'
        # what names it: a kernel's name id, a copy's kinds (a memset has one name)
        head_key = (kind, name_key, col["copy_kind"][j], col["src_kind"][j],
                    col["dst_kind"][j]) if kind == MEMCPY else (kind, name_key)
        head = heads.get(head_key)
        if head is None:
            head = heads[head_key] = (f'"cat":{_json(_OP_CATS.get(kind, CAT_KERNEL))},'
                                      f'"name":{_json(op_name(ops, int(order[j]), names))}')
        if 0 <= r < len(range_names):
            by = launched_by.get(r)
            if by is None:
                by = launched_by[r] = f',"launched by":{_json(range_names[r])}'
            rest += by
        link = acol["link"][j]
        if 0 <= link < len(link_keys):
            lk = (link, acol["backward"][j])
            lt = link_texts.get(lk)
            if lt is None:
                lt = link_texts[lk] = \
                    f',"link":{_json(link_range_text(link_keys[link], bool(lk[1])))}'
            rest += lt
        gpid = gpu_pid(pid, device)
        ts = _us_text(t0 - start_ns)
        texts.setdefault(by_kind.get(kind, KERNELS), []).append(
            f'{{"ph":"X",{head},"pid":{gpid},"tid":{stream},"ts":{ts},'
            f'"dur":{_us_text(max(0, t1 - t0))},"args":{{"device":{device},'
            f'"context":{col["context"][j]},"stream":{stream},"correlation":{corr},'
            f'"External id":{ext}{rest}}}}}')
        launch = acol["api_start"][j]
        if launch < 0 or tid < 0 or corr in flows_started:
            continue
        flows_started.add(corr)
        end = acol["api_end"][j]
        if r >= 0 and acol["range_t1"][j] >= 0:
            end = min(end, acol["range_t1"][j])  # inside its range on the thread's track
        end = max(end, launch)
        domain, cbid = acol["api_domain"][j], acol["cbid"][j]
        call = call_heads.get((domain, cbid))
        if call is None:
            cat = CAT_DRIVER if domain == DRIVER else CAT_RUNTIME
            call = call_heads[(domain, cbid)] = \
                f'"cat":{_json(cat)},"name":{_json(api_name(domain, cbid))}'
        launch_ts = _us_text(launch - start_ns)
        api_texts.setdefault(CUDA_DRIVER if domain == DRIVER else CUDA_RUNTIME, []).append(
            f'{{"ph":"X",{call},"pid":{pid},"tid":{tid},"ts":{launch_ts},'
            f'"dur":{_us_text(end - launch)},"args":{{"cbid":{cbid},"correlation":{corr},'
            f'"External id":{ext}}}}}')
        flow_start.append(f'{{"ph":"s","id":{corr},"pid":{pid},"tid":{tid},"ts":{launch_ts},'
                          f'{flow_tail}}}')
        flow_end.append(f'{{"ph":"f","id":{corr},"pid":{gpid},"tid":{stream},"ts":{ts},'
                        f'{flow_tail},"bp":"e"}}')
    meta: list[JsonObject] = []
    for device in sorted(tracks):
        gpid = gpu_pid(pid, device)
        meta.append({"ph": "M", "name": "process_name", "pid": gpid, "tid": 0,
                     "args": {"name": f"GPU {device}"}})
        meta.append({"ph": "M", "name": "process_labels", "pid": gpid, "tid": 0,
                     "args": {"labels": f"CUDA device {device} (process {pid})"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": gpid, "tid": 0,
                     "args": {"sort_index": gpid}})
        for stream in sorted(tracks[device]):
            meta.append({"ph": "M", "name": "thread_name", "pid": gpid, "tid": stream,
                         "args": {"name": f"stream {stream}"}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": gpid, "tid": stream,
                         "args": {"sort_index": stream}})
    out.events = meta
    out.texts = {**api_texts, **({FLOW_START: flow_start} if flow_start else {}), **texts,
                 **({FLOW_END: flow_end} if flow_end else {})}
    return out


def profiler_steps(iterations: Iterable[tuple[int, int, int, int]], *, pid: int,
                   start_ns: int) -> list[JsonObject]:
    """``ProfilerStep#N`` events over iterations ``(tid, t0 ns, t1 ns, number)``."""
    return [{"ph": "X", "cat": CAT_STEP, "name": f"{STEP_PREFIX}{number}", "pid": pid,
             "tid": tid, "ts": _us(t0 - start_ns), "dur": _us(max(0, t1 - t0)),
             "args": {}} for tid, t0, t1, number in iterations]


def trace_fields(meta: Mapping[str, Any]) -> JsonObject:
    """Kineto's top-level fields from the agent's trace metadata (``otherData`` part)."""
    devices = meta.get("devices") or []
    clock = meta.get("clock") or {}
    process = meta.get("process") or {}
    rank = meta.get("rank")
    world = process.get("world_size")
    out: JsonObject = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": int(d.get("id", i)), "name": str(d.get("name", ""))}
                             for i, d in enumerate(devices) if isinstance(d, Mapping)],
        "distributedInfo": {"backend": "nccl" if world else "none",
                            "rank": int(rank) if isinstance(rank, int) else 0,
                            "world_size": int(world) if isinstance(world, int) else 1},
    }
    unix = clock.get("unix_time_ns_at_start")
    if isinstance(unix, int):
        out["baseTimeNanoseconds"] = unix
    return out


@dataclass
class GpuTrace:
    """What a trace holds of the GPU activity: the writer's tracks, the External ids added
    to the launching ranges (``event_args``), and Kineto's top-level fields."""

    tracks: list[Track]
    range_args: dict[tuple[int, int], JsonObject]
    top: JsonObject
    events: int


def for_trace(analysis: GpuAnalysis, meta: Mapping[str, Any], *, pid: int, start_ns: int,
              rows_by_thread: Mapping[int, RangeRows], loop_tid: int | None,
              span: tuple[int, int] | None = None) -> GpuTrace:
    """The GPU events of ``analysis`` for a trace of process ``pid`` (the live agent's at
    exit, a replay's): the operations it kept (those launched inside ``span``, agent ns,
    when given), ``ProfilerStep#N`` over the loop thread's iterations among
    ``rows_by_thread`` (the recorder's rows) whose GPU operations it kept, all of them (each
    step holds all its kernels, which HolisticTraceAnalysis's breakdowns need), and the
    top-level fields from ``meta`` (the run record)."""
    records = analysis.records()
    if span is not None and len(records):
        launch = records.attr.api_start
        records = records.take((launch >= span[0]) & (launch <= span[1]))
    encoded = encode(records, pid=pid, start_ns=start_ns, names=analysis.names,
                     range_names=analysis.range_names, link_keys=analysis.link_keys)
    iterations = iteration_rows(analysis, rows_by_thread, loop_tid)
    whole = analysis.keeper.complete_iterations()  # a step only where all its GPU work is
    iterations = [it for it in iterations if (it[0], it[2]) in whole]
    if span is not None:
        iterations = [it for it in iterations if it[1] >= span[0] and it[2] <= span[1]]
    steps = profiler_steps(iterations, pid=pid, start_ns=start_ns)
    written: list[Track] = [*tracks(encoded.events + steps), *encoded.texts.items()]
    return GpuTrace(written, encoded.range_args, trace_fields(meta), len(encoded) + len(steps))


def figures_from_events(events: Mapping[str, Sequence[Mapping[str, Any]]],
                        rows: tuple[Sequence[tuple[str, str]], Mapping[int, RangeRows]],
                        meta: Mapping[str, Any]) -> GpuFigures | None:
    """The GPU figures of a saved trace whose record holds none: its GPU events read back
    (``events``: :attr:`~.tracefile.Trace.events`) and attributed again to its ranges
    (``rows``: names and per-thread rows, as :meth:`~.tracefile.Trace.range_rows` gives them);
    ``None`` when it has no GPU operation."""
    start = int((meta.get("clock") or {}).get("perf_counter_ns_at_start") or 0)
    batch = activity_from_events(
        [ev for name in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")
         for ev in events.get(name, ())], start)
    if not len(batch.ops):
        return None
    analysis = GpuAnalysis(fit(ClockPairs.from_rows([(0, 0)])), batch.names,
                           int(meta.get("warmup_skip") or 0),
                           record_limit=0, identity_threads=True)  # loop: the first to iterate
    names, per_thread = rows
    for i, (name, category) in enumerate(names):
        analysis.add_name(i, name, category)
    for tid, block in per_thread.items():
        analysis.feed_ranges(tid, block)
        analysis.thread_finished(tid)
    analysis.feed_activity(batch)
    return analysis.finish()


def iteration_rows(analysis: GpuAnalysis, rows_by_thread: Mapping[int, RangeRows],
                   loop_tid: int | None) -> list[tuple[int, int, int, int]]:
    """The loop thread's iterations ``(tid, t0, t1, number)`` from recorded rows (``None``:
    the thread with the most iterations)."""
    out: list[tuple[int, int, int, int]] = []
    kinds = analysis.attributor.kinds
    iter_index = np.array([k == K_ITER for k in kinds], dtype=bool)
    if loop_tid is None and rows_by_thread and len(iter_index):
        def iterations(rows: RangeRows) -> int:
            index = np.asarray(rows, dtype=np.int64).reshape(-1, 4)[:, 0]
            index = index[(index >= 0) & (index < len(iter_index))]
            return int(iter_index[index].sum())

        loop_tid = max(rows_by_thread, key=lambda tid: iterations(rows_by_thread[tid]))
    for tid, rows in rows_by_thread.items():
        if loop_tid is not None and tid != loop_tid:
            continue
        a = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        for index, t0, t1, packed in a.tolist():
            if index < len(kinds) and kinds[index] == K_ITER:
                number = (packed >> DEPTH_BITS) - 1
                out.append((tid, t0, t1, number if number >= 0 else len(out)))
    out.sort(key=lambda r: r[1])
    return out


# --------------------------------------------------------------------------
# Reading back
# --------------------------------------------------------------------------

def activity_from_events(events: Iterable[Mapping[str, Any]], start_ns: int = 0,
                         names: NameTable | None = None) -> ActivityBatch:
    """The GPU operations and launching calls of a saved trace, as an
    :class:`ActivityBatch` on the agent's clock (``perf_counter_ns`` = ``start_ns`` +
    ``ts``); its API calls carry the agent's thread ids (attribute with
    ``identity_threads`` and an identity clock map)."""
    names = names if names is not None else NameTable()
    ops: dict[str, list[int]] = {c: [] for c in GpuOps.columns()}
    api: dict[str, list[int]] = {c: [] for c in ApiCalls.columns()}

    def ns(value: Any) -> int:
        return start_ns + round(float(value) * 1000)

    kinds = {CAT_KERNEL: KERNEL, CAT_MEMCPY: MEMCPY, CAT_MEMSET: MEMSET}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        args = ev.get("args") or {}
        if cat in kinds:
            row = dict.fromkeys(GpuOps.columns(), -1)
            row["kind"] = kinds[cat]
            row["start"] = ns(ev["ts"])
            row["end"] = row["start"] + round(float(ev["dur"]) * 1000)
            for col in ("device", "context", "stream", "correlation"):
                row[col] = int(args.get(col, -1))
            if cat == CAT_KERNEL:
                row["name"] = names.intern(str(ev.get("name", "")))
                grid, block = args.get("grid") or [-1] * 3, args.get("block") or [-1] * 3
                row["grid_x"], row["grid_y"], row["grid_z"] = (int(x) for x in grid[:3])
                row["block_x"], row["block_y"], row["block_z"] = (int(x) for x in block[:3])
                row["registers"] = int(args.get("registers per thread", -1))
                row["dynamic_smem"] = int(args.get("shared memory", -1))
            else:
                row["bytes"] = int(args.get("bytes", -1))
                if cat == CAT_MEMCPY:
                    row["copy_kind"], row["src_kind"], row["dst_kind"] = _copy_kinds(
                        str(ev.get("name", "")))
            for col, value in row.items():
                ops[col].append(value)
        elif cat in (CAT_RUNTIME, CAT_DRIVER):
            domain = DRIVER if cat == CAT_DRIVER else RUNTIME
            t0 = ns(ev["ts"])
            api["domain"].append(domain)
            api["start"].append(t0)
            api["end"].append(t0 + round(float(ev["dur"]) * 1000))
            api["correlation"].append(int(args.get("correlation", -1)))
            cbid = args.get("cbid")
            api["cbid"].append(int(cbid) if cbid is not None
                               else _api_cbid(domain, str(ev.get("name", ""))))
            api["thread"].append(int(ev.get("tid", -1)))
    return ActivityBatch(GpuOps.from_columns(len(ops["kind"]), ops),
                         ApiCalls.from_columns(len(api["domain"]), api),
                         ExternalIds.empty(), names)


def _copy_kinds(name: str) -> tuple[int, int, int]:
    """``Memcpy HtoD (Pageable -> Device)`` -> the CUPTI kinds (-1 where unknown)."""
    def code(table: Mapping[int, str], text: str) -> int:
        for k, v in table.items():
            if v == text:
                return k
        return -1

    parts = name.split(" ", 2)
    copy = code(COPY_KIND_NAMES, parts[1]) if len(parts) > 1 else -1
    src = dst = -1
    if len(parts) > 2 and parts[2].startswith("(") and " -> " in parts[2]:
        a, b = parts[2][1:].rstrip(")").split(" -> ", 1)
        src, dst = code(MEMORY_KIND_NAMES, a), code(MEMORY_KIND_NAMES, b)
    return copy, src, dst
