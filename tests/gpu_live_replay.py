"""The real CUPTI recordings (tests/data/gpu/cupti) replayed through the live agent's path.

Without a GPU, the two stand-ins are the recordings themselves: the recorded process's
ranges go through a real :class:`~chainer_autoprof.sinks.recorder.Recorder` (its blocks,
its handover to the GPU queue), and its CUPTI records, as cupti-python hands them over,
through a real :class:`~chainer_autoprof.runtime.gpu_activity.CuptiCollector`'s buffer
callback on a thread of their own (as CUPTI's); the session's drain thread attributes them;
the exit runs as the agent's (:meth:`GpuSession.finish`, then ``report_run`` writing the
trace through the codec).  Two readers of CUPTI's records (``reader``): ``python``, the
cupti-python collector, whose own CUPTI calls (enable, flush, timestamps) are not run (it has
no ``cupti`` module; its clock pairs are the recording's); and ``native``, the C reader
started as the agent starts it (:func:`gpu_session.start_cupti`) with the tests' libcupti
(:mod:`cupti_fake`), which serves the recording as CUPTI's record structs on a thread of its
own: every CUPTI call of the live path runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import numpy as np

from chainer_autoprof.common import gpu_records
from chainer_autoprof.common import names as range_names
from chainer_autoprof.common.gpu_records import KERNEL, MEMCPY, Recording, read_recording
from chainer_autoprof.common.settings import from_environ
from chainer_autoprof.lifecycle import gpu_session
from chainer_autoprof.lifecycle.finish import report_run
from chainer_autoprof.report import trace_events
from chainer_autoprof.report.tracefile import Trace, read_trace
from chainer_autoprof.runtime import cupti_native, cupti_readers
from chainer_autoprof.runtime.device import CountingBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.gpu_activity import CuptiCollector
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder

DATA = Path(__file__).resolve().parent / "data" / "gpu" / "cupti"


def as_cupti_records(rec: Recording) -> list[SimpleNamespace]:
    """The recording's rows as cupti-python hands records over (attributes in snake case),
    in the order CUPTI fills its buffers: by time."""
    out: list[tuple[int, SimpleNamespace]] = []
    b = rec.batch
    kinds = {KERNEL: gpu_records.CUPTI_KIND_CONCURRENT_KERNEL,
             MEMCPY: gpu_records.CUPTI_KIND_MEMCPY,
             gpu_records.MEMSET: gpu_records.CUPTI_KIND_MEMSET}
    o = b.ops
    for i in range(len(o)):
        r = SimpleNamespace(kind=kinds[int(o.kind[i])], start=int(o.start[i]),
                            end=int(o.end[i]), correlation_id=int(o.correlation[i]),
                            device_id=int(o.device[i]), context_id=int(o.context[i]),
                            stream_id=int(o.stream[i]))
        if o.kind[i] == KERNEL:
            r.name = b.names.name(int(o.name[i]))
            for col, attr in (("grid_x", "grid_x"), ("grid_y", "grid_y"), ("grid_z", "grid_z"),
                              ("block_x", "block_x"), ("block_y", "block_y"),
                              ("block_z", "block_z"), ("registers", "registers_per_thread"),
                              ("static_smem", "static_shared_memory"),
                              ("dynamic_smem", "dynamic_shared_memory")):
                setattr(r, attr, int(getattr(o, col)[i]))
        else:
            r.bytes, r.copy_kind = int(o.bytes[i]), int(o.copy_kind[i])
            r.src_kind, r.dst_kind, r.value = int(o.src_kind[i]), int(o.dst_kind[i]), 0
        out.append((int(o.end[i]), r))
    a = b.api
    for i in range(len(a)):
        out.append((int(a.end[i]), SimpleNamespace(
            kind=gpu_records.CUPTI_KIND_RUNTIME if a.domain[i] == gpu_records.RUNTIME
            else gpu_records.CUPTI_KIND_DRIVER, start=int(a.start[i]), end=int(a.end[i]),
            correlation_id=int(a.correlation[i]), cbid=int(a.cbid[i]),
            thread_id=int(a.thread[i]), process_id=0)))
    out.sort(key=lambda item: item[0])
    return [r for _t, r in out]


def with_evaluation(name: str, repeats: int, gap_ns: int = 5_000_000) -> Recording:
    """Recording ``name`` with an evaluation after training: the last iteration's GPU
    operations ``repeats`` times more, back to back, ``gap_ns`` after the last iteration
    ended and after the GPU finished, each launched by the loop thread (its own launching
    call, new correlation ids) outside any iteration."""
    rec = read_recording(str(DATA / name / "cupti_activity.json.gz"))
    trace = read_trace(str(DATA / name / "agent_trace.json"))
    ops, api = rec.batch.ops, rec.batch.api
    last = int(trace.meta["clock"]["perf_counter_ns_at_start"]) + max(
        r.t1 for r in trace.ranges if r.category == range_names.ITERATION)
    pairs = rec.clock
    slope = (pairs.cupti_ns[-1] - pairs.cupti_ns[0]) / (pairs.perf_ns[-1] - pairs.perf_ns[0])
    last_cupti = int(pairs.cupti_ns[0] + (last - pairs.perf_ns[0]) * slope)
    per_iteration = len(ops) // 15
    template = ops.take(np.argsort(ops.start, kind="stable")[-per_iteration:])
    by_corr = np.argsort(api.correlation, kind="stable")
    calls = api.take(by_corr[np.searchsorted(api.correlation[by_corr], template.correlation)])
    assert np.array_equal(calls.correlation, template.correlation)
    dur = template.end - template.start
    n = per_iteration * repeats
    start = max(last_cupti, int(ops.end.max())) + gap_ns + np.cumsum(
        np.tile(dur + 2_000, repeats)) - np.tile(dur + 2_000, repeats)[0]
    corr = int(max(ops.correlation.max(), api.correlation.max())) + 1 + np.arange(n)
    new_ops = template.take(np.tile(np.arange(per_iteration), repeats))
    new_ops.start, new_ops.end, new_ops.correlation = start, start + np.tile(dur, repeats), corr
    new_api = calls.take(np.tile(np.arange(per_iteration), repeats))
    new_api.start, new_api.end, new_api.correlation = start - 8_000, start - 3_000, corr
    batch = gpu_records.ActivityBatch(gpu_records.GpuOps.concat([ops, new_ops]),
                                      gpu_records.ApiCalls.concat([api, new_api]),
                                      rec.batch.external, rec.batch.names)
    return Recording(batch, rec.clock, rec.external_names, rec.description)


def replay_clock(start_ns: int, end_ns: int) -> Callable[[], int]:
    """The recorded process's clock for the tracer: its start first, then its end."""
    calls = [0]

    def clock() -> int:
        calls[0] += 1
        return start_ns if calls[0] == 1 else end_ns

    return clock


