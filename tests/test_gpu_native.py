"""The native CUPTI reader (``runtime/cupti_native.c``): CUPTI's buffers walked in C, served by
the tests' libcupti (``tests/cupti_fake``) from the real recordings as CUPTI's record structs,
on that library's own thread -- the exact live path, without a GPU.  The figures it leads to
are those of the cupti-python reader (the per-link times and busy shares of
``test_gpu_live.py`` run on both readers)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cupti_fake import FakeCupti, stream_entries
from gpu_live_replay import DATA, environ, replay_live, short
from keeper_reference import attributed_ops
from support import native_under_test

from chainer_autoprof.common import gpu_records as gr
from chainer_autoprof.common.gpu_records import ActivityBatch, GpuOps, read_recording
from chainer_autoprof.runtime import cupti_native, cupti_readers, gpu_activity
from chainer_autoprof.runtime.hotpath import build

RECORDINGS = ("b512", "b16")


# the run for a machine that cannot build C (CHAINER_AUTOPROF_TEST_NATIVE=0) skips these, as
# the native hot path's tests
pytestmark = pytest.mark.skipif(
    not native_under_test(),
    reason="native extensions are not under test (CHAINER_AUTOPROF_TEST_NATIVE=0)")


@pytest.fixture(scope="module", autouse=True)
def extension():
    """The native reader, built in place."""
    build.build_cupti_in_place()
    return cupti_native.load_extension()


def recording(name: str):
    return read_recording(str(DATA / name / "cupti_activity.json.gz"))


def collect(name: str, folder: Path, *, pieces: int = 5, entries=None, on_batch=None,
            system_ids: bool = False, calls: str | None = "all"):
    """Start the native reader as the agent does on the tests' libcupti serving ``name``
    (or ``entries``), CUPTI recording ``calls`` (None: as by default); every batch it hands
    over, the collector and the library."""
    rec = recording(name)
    fake = FakeCupti(rec, folder, system_ids=system_ids, entries=entries)
    batches: list[ActivityBatch] = []
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: None, cupti_native.ENV_CUPTI_CALLS: calls}):
        got = cupti_readers.start(on_batch or batches.append)
    assert not isinstance(got, str), got
    fake.serve(pieces, 0.0)
    fake.wait()
    assert got.stop(5.0) is None
    return rec, batches, got, fake


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_operation_comes_as_recorded_with_the_call_that_launched_it(name, tmp_path):
    rec, batches, collector, fake = collect(name, tmp_path)
    assert collector.reader == f"native ({fake.path})"
    assert isinstance(collector, cupti_native.NativeCuptiCollector)
    assert len(batches) == 5  # one per buffer the library handed over
    ops = GpuOps.concat([b.ops for b in batches])
    api = gr.ApiCalls.concat([b.api for b in batches])
    want = rec.batch.ops.take(np.lexsort((rec.batch.ops.correlation, rec.batch.ops.end)))
    got = ops.take(np.lexsort((ops.correlation, ops.end)))
    assert len(got) == len(want)
    for column in GpuOps.columns():  # each field the recording holds (-1: it has none)
        theirs = getattr(want, column)
        held = theirs != -1
        assert np.array_equal(getattr(got, column)[held], theirs[held]), column
    names = batches[0].names
    assert [names.name(i) for i in got.name[got.kind == gr.KERNEL]] == \
        [rec.batch.names.name(i) for i in want.name[want.kind == gr.KERNEL]]
    # the calls handed over: exactly one per launch, as recorded; the others stay in C
    assert sorted(api.correlation.tolist()) == sorted(set(ops.correlation.tolist()))
    recorded = {c: i for i, c in enumerate(rec.batch.api.correlation.tolist())}
    at = np.array([recorded[c] for c in api.correlation.tolist()])
    for column in gr.ApiCalls.columns():
        assert np.array_equal(getattr(api, column), getattr(rec.batch.api, column)[at]), column
    # every record of the enabled kinds and calls was read, none was left incomplete
    quiet = np.isin(rec.batch.api.cbid, [17, 16, 10, 11, 317, 200]) & \
        (rec.batch.api.domain == gr.RUNTIME) | \
        np.isin(rec.batch.api.cbid, [677, 629, 9, 304]) & (rec.batch.api.domain == gr.DRIVER)
    assert collector.records == fake.served == len(rec.batch.ops) + int((~quiet).sum())
    assert collector.buffers == 5 and collector.ops == len(rec.batch.ops)
    assert collector.incomplete == collector.callback_errors == 0
    calls_read = collector.records - collector.ops
    assert collector.api_handed == len(api) == len(set(ops.correlation.tolist()))
    assert len(api) < 0.6 * calls_read


def test_each_buffer_brings_a_clock_pair_read_as_it_completed(tmp_path):
    """The extension reads a clock pair as each buffer completes (CUPTI's clock between two
    reads of perf_counter's, before the GIL is waited for) and hands it over with the buffer:
    one pair per buffer, read while the buffers were served, its CUPTI time the one the
    library's clock gives at the pair's perf_counter time, within the pair's own read time."""
    rec = recording("b16")
    fake = FakeCupti(rec, tmp_path)
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: None}):
        collector = cupti_readers.start(lambda batch: None)
    assert not isinstance(collector, str), collector
    before = time.perf_counter_ns()
    fake.serve(4, 0.002)
    fake.wait()
    after = time.perf_counter_ns()
    assert collector.stop(5.0) is None
    served = [p for p in collector.pair_rows() if before <= p[1] <= after]
    assert len(served) == 4 == collector.buffers
    # the library's clock: the line through the recording's first and last pair
    c0, p0 = int(rec.clock.cupti_ns[0]), int(rec.clock.perf_ns[0])
    c1, p1 = int(rec.clock.cupti_ns[-1]), int(rec.clock.perf_ns[-1])
    drift = ((c1 - c0) - (p1 - p0)) / (p1 - p0)
    for cupti, perf, read in served:
        assert 0 <= read < 50_000_000
        assert abs(cupti - (c0 + (perf - p0) * (1 + drift))) <= read / 2 + 1_000


def test_a_failing_clock_read_loses_no_buffer(tmp_path):
    """Where CUPTI's clock fails as a buffer completes, the buffer still comes (without a
    clock pair: the map keeps the pairs it has), every operation in it, no error counted."""
    rec = recording("b16")
    fake = FakeCupti(rec, tmp_path)
    batches: list[ActivityBatch] = []
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: None}):
        collector = cupti_readers.start(batches.append)
    assert not isinstance(collector, str), collector
    pairs = len(collector.pair_rows())  # the start's
    fake.clock_fails(True)
    fake.serve(3, 0.0)
    fake.wait()
    fake.clock_fails(False)
    assert collector.stop(5.0) is None
    assert len(batches) == 3 == collector.buffers
    assert sum(b.op_count for b in batches) == len(rec.batch.ops)
    assert collector.callback_errors == 0
    assert len(collector.pair_rows()) == pairs + 1  # the end's only


def _table_rows(column: np.ndarray) -> int:
    """How many rows the extension's table behind ``column`` has room for."""
    block = column
    while isinstance(block, np.ndarray):
        block = block.base
    return memoryview(block).nbytes // 8 // len(GpuOps.columns())


def test_every_size_of_table_holds_the_same_rows(tmp_path):
    """The walk is compiled for each fixed size of table (powers of two) and for any other (a
    buffer larger than the sizes): small buffers and one buffer of 48 runs' records give
    every operation, as recorded, with its call."""
    from dataclasses import replace

    rec = recording("b16")
    b = rec.batch
    step = int(max(b.ops.correlation.max(), b.api.correlation.max())) + 1
    copies = range(48)  # the run 48 times over, each copy's ids after the previous ones
    ops = GpuOps.concat([replace(b.ops.take(slice(None)), correlation=b.ops.correlation
                                 + j * step) for j in copies])
    api = gr.ApiCalls.concat([replace(b.api.take(slice(None)), correlation=b.api.correlation
                                      + j * step) for j in copies])
    long_run = replace(rec, batch=ActivityBatch(ops, api, b.external, b.names))
    rows_seen = set()
    for buffer_bytes in (64 << 10, 32 << 20):
        fake = FakeCupti(long_run, tmp_path / str(buffer_bytes))
        batches: list[ActivityBatch] = []
        with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path)}):
            collector = cupti_native.start(batches.append, buffer_bytes=buffer_bytes)
        assert not isinstance(collector, str), collector
        fake.serve(1, 0.0)
        fake.wait()
        assert collector.stop(5.0) is None and collector.callback_errors == 0
        rows_seen |= {_table_rows(batch.ops.start) for batch in batches}
        got = GpuOps.concat([batch.ops for batch in batches])
        calls = gr.ApiCalls.concat([batch.api for batch in batches])
        order = np.lexsort((got.correlation, got.end))
        want_order = np.lexsort((ops.correlation, ops.end))
        for column in GpuOps.columns():  # each field the recording holds (-1: it has none)
            theirs = getattr(ops, column)[want_order]
            held = theirs != -1
            assert np.array_equal(getattr(got, column)[order][held], theirs[held]), column
        names = batches[0].names
        assert [names.name(i) for i in got.name[order].tolist()] == \
            [b.names.name(i) for i in ops.name[want_order].tolist()]
        assert sorted(calls.correlation.tolist()) == sorted(ops.correlation.tolist())
    fixed = {r for r in rows_seen if r & (r - 1) == 0 and r <= 1 << 18}
    assert fixed and max(rows_seen) > 1 << 18, rows_seen


def test_the_calls_that_launch_nothing_are_switched_off_in_cupti(extension):
    """The noisy calls are turned off by CUPTI's own per-call switch (by callback id), as
    the cupti-python reader does by name: they are never recorded, let alone read."""
    assert set(extension.RUNTIME_CBIDS) == set(gpu_activity.QUIET_RUNTIME)
    assert set(extension.DRIVER_CBIDS) == set(gpu_activity.QUIET_DRIVER)
    assert extension.RUNTIME_CBIDS["cudaGetDevice_v3020"] == 17
    assert extension.DRIVER_CBIDS["cuGetProcAddress_v2"] == 677


def _launching(rec, extension) -> np.ndarray:
    """Which of the recording's API records are calls that put work on a stream."""
    api = rec.batch.api
    return (np.isin(api.cbid, extension.RUNTIME_LAUNCH_CBIDS) & (api.domain == gr.RUNTIME)) | \
        (np.isin(api.cbid, extension.DRIVER_LAUNCH_CBIDS) & (api.domain == gr.DRIVER))


