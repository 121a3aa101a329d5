"""One trace-event codec: the final trace, the trace so far and merge write and read events alike,
and a new kind of event plugs in as one class (the GPU tracks to come)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from chainer_autoprof.analysis.shapes import MAX_US, TEXT, Number
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.lifecycle.flusher import Flusher
from chainer_autoprof.report import trace_events
from chainer_autoprof.report.compare import main as report_main
from chainer_autoprof.report.merge import main as merge_main
from chainer_autoprof.report.partial import read_partial
from chainer_autoprof.report.trace_events import EventKind, Timeline, dumps, fixed3, register
from chainer_autoprof.report.tracefile import ThreadRanges, read_trace, write_trace
from chainer_autoprof.runtime.device import NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder


def _record(tmp_path, limit: int = 100_000) -> tuple[Tracer, Recorder, Flusher]:
    tracer = Tracer(1, SyncPolicy(0, NullBackend()))
    cfg = Config({"summary": True, "trace": str(tmp_path / "run.json"), "record_limit": limit,
                  "warmup": 0})
    recorder = Recorder(cfg, tracer, chunk_ranges=50)
    tracer.add_sink(recorder)
    flusher = Flusher(recorder, lambda: str(tmp_path / "run.json"), limit,
                      lambda: {"pid": 1, "main_tid": threading.main_thread().native_id,
                               "process_name": "train.py (pid 1)",
                               "clock": {"perf_counter_ns_at_start": tracer.start_ns,
                                         "unix_time_ns_at_start": 0}})
    iteration = tracer.info(names.ITERATION, names.ITERATION)
    forward = tracer.info("forward", names.FORWARD)
    ts = tracer.state()
    for _ in range(70):
        tok = tracer.begin(iteration, ts)
        tracer.end(tracer.begin(forward, ts), ts)
        tracer.end(tok, ts)
    return tracer, recorder, flusher


def test_the_final_trace_and_the_trace_so_far_hold_the_same_events(tmp_path):
    """Both go through the codec: the same ranges give the same events, to the nanosecond."""
    tracer, recorder, flusher = _record(tmp_path)
    partial = flusher.flush(None, [])
    blocks, _mark = recorder.retained_since(0)
    per_thread: dict[int, list[Any]] = {}
    for tid, block in blocks + recorder.pending_blocks():
        per_thread.setdefault(tid, []).append(block)
    names_ = {ts.tid: ts.thread_name for ts in tracer.states.values()}
    final = tmp_path / "final.json"
    written = write_trace(str(final), pid=1, start_ns=tracer.start_ns, infos=recorder.infos,
                          threads=[ThreadRanges(tid, names_[tid], b) for tid, b in
                                   per_thread.items()],
                          other={}, process_name="train.py (pid 1)",
                          main_tid=threading.main_thread().native_id)
    assert written == 140
    events = json.loads(final.read_text())["traceEvents"]
    assert read_partial(partial)["traceEvents"] == events
    assert [r.name for r in read_trace(str(final)).ranges[:4]] == ["iteration", "forward"] * 2


class Instant:
    """A made-up event for the test: a named instant on the main thread."""

    def __init__(self, t_ns: int, text: str) -> None:
        self.t_ns, self.text = t_ns, text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instant) and (self.t_ns, self.text) == (other.t_ns, other.text)


class Instants(EventKind[Instant]):
    """Instant events (``ph: "i"``): how a GPU track would plug in, in a dozen lines."""

    name, ph, key, doc, read = "instant", "i", None, "a named instant", True

    def encode(self, items: list[Instant], timeline: Timeline) -> Iterator[str]:
        for item in items:
            yield dumps({"ph": "i", "s": "t", "name": item.text, "pid": timeline.pid, "tid": 7,
                         "ts": float(fixed3(item.t_ns - timeline.start_ns))})

    def decode(self, ev: dict[str, Any], where: str) -> Instant:
        ts = Number(-MAX_US, MAX_US).check(ev.get("ts"), f"{where}: ts")
        return Instant(round(ts * 1000), TEXT.check(ev.get("name"), f"{where}: name"))


@pytest.fixture
def instants():
    kind = register(Instants())
    yield kind
    del trace_events.KINDS[(kind.ph, kind.key)]


def test_a_new_event_kind_is_written_read_back_and_merged(instants, tmp_path):
    start = 10**12
    rows = np.array([[0, start + 1_000, start + 9_000, 1 << 16]], dtype=np.int64)
    path = tmp_path / "t.json"
    record = {"pid": os.getpid(), "clock": {"perf_counter_ns_at_start": start,
                                            "unix_time_ns_at_start": 0}}
    write_trace(str(path), pid=os.getpid(), start_ns=start, other=record,
                infos=[(names.ITERATION, names.ITERATION, 0xFFFFF100)], process_name="p",
                threads=[ThreadRanges(7, "MainThread", [rows])],
                tracks=[(instants, [Instant(start + 4_321, "launch")])])
    trace = read_trace(str(path))
    assert trace.events == {"instant": [Instant(4_321, "launch")]}
    assert [(r.name, r.t0, r.t1) for r in trace.ranges] == [(names.ITERATION, 1_000, 9_000)]
    assert report_main([str(path), "--no-advice"]) == 0

    merged = tmp_path / "m.json"
    assert merge_main([str(path), "-o", str(merged), "-q"]) == 0
    events = json.loads(merged.read_text())["traceEvents"]
    moved = [ev for ev in events if ev["ph"] == "i"]
    assert len(moved) == 1 and moved[0]["pid"] == 1 and moved[0]["name"] == "launch"
    assert moved[0]["ts"] == pytest.approx(4.321)  # the one input is the merged timeline's zero


def test_a_damaged_event_of_a_new_kind_is_one_line(instants, tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "i", "name": 5, "ts": 1.0}]}))
    assert report_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "event 0: name is 5, not a string" in err


def test_kinds_are_told_apart_by_phase_and_name_or_category():
    assert trace_events.kind_of({"ph": "M", "name": "thread_name"}) is trace_events.THREAD_NAME
    assert trace_events.kind_of({"ph": "X", "cat": "forward"}) is trace_events.RANGES
    assert trace_events.kind_of({"ph": "M", "name": "something else"}) is None
    assert trace_events.kind_of({"ph": "s"}) is None  # carried by merge as it is
    with pytest.raises(ValueError, match="registered already"):
        register(trace_events.Ranges())