@dataclass
class LiveReplay:
    name: str
    trace: Trace               # the recorded process's own trace
    recording: Recording
    session: gpu_session.GpuSession
    outcome: gpu_session.GpuOutcome | None
    stats: Any                 # RunStats at exit
    path: Path                 # the trace written by the live writer
    main_thread: int           # CUPTI's id of the recorded loop thread
    reader: str = "python"
    served: int = 0            # records the tests' libcupti handed over (native)


def replay_live(name: str, out_dir: Path, *, buffers: int = 12, block_rows: int = 64,
                record_limit: int = 200_000, summary: bool = False,
                collector_records: Callable[[Recording], list[Any]] = as_cupti_records,
                pace_s: float = 0.1, window: bool = False,
                recording: Recording | None = None, reader: str = "python") -> LiveReplay:
    """Replay recording ``name`` (its CUPTI records: ``recording`` when given) through the
    live path and write its trace in ``out_dir`` (``reader``: ``python`` or ``native``, see
    the module docstring)."""
    trace = read_trace(str(DATA / name / "agent_trace.json"))
    rec = recording if recording is not None else read_recording(
        str(DATA / name / "cupti_activity.json.gz"))
    meta = trace.meta
    start = int(meta["clock"]["perf_counter_ns_at_start"])
    end = start + int(meta["clock"]["duration_ns"])
    path = out_dir / f"{name}.json"
    cfg = from_environ({}, overrides={"trace": str(path), "granularity": "link",
                                      "warmup": int(meta["warmup_skip"]), "summary": summary,
                                      "record_limit": record_limit, "gpu_activity": True,
                                      "gc": False, "flush_interval": 0})
    tracer = Tracer(range_names.GRANULARITY_LEVEL["link"], SyncPolicy(0, CountingBackend()),
                    clock=replay_clock(start, end))
    tracer.sync.add_devices([0])
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)
    # the recorded names, as the tracer made them in that process
    recorded_names, rows = trace.range_rows()
    index = np.array([tracer.info(n, c).index for n, c in recorded_names], dtype=np.int64)
    (tid, block), = rows.items()
    block = block.copy()
    block[:, 0] = index[block[:, 0]]
    main_thread = int(np.bincount(np.unique(rec.batch.api.thread, return_inverse=True)[1])
                      .argmax())
    main_thread = int(np.unique(rec.batch.api.thread)[main_thread])
    collector_box: list[CuptiCollector] = []

    def start_collector(on_batch: Callable[..., None], names: Any) -> CuptiCollector:
        collector = CuptiCollector(on_batch, names=names)
        collector._pairs = [tuple(int(x) for x in row) for row in zip(
            rec.clock.cupti_ns, rec.clock.perf_ns, rec.clock.read_ns)]
        collector.running = True
        collector_box.append(collector)
        return collector

    fake = None
    if reader == "native":
        from cupti_fake import FakeCupti

        fake = FakeCupti(rec, out_dir)
        start = gpu_session.start_cupti  # as the agent starts it
    else:
        start = start_collector
    session = gpu_session.GpuSession(recorder, record_limit=record_limit,
                                     warmup_skip=recorder.warm_skip, window=window,
                                     main_tid=tid, start_collector=start)
    tracer.on_new_thread = session.thread_started  # the agent's composition
    recorder.gpu_handover = session.handover
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path) if fake else None,
                  cupti_readers.ENV_CUPTI_READER: reader}):
        session.start()  # as at CuPy's import
    assert session.state == "running", session.why_off
    if fake is not None:  # the recorded pairs too: the records lie between them
        session.collector._pairs[:0] = [tuple(int(x) for x in row) for row in zip(
            rec.clock.cupti_ns, rec.clock.perf_ns, rec.clock.read_ns)]
    # the recorded loop thread's state was made in that process: its id as told then
    session._threads.append((main_thread, tid))
    if fake is not None:
        fake.serve(buffers, pace_s)
        feeder = threading.Thread(target=fake.wait, name="cupti-replay-wait")
    else:
        records = collector_records(rec)
        cut = np.linspace(0, len(records), buffers + 1).astype(int)

        def cupti_thread() -> None:  # hands over buffers as CUPTI's own thread does
            for i in range(buffers):
                collector_box[0]._buffer_completed(records[cut[i]:cut[i + 1]])
                time.sleep(pace_s)

        feeder = threading.Thread(target=cupti_thread, name="cupti-replay")
    feeder.start()
    for i in range(0, len(block), block_rows):  # the loop thread's blocks, as it fills them
        recorder._absorb(tid, [tuple(row) for row in block[i:i + block_rows].tolist()])
        time.sleep(pace_s * buffers * block_rows / max(1, len(block)))
    feeder.join()
    tracer.close()
    outcome = session.finish()
    stats = report_run(recorder, tracer, cfg, hits=1, trace_path=lambda: str(path),
                       gpu=outcome)
    return LiveReplay(name, trace, rec, session, outcome, stats, path, main_thread, reader,
                      fake.served if fake is not None else 0)