@pytest.mark.parametrize("name,calls", [(r, None) for r in RECORDINGS] + [("b16", "launches")])
def test_cupti_records_only_the_launching_calls_by_default(name, calls, tmp_path, extension):
    """By default (or CHAINER_AUTOPROF_CUPTI_CALLS=launches) the API kinds stay off and only
    the calls that put work on a stream are switched on, so CUPTI records no other call (its
    tracing of every call is what a host-bound model pays for); every operation still gets
    its call."""
    rec, batches, collector, fake = collect(name, tmp_path, calls=calls)
    assert collector.reader == f"native ({fake.path}); only the launching calls recorded"
    launching = _launching(rec, extension)
    ops = GpuOps.concat([b.ops for b in batches])
    api = gr.ApiCalls.concat([b.api for b in batches])
    assert len(ops) == len(rec.batch.ops)
    # what CUPTI recorded: the operations and the launching calls, nothing else
    assert collector.records == fake.served == len(ops) + int(launching.sum())
    assert int(launching.sum()) < 0.1 * len(rec.batch.api)
    # each operation's call among them, handed over once
    assert sorted(api.correlation.tolist()) == sorted(set(ops.correlation.tolist()))
    assert set(api.correlation.tolist()) <= set(
        rec.batch.api.correlation[launching].tolist())


@pytest.mark.parametrize("calls", [None, "all"])
def test_switched_off_cupti_records_nothing_and_on_again_as_before(calls, tmp_path, extension):
    """Outside a capture window CUPTI is switched off (``record(False)``): every kind and
    every launching call off in libcupti, so what the program runs then is not traced at all;
    switched on again, the operations and their calls are recorded as from the start."""
    rec = recording("b16")
    fake = FakeCupti(rec, tmp_path)
    batches: list[ActivityBatch] = []
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: None, cupti_native.ENV_CUPTI_CALLS: calls}):
        collector = cupti_readers.start(batches.append)
    assert not isinstance(collector, str), collector
    ops_kinds = {gr.CUPTI_KIND_CONCURRENT_KERNEL, gr.CUPTI_KIND_MEMCPY, gr.CUPTI_KIND_MEMSET}
    launch = (gr.CUPTI_KIND_DRIVER, int(extension.DRIVER_LAUNCH_CBIDS[0]))
    on = fake.enabled_kinds, fake.call_recorded(*launch)
    assert ops_kinds <= on[0] and on[1]
    entries = stream_entries(rec)
    third = len(entries) // 3
    is_op = np.isin(entries["kind"], list(ops_kinds))

    collector.record(False)
    assert fake.enabled_kinds == set() and not fake.call_recorded(*launch)
    fake.run(third)
    assert fake.served == 0 and not batches
    collector.record(True)
    assert (fake.enabled_kinds, fake.call_recorded(*launch)) == on
    fake.run(third)
    collector.record(False)
    collector.record(False)  # idempotent
    fake.run(-1)  # the rest
    assert collector.stop(5.0) is None
    ops = GpuOps.concat([b.ops for b in batches])
    middle = entries[third:2 * third]
    assert sorted(ops.correlation.tolist()) == sorted(
        middle["f"][is_op[third:2 * third], 2].tolist())
    handed = gr.ApiCalls.concat([b.api for b in batches])
    assert set(handed.correlation.tolist()) <= set(ops.correlation.tolist())
    assert fake.enabled_kinds == set()


def test_a_libcupti_that_switches_no_call_on_records_every_call_and_says_so(tmp_path):
    with environ({"CUPTI_FAKE_NO_CALL_SWITCH": "1"}):
        rec, _batches, collector, fake = collect("b16", tmp_path, pieces=1, calls=None)
    assert collector.reader == (f"native ({fake.path}); libcupti switches no single call "
                                "on: every call recorded")
    assert collector.calls == "all"
    assert fake.served > 2 * len(rec.batch.ops)  # the other calls recorded again
    assert collector.api_handed == len(set(rec.batch.ops.correlation.tolist()))


def test_an_unknown_choice_of_calls_is_one_line():
    with environ({cupti_native.ENV_CUPTI_CALLS: "some"}):
        got = cupti_readers.start(lambda batch: None)
    assert got == f"{cupti_native.ENV_CUPTI_CALLS}='some': accepted all or launches"


def test_an_operation_before_its_call_still_gets_it(tmp_path):
    """CUPTI's buffers need not keep a launch before its kernel: an operation whose call
    comes in a later buffer waits for it in C and gets it handed over when it comes."""
    rec = recording("b16")
    entries = stream_entries(rec)
    api = np.isin(entries["kind"], [gr.CUPTI_KIND_RUNTIME, gr.CUPTI_KIND_DRIVER])
    reordered = np.concatenate([entries[~api], entries[api]])  # every call after every op
    _, batches, _, _ = collect("b16", tmp_path, pieces=2, entries=reordered)
    assert len(batches[0].ops) == len(rec.batch.ops)  # every op in the first buffer
    later = batches[1].api  # calls that came in a later buffer than their operation
    handed = gr.ApiCalls.concat([b.api for b in batches])
    assert len(later) > 100 and len(batches[1].ops) == 0
    assert sorted(handed.correlation.tolist()) == sorted(set(rec.batch.ops.correlation.tolist()))


def test_a_buffer_is_handed_on_as_the_readers_tables_and_read_whole_in_c(tmp_path, extension):
    """The native reader hands each buffer on as the two tables it wrote (a TableBatch):
    their columns are made only when read; the C kernels take the tables whole and keep,
    join and map the same calls and times as from those columns, the operations' table
    taken only with the block of their mapped times (its own times are CUPTI's)."""
    from chainer_autoprof.analysis.gpu_attribution import _BLOCK_ROWS
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.analysis.stats import PHASE_KEYS

    rec, batches, _collector, _fake = collect("b16", tmp_path, pieces=2)
    batch = batches[0]
    assert isinstance(batch, gr.TableBatch) and batch._ops is None and batch._api is None
    n = batch.op_count
    assert n > 0 and batch.api_count > 0 and batch._ops is None  # counted, nothing made
    ops, api = batch.ops, batch.api
    assert (len(ops), len(api)) == (n, batch.api_count)
    clock = fit(rec.clock)
    blocks = []
    for tables in (True, False):
        store = extension.api_store(1 << 16)
        extension.api_add(store, batch.api_table if tables else (
            api.domain, api.start, api.end, api.correlation, api.cbid, api.thread), clock)
        block = np.full((len(_BLOCK_ROWS), n), -7, dtype=np.int64)
        got = extension.join_block(store, clock, batch.op_table if tables else (
            ops.correlation, ops.start, ops.end), block)
        blocks.append((got, block))
    assert blocks[0][0] == blocks[1][0] and blocks[0][0][0] == 0  # every call found
    assert np.array_equal(blocks[0][1], blocks[1][1])
    # the buffer's calls handed to the join itself: kept, then joined, in the one call
    store = extension.api_store(1 << 16)
    block = np.full((len(_BLOCK_ROWS), n), -7, dtype=np.int64)
    got = extension.join_block(store, clock, batch.op_table, block, batch.api_table)
    assert got == blocks[0][0] and np.array_equal(block, blocks[0][1])
    assert extension.join_block(store, clock, batch.op_table, block, None) == got  # kept
    attr_cols = tuple(np.zeros(n, dtype=np.int64) for _ in range(8))
    with pytest.raises(ValueError, match="takes its block"):
        extension.figure_add(extension.kernel_table(16), batch.op_table, attr_cols,
                             np.zeros((1, 5), dtype=np.int64),
                             np.zeros((len(PHASE_KEYS), 3), dtype=np.int64), (0, 1, 2), -1,
                             None, np.empty((n, 7), dtype=np.int64))

@pytest.mark.parametrize("name,calls", [(r, "all") for r in RECORDINGS] + [("b16", "launches")])
def test_the_native_reader_gives_the_figures_of_the_python_one(name, calls, tmp_path):
    """The same recording through both readers, each on the live path: the same operations,
    attributed to the same ranges, the same per-link times and busy share (also where the
    native reader has CUPTI record only the launching calls)."""
    runs = {}
    for reader in ("python", "native"):
        (tmp_path / reader).mkdir()
        with environ({cupti_native.ENV_CUPTI_CALLS: calls}):
            runs[reader] = replay_live(name, tmp_path / reader, reader=reader, pace_s=0.01)
    py, nat = (runs[r].outcome.figures for r in ("python", "native"))
    assert runs["native"].session.reader.startswith("native (")
    assert nat.ops == py.ops and nat.iterations == py.iterations
    assert nat.statuses.keys() == py.statuses.keys() == {"attributed"}
    assert nat.busy_share == pytest.approx(py.busy_share, rel=1e-6)
    per = {reader: {short(x["name"]): (x["fwd_ms"], x["bwd_ms"]) for x in fig.links}
           for reader, fig in (("python", py), ("native", nat))}
    assert per["native"].keys() == per["python"].keys()
    for link, (fwd, bwd) in per["python"].items():  # within ns: the clock pairs read live
        assert per["native"][link] == pytest.approx((fwd, bwd), rel=1e-6, abs=5e-6), link
    kept = {r: runs[r].outcome.analysis.records() for r in runs}
    order = {r: np.lexsort((kept[r].ops.correlation, kept[r].ops.start)) for r in runs}
    for column in ("range", "link", "backward", "phase", "iteration"):
        assert np.array_equal(getattr(kept["native"].attr, column)[order["native"]],
                              getattr(kept["python"].attr, column)[order["python"]]), column


def test_a_failing_consumer_is_counted_and_cuptis_thread_goes_on(tmp_path):
    calls = []

    def broken(batch):
        calls.append(threading.current_thread().name)
        raise RuntimeError("consumer bug")

    _, _, collector, _ = collect("b16", tmp_path, pieces=3, on_batch=broken)
    assert len(calls) == 3 and collector.callback_errors == 3
    assert "consumer bug" in collector.last_error
    # handed over by the collector's stop, on its thread: CUPTI's (the library's) thread
    # never entered Python (it would be a "Dummy" thread there)
    assert calls == ["chainer_autoprof-cupti-stop"] * 3


def test_buffers_waiting_for_python_are_bounded_and_what_goes_is_counted(tmp_path, extension):
    """Walked buffers wait in C for the drain, their tables' bytes bounded: a drain that does
    not come (here: none until the stop) costs the newest buffers' operations, each counted
    (``queue_dropped_ops``, in the run record's collector counts), never memory."""
    rec = recording("b16")
    fake = FakeCupti(rec, tmp_path)
    seen: list[ActivityBatch] = []
    limit = 100 << 10  # bytes of rows: a few of the ten buffers (350 KiB in all)
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path)}):
        collector = cupti_native.start(seen.append, waiting_bytes=limit)
    assert not isinstance(collector, str), collector
    fake.serve(10, 0.0)
    fake.wait()
    assert 0 < extension.waiting() < 10
    assert collector.stop(5.0) is None
    handed = sum(len(b.ops) for b in seen)
    assert collector.queue_dropped_ops > 0 and handed + collector.queue_dropped_ops == \
        len(rec.batch.ops)
    rows = sum(len(b.ops) * len(GpuOps.columns()) + len(b.api) * 6 for b in seen) * 8
    assert rows <= limit
    assert extension.counts()["unread"] == 10 - len(seen)


