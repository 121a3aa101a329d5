"""The GPU timeline in the trace: Kineto's conventions, read by HolisticTraceAnalysis, by the
Chrome/Perfetto JSON rules and by the agent's own reader; read back into the same figures."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from gpu_live_replay import hta_as_written, idle_shares
from traces import check_trace_file, nest_per_track

from chainer_autoprof.analysis.gpu_clock import fit
from chainer_autoprof.common import names
from chainer_autoprof.common.gpu_records import ClockPairs, NameTable, read_recording
from chainer_autoprof.report import gpu_events, gpu_replay
from chainer_autoprof.report.trace_events import GpuEventKind, Timeline, dumps, kind_of
from chainer_autoprof.report.tracefile import open_trace, read_trace

DATA = Path(__file__).resolve().parent / "data" / "gpu" / "cupti"
RECORDINGS = ("b512", "b16")


def combined(name: str, tmp: Path, counted_only: bool):
    """The agent trace of the recorded process with the GPU events written into it."""
    source = DATA / name / "agent_trace.json"
    trace = read_trace(str(source))
    analysis = gpu_replay.replay(trace, read_recording(str(DATA / name / "cupti_activity.json.gz")))
    span = gpu_replay.counted_span(trace) if counted_only else None
    data = gpu_replay.with_gpu_events(open_trace(str(source)), trace, analysis, span=span)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "rank0.json"
    path.write_text(json.dumps(data, allow_nan=False))
    return trace, analysis, data, path


@pytest.mark.parametrize("name", RECORDINGS)
def test_trace_with_gpu_events_follows_the_viewers_rules(name, tmp_path):
    trace, analysis, data, path = combined(name, tmp_path, counted_only=False)
    events = json.loads(path.read_text())["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M", "s", "f")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["name"], str)
    nest_per_track(events)
    # every track is named; the GPUs are processes of their own, streams their threads
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named = {(e["pid"], e["tid"]) for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} <= named
    assert {e["pid"] for e in slices} <= named_pids
    kernels = [e for e in slices if e["cat"] == "kernel"]
    assert len(kernels) == int((analysis.records().ops.kind == 0).sum())
    assert {e["pid"] for e in kernels} == {gpu_events.gpu_pid(trace.pid, 0)}
    assert {e["args"]["stream"] for e in kernels} == {e["tid"] for e in kernels} == {7}
    # flows: each launch's call to its first GPU operation, both ends on a slice's start
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == len(analysis.records())
    slice_starts = {(e["pid"], e["tid"], e["ts"]) for e in slices}
    for corr, s in starts.items():
        f = ends[corr]
        assert s["cat"] == f["cat"] == "ac2g" and f["bp"] == "e"
        assert (s["pid"], s["tid"], s["ts"]) in slice_starts
        assert (f["pid"], f["tid"], f["ts"]) in slice_starts
    # the calls sit on the launching thread's track, inside the range that launched them
    calls = [e for e in slices if e["cat"] in ("cuda_runtime", "cuda_driver")]
    assert {e["tid"] for e in calls} == {trace.meta["main_tid"]}
    assert {e["name"] for e in calls} >= {"cuLaunchKernel", "cudaMemcpyAsync"}
    # the launching ranges carry the External id their kernels carry
    gpu_ops = [e for e in slices if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    ids = {e["args"]["External id"] for e in gpu_ops} - {-1}
    ranges = [e for e in slices if e["pid"] == trace.pid and "depth" in e.get("args", {})]
    assert ids == {e["args"]["External id"] for e in ranges if "External id" in e["args"]}
    # Kineto's top-level fields
    assert data["distributedInfo"]["rank"] == 0 and data["schemaVersion"] == 1
    assert data["deviceProperties"] == [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    assert data["baseTimeNanoseconds"] == trace.meta["clock"]["unix_time_ns_at_start"]


@pytest.mark.parametrize("name", RECORDINGS)
def test_each_gpu_event_is_written_as_its_kinds_compact_strict_json(name):
    """The per-operation events are made as JSON texts directly (a full trace holds
    ``record_limit`` of them): each is exactly the compact strict JSON of the event it
    reads back as, of the kind it is written under."""
    trace = read_trace(str(DATA / name / "agent_trace.json"))
    analysis = gpu_replay.replay(trace, read_recording(str(DATA / name / "cupti_activity.json.gz")))
    _names, rows = trace.range_rows()
    built = gpu_events.for_trace(analysis, trace.meta, pid=trace.pid, start_ns=0,
                                 rows_by_thread=rows, loop_tid=trace.meta.get("main_tid"))
    written = 0
    for kind, items in built.tracks:
        if not isinstance(kind, GpuEventKind):
            continue  # the tracks' names: the codec's metadata kinds
        for text in kind.encode(items, Timeline(trace.pid, 0)):
            event = json.loads(text)
            assert text == dumps(event), text
            assert kind_of(event) is kind, text
            written += 1
    assert written > 4 * len(analysis.records()) - 10


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_agents_reader_sees_its_ranges_unchanged(name, tmp_path):
    """The GPU events are told apart by :func:`gpu_events.is_gpu_event`; without them the
    trace reads back exactly as before, and its ranges still pass the viewers' checks."""
    trace, _analysis, data, _path = combined(name, tmp_path, counted_only=False)
    original = open_trace(str(DATA / name / "agent_trace.json"))["traceEvents"]
    ours = [e for e in data["traceEvents"] if not gpu_events.is_gpu_event(e)]
    theirs = [e for e in data["traceEvents"] if gpu_events.is_gpu_event(e)]
    assert len(ours) == len(original) and len(theirs) > 4 * 1000
    for before, after in zip(original, ours):
        args = dict(after.get("args") or {})
        args.pop("External id", None)
        assert {**after, "args": args} == before or after == before
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps({**data, "traceEvents": ours}))
    check_trace_file(stripped)
    assert read_trace(str(stripped)).stats() == trace.stats()


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_saved_trace_gives_back_the_same_figures(name, tmp_path):
    """report on a saved trace: its GPU events, read back, go through the same attribution
    and give the same figures as the live analysis."""
    trace, analysis, _data, path = combined(name, tmp_path, counted_only=False)
    live = analysis.finish().to_dict()
    saved = open_trace(str(path))
    # the agent's reader takes the ranges (the GPU events routed apart), ...
    ranges_only = tmp_path / "ranges.json"
    ranges_only.write_text(json.dumps({**saved, "traceEvents": [
        e for e in saved["traceEvents"] if not gpu_events.is_gpu_event(e)]}))
    # ... the GPU events come back as activity on the agent's clock and threads
    start = trace.meta["clock"]["perf_counter_ns_at_start"]
    batch = gpu_events.activity_from_events(saved["traceEvents"], start, NameTable())
    assert len(batch.ops) == len(analysis.records())
    identity = fit(ClockPairs.from_rows([(0, 0)]))
    again = gpu_replay.analyse(read_trace(str(ranges_only)), [batch], identity, batch.names,
                               identity_threads=True).finish().to_dict()
    live.pop("clock")
    again.pop("clock")
    assert again == live