@contextlib.contextmanager
def environ(values: dict[str, str | None]) -> Iterator[None]:
    """Environment variables set (a value) or unset (None) for a ``with`` block."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def counted_only(data: dict[str, Any]) -> dict[str, Any]:
    """A trace's JSON cut to its counted iterations (the span the agent's GPU figures cover,
    for HolisticTraceAnalysis): their ``ProfilerStep#N`` marks, and the GPU operations, calls
    and flows of the launches inside them; every other event as it is."""
    skip = data["otherData"]["chainer_autoprof"]["warmup_skip"]
    events = data["traceEvents"]
    steps = [e for e in events if trace_events.kind_of(e) is trace_events.PROFILER_STEPS]
    counted = [e for e in steps if int(e["name"].split("#")[1]) >= skip]
    t0 = min(e["ts"] for e in counted)
    t1 = max(e["ts"] + e["dur"] for e in counted)
    launches = (trace_events.CUDA_DRIVER, trace_events.CUDA_RUNTIME)
    launched = {(e.get("args") or {}).get("correlation") for e in events
                if trace_events.kind_of(e) in launches and t0 <= e["ts"] <= t1}
    kept = []
    for e in events:
        kind = trace_events.kind_of(e)
        if kind is trace_events.PROFILER_STEPS:
            if e in counted:
                kept.append(e)
        elif kind in trace_events.GPU_KINDS:
            if e.get("id", (e.get("args") or {}).get("correlation")) in launched:
                kept.append(e)
        else:
            kept.append(e)
    return {**data, "traceEvents": kept}


def hta_figures(trace_json: dict[str, Any], folder: Path) -> dict[str, Any]:
    """HolisticTraceAnalysis on a trace (its counted iterations): its steps, the temporal
    breakdown's busy and active shares, and the idle-time breakdown by category (us)."""
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank0.json").write_text(json.dumps(counted_only(trace_json)))
    ta = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    temporal = ta.get_temporal_breakdown(visualize=False)
    idle, _stats = ta.get_idle_time_breakdown(visualize=False)
    row = temporal.iloc[0]
    return {"steps": ta.get_profiler_steps(),
            "busy": row["compute_time(us)"] / row["kernel_time(us)"],
            "active": 1 - row["idle_time(us)"] / row["kernel_time(us)"],
            "idle_us": row["idle_time(us)"],
            "idle": {r["idle_category"]: r["idle_time"]
                     for r in idle[["idle_category", "idle_time"]].to_dict("records")}}


