"""The trace so far: written in the background while ranges are recorded, read back exactly.

In-process, with real threads: the tracer and recorder record ranges on
several threads while the flusher writes the partial trace from another,
as the monitor thread does in a run.  Every range must reach the file once:
none lost between a buffer copy and its aggregation, none written twice.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from chainer_autoprof.analysis.stall import odd_one_out, position
from chainer_autoprof.common.settings import Config
from chainer_autoprof.lifecycle.flusher import Flusher
from chainer_autoprof.report import partial as partial_format
from chainer_autoprof.report.compare import main as report_main
from chainer_autoprof.report.partial import read_partial
from chainer_autoprof.runtime.device import NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder


def _tracer(tmp_path, limit: int, chunk: int) -> tuple[Tracer, Recorder, Flusher]:
    tracer = Tracer(1, SyncPolicy(0, NullBackend()))
    cfg = Config({"summary": True, "trace": str(tmp_path / "run.json"), "record_limit": limit,
                  "warmup": 0})
    recorder = Recorder(cfg, tracer, chunk_ranges=chunk)
    tracer.add_sink(recorder)
    flusher = Flusher(recorder, lambda: str(tmp_path / "run.json"), limit,
                      lambda: {"pid": 1, "clock": {"perf_counter_ns_at_start": tracer.start_ns,
                                                   "unix_time_ns_at_start": 0},
                               "settings": {"record_limit": limit}})
    return tracer, recorder, flusher


def _work(tracer: Tracer, n: int) -> None:
    outer = tracer.info("iteration", "iteration")
    inner = tracer.info("forward", "forward")
    ts = tracer.state()
    for _ in range(n):
        tok = tracer.begin(outer, ts)
        tracer.end(tracer.begin(inner, ts), ts)
        tracer.end(tok, ts)


def test_every_range_reaches_the_partial_trace_once(tmp_path):
    tracer, _recorder, flusher = _tracer(tmp_path, limit=1_000_000, chunk=97)
    done = threading.Event()

    def keep_flushing() -> None:
        while not done.is_set():
            flusher.flush(None, [])
            time.sleep(0.0005)

    writer = threading.Thread(target=keep_flushing)
    writer.start()
    workers = [threading.Thread(target=_work, args=(tracer, 3000)) for _ in range(3)]
    for w in workers:
        w.start()
    _work(tracer, 3000)
    for w in workers:
        w.join()
    done.set()
    writer.join()
    path = flusher.flush(None, [])
    assert path == str(tmp_path / "run.json.partial")
    events = [e for e in read_partial(path)["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 4 * 3000 * 2
    per_thread: dict[int, list] = {}
    for e in events:
        per_thread.setdefault(e["tid"], []).append((e["ts"], e["dur"], e["name"]))
    assert len(per_thread) == 4
    for rows in per_thread.values():
        assert len(rows) == len(set(rows)) == 6000  # none twice
        assert sum(name == "iteration" for _t, _d, name in rows) == 3000


def test_the_file_stays_bounded_and_keeps_the_newest(tmp_path):
    tracer, recorder, flusher = _tracer(tmp_path, limit=1000, chunk=64)
    for _ in range(20):
        _work(tracer, 200)  # 400 ranges between two writes
        flusher.flush(None, [])
    path = tmp_path / "run.json.partial"
    assert path.stat().st_size < 3 * 1000 * 32 + 64 * 1024
    data = read_partial(str(path))
    events = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert 1000 <= len(events) <= 2000 + 64
    newest = max(e["ts"] + e["dur"] for e in events)  # microseconds since the start
    recorded = [block for _tid, block in recorder.retained] + \
        [block for _tid, block in recorder.pending_blocks()]
    last_end = max(int(block[:, 2].max()) for block in recorded)
    assert abs(newest * 1000 - (last_end - tracer.start_ns)) < 1
    assert data["otherData"]["chainer_autoprof"]["dropped_ranges"] > 0
    flusher.discard()
    assert not path.exists()


def _snap(rank: int, iteration: int, *ranges: tuple[str, str]) -> dict:
    return {"rank": rank, "pid": 100 + rank, "iteration": iteration, "in_iteration": True,
            "threads": [{"name": "MainThread", "main": True, "loop": True,
                         "open": [{"name": n, "category": c, "open_s": 3.0} for n, c in ranges]}]}


ALLREDUCE = (("iteration", "iteration"), ("update", "update"),
             ("comm:multi_node_mean_grad", "comm"))


def test_odd_one_out_rules():
    data = (("iteration", "iteration"), ("data", "data"))
    # the ranks in a collective wait for the one that is elsewhere
    found = odd_one_out([position(_snap(r, 7, *ALLREDUCE)) for r in (0, 2, 3)]
                        + [position(_snap(1, 7, *data))])
    assert [p.rank for p in found.odd] == [1] and found.rule == "majority"
    assert found.others_in == "comm:multi_node_mean_grad"
    # one rank went into the collective, the others never left their data phase
    found = odd_one_out([position(_snap(r, 7, *data)) for r in (0, 2, 3)]
                        + [position(_snap(1, 7, *ALLREDUCE))])
    assert [p.rank for p in found.odd] == [1] and found.others_in == "data"
    # two ranks: the one outside the collective holds the other
    found = odd_one_out([position(_snap(0, 7, *ALLREDUCE)), position(_snap(1, 7, *data))])
    assert [p.rank for p in found.odd] == [1] and found.rule == "comm"
    # two ranks, an iteration apart, neither in a collective
    found = odd_one_out([position(_snap(0, 8, *data)),
                         position(_snap(1, 7, ("iteration", "iteration"),
                                        ("forward", "forward")))])
    assert [p.rank for p in found.odd] == [1] and found.rule == "behind"
    # the majority's place, finer ranges (links, gc) ignored
    found = odd_one_out([position(_snap(0, 7, ("iteration", "iteration"), ("forward", "forward"),
                                        ("l1 (Linear)", "link"))),
                         position(_snap(1, 7, ("iteration", "iteration"), ("forward", "forward"),
                                        ("gc gen 2", "gc"))),
                         position(_snap(2, 7, ("iteration", "iteration"),
                                        ("backward", "backward")))])
    assert [p.rank for p in found.odd] == [2] and found.rule == "majority"
    # all in the same place, or two ranks in two places: nobody to name
    assert odd_one_out([position(_snap(r, 7, *ALLREDUCE)) for r in (0, 1)]) is None
    assert odd_one_out([position(_snap(0, 7, ("iteration", "iteration"), ("data", "data"))),
                        position(_snap(1, 7, ("iteration", "iteration"),
                                       ("forward", "forward")))]) is None


def _report(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report_main(argv)
    return code, out.getvalue(), err.getvalue()


def _through_a_pipe(data: bytes) -> str:
    """A path that reads ``data`` from a pipe (``report <(zcat run.json.partial.gz)``)."""
    read, write = os.pipe()

    def feed() -> None:
        with os.fdopen(write, "wb") as f:
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return f"/dev/fd/{read}"


def test_report_reads_a_trace_or_a_trace_so_far_from_a_pipe(tmp_path):
    """The first bytes say which kind of file it is: a pipe is read once, whichever it is."""
    tracer, _recorder, flusher = _tracer(tmp_path, limit=100_000, chunk=64)
    _work(tracer, 200)
    partial = Path(flusher.flush(None, []))
    final = json.dumps(read_partial(str(partial))).encode()
    for data in (partial.read_bytes(), final):
        path = _through_a_pipe(data)
        try:
            code, out, err = _report([path])
        finally:
            os.close(int(path.rsplit("/", 1)[1]))
        assert code == 0, err
        assert "200 counted" in out


@pytest.mark.parametrize("record", [
    partial_format.json_record(b"META", ["not", "an", "object"]),
    partial_format.json_record(b"NAME", [[0, "iteration"]]),
    partial_format.json_record(b"THRD", {"tid": 1}),
    partial_format.json_record(b"STAT", "written"),
    partial_format.json_record(b"META", {"pid": 1, "clock": "now"}),
    partial_format.rows_records(1, [[0, 2000, 1000, 0]])[0],  # ends before it begins
])
def test_a_damaged_trace_so_far_is_one_line(tmp_path, record):
    tracer, _recorder, flusher = _tracer(tmp_path, limit=100_000, chunk=64)
    _work(tracer, 20)
    path = Path(flusher.flush(None, []))
    path.write_bytes(path.read_bytes() + record)
    code, out, err = _report([str(path)])
    assert (code, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and str(path) in err, err
    assert "internal error" not in err and "Traceback" not in err