def test_once_closed_a_late_buffer_is_freed_unread(tmp_path, extension):
    """A buffer CUPTI hands over after the collector closed (a last flush given up at exit)
    never calls into Python."""
    rec = recording("b16")
    fake = FakeCupti(rec, tmp_path)
    seen: list[ActivityBatch] = []
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path)}):
        collector = cupti_readers.start(seen.append)
    assert not isinstance(collector, str)
    extension.close()  # what stop() does last, whether or not CUPTI's flush came back
    fake.serve(2, 0.0)
    fake.wait()
    assert seen == [] and extension.counts()["unread"] == 2
    assert collector.stop(5.0) is None


def test_which_reader_runs_is_chosen_in_one_place_and_said(tmp_path):
    fake = FakeCupti(recording("b16"), tmp_path)
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(tmp_path / "no-libcupti.so"),
                  cupti_readers.ENV_CUPTI_READER: None}):
        got = cupti_readers.start(lambda batch: None)
    # no libcupti: the cupti-python reader is tried (and is not installed here)
    assert isinstance(got, str) and "cupti-python" in got and "\n" not in got
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(tmp_path / "no-libcupti.so"),
                  cupti_readers.ENV_CUPTI_READER: "native"}):
        got = cupti_readers.start(lambda batch: None)
    assert isinstance(got, str) and got.startswith("libcupti could not be loaded from ")
    with environ({cupti_readers.ENV_CUPTI_READER: "fast"}):
        got = cupti_readers.start(lambda batch: None)
    assert got == f"{cupti_readers.ENV_CUPTI_READER}='fast': accepted native or python"
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: "python"}):
        got = cupti_readers.start(lambda batch: None)
    assert isinstance(got, str) and "cupti-python" in got
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path),
                  cupti_readers.ENV_CUPTI_READER: None}):
        got = cupti_readers.start(lambda batch: None)
    assert not isinstance(got, str) and got.reader == \
        f"native ({fake.path}); only the launching calls recorded"
    assert got.stop(5.0) is None


def test_system_thread_ids_where_cupti_gives_them(tmp_path):
    _, _, collector, _ = collect("b16", tmp_path, pieces=1, system_ids=True)
    assert collector.system_thread_ids
    _, _, collector, _ = collect("b16", tmp_path, pieces=1, system_ids=False)
    assert not collector.system_thread_ids


def test_without_a_gpu_the_real_libcupti_says_so_in_one_line():
    """The nvidia-cuda-cupti wheel's libcupti on a machine without a CUDA driver."""
    found = [p for p in cupti_native.libcupti_candidates() if "/nvidia/" in p]
    if not found:
        pytest.skip("no nvidia-cuda-cupti wheel installed")
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a CUDA driver")
    except OSError:
        pass
    with environ({cupti_native.ENV_CUPTI_LIBRARY: None, cupti_readers.ENV_CUPTI_READER: None}):
        got = cupti_readers.start(lambda batch: None)
    assert isinstance(got, str) and got.startswith("no CUDA driver for CUPTI") and "\n" not in got


def test_a_buffer_is_walked_while_the_training_holds_the_gil(tmp_path, extension):
    """CUPTI's thread never takes the GIL: while this thread keeps it (a Python loop, no
    switch for 30 s), CUPTI's thread reads every record of a buffer and queues its tables;
    they reach Python when a thread of ours takes them (``hand_over``, the drain's)."""
    rec = recording("b512")
    fake = FakeCupti(rec, tmp_path)
    seen: list[ActivityBatch] = []
    with environ({cupti_native.ENV_CUPTI_LIBRARY: str(fake.path)}):
        collector = cupti_readers.start(seen.append)
    assert not isinstance(collector, str)
    fake.prepare(1)
    expected = fake.served
    switch = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        fake.serve(1, 0.0, prepared=True)
        deadline = time.perf_counter() + 10.0
        while extension.waiting() < 1 and time.perf_counter() < deadline:
            pass  # Python bytecode: the GIL stays with this thread
        walked, queued, handed = extension.walked(), extension.waiting(), len(seen)
    finally:
        sys.setswitchinterval(switch)
    fake.wait()
    assert (walked, queued, handed) == (expected, 1, 0)
    collector.hand_over()
    assert extension.waiting() == 0
    assert len(seen) == 1 and len(seen[0].ops) == len(rec.batch.ops)
    assert collector.stop(5.0) is None