@pytest.mark.parametrize("name", RECORDINGS)
def test_holistic_trace_analysis_reads_the_trace(name, tmp_path):
    """HolisticTraceAnalysis loads the trace, finds the counted iterations by their
    ProfilerStep marks, runs its temporal and idle-time breakdowns, and over the same span
    its GPU busy share is within 5 points of ours, and so is each idle category's share
    (host wait, kernel wait, other: the agent's split follows HTA's rules)."""
    hta = pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (it comes with the test extra: "
               "pip install -e '.[test]')")
    logging.getLogger("hta").setLevel(logging.ERROR)
    trace, analysis, _data, path = combined(name, tmp_path / "traces", counted_only=True)
    figures = analysis.finish()
    ta = hta.TraceAnalysis(trace_dir=str(path.parent), include_last_profiler_step=True)
    counted = list(range(trace.meta["warmup_skip"], 15))
    assert ta.get_profiler_steps() == counted
    temporal = ta.get_temporal_breakdown(visualize=False)
    idle, _stats = ta.get_idle_time_breakdown(visualize=False)
    row = temporal.iloc[0]
    # the same span: HTA's from the first to the last kernel of the counted iterations
    assert row["kernel_time(us)"] == pytest.approx(figures.span_ms * 1000, rel=0.01)
    hta_active = 1 - row["idle_time(us)"] / row["kernel_time(us)"]
    assert abs(hta_active - figures.active_share) < 0.05
    assert abs(row["compute_time(us)"] / row["kernel_time(us)"] - figures.busy_share) < 0.05
    assert set(idle["stream"]) == {7} and idle["idle_time"].sum() == pytest.approx(
        row["idle_time(us)"], rel=0.01)
    # the idle time splits alike: host wait, kernel wait (launch latency), other
    hta_idle = {r["idle_category"]: r["idle_time"]
                for r in idle[["idle_category", "idle_time"]].to_dict("records")}
    shares = idle_shares(figures.idle_ms, hta_idle)
    for category, (theirs, ours) in shares.items():
        assert abs(theirs - ours) < 0.05, (category, shares)
    dominant = "host_wait" if name == "b16" else "kernel_wait"
    assert shares[dominant][1] > 0.9
    print(f"{name}: HTA busy {hta_active:.4f} (compute "
          f"{row['compute_time(us)'] / row['kernel_time(us)']:.4f}), ours busy "
          f"{figures.busy_share:.4f} active {figures.active_share:.4f}; HTA idle "
          f"{idle[['idle_category', 'idle_time']].to_dict('records')}")


def test_an_iteration_without_its_gpu_work_gets_no_profiler_step(tmp_path):
    """A ProfilerStep is written only over an iteration whose GPU operations the trace holds:
    with iteration 7's operations gone from the recording, its step is gone too, and
    HolisticTraceAnalysis's breakdowns still run on the trace."""
    pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (it comes with the test extra: "
               "pip install -e '.[test]')")
    source = DATA / "b16" / "agent_trace.json"
    trace = read_trace(str(source))
    rec = read_recording(str(DATA / "b16" / "cupti_activity.json.gz"))
    start = trace.meta["clock"]["perf_counter_ns_at_start"]  # ranges: ns since the start
    iterations = sorted((r.t0, r.t1) for r in trace.ranges if r.category == names.ITERATION)
    t0, t1 = (start + t for t in iterations[7])
    api = rec.batch.api
    launch = dict(zip(api.correlation.tolist(), fit(rec.clock).to_agent(api.start).tolist()))
    ops = rec.batch.ops
    keep = np.array([not t0 <= launch.get(c, -1) <= t1 for c in ops.correlation.tolist()])
    assert (~keep).sum() > 50
    rec.batch.ops = ops.take(keep)
    analysis = gpu_replay.replay(trace, rec)
    data = gpu_replay.with_gpu_events(open_trace(str(source)), trace, analysis)
    steps = [e["name"] for e in data["traceEvents"] if e.get("cat") == "user_annotation"]
    assert steps == [f"ProfilerStep#{i}" for i in range(15) if i != 7]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    assert hta_as_written(path, tmp_path / "hta")["steps"] == [i for i in range(14) if i != 7]