def hta_as_written(path: Path, folder: Path) -> dict[str, Any]:
    """HolisticTraceAnalysis on a trace as written, as a user calls it (default options):
    its steps, and its temporal and idle-time breakdowns, each checked to hold."""
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank0.json").write_text(path.read_text())
    ta = TraceAnalysis(trace_dir=str(folder))
    temporal = ta.get_temporal_breakdown(visualize=False)
    idle, _stats = ta.get_idle_time_breakdown(visualize=False)
    row = temporal.iloc[0]
    assert row["kernel_time(us)"] > 0 and row["compute_time(us)"] > 0
    assert abs(idle["idle_time"].sum() - row["idle_time(us)"]) <= 0.01 * row["idle_time(us)"]
    return {"steps": ta.get_profiler_steps(), "temporal": row, "idle": idle}


#: HolisticTraceAnalysis's idle categories -> the agent's idle causes that make each.
HTA_IDLE = {"host_wait": ("host", "between iterations"), "kernel_wait": ("launch",),
            "other": ("other",)}


def idle_shares(ours: dict[str, float], hta: dict[str, float]
                ) -> dict[str, tuple[float, float]]:
    """Each HTA idle category's share of the idle time, HTA's and the agent's (its causes
    that make the category; copies are no idle time to HTA)."""
    mine = {k: sum(ours.get(c, 0.0) for c in causes) for k, causes in HTA_IDLE.items()}
    total_mine, total_hta = sum(mine.values()) or 1.0, sum(hta.values()) or 1.0
    return {k: (hta.get(k, 0.0) / total_hta, mine[k] / total_mine) for k in HTA_IDLE}


def short(link_key: str) -> str:
    """``predictor/conv1 (Convolution2D) @gpu0`` -> ``conv1``, as the recording names links."""
    return link_key.split(" (")[0].split(" @")[0].split("/")[-1]


def forward_kernel_time_by_link(analysis: Any, recording: Recording
                                ) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Each link's forward kernel time (ns) as the agent attributed it (by launch), as the
    recording's external ids attribute it, and where both agree on the kernel."""
    records = analysis.records()
    ext = dict(zip(recording.batch.external.correlation.tolist(),
                   recording.batch.external.external_id.tolist()))
    ours: Counter[str] = Counter()
    theirs: Counter[str] = Counter()
    both: Counter[str] = Counter()
    k = records.ops.kind == KERNEL
    dur = (records.ops.end - records.ops.start)[k]
    for corr, ns, link, bwd in zip(records.ops.correlation[k].tolist(), dur.tolist(),
                                   records.attr.link[k].tolist(),
                                   records.attr.backward[k].tolist()):
        mine = short(analysis.link_keys[link]) if link >= 0 and not bwd else None
        recorded = recording.external_names.get(ext[corr]) if corr in ext else None
        if mine:
            ours[mine] += ns
        if recorded:
            theirs[recorded] += ns
        if mine and mine == recorded:
            both[mine] += ns
    return ours, theirs, both