def test_the_benchmark_measures_every_segment_of_both_readers():
    """benchmarks/gpu_activity.py's measured process, without callgrind (its counts are then
    no-ops): every segment runs, on the records both readers were served."""
    import subprocess

    from support import REPO, clean_env

    paths = os.pathsep.join(str(REPO / d) for d in ("", "tests", "benchmarks"))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_activity.py"),
                           "--child", "b16"], env=clean_env(PYTHONPATH=paths), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    segments = [line.split()[1:3] for line in proc.stdout.splitlines()
                if line.startswith("segment ")]
    labels = [label for label, _n in segments]
    for run in ("native-live", "native-trainer", "native-12", "native-x10", "launches-live",
                "python-live", "python-12", "python-x10", "native-limit"):
        assert [f"read:{run}", f"attribute:{run}", f"finish:{run}"] == \
            [x for x in labels if x.endswith(f":{run}") and not x.startswith("launches:")]
    served = {label: int(n) for label, n in segments}
    assert served["read:native-live"] == served["read:python-live"] == \
        served["read:native-trainer"] > 4000
    assert served["read:native-x10"] == 10 * served["read:native-live"] == \
        served["read:native-limit"]
    # the launching calls alone: the same operations, under three records in four
    assert 1000 < served["read:launches-live"] < 0.75 * served["read:native-live"]
    ops = {line.split()[1]: int(line.split()[3]) for line in proc.stdout.splitlines()
           if line.startswith("segment read:")}
    assert ops["read:launches-live"] == ops["read:native-live"] > 1000
    assert labels[-9:] == ["thread:off", "thread:on"] * 4 + ["launches:native-x10"]


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/gpu_activity.py as a module (its ``Primed`` replays, in this process)."""
    from support import REPO

    from chainer_autoprof.lifecycle import gpu_session

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_activity
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    # (the benchmark's process drains by hand: its setting undone for the tests after this)
    monkeypatch.setattr(gpu_session, "DRAIN_INTERVAL_S", gpu_session.DRAIN_INTERVAL_S)
    return gpu_activity


def test_the_benchmarks_trainer_run_puts_operations_between_iterations(tmp_path, extension,
                                                                       bench):
    """benchmarks/gpu_activity.py's ``trainer`` buffer is what it stands for: the same
    operations as the live one, every iteration kept, a few operations of each iteration
    but the last now outside any iteration, between iterations; C groups it (the live
    one's: the usual runs)."""
    cache: dict[str, object] = {}
    seen = []
    for between in (0.0, bench.TRAINER_SHARE):
        primed = bench.Primed("b16", "native", tmp_path / str(between), cache, 1, 200_000,
                              between)
        primed.fake.prepare(1)
        primed.hand_over(1)
        assert primed.session._drain_safely()
        keeper = primed.session.analysis.keeper
        keeper._settle()
        it = np.concatenate([block.items.attr.iteration for block in keeper.blocks])
        seen.append((len(it), int((it < 0).sum()), len(np.unique(it[it >= 0])),
                     int(np.count_nonzero(np.diff(it))) + 1))
        primed.session.stop()
        found = extension.keeper_runs((it, np.full(len(it), 5, dtype=np.int64)))
        assert len(found) == (5 if between else 8)  # C's groups, or the usual runs
    (ops, outside, iterations, runs), (ops_t, outside_t, iterations_t, runs_t) = seen
    assert ops_t == ops and iterations_t == iterations == 15 and runs == iterations + 1
    assert 2 * iterations <= outside_t - outside <= 5 * iterations  # some 3 an iteration
    assert runs_t > 2 * (iterations - 1)  # an outside run after most iterations


# -- the attribution's range lookup in C (runtime/cupti_locate.c) and its NumPy twin --------
def _attributed(analysis):
    kept = analysis.records()
    order = np.lexsort((kept.ops.start, kept.ops.correlation))
    return {c: getattr(kept.attr, c)[order] for c in kept.attr.columns()}


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_range_lookup_in_c_attributes_as_its_numpy_twin(name, extension, monkeypatch):
    """Both lookups on a recording, whole and cut into buffers that come shuffled: every
    operation's columns and every figure alike (the live session uses C where built)."""
    import functools
    import random

    from chainer_autoprof.analysis.gpu_analysis import GpuAnalysis
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.report import gpu_replay
    from chainer_autoprof.report.tracefile import read_trace

    trace = read_trace(str(DATA / name / "agent_trace.json"))
    rec = recording(name)
    pieces = rec.batch.split(17)
    random.Random(3).shuffle(pieces)
    for batches in ([rec.batch], pieces):
        runs = []
        for kernel in (None, extension.locate):
            monkeypatch.setattr(gpu_replay, "GpuAnalysis",
                                functools.partial(GpuAnalysis, locate=kernel))
            runs.append(gpu_replay.analyse(trace, batches, fit(rec.clock), rec.batch.names))
        numpy_run, native = runs
        assert numpy_run.attributor.locate is None and native.attributor.locate is not None
        assert numpy_run.finish().to_dict() == native.finish().to_dict()
        a, b = _attributed(numpy_run), _attributed(native)
        assert len(a["range"]) == len(rec.batch.ops)
        for column, values in a.items():
            assert np.array_equal(values, b[column]), column
        assert (b["link"] >= 0).sum() > len(rec.batch.ops) // 2  # links found, not all -1


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_usual_buffer_in_c_is_attributed_as_numpys(name, extension, monkeypatch):
    """Buffers as CUPTI hands them over live (each with the calls of its operations, in
    order), the launching thread mapped and its ranges fed: each is mapped, joined, located
    and settled in C as one table (two calls, no general path), and every operation's
    columns, the statuses' ops and GPU time and every figure are NumPy's."""
    from chainer_autoprof.analysis.gpu_analysis import GpuAnalysis
    from chainer_autoprof.analysis.gpu_attribution import LaunchAttributor
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.report.tracefile import read_trace

    trace = read_trace(str(DATA / name / "agent_trace.json"))
    rec = recording(name)
    ops, api = rec.batch.ops, rec.batch.api
    ops = ops.take(np.argsort(ops.correlation, kind="stable"))
    launched = api.take(np.isin(api.correlation, ops.correlation))
    launched = launched.take(np.argsort(launched.correlation, kind="stable"))
    cuts = [len(ops) * i // 6 for i in range(7)]
    buffers = []
    for a, b in zip(cuts[:-1], cuts[1:]):  # each buffer: its operations and their calls
        part = ops.take(slice(a, b))
        buffers.append(ActivityBatch(part, launched.take(np.isin(
            launched.correlation, part.correlation)), gr.ExternalIds.empty(), rec.batch.names))
    threads, counts = np.unique(launched.thread, return_counts=True)
    general = []
    join = LaunchAttributor._join_api
    monkeypatch.setattr(LaunchAttributor, "_join_api", lambda self, force: (
        general.append(self.locate), join(self, force))[1])
    runs = []
    for kernel in (None, extension.locate):
        analysis = GpuAnalysis(fit(rec.clock), rec.batch.names, int(trace.meta["warmup_skip"]),
                               loop_tid=trace.meta["main_tid"], locate=kernel)
        range_names, rows = trace.range_rows()
        for i, (range_name, category) in enumerate(range_names):
            analysis.add_name(i, range_name, category)
        analysis.map_thread(int(threads[counts.argmax()]), trace.meta["main_tid"])
        for tid, block in rows.items():
            analysis.feed_ranges(tid, block)
        for batch in buffers:
            analysis.feed_activity(batch)
        runs.append(analysis)
    numpy_run, native = runs
    assert native.attributor.native is not None and extension.locate not in general
    want, got = numpy_run.finish().to_dict(), native.finish().to_dict()
    assert got["statuses"]["attributed"]["ops"] == len(rec.batch.ops)
    assert got == want
    a, b = _attributed(numpy_run), _attributed(native)
    for column, values in a.items():
        assert np.array_equal(values, b[column]), column
    assert (b["link"] >= 0).sum() > len(rec.batch.ops) // 2  # links found, not all -1


def _nested_ranges(seed: int, touching: bool = False
                   ) -> tuple[list[str], list[tuple[int, int, int, int]], np.ndarray]:
    """Random nested ranges of every kind on one thread, in end order (names' categories,
    rows), and launches: sorted then shuffled, in ranges, on their edges and outside any
    (``touching``: a range may start where the one before it at its depth ends)."""
    import random

    from chainer_autoprof.analysis.stats import DEPTH_BITS
    from chainer_autoprof.common import names as range_names

    categories = [range_names.ITERATION, *range_names.PHASES, range_names.LINK,
                  range_names.LINK_BACKWARD, range_names.GC, range_names.FUNCTION, "user"]
    rng = random.Random(seed)
    rows: list[tuple[int, int, int, int]] = []

    def nest(t0: int, t1: int, depth: int) -> None:
        t = t0
        while depth < 7 and t < t1 - 40:
            a = t + rng.randrange(0 if touching else 1, 20)
            b = min(t1 - 1, a + rng.randrange(5, max(6, (t1 - a) // 2)))
            if b <= a:
                break
            index = rng.randrange(len(categories) + 3)  # the last three: unknown names
            nest(a, b, depth + 1)
            number = (len(rows) + 1) if index == 0 else 0
            rows.append((index, a, b, depth | (number << DEPTH_BITS)))
            t = b

    nest(0, 200_000, 0)
    for depth in range(30):  # and one deep chain, each range in the one before
        rows.append((rng.randrange(len(categories) + 3), 300_000 + 97 * depth,
                     400_000 - 89 * depth, depth))
    rows.sort(key=lambda r: r[2])
    launches = np.array([rng.randrange(-50, 200_050) for _ in range(3000)]
                        + [rng.randrange(299_000, 401_000) for _ in range(1000)]
                        + [r[1] for r in rows] + [r[2] for r in rows], dtype=np.int64)
    launches = np.concatenate([np.sort(launches), launches[rng.sample(range(len(launches)),
                                                                      len(launches))]])
    return categories, rows, launches


def test_the_range_lookup_in_c_on_nested_ranges_of_every_kind(extension):
    """Random nested ranges of every kind (garbage collection passed over for its parent,
    names the attribution does not know), launches out of order, on a range's edges and
    outside any: the C lookup writes what NumPy's does."""
    from chainer_autoprof.analysis.gpu_attribution import (
        LOCATE_KINDS,
        AttributedOps,
        LaunchAttributor,
        _unlocated,
    )
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.common.gpu_records import ClockPairs

    assert tuple(extension.LOCATE_KINDS) == LOCATE_KINDS
    categories, rows, launches = _nested_ranges(11)
    got = []
    for kernel in (None, extension.locate):
        att = LaunchAttributor(fit(ClockPairs.from_rows([(0, 0)])), 2, locate=kernel)
        for i, category in enumerate(categories):
            att.add_name(i, f"{category}-{i}", category)
        att.feed_ranges(1, rows)
        ops = GpuOps.from_columns(len(launches), {
            "kind": np.zeros(len(launches)), "start": launches, "end": launches + 5})
        attr = _unlocated(len(launches), 0, {"api_start": launches.copy(),
                                              "tid": np.ones(len(launches))})
        out = att._locate(1, att.threads[1], AttributedOps(ops, attr), open_known=True)
        got.append(out.attr)
    numpy_run, native = got
    assert (numpy_run.range >= 0).sum() > 1000 and (numpy_run.link >= 0).sum() > 100
    assert (numpy_run.iteration >= 0).sum() > 100 and (numpy_run.phase >= 0).sum() > 100
    assert numpy_run.range_depth.max() > 16
    for column in numpy_run.columns():
        assert np.array_equal(getattr(numpy_run, column), getattr(native, column)), column


def test_the_clock_fit_in_c_equals_numpys_to_the_bit(extension):
    """The live session refits the clock with each buffer in C: on pairs one, two, a few and
    thousands (past NumPy's pairwise blocks), out of order, with equal CUPTI times and with
    reads unknown, every field of the map is NumPy's fit's exactly."""
    import random

    from chainer_autoprof.analysis.gpu_clock import ClockMap, fit
    from chainer_autoprof.common.gpu_records import ClockPairs

    rng = random.Random(7)
    checked = 0
    for n in (1, 2, 3, 7, 8, 9, 17, 127, 128, 129, 300, 4096):
        for _ in range(12):
            base = rng.randrange(1 << 60)
            rows = []
            for i in range(n):
                c = base + i * rng.randrange(1, 10**9) if rng.random() < 0.9 else \
                    base + rng.randrange(10**12)
                rows.append((c, c + rng.randrange(-10**6, 10**6) + 12_345,
                             rng.choice([-1, rng.randrange(10**4)])))
            if n > 2 and rng.random() < 0.3:
                rows = [(base, p, r) for _c, p, r in rows]  # one CUPTI time: offset alone
            assert ClockMap(*extension.clock_fit(rows)) == fit(ClockPairs.from_rows(rows))
            checked += 1
    assert checked == 144
    with pytest.raises(ValueError):
        extension.clock_fit([])


@pytest.mark.parametrize("seed", [11, 12])
def test_the_lookup_of_a_ready_buffer_settles_as_numpy_does(extension, seed):
    """Where every range around the launches is known (the usual buffer), the C walk goes
    launch by launch (a launch in the previous one's deepest range searches only below it)
    and settles each operation: on random nested ranges, launches sorted and shuffled,
    part of them before the thread's horizon, every column NumPy's attribution writes,
    into columns left unset, and the sums per status."""
    from chainer_autoprof.analysis.gpu_attribution import (
        ATTRIBUTED,
        PHASE_OTHER,
        PHASE_OUTSIDE,
        RANGES_DROPPED,
        AttributedOps,
        LaunchAttributor,
        _unlocated,
    )
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.common.gpu_records import ClockPairs

    categories, rows, launches = _nested_ranges(seed, touching=True)
    assert len({r[1] for r in rows} & {r[2] for r in rows}) > 100
    att = LaunchAttributor(fit(ClockPairs.from_rows([(0, 0)])), 2)
    for i, category in enumerate(categories):
        att.add_name(i, f"{category}-{i}", category)
    att.feed_ranges(1, rows)
    th = att.threads[1]
    th.horizon_ns = 50_000
    n = len(launches)
    ops = GpuOps.from_columns(n, {"kind": np.zeros(n), "start": launches,
                                  "end": launches + 1 + (launches % 7)})
    want = att._locate(1, th, AttributedOps(ops, _unlocated(n, 0, {
        "api_start": launches.copy(), "tid": np.ones(n)})), open_known=False).attr
    columns = ("range", "range_t0", "range_t1", "range_depth", "link", "backward", "phase",
               "iteration", "number", "iter_end")
    out = np.full((len(columns) + 4, n), 12_345, dtype=np.int64)  # none of them -1 or 0
    kinds, link_ids = att._kind_tables()
    sums = extension.locate(launches, [
        (d, slot.t0, slot.t1, slot.index, slot.ordinal, slot.number)
        for d, slot in sorted(th.depths.items())], kinds, link_ids, list(out[:-3]), (
        out[-3], out[-2], out[-1], ops.start, ops.end, 2, th.horizon_ns, PHASE_OUTSIDE,
        PHASE_OTHER, ATTRIBUTED, RANGES_DROPPED, 1))
    for i, column in enumerate(columns):
        assert np.array_equal(out[i], getattr(want, column)), column
    assert np.array_equal(out[-3], want.counted) and np.array_equal(out[-2], want.status)
    assert np.array_equal(out[-1], want.tid)
    dropped = want.status == RANGES_DROPPED
    dur = ops.end - ops.start
    assert 0 < dropped.sum() < n and (want.range_depth > 16).any()
    assert sums == ((~dropped).sum(), dur[~dropped].sum(), dropped.sum(), dur[dropped].sum())


def test_cuptis_clock_mapped_in_c_as_numpy_maps_it(extension):
    """Each buffer's timestamps go onto the agent's clock in C: halves rounded to even,
    negative offsets, drift, times far from the first pair, exactly as ClockMap.to_agent."""
    import random

    from chainer_autoprof.analysis.gpu_clock import ClockMap

    rng = random.Random(3)
    base = 1_700_000_000_000_000_000
    cupti = np.array([base + rng.randrange(-10**13, 10**13) for _ in range(20_000)]
                     + [base + k for k in range(-50, 50)], dtype=np.int64)
    for slope, offset in ((1.0, 0.5), (1.0, -0.5), (1.0, -2.5), (1 + 3e-5, 1234.5),
                          (1 - 7e-6, -98765.25), (1.0, 0.0)):
        clock = ClockMap(base, 5_000_000, slope, offset, 0, 0, base, base, 2)
        got = np.empty_like(cupti)
        extension.to_agent((clock.cupti0, clock.perf0, slope, offset), cupti, got)
        assert np.array_equal(got, clock.to_agent(cupti)), (slope, offset)


@pytest.mark.parametrize("loop_tid", [None, 7])
def test_the_timelines_rows_in_c_are_numpys(extension, loop_tid):
    """The GPU timeline's row of each operation, made in C, is NumPy's: the loop thread
    told, or found as the thread of the first operation in an iteration (operations of
    that thread before it included), kernels apart from copies; with the one device of
    every row (none when several) and the earliest start, which spare NumPy's checks."""
    from chainer_autoprof.analysis.gpu_attribution import PHASE_OUTSIDE, _unlocated
    from chainer_autoprof.analysis.gpu_figures import GpuFigureBuilder
    from chainer_autoprof.analysis.stats import PHASE_KEYS
    from chainer_autoprof.common.gpu_records import KERNEL, MEMCPY, MEMSET, NameTable

    rng = np.random.default_rng(5)
    n = 500
    ops = GpuOps.from_columns(n, {"kind": rng.integers(0, 3, n), "start": rng.integers(0, 10**6, n),
                                  "end": rng.integers(10**6, 2 * 10**6, n)})
    iteration = np.where(np.arange(n) < 40, -1, rng.integers(-1, 5, n))
    attr = _unlocated(n, 0, {"api_start": rng.integers(0, 10**6, n), "tid": rng.choice([7, 8], n),
                             "iteration": iteration, "iter_end": rng.integers(0, 10**6, n)})
    builder = GpuFigureBuilder([], NameTable(), loop_tid=loop_tid)  # NumPy's rows
    want = builder._timeline_rows(ops, attr, ops.kind == KERNEL, attr.iteration >= 0)
    got = np.empty((n, 7), dtype=np.int64)

    def rows_in_c() -> tuple[object, object, object]:  # (the sums' pass makes the rows too)
        return extension.figure_add(extension.kernel_table(16), (
            ops.kind, ops.start, ops.end, ops.name, ops.device), (
            attr.counted, attr.iteration, attr.link, attr.backward, attr.phase, attr.api_start,
            attr.iter_end, attr.tid), np.zeros((0, 5), dtype=np.int64),
            np.zeros((len(PHASE_KEYS), 3), dtype=np.int64), (KERNEL, MEMCPY, MEMSET),
            PHASE_OUTSIDE, loop_tid, got)[5:]

    found, device, earliest = rows_in_c()
    assert found == builder.loop_tid and np.array_equal(got, want)
    assert (want[:40, 6] == 1).any()  # before the first operation in an iteration, too
    assert device == -1 and earliest == int(ops.start.min())  # one device, the first start
    ops.device[7] = 1  # and a second device: none is every row's
    assert rows_in_c()[1] is None
    if loop_tid is None:  # no operation in an iteration: no loop thread yet, none its row
        attr.iteration[:] = -1
        builder = GpuFigureBuilder([], NameTable())
        want = builder._timeline_rows(ops, attr, ops.kind == KERNEL, attr.iteration >= 0)
        assert rows_in_c()[0] is None is builder.loop_tid
        assert np.array_equal(got, want) and not got[:, 6].any()


@pytest.mark.parametrize("room", [4096, 40])
def test_the_top_kernels_sums_in_c_over_many_buffers_are_numpys(extension, room, monkeypatch):
    """The counted kernels' sums per (name, link, direction), kept in C across buffers, come
    out as NumPy's: the same keys in the same order (each buffer's new keys after the
    earlier ones', in key order), the same sums, and where more keys come than the table
    holds, the same ones summed as "other"."""
    from chainer_autoprof.analysis import gpu_figures
    from chainer_autoprof.analysis.gpu_attribution import PHASE_OUTSIDE, _unlocated
    from chainer_autoprof.analysis.gpu_figures import GpuFigureBuilder
    from chainer_autoprof.analysis.stats import PHASE_KEYS
    from chainer_autoprof.common.gpu_records import KERNEL, MEMCPY, MEMSET, NameTable

    monkeypatch.setattr(gpu_figures, "MAX_KERNEL_KEYS", room)
    rng = np.random.default_rng(11)
    links = [f"l{i}" for i in range(6)]
    builder = GpuFigureBuilder(links, NameTable())  # NumPy's sums
    table = extension.kernel_table(room)
    for n in (300, 1, 0, 700, 50, 300):  # buffers: new keys and known ones mixed
        ops = GpuOps.from_columns(n, {"kind": rng.choice([KERNEL, KERNEL, MEMCPY], n),
                                      "start": rng.integers(0, 10**6, n),
                                      "end": rng.integers(10**6, 2 * 10**6, n),
                                      "name": rng.integers(0, 60, n)})
        attr = _unlocated(n, 0, {"iteration": rng.integers(0, 5, n),
                                 "link": rng.integers(-1, len(links), n)})
        attr.counted[:] = rng.integers(0, 2, n)
        attr.backward[:] = rng.integers(0, 2, n)
        extension.figure_add(table, (ops.kind, ops.start, ops.end, ops.name, ops.device), (
            attr.counted, attr.iteration, attr.link, attr.backward, attr.phase, attr.api_start,
            attr.iter_end, attr.tid), np.zeros((len(links), 5), dtype=np.int64),
            np.zeros((len(PHASE_KEYS), 3), dtype=np.int64), (KERNEL, MEMCPY, MEMSET),
            PHASE_OUTSIDE, None, np.empty((n, 7), dtype=np.int64))
        counted = (ops.kind == KERNEL) & (attr.counted == 1)
        if counted.any():
            builder._add_kernels(ops.name[counted], attr.link[counted],
                                 attr.backward[counted], (ops.end - ops.start)[counted])
    keys, ns, calls, other_ns, other_calls = extension.kernel_rows(table)
    assert keys == list(builder.kernel_keys)
    assert [ns, calls] == builder.kernel_sums.T.tolist()
    assert [other_ns, other_calls] == builder.other_kernels.tolist()
    assert (other_calls > 0) == (room < len(keys) + 1)  # the small table overflows


def test_the_trace_keeper_groups_a_buffer_in_c_as_numpy_does(extension):
    """The trace keeper's groups of a usual buffer (one thread, iterations in order) found
    in one C call keep, drop and count what NumPy's grouping does: buffers of one thread
    in order, out of order, of two threads, late operations of a dropped iteration, the
    oldest iterations evicted and an iteration alone over the limit trimmed."""
    from chainer_autoprof.analysis.gpu_analysis import AttributedKeeper
    from chainer_autoprof.analysis.gpu_attribution import AttributedOps

    rng = np.random.default_rng(11)

    def buffer(iteration: list[int], corr: int, tids: list[int]) -> AttributedOps:
        return attributed_ops(iteration, corr, tids, 2, end_offset=7)

    buffers, corr, ordinal = [], 0, 0
    for turn in range(60):
        if turn % 10 == 9:  # out of order, two threads, or late operations of an old one
            its = sorted(rng.integers(max(0, ordinal - 6), ordinal + 1, 30).tolist(),
                         reverse=turn % 20 == 9)
            tids = rng.choice([7, 8], 30).tolist() if turn % 30 == 9 else [7] * 30
        else:
            size = int(rng.integers(5, 60))
            its = ([-1] * 3 if turn == 0 else []) + [ordinal] * size + [ordinal + 1] * (size // 3)
            tids, ordinal = [7] * len(its), ordinal + 1
        buffers.append(buffer(its, corr, tids))
        corr += len(its)
    for its, tids in (([ordinal] * 560 + [ordinal - 3] * 40, [7] * 600),  # late ones, far in
                      ([ordinal] * 560 + [ordinal + 1] * 40, [7] * 560 + [8] * 40)):
        buffers.append(buffer(its, corr, tids))
        corr += len(its)
    buffers.append(buffer([ordinal + 5] * 400, corr, [7] * 400))  # alone over the limit

    def state(keeper: AttributedKeeper) -> tuple:
        kept = keeper.records()
        return (kept.ops.correlation.tolist(), kept.attr.iteration.tolist(), keeper.kept,
                keeper.dropped, list(keeper.dropped_by), keeper.dropped_iterations,
                keeper.complete_iterations(), keeper.note())

    # asked after every buffer (each buffer's groups made at once), NumPy's and C's; C's
    # asked only every seventh buffer (the buffers between wait, their groups made when an
    # eviction needs them, several at once)
    keepers = [AttributedKeeper(300), AttributedKeeper(300, extension),
               AttributedKeeper(300, extension)]
    assert keepers[0].native is None and keepers[1].native is extension
    for turn, items in enumerate(buffers):
        for keeper in keepers:
            keeper.add(items)
        seen = [state(keepers[0]), state(keepers[1])]
        assert seen[0] == seen[1]
        assert (keepers[2].kept, keepers[2].dropped) == seen[0][2:4]
        if turn % 7 == 6 or turn == len(buffers) - 1:
            assert state(keepers[2]) == seen[0]
    assert keepers[1].dropped_iterations > 10 and keepers[1].complete_iterations() == set()
    assert sum(len(b.items) for b in keepers[1].blocks) <= 2 * 300


def test_the_trace_keepers_runs_in_c_are_numpys_at_every_row(extension):
    """``keeper_runs`` (four rows a turn, blocks of 512) says a buffer is one thread's in
    order exactly where NumPy does, with each run's first row, the first run in an
    iteration and the first counted one, whichever row breaks it: another thread, an
    ordinal that falls, or a warm-up run after a counted one, at every row of buffers
    around those sizes."""
    for n in (1, 2, 3, 4, 5, 8, 9, 511, 512, 513, 1030):
        it = np.repeat(np.arange(-1, n), 7)[:n].astype(np.int64)
        tid = np.full(n, 1 << 40, dtype=np.int64)
        counted = (it >= 3).astype(np.int64)
        found = extension.keeper_runs((it, tid, counted))
        thread, firsts, counted_row, first_run, start, first, last_row, last = found
        runs = [0, *np.flatnonzero(np.diff(it)) + 1]
        assert thread == 1 << 40 and np.frombuffer(firsts, np.int64).tolist() == runs
        assert (first_run, start, first) == ((1, 7, 0) if n > 7 else (1, n, -1))
        assert counted_row == (int(np.argmax(it >= 3)) if (it >= 3).any() else n)
        assert (last_row, last) == (runs[-1], it[-1])
        assert extension.keeper_runs((it, tid)) == (*found[:2], -1, *found[3:])  # (unread)
        for row in range(n):
            other = tid.copy()
            other[row] ^= 1 << (row % 63)  # one bit off, anywhere (the first: all the rest)
            assert extension.keeper_runs((it, other, counted)) is None or n == 1
            if row:
                fell = it.copy()
                fell[row] = it[row - 1] - 1
                got = extension.keeper_runs((fell, tid, counted))
                if fell[row] == -1:  # outside any iteration, between iterations: NumPy's groups
                    assert _interleaved(got) == _numpy_groups(fell, 1 << 40)
                else:
                    assert got is None
            if row in runs and counted[row] == 1 and it[row] >= 0:  # a counted run goes
                warm = counted.copy()  # back to warm-up: C leaves it to NumPy
                warm[row] = 0
                assert (extension.keeper_runs((it, tid, warm)) is None) == (
                    counted[runs].tolist().index(1) < runs.index(row))
                warm[row] = 5  # (any other value is warm-up)
                assert (extension.keeper_runs((it, tid, warm)) is None) == (
                    counted[runs].tolist().index(1) < runs.index(row))
    empty = np.zeros(0, dtype=np.int64)
    assert extension.keeper_runs((empty, empty, empty)) is None



def _numpy_groups(it: np.ndarray, thread: int) -> tuple[object, ...]:
    """The groups the trace keeper's NumPy path makes of one thread's buffer."""
    _keys, firsts, inverse, counts = np.unique(it, return_index=True, return_inverse=True,
                                               return_counts=True)
    return (thread, int(it[it >= 0][0]), firsts.tolist(), counts.tolist(),
            inverse.reshape(-1).tolist())


def _interleaved(found: tuple[object, ...] | None) -> tuple[object, ...] | None:
    """``keeper_runs``' answer on such a buffer, its bytes read."""
    if found is None or len(found) != 5:
        return found
    thread, first, *tables = found
    return (thread, first, *(np.frombuffer(t, np.int64).tolist() for t in tables))


def test_a_trainers_buffer_gets_numpys_groups_from_c(extension):
    """A buffer as a Trainer's run makes them (one thread; after each update its extensions'
    operations, outside any iteration, before the next iteration's) gets from C the groups
    NumPy's path makes, without a sort; another thread, a second value outside, an
    iteration that falls, or nothing but operations outside: NumPy's path, as before."""
    rng = np.random.default_rng(11)
    for n_iter in (1, 2, 5, 40):
        parts = []
        for i in range(n_iter):
            parts += [i] * int(rng.integers(1, 30)) + [-1] * int(rng.integers(0, 4))
        it = np.array([-1, *parts, -1], dtype=np.int64)  # (start-up's op first, one at the end)
        if np.all(np.diff(it) >= 0):
            continue  # (in order: the usual buffer's runs)
        tid = np.full(len(it), 7, dtype=np.int64)
        got = extension.keeper_runs((it, tid, (it >= 1).astype(np.int64)))
        assert _interleaved(got) == _numpy_groups(it, 7)
        assert extension.keeper_runs((it, tid)) == got  # (the counted column unread)
        for change in ("thread", "outside", "falls"):
            bad, bad_tid = it.copy(), tid.copy()
            row = int(rng.integers(0, len(it)))
            if change == "thread":
                bad_tid[row] = 8
            elif change == "outside":
                bad[np.flatnonzero(it < 0)[-1]] = -2
            else:
                inside = np.flatnonzero(it > 0)
                if not len(inside):
                    continue
                bad[inside[-1]] = 0
                bad[inside[-1] - 1] = max(1, bad[inside[-1] - 1])
            assert extension.keeper_runs((bad, bad_tid)) is None, change
    assert extension.keeper_runs((np.full(9, -1, np.int64), np.full(9, 7, np.int64)))[1] == \
        bytes(8)  # all outside: one run (the usual answer)


def test_the_usual_buffers_block_is_read_in_c_as_its_columns(extension):
    """The figures' pass and the keeper's runs read the usual buffer's C table (the
    attributor's block, its rows by name) as they read the same rows handed as columns:
    the same sums, timeline rows and runs, at the limit (its counted rows read) or under
    it; and the attribution handed on makes its columns only when they are asked for."""
    from chainer_autoprof.analysis.gpu_attribution import (
        _BLOCK_ROWS,
        PHASE_OUTSIDE,
        BlockAttributedOps,
    )
    from chainer_autoprof.analysis.stats import PHASE_KEYS
    from chainer_autoprof.common.gpu_records import KERNEL, MEMCPY, MEMSET

    rng = np.random.default_rng(3)
    n = 400
    block = rng.integers(-1, 6, (len(_BLOCK_ROWS), n)).astype(np.int64)
    row = {name: block[i] for i, name in enumerate(_BLOCK_ROWS)}
    row["iteration"][:] = np.sort(rng.integers(-1, 6, n))
    row["tid"][:] = 9
    row["counted"][:] = row["iteration"] >= 2
    ops = GpuOps.from_columns(n, {"kind": rng.integers(0, 3, n), "start": block[0],
                                  "end": block[1] + 10, "name": rng.integers(0, 9, n)})
    items = BlockAttributedOps(ops, block, n)
    attr_cols = tuple(row[c] for c in ("counted", "iteration", "link", "backward", "phase",
                                       "api_start", "iter_end", "tid"))
    out = []
    for given in (block, attr_cols):
        sums = (np.zeros((6, 5), dtype=np.int64), np.zeros((len(PHASE_KEYS), 3), np.int64))
        rows = np.empty((n, 7), dtype=np.int64)
        table = extension.kernel_table(64)
        got = extension.figure_add(table, (ops.kind, ops.start, ops.end, ops.name, ops.device),
                                   given, *sums, (KERNEL, MEMCPY, MEMSET), PHASE_OUTSIDE,
                                   None, rows)
        out.append((got, sums[0].tolist(), sums[1].tolist(), rows.tolist(),
                    extension.kernel_rows(table)))
    assert out[0] == out[1] and out[0][1] != np.zeros((6, 5)).tolist()
    assert items._attr is None  # nothing read the columns yet
    for at_limit in (False, True):
        assert extension.keeper_block_runs(block, at_limit) == extension.keeper_runs(
            (row["iteration"], row["tid"], row["counted"])[:3 if at_limit else 2])
    assert np.array_equal(items.attr.phase, row["phase"]) and items.attr.phase.base is not None


def test_the_trace_keeper_makes_a_usual_buffers_groups_only_when_needed(extension):
    """A usual buffer under the limit (one thread, iterations in order) is kept in a few
    allocations whatever its iterations (its groups, some thousands of instructions each,
    made when an eviction or a question needs them): then the same as made at once."""
    from chainer_autoprof.analysis.gpu_analysis import AttributedKeeper
    from chainer_autoprof.analysis.gpu_attribution import AttributedOps

    def buffer(iterations: int, corr: int) -> AttributedOps:
        it = np.repeat(np.arange(corr // 1000, corr // 1000 + iterations), 3)
        return attributed_ops(it, corr, 3, 1, end_scale=10, end_offset=9)

    buffers = [buffer(300, 0), buffer(300, 300_000), buffer(40, 900_000)]
    lazy, eager = AttributedKeeper(1800, extension), AttributedKeeper(1800)
    lazy.add(buffers[0])  # the first: its code's first run
    before = sys.getallocatedblocks()
    lazy.add(buffers[1])
    assert sys.getallocatedblocks() - before < 30  # not some per iteration (300)
    lazy.add(buffers[2])  # over the limit: the oldest iterations go
    for items in buffers:
        eager.add(items)
        eager.complete_iterations()
    assert lazy.dropped == eager.dropped == 3 * 640 - 1800  # 40 iterations whole
    assert lazy.records().ops.correlation.tolist() == eager.records().ops.correlation.tolist()
    assert lazy.complete_iterations() == eager.complete_iterations()
    assert len(lazy.complete_iterations()) == 640 - 40


@pytest.mark.parametrize("seed, limit, extensions", [(3, 500, False), (4, 150, False),
                                                    (5, 1000, False), (6, 300, True),
                                                    (7, 150, True)])
def test_the_trace_keeper_at_its_limit_drops_what_the_reference_did(extension, seed, limit,
                                                                    extensions):
    """Over a long run at the limit (iterations going on from one buffer to the next, an
    evaluation now and then, late operations, another thread, a buffer out of order, an
    iteration alone over the limit at the end; with ``extensions``, a Trainer's operations
    outside any iteration after most iterations), the keeper keeps and drops, buffer after
    buffer, the operations its reference (one object and heap entry a group) did, and says
    the same counts, whole iterations and note: on C's lane or C's groups, on NumPy's
    groups, and asked only now and then (its buffers' groups waiting)."""
    from keeper_reference import ReferenceKeeper, keeper_state, long_run_buffers

    from chainer_autoprof.analysis.gpu_analysis import AttributedKeeper

    reference = ReferenceKeeper(limit)
    numpy_, native, lazy = (AttributedKeeper(limit), AttributedKeeper(limit, extension),
                            AttributedKeeper(limit, extension))
    in_lane = grouped_in_c = 0
    for turn, items in enumerate(long_run_buffers(seed, 160, extensions=extensions)):
        for keeper in (reference, numpy_, native, lazy):
            keeper.add(items)
        in_lane += bool(native._lane)
        found = extension.keeper_runs((items.attr.iteration, items.attr.tid))
        grouped_in_c += found is not None and len(found) == 5
        want = keeper_state(reference)
        assert keeper_state(numpy_) == want and keeper_state(native) == want
        if turn % 10 == 9:
            assert keeper_state(lazy) == want
        assert sum(len(block.items) for block in native.blocks) <= 2 * limit
    if extensions:  # a Trainer's buffers went by C's groups
        assert grouped_in_c > 100
    else:  # the usual buffers went by C's lane (an evaluation's: by C's groups)
        assert in_lane > 100 and grouped_in_c > 0
    assert reference.dropped_iterations > 200 and reference.dropped_by[0] > 300


def test_the_trace_keeper_at_its_limit_makes_nothing_per_iteration(extension):
    """At the limit, a usual buffer of 1,000 iterations that pushes 1,000 others out makes
    no object per iteration: its peak of traced memory is that of a few, where one object
    a group (the reference) takes some hundred kilobytes."""
    import tracemalloc

    from keeper_reference import ReferenceKeeper

    from chainer_autoprof.analysis.gpu_analysis import AttributedKeeper
    from chainer_autoprof.analysis.gpu_attribution import AttributedOps

    def buffer(turn: int) -> AttributedOps:
        it = np.repeat(np.arange(1000 * turn, 1000 * turn + 1000), 2)
        return attributed_ops(it, 2000 * turn, 3, 0, end_scale=10, end_offset=9,
                              first_start=0)

    buffers = [buffer(turn) for turn in range(8)]
    peaks = {}
    for keeper in (AttributedKeeper(4000, extension), ReferenceKeeper(4000)):
        for items in buffers[:4]:  # at the limit, then once over it
            keeper.add(items)
        keeper.complete_iterations()
        tracemalloc.start()
        try:
            peak = 0
            for items in buffers[4:]:
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                keeper.add(items)
                peak = max(peak, tracemalloc.get_traced_memory()[1] - before)
        finally:
            tracemalloc.stop()
        assert keeper.dropped == 6 * 2000 and len(keeper.complete_iterations()) == 2000
        peaks[type(keeper).__name__] = peak
    assert peaks["AttributedKeeper"] < 40_000  # (C's first rows: 8 kB, twice while made)
    assert peaks["ReferenceKeeper"] > 10 * peaks["AttributedKeeper"]


def test_the_launching_calls_kept_in_c_are_numpys_under_their_bound(extension, monkeypatch):
    """The calls kept in C (appended, sorted when buffers come out of order, the oldest ids
    cut past ``max_api``) are the ones NumPy's table keeps: the calls coming in shuffled
    buffers before their operations, a third of them kept, the same operations find theirs
    and the others are counted without a launch, column for column."""
    import functools
    import random
    from dataclasses import replace

    from chainer_autoprof.analysis.gpu_analysis import GpuAnalysis, Limits
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.common.gpu_records import ApiCalls
    from chainer_autoprof.report import gpu_replay
    from chainer_autoprof.report.tracefile import read_trace

    trace = read_trace(str(DATA / "b16" / "agent_trace.json"))
    rec = recording("b16")
    pieces = rec.batch.split(9)
    random.Random(5).shuffle(pieces)
    calls_first = [replace(p, ops=GpuOps.empty()) for p in pieces] + \
        [replace(p, api=ApiCalls.empty()) for p in rec.batch.split(5)]
    runs = []
    for kernel in (None, extension.locate):
        monkeypatch.setattr(gpu_replay, "GpuAnalysis", functools.partial(GpuAnalysis,
                                                                         locate=kernel))
        runs.append(gpu_replay.analyse(trace, calls_first, fit(rec.clock), rec.batch.names,
                                       limits=Limits(max_api=len(rec.batch.api) // 3)))
    numpy_run, native = runs
    assert native.attributor.native is not None and numpy_run.attributor.native is None
    assert numpy_run.finish().to_dict() == native.finish().to_dict()
    missing = numpy_run.finish().statuses["no launch record"]["ops"]
    assert len(rec.batch.ops) // 2 < missing < len(rec.batch.ops)
    a, b = _attributed(numpy_run), _attributed(native)
    for column, values in a.items():
        assert np.array_equal(values, b[column]), column


def test_a_readers_new_kernel_names_are_appended_at_once_only_where_they_go():
    """A buffer's new names go in as one slice of ids only when the table is as long as
    their first id and holds none of them, no two alike; else nothing changes (the reader
    then interns them one by one)."""
    from chainer_autoprof.common.gpu_records import NameTable

    names = NameTable(["a"])
    assert not names.extend_new(0, ["b"])       # not where they go
    assert not names.extend_new(1, ["a", "b"])  # one known
    assert not names.extend_new(1, ["b", "b"])  # two alike
    assert names.names == ["a"] and names.intern("b") == 1
    assert names.extend_new(2, ["c", "d"])
    assert names.names == ["a", "b", "c", "d"] and names.intern("d") == 3


def test_a_readers_names_are_read_only_when_asked_and_outlive_its_collector(tmp_path):
    """The native reader hands over a buffer's new kernel names as a range of ids, no text
    read (no Python string made per name on CUPTI's thread); the texts come when a name is
    first asked, right, also after the collector stopped and another one started."""
    rec, batches, collector, _ = collect("b16", tmp_path)
    names = batches[0].names
    distinct = len(set(rec.batch.names.name(i) for i in rec.batch.ops.name.tolist() if i >= 0))
    assert len(names) == distinct == collector._ext.counts()["names"] > 10
    assert names.pending == distinct  # handed over, none read yet
    ops = GpuOps.concat([b.ops for b in batches])
    kernels = ops.kind == gr.KERNEL
    by_correlation = dict(zip(rec.batch.ops.correlation.tolist(),
                              (rec.batch.names.name(i) for i in rec.batch.ops.name.tolist())))
    want = [by_correlation[c] for c in ops.correlation[kernels].tolist()]
    # another collector starts on the same extension (its names begin again at id 0)
    _, others, _, _ = collect("b512", tmp_path / "second")
    assert others[0].names is not names and others[0].names.pending > 0
    assert [names.name(i) for i in ops.name[kernels].tolist()] == want
    assert names.pending == 0 and names.intern(want[0]) == int(ops.name[kernels][0])
    assert names.name(len(names)) == f"kernel#{len(names)}"


def test_a_forked_child_still_reads_the_names_its_parent_had_not(tmp_path):
    """Names still in the extension's store at a fork are read in the child from its copy
    of the store (its lock free: no walk runs in the child)."""
    rec, batches, _, _ = collect("b16", tmp_path)
    names = batches[0].names
    assert names.pending == len(names) > 0
    want = [rec.batch.names.name(i) for i in range(len(rec.batch.names))]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if every name reads as in the recording
        try:
            got = {names.name(i) for i in range(len(names))}
            os._exit(0 if got <= set(want) and len(got) == len(names) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert names.pending == len(names)  # the parent's table: still unread


def test_names_added_unread_are_fetched_once_before_any_interning():
    """Ids added with their texts left in a source keep their places: a name interned
    after them gets the next id, one already among them its own; the source is read once."""
    from chainer_autoprof.common.gpu_records import NameTable

    reads: list[tuple[int, int]] = []

    class Store:
        def texts(self, first: int, stop: int) -> list[str]:
            reads.append((first, stop))
            return [f"k{i}" for i in range(first, stop)]

    names = NameTable(["a"])
    assert not names.extend_from(0, 3, Store())   # not where they go
    assert names.extend_from(1, 4, Store()) and names.extend_from(4, 6, Store())
    assert len(names) == 6 and names.pending == 5 and reads == []
    assert names.intern("k2") == 2 and names.intern("new") == 6
    assert reads == [(1, 4), (4, 6)] and names.pending == 0
    assert names.names == ["a", "k1", "k2", "k3", "k4", "k5", "new"]
    assert not names.extend_new(6, ["x"]) and names.extend_new(7, ["x"])
    assert names.intern_all(["k5", "y"]) == [5, 8]


def test_kernel_names_keep_their_table_ids_when_the_extensions_differ():
    """The extension numbers kernel names itself; the collector's table may hold others'
    (a name interned meanwhile): each operation still names its own kernel, whether the
    ids agreed from the start, stop agreeing later, or never did."""
    from chainer_autoprof.common.gpu_records import NameTable
    from chainer_autoprof.runtime.cupti_native import NativeCuptiCollector

    room = 4
    name_row = GpuOps.columns().index("name")

    class Store(list):  # the extension's NameStore: texts by id
        def texts(self, first: int, stop: int) -> list[str]:
            return self[first:stop]

    def tables(ids: list[int]) -> tuple[bytearray, bytearray]:  # as the extension's blocks
        ops = np.full((len(GpuOps.columns()), room), -1, dtype=np.int64)
        ops[name_row, :len(ids)] = ids
        return bytearray(ops.tobytes()), bytearray(np.zeros((6, room), np.int64).tobytes())

    store = Store(["k0", "k1", "k2"])
    for before in ([], ["another's kernel"]):
        names = NameTable()
        for text in before:
            names.intern(text)
        collector = NativeCuptiCollector(lambda batch: None, names=names)
        ops, api = tables([0, 1, 0])
        first = collector.batch_from_tables(ops, 3, api, 0, room, 0, 2, store)
        assert [names.name(i) for i in first.ops.name.tolist()] == ["k0", "k1", "k0"]
        names.intern("interned meanwhile")
        ops, api = tables([2, 1, 0, 2])
        second = collector.batch_from_tables(ops, 4, api, 0, room, 2, 1, store)
        assert [names.name(i) for i in second.ops.name.tolist()] == ["k2", "k1", "k0", "k2"]
    # a buffer handed over before the one that first held the earlier names (two CUPTI
    # threads): its names are read and interned, each operation still named right
    names = NameTable()
    collector = NativeCuptiCollector(lambda batch: None, names=names)
    ops, api = tables([2, 2])
    later = collector.batch_from_tables(ops, 2, api, 0, room, 2, 1, store)
    ops, api = tables([0, 1, 2])
    earlier = collector.batch_from_tables(ops, 3, api, 0, room, 0, 2, store)
    assert [names.name(i) for i in later.ops.name.tolist()] == ["k2", "k2"]
    assert [names.name(i) for i in earlier.ops.name.tolist()] == ["k0", "k1", "k2"]


# -- the GPU timeline's placement in C (timeline_place) and its NumPy twin (_Timeline._process)
def _timeline_state(tl) -> dict[str, object]:
    """What a timeline's figures and its placing of later rows depend on."""
    return {"key": tl.key, "max_ord": tl.max_ord, "fa": tl.fa, "fk": tl.fk,
            "win_start": tl.win_start, "acc": np.asarray(tl.acc).tolist(),
            "iter_end": dict(tl.iter_end), "late": tl.late, "placed_ns": tl.placed_ns,
            "pool_n": tl.pool_n, "counted": tl.counted, "totals": tl.totals.tolist(),
            "series": None if tl.series is None else [v.tolist() for v in tl.series.values]}


def _placed_both_ways(extension, feeds, *, warmup_skip: int = 0, max_kept: int = 64):
    """Two timelines, NumPy's and C's, fed the same (rows, upto) in turn (upto False: no
    placing then; None: all), compared after every turn and after the finish; NumPy's."""
    from chainer_autoprof.analysis.gpu_figures import _Timeline

    numpy_tl, c_tl = _Timeline(0, max_kept), _Timeline(0, max_kept, extension)
    assert numpy_tl.native is None and c_tl.native is extension
    for tl in (numpy_tl, c_tl):
        tl.warmup_skip = warmup_skip
    for turn, (rows, upto) in enumerate(feeds):
        for tl in (numpy_tl, c_tl):
            tl.add(rows.copy())
            if upto is not False:
                tl.place(upto)
        assert _timeline_state(c_tl) == _timeline_state(numpy_tl), turn
    for tl in (numpy_tl, c_tl):
        tl.finish()
    assert _timeline_state(c_tl) == _timeline_state(numpy_tl)
    return numpy_tl


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_timeline_placed_in_c_is_numpys_on_the_recordings(name, extension, monkeypatch):
    """The GPU timeline's rows of a real recording (as the live analysis pools them),
    placed in C in chunks cut at many points (some behind what was placed: late rows),
    give NumPy's windows, totals, counted and late operations and the same state after
    every chunk; and the whole analysis' figures with C's placement are NumPy's."""
    import functools

    from chainer_autoprof.analysis import gpu_figures
    from chainer_autoprof.analysis.gpu_analysis import GpuAnalysis
    from chainer_autoprof.analysis.gpu_clock import fit
    from chainer_autoprof.report import gpu_replay
    from chainer_autoprof.report.tracefile import read_trace

    trace = read_trace(str(DATA / name / "agent_trace.json"))
    rec = recording(name)
    pooled: list[np.ndarray] = []
    add = gpu_figures._Timeline.add

    def kept(tl, rows, earliest=None):  # the rows as the analysis hands them on
        pooled.append(rows.copy())
        add(tl, rows, earliest)

    monkeypatch.setattr(gpu_figures._Timeline, "add", kept)
    monkeypatch.setattr(gpu_replay, "GpuAnalysis",
                        functools.partial(GpuAnalysis, locate=extension.locate))
    native = gpu_replay.analyse(trace, rec.batch.split(3), fit(rec.clock), rec.batch.names)
    assert all(tl.native is extension for tl in native.builder.timelines.values())
    monkeypatch.setattr(gpu_replay, "GpuAnalysis", GpuAnalysis)  # (locate None: NumPy's)
    numpy_run = gpu_replay.analyse(trace, rec.batch.split(3), fit(rec.clock), rec.batch.names)
    assert all(tl.native is None for tl in numpy_run.builder.timelines.values())
    assert native.finish().to_dict() == numpy_run.finish().to_dict()
    monkeypatch.setattr(gpu_figures._Timeline, "add", add)
    rows = np.concatenate(pooled[:len(pooled) // 2])  # (the native run's)
    assert len(rows) == len(rec.batch.ops)
    rng = np.random.default_rng(7)
    for pieces in (1, 4, 9, 40):
        chunks = np.array_split(rows, pieces)
        feeds = []  # each cut at a start of the rows so far (or none: placed later)
        for k, chunk in enumerate(chunks):
            so_far = np.concatenate(chunks[:k + 1])[:, 0]
            feeds.append((chunk, int(rng.choice(so_far)) if rng.random() < 0.8 else False))
        got = _placed_both_ways(extension, feeds, warmup_skip=2)
        assert got.counted >= 10 and got.totals[1] > 0  # iterations' windows were placed
        if pieces == 40:
            assert got.late > 0  # rows behind a cut, left off alike


def _adversarial_rows(rng, n: int, t0: int) -> np.ndarray:
    """Rows of several threads in and out of iterations: starts in or out of order, long
    operations across windows, launches after or before their start (or none), iteration
    ends that differ within an iteration (each ordinal's first one counts) or are unknown;
    sometimes on a coarse grid."""
    start = t0 + rng.integers(0, 10**6, n)
    if rng.random() < 0.5:
        start = np.sort(start)
    end = start + np.where(rng.random(n) < 0.1, rng.integers(0, 2 * 10**6, n),
                           rng.integers(0, 50_000, n))
    loop = rng.integers(0, 2, n)
    ordinal = np.where(rng.random(n) < 0.3, -1, t0 // 10**6 + rng.integers(-1, 4, n))
    ordinal = np.where(loop == 1, ordinal, rng.choice([-1, -1, 0, 3], n))  # other threads
    launch = np.where(rng.random(n) < 0.1, -1, start - rng.integers(-60_000, 60_000, n))
    iter_end = np.where(rng.random(n) < 0.3, -1, start + rng.integers(-200_000, 200_000, n))
    rows = np.column_stack([start, end, rng.integers(0, 2, n), launch, ordinal, iter_end,
                            loop]).astype(np.int64)
    if rng.random() < 0.5:  # times on a coarse grid: ties (a launch at an iteration's end, a
        grain = 10_000      # gap of LAUNCH_GAP_NS exactly, starts alike)
        for c in (0, 1, 3, 5):
            rows[:, c] = np.where(rows[:, c] < 0, rows[:, c], rows[:, c] // grain * grain)
    return rows


def test_the_timeline_placed_in_c_is_numpys_on_adversarial_rows(extension):
    """Rows meant to break a sequential pass: unsorted, spanning window boundaries (their
    union time moved on), after an iteration's end (the windows outside one), of other
    threads, with iteration ends that change within a chunk, in chunks of one row, empty
    ones, placed at random points or all at once: C's windows and state are NumPy's."""
    from chainer_autoprof.analysis.gpu_figures import _NEG, _Timeline

    rng = np.random.default_rng(13)
    seen = {"counted": 0, "late": 0, "outside": 0}
    for _ in range(120):
        feeds, t = [], 0
        for _ in range(int(rng.integers(1, 7))):
            n = int(rng.choice([0, 1, 1, 5, 40, 120]))
            feeds.append((_adversarial_rows(rng, n, t), False if rng.random() < 0.2 else (
                None if rng.random() < 0.1 else int(rng.integers(t - 10**5, t + 10**6)))))
            t += int(rng.integers(0, 2 * 10**6))
        got = _placed_both_ways(extension, feeds, warmup_skip=int(rng.integers(0, 3)),
                                max_kept=int(rng.choice([2, 64])))
        seen["counted"] += got.counted
        seen["late"] += got.late
        seen["outside"] += bool(got.iter_end)
    assert min(seen.values()) > 0, seen
    # a chunk of no rows leaves the state as it was, and so does NumPy's
    for tl in (_Timeline(0, 8), _Timeline(0, 8, extension)):
        tl.add(_adversarial_rows(np.random.default_rng(1), 50, 0))
        tl.place(500_000)
        before = _timeline_state(tl)
        none = np.zeros((0, 7), dtype=np.int64)
        if tl.native is None:
            tl._process(none)
        else:
            tl._process_in_c(none, extension)
        assert _timeline_state(tl) == before and tl.fa != _NEG
    # many iterations in one chunk, and more iterations' ends than kept (the newest kept)
    for n in (3000, 6000):
        many = np.zeros((n, 7), dtype=np.int64)
        many[:, 0] = many[:, 1] = np.arange(n) * 10
        many[:, 3], many[:, 4], many[:, 5], many[:, 6] = -1, np.arange(n), np.arange(n) + 1, 1
        got = _placed_both_ways(extension, [(many, None)])
        assert len(got.iter_end) == (n if n <= 4096 else 1025) and got.counted == n


def test_the_timeline_in_c_splits_ties_as_numpy_and_hta_do(extension):
    """Ties decide alike in both: an operation launched the moment the GPU fell idle was
    not late (other, not host); a gap of LAUNCH_GAP_NS exactly is no launch latency; what
    the loop thread launched at its iteration's host end still belongs to it, a nanosecond
    later outside it (its gap between iterations)."""
    from chainer_autoprof.analysis.gpu_figures import LAUNCH_GAP_NS

    ends = (1_000_000, 2_000_000)
    rows = np.array([  # start, end, kernel, launch, ordinal, iteration's end, loop thread
        (0, 100_000, 1, 0, 0, ends[0], 1),
        (200_000, 300_000, 1, 100_000, 0, ends[0], 1),                  # at idle: other
        (330_000, 400_000, 1, 310_000, 0, ends[0], 1),                  # after: host
        (400_000 + LAUNCH_GAP_NS, 500_000, 0, 399_999, 0, ends[0], 1),  # a copy; other
        (600_000, 700_000, 1, 550_000, 1, ends[1], 1),                  # between
        (800_000, 850_000, 1, ends[1], -1, -1, 1),                      # host, in it
        (900_000, 950_000, 1, ends[1] + 1, -1, -1, 1)], dtype=np.int64)  # outside it
    for cut in (None, 200_000, 400_000 + LAUNCH_GAP_NS, False):  # the first rows placed first
        got = _placed_both_ways(extension, [(rows[:4], cut), (rows[4:], None)])
        windows = np.array(got.series.values).T * 1e6
        assert np.round(windows).astype(np.int64).tolist() == [
            # span, busy, host, copies, between, launch, other
            [600_000, 270_000, 30_000, 70_000, 100_000, 0, 130_000],
            [300_000, 150_000, 100_000, 0, 50_000, 0, 0]]
        assert got.counted == 2 and got.totals.tolist() == [900_000, 420_000, 130_000, 70_000,
                                                            150_000, 0, 130_000]


def test_the_timelines_pool_is_sorted_in_c_as_numpys_stable_sort(extension):
    """The pooled chunks sorted by start in C come out as NumPy's stable sort of them one
    after another: chunks in order, nearly in order (a row a few or many places back: a
    buffer's kernels and then its copies), reversed, many equal starts (their order kept),
    more runs than the first room for them, empty chunks and none."""
    rng = np.random.default_rng(17)
    for _ in range(400):
        chunks = []
        for _ in range(int(rng.integers(0, 5))):
            n = int(rng.choice([0, 1, 2, 5, 30, 200, 1000]))
            starts = rng.integers(0, int(rng.choice([3, 100, 10**6])), n)
            shape = int(rng.integers(0, 4))
            if shape < 3:
                starts = np.sort(starts)
            if shape == 1 and n:  # some rows a few places back
                back = rng.integers(0, n, max(1, n // 20))
                starts[back] -= rng.integers(0, 50, len(back))
            if shape == 2:
                starts = starts[::-1].copy()
            rows = np.zeros((n, 7), dtype=np.int64)
            rows[:, 0], rows[:, 1] = starts, np.arange(n) + 10_000 * len(chunks)  # (which row)
            chunks.append(rows)
        pooled = np.concatenate(chunks) if chunks else np.zeros((0, 7), dtype=np.int64)
        got = np.empty_like(pooled)
        extension.timeline_sort(chunks, got)
        assert np.array_equal(got, pooled[np.argsort(pooled[:, 0], kind="stable")])


def test_the_full_traces_compaction_copies_a_buffers_two_tables_as_its_columns(
        tmp_path, extension, bench, monkeypatch):
    """With the trace full, the keeper compacts its blocks at every buffer: a usual buffer's
    rows copied as its two tables (the attribution's block and the reader's table) are its
    rows copied column by column, every column; and a replay at the limit (ten buffers,
    whole iterations dropped at each) keeps and drops the same operations either way."""
    from chainer_autoprof.analysis.gpu_attribution import AttributedOps, BlockAttributedOps

    def columns(items):
        return ({c: getattr(items.ops, c).tolist() for c in items.ops.columns()},
                {c: getattr(items.attr, c).tolist() for c in items.attr.columns()})

    cache: dict[str, object] = {}
    primed = bench.Primed("b16", "native", tmp_path / "one", cache)
    primed.fake.prepare(1)
    primed.hand_over(1)
    assert primed.session._drain_safely()
    (items, *_), = primed.session.analysis.keeper._pending  # the buffer, as the keeper got it
    assert isinstance(items, BlockAttributedOps) and items.op_table is not None
    n = len(items)
    for a, b in ((0, n), (1, n), (n // 3, n - 5), (n - 1, n)):
        made = items.copied(a, b)
        assert isinstance(made, BlockAttributedOps) and len(made) == b - a
        want = columns(AttributedOps(items.ops.take(slice(a, b)), items.attr.take(slice(a, b))))
        assert columns(made) == want
        assert not np.shares_memory(made.block, items.block)
    primed.session.stop()

    copied = BlockAttributedOps.copied
    by_tables = []

    def counting(self, a, b):
        made = copied(self, a, b)
        by_tables.append(made is not None)
        return made

    seen = []
    for tables in (True, False):
        monkeypatch.setattr(BlockAttributedOps, "copied",
                            counting if tables else lambda self, a, b: None)
        primed = bench.Primed("b16", "native", tmp_path / str(tables), cache, 10,
                              bench.LIMIT_RECORDS)
        primed.fake.prepare(10)
        primed.hand_over(10)
        assert primed.session._drain_safely()
        keeper = primed.session.analysis.keeper
        kept = keeper.records()
        seen.append((kept.ops.correlation.tolist(), kept.attr.iteration.tolist(), keeper.kept,
                     keeper.dropped, list(keeper.dropped_by), keeper.complete_iterations()))
        primed.session.stop()
    assert seen[0] == seen[1] and len(seen[0][0]) > 100 and seen[0][3] > 10_000
    assert by_tables.count(True) >= 9  # a compaction at (nearly) every buffer, by the tables
