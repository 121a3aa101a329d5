"""GPU time per link without synchronizing: the real CUPTI recordings replayed through the
path live activity takes (records -> batches -> attribution by launch -> figures)."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gpu_live_replay import forward_kernel_time_by_link, short

from chainer_autoprof.analysis.gpu_analysis import Limits
from chainer_autoprof.analysis.gpu_attribution import (
    ATTRIBUTED,
    NO_THREAD,
    STATUSES,
    AttributedOps,
    LaunchAttributor,
)
from chainer_autoprof.analysis.gpu_clock import fit
from chainer_autoprof.analysis.gpu_figures import IDLE_KEYS, GpuFigures
from chainer_autoprof.common import gpu_records
from chainer_autoprof.common.gpu_records import (
    KERNEL,
    MEMCPY,
    ActivityBatch,
    ApiCalls,
    ClockPairs,
    ExternalIds,
    GpuOps,
    NameTable,
    read_recording,
)
from chainer_autoprof.report import gpu_replay
from chainer_autoprof.report.tracefile import read_trace
from chainer_autoprof.runtime import cupti_readers, gpu_activity

DATA = Path(__file__).resolve().parent / "data" / "gpu" / "cupti"
RECORDINGS = ("b512", "b16")


def recording(name: str):
    return read_recording(str(DATA / name / "cupti_activity.json.gz"))


def agent_trace(name: str):
    return read_trace(str(DATA / name / "agent_trace.json"))


@pytest.fixture(scope="module", params=RECORDINGS)
def replayed(request):
    name = request.param
    trace, rec = agent_trace(name), recording(name)
    analysis = gpu_replay.replay(trace, rec)
    return name, trace, rec, analysis, analysis.finish()


# -- the records ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", RECORDINGS)
def test_recording_becomes_one_batch_of_every_record(name):
    raw = json.loads(__import__("gzip").open(DATA / name / "cupti_activity.json.gz").read())
    rec = recording(name)
    ops, api = rec.batch.ops, rec.batch.api
    assert int((ops.kind == KERNEL).sum()) == len(raw["kernels"])
    assert int((ops.kind == MEMCPY).sum()) == len(raw["memcpy"])
    assert len(api) == len(raw["runtime"]) + len(raw["driver"])
    assert len(rec.batch.external) == len(raw["external"])
    assert rec.batch.names.names == raw["kernel_names"]
    k = ops.kind == KERNEL
    assert sorted(ops.start[k].tolist()) == sorted(r[0] for r in raw["kernels"])
    # copies have no device column there: placed on their stream's device
    assert set(ops.device.tolist()) == {0}
    # every operation's correlation id is that of exactly one runtime or driver call
    runtime = set(api.correlation[api.domain == gpu_records.RUNTIME].tolist())
    driver = set(api.correlation[api.domain == gpu_records.DRIVER].tolist())
    assert not runtime & driver
    corr = set(ops.correlation.tolist())
    assert corr <= runtime | driver
    # CuPy's own kernels come from driver calls, cuBLAS's and the copies from runtime calls
    assert corr & driver and corr & runtime


def _as_cupti_records(rec) -> list[SimpleNamespace]:
    """The recording's rows as cupti-python hands records over (attributes in snake case)."""
    out = []
    b = rec.batch
    kinds = {KERNEL: gpu_records.CUPTI_KIND_CONCURRENT_KERNEL,
             MEMCPY: gpu_records.CUPTI_KIND_MEMCPY,
             gpu_records.MEMSET: gpu_records.CUPTI_KIND_MEMSET}
    for i in range(len(b.ops)):
        o = b.ops
        rec_ = SimpleNamespace(kind=kinds[int(o.kind[i])], start=int(o.start[i]), end=int(o.end[i]),
                               correlation_id=int(o.correlation[i]), device_id=int(o.device[i]),
                               stream_id=int(o.stream[i]))
        if o.kind[i] == KERNEL:
            rec_.name = b.names.name(int(o.name[i]))
        else:
            rec_.bytes, rec_.copy_kind = int(o.bytes[i]), int(o.copy_kind[i])
        out.append(rec_)
    for i in range(len(b.api)):
        a = b.api
        out.append(SimpleNamespace(
            kind=gpu_records.CUPTI_KIND_RUNTIME if a.domain[i] == gpu_records.RUNTIME
            else gpu_records.CUPTI_KIND_DRIVER, start=int(a.start[i]), end=int(a.end[i]),
            correlation_id=int(a.correlation[i]), cbid=int(a.cbid[i]),
            thread_id=int(a.thread[i]), process_id=569))
    for i in range(len(b.external)):
        out.append(SimpleNamespace(kind=gpu_records.CUPTI_KIND_EXTERNAL_CORRELATION,
                                   correlation_id=int(b.external.correlation[i]),
                                   external_id=int(b.external.external_id[i]), external_kind=2))
    out.append(SimpleNamespace(kind=37, stream_id=7))  # a kind not collected: skipped
    return out


@pytest.mark.parametrize("name", RECORDINGS)
def test_live_conversion_of_cupti_records_gives_the_loaders_batch(name):
    """The live collector's conversion (cupti-python's record objects, one buffer at a time)
    yields the same records as the recording's loader."""
    rec = recording(name)
    names = NameTable()
    records = _as_cupti_records(rec)
    pieces = [gpu_records.batch_from_records(records[i:i + 997], names)
              for i in range(0, len(records), 997)]
    live = ActivityBatch(GpuOps.concat([p.ops for p in pieces]),
                         ApiCalls.concat([p.api for p in pieces]),
                         ExternalIds.concat([p.external for p in pieces]), names)
    for column in ("kind", "start", "end", "correlation", "device", "stream", "bytes",
                   "copy_kind"):
        assert live.ops.__dict__[column].tolist() == rec.batch.ops.__dict__[column].tolist()
    assert [names.name(i) for i in live.ops.name.tolist()] == \
        [rec.batch.names.name(i) if i >= 0 else "kernel#-1" for i in rec.batch.ops.name.tolist()]
    for column in ApiCalls.columns():
        assert live.api.__dict__[column].tolist() == rec.batch.api.__dict__[column].tolist()
    assert live.external.external_id.tolist() == rec.batch.external.external_id.tolist()


@pytest.mark.parametrize("name", RECORDINGS)
def test_clock_pairs_put_cupti_on_the_agents_clock(name):
    rec = recording(name)
    clock = fit(rec.clock)
    # through both pairs exactly; the pairs' reads bound the error to a few microseconds
    assert clock.to_agent(rec.clock.cupti_ns).tolist() == rec.clock.perf_ns.tolist()
    assert clock.residual_ns == 0 and 0 < clock.bound_ns < 10_000
    assert abs(clock.slope - 1) < 1e-6  # the two clocks drift by less than 1 ppm
    # every record lies inside the span of the pairs
    assert clock.first_ns <= int(rec.batch.api.start.min())
    assert int(rec.batch.ops.end.max()) <= clock.last_ns


def test_a_fit_through_more_pairs_measures_the_clocks_straying():
    cupti = np.array([0, 1_000_000_000, 2_000_000_000], dtype=np.int64)
    perf = np.array([5_000, 1_000_005_000 + 800, 2_000_005_000], dtype=np.int64)
    clock = fit(ClockPairs(cupti, perf, np.array([300, 200, -1], dtype=np.int64)))
    assert 500 <= clock.residual_ns <= 600  # the middle pair strays 800 ns from a line
    assert clock.bound_ns == clock.residual_ns + 300
    assert clock.bound_at(3_000_000_000) > clock.bound_ns  # extrapolated: more
    single = fit(ClockPairs.from_rows([(100, 40)]))
    assert single.to_agent(np.array([1100], dtype=np.int64)).tolist() == [1040]
    with pytest.raises(ValueError):
        fit(ClockPairs.from_rows([]))


def test_a_clock_pair_is_read_between_two_perf_counter_reads():
    import time
    other, perf, read = gpu_activity.read_clock_pair(time.time_ns)
    assert read >= 0 and abs(time.perf_counter_ns() - perf) < 1_000_000_000
    assert abs(time.time_ns() - other) < 1_000_000_000


# -- attribution by launch -----------------------------------------------------------------

def test_forward_time_per_link_agrees_with_the_recordings_external_ids(replayed):
    """Attributed by launch (not by the external ids), each link's forward kernel time
    agrees with the external-id attribution of the same kernels for >= 99% of its time."""
    name, _trace, rec, analysis, _fig = replayed
    assert len(analysis.records()) == len(rec.batch.ops)  # nothing dropped at the default limit
    ours, theirs, both = forward_kernel_time_by_link(analysis, rec)
    assert set(theirs) == {"Classifier", "predictor", "conv1", "conv2", "conv3", "fc1",
                           "fc2", "fc3"}
    assert set(ours) == set(theirs)
    for link in theirs:
        assert both[link] >= 0.99 * max(theirs[link], ours[link]), (name, link)


def test_every_operation_is_attributed_to_the_thread_that_launched_it(replayed):
    _name, trace, rec, analysis, fig = replayed
    assert fig.statuses == {"attributed": {"ops": len(rec.batch.ops),
                                           "ms": pytest.approx(fig.statuses["attributed"]["ms"])}}
    # the recording has no thread map: CUPTI's main thread was found by containment
    main = trace.meta["main_tid"]
    assert list(analysis.attributor.thread_map.values()) == [main]
    # its id is pthread_self() cut to 32 bits (a glibc thread descriptor: 64-byte aligned)
    (cupti_thread,) = analysis.attributor.thread_map
    assert cupti_thread != main and cupti_thread % 64 == 0
    records = analysis.records()
    assert set(records.attr.tid.tolist()) == {main}
    # each launch lies inside the range it is attributed to; the few outside every range
    # (the model's arrays copied to the GPU before training) belong to no iteration
    a = records.attr
    ranged = a.range >= 0
    assert ((a.range_t0 <= a.api_start) & (a.api_start <= a.range_t1))[ranged].all()
    assert (a.iteration[~ranged] == -1).all() and ranged.mean() > 0.95


def test_b512_conv2_and_conv3_forward_per_iteration():
    fig = gpu_replay.replay(agent_trace("b512"), recording("b512")).finish()
    per = {short(link["name"]): fig.per_iteration(link["fwd_ms"]) for link in fig.links}
    assert per["conv2"] == pytest.approx(5.9, rel=0.05)
    assert per["conv3"] == pytest.approx(2.9, rel=0.05)
    # GPU-bound: the kernels keep the GPU busy, the host never makes it wait
    assert fig.busy_share > 0.95
    assert fig.idle_ms["host"] < 0.01 * fig.span_ms
    assert fig.iterations == 12 and fig.warmup_skip == 3


def test_b16_gpu_busy_share_near_22_percent():
    fig = gpu_replay.replay(agent_trace("b16"), recording("b16")).finish()
    assert fig.busy_share == pytest.approx(0.22, abs=0.05)
    # host-bound: the idle time is the host's (launching late) far more than the rest
    assert fig.idle_ms["host"] > 0.6 * (fig.span_ms - fig.busy_ms)
    # the windows add up: busy + every idle category == the span, per iteration too
    assert fig.busy_ms + sum(fig.idle_ms.values()) == pytest.approx(fig.span_ms, abs=1e-3)
    cols = fig.iteration_ms
    for i in range(fig.iterations):
        assert cols["busy"][i] + sum(cols[k][i] for k in IDLE_KEYS) == \
            pytest.approx(cols["span"][i], abs=1e-5)


def test_figures_by_phase_link_and_kernel_add_up(replayed):
    _name, _trace, rec, analysis, fig = replayed
    records = analysis.records()
    counted = (records.attr.counted == 1) & (records.ops.kind == KERNEL)
    kernel_ns = int((records.ops.end - records.ops.start)[counted].sum())
    assert sum(p["kernel_ms"] for p in fig.phases.values()) == pytest.approx(kernel_ns / 1e6)
    assert sum(p["kernels"] for p in fig.phases.values()) == int(counted.sum())
    # nearly every kernel launched in forward or backward sits in a link's range (backward
    # starts with the loss's gradient, filled before the first link-backward range)
    linked = sum(x["fwd_ms"] + x["bwd_ms"] for x in fig.links)
    passes = fig.phases["forward"]["kernel_ms"] + fig.phases["backward"]["kernel_ms"]
    assert 0.998 * passes <= linked <= passes
    # every iteration runs the same work: the same kernels, each in one counted iteration
    per_iteration = Counter(records.attr.iteration[counted].tolist())
    assert len(per_iteration) == fig.iterations and len(set(per_iteration.values())) == 1
    assert 100 <= next(iter(per_iteration.values())) <= 102
    top = fig.top_kernels[0]
    assert top["ms"] == max(t["ms"] for t in fig.top_kernels) and top["calls"] > 0
    assert all(t["link"] is None or analysis.link_keys.count(t["link"]) == 1
               for t in fig.top_kernels)
    assert fig.warmup_kernel_ms > 0 and fig.ops["kernel"] == int(
        (rec.batch.ops.kind == KERNEL).sum())


def test_figures_serialize_for_the_run_record(replayed):
    fig = replayed[4]
    data = fig.to_dict()
    text = json.dumps(data, allow_nan=False)
    again = GpuFigures.from_dict(json.loads(text))
    assert again == fig
    assert GpuFigures.from_dict({**data, "a later field": 1}) == fig


@pytest.mark.parametrize("name", RECORDINGS)
def test_buffers_in_any_blocks_and_order_give_the_same_figures(name):
    """Live, buffers come late and out of order across streams, ranges in blocks: the
    result does not depend on how either is cut or ordered."""
    trace, rec = agent_trace(name), recording(name)
    whole = gpu_replay.replay(trace, rec, pieces=1).finish().to_dict()
    clock = fit(rec.clock)
    pieces = rec.batch.split(41)
    random.Random(7).shuffle(pieces)
    # ranges in small blocks, interleaved with the buffers, and the API calls of a buffer
    # arriving after its operations
    analysis = gpu_replay.GpuAnalysis(clock, rec.batch.names, trace.meta["warmup_skip"],
                                      loop_tid=trace.meta["main_tid"],
                                      limits=Limits(max_pool=300))
    names, rows = trace.range_rows()
    for i, (n, c) in enumerate(names):
        analysis.add_name(i, n, c)
    (tid, block), = rows.items()
    chunks = [block[i:i + 13] for i in range(0, len(block), 13)]
    for chunk, piece in itertools.zip_longest(chunks, pieces):
        if piece is not None:
            analysis.feed_activity(ActivityBatch(piece.ops, ApiCalls.empty(),
                                                 ExternalIds.empty(), piece.names))
        if chunk is not None:
            analysis.feed_ranges(tid, chunk)
        if piece is not None:
            analysis.feed_activity(ActivityBatch(GpuOps.empty(), piece.api, piece.external,
                                                 piece.names))
    analysis.thread_finished(tid)
    got = analysis.finish().to_dict()
    late = got.pop("late_ops")
    whole.pop("late_ops")
    # a tiny reorder pool places some operations late: they leave the timeline only
    for key in ("links", "phases", "top_kernels", "warmup_kernel_ms", "ops", "statuses"):
        assert got[key] == whole[key], key
    if late == 0:
        assert got == whole


def test_an_unknown_thread_is_counted_not_guessed():
    """Operations launched by a CUPTI thread that no agent thread contains stay unattributed."""
    rec = recording("b16")
    trace = agent_trace("b16")
    clock = fit(rec.clock)
    att = LaunchAttributor(clock, 3)
    names, rows = trace.range_rows()
    for i, (n, c) in enumerate(names):
        att.add_name(i, n, c)
    (tid, block), = rows.items()
    # the only agent thread's ranges lie elsewhere in time than every launch
    elsewhere = block.copy()
    elsewhere[:, 1:3] += 10**12
    out = [att.feed_ranges(tid, elsewhere)]
    out.append(att.feed_activity(rec.batch))
    out.append(att.finish())
    got = AttributedOps.concat(out)
    assert len(got) == len(rec.batch.ops)
    status = Counter(got.attr.status.tolist())
    # nothing ties the CUPTI thread to it: counted, never attributed to a guess
    assert status[NO_THREAD] == len(got)
    assert att.statuses() == {STATUSES[NO_THREAD]: {
        "ops": len(got), "ms": pytest.approx(int((got.ops.end - got.ops.start).sum()) / 1e6)}}
    assert ATTRIBUTED not in status


def test_the_live_agents_thread_map_needs_no_guess():
    rec = recording("b16")
    trace = agent_trace("b16")
    analysis = gpu_replay.GpuAnalysis(fit(rec.clock), rec.batch.names, 3)
    names, rows = trace.range_rows()
    for i, (n, c) in enumerate(names):
        analysis.add_name(i, n, c)
    (tid, block), = rows.items()
    main_thread = Counter(rec.batch.api.thread.tolist()).most_common(1)[0][0]
    analysis.map_thread(main_thread, tid)
    analysis.feed_activity(rec.batch)
    analysis.feed_ranges(tid, block)
    fig = analysis.finish()
    assert fig.to_dict() == gpu_replay.replay(trace, rec).finish().to_dict()
    assert analysis.attributor.thread_map == {main_thread: tid}


# -- the live collector, without a GPU ------------------------------------------------------

def test_without_cupti_python_gpu_activity_is_one_line_and_nothing_else(monkeypatch):
    monkeypatch.setenv(cupti_readers.ENV_CUPTI_READER, "python")
    got = cupti_readers.start(lambda batch: None)
    assert isinstance(got, str) and "cupti-python" in got and "\n" not in got


def test_cupti_taken_by_nsight_is_named():
    class CuptiError(Exception):
        status = gpu_activity.CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED

    line = gpu_activity.describe_error(CuptiError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"))
    assert "Nsight" in line and "\n" not in line


def test_a_failing_consumer_never_reaches_cuptis_thread():
    def broken(batch):
        raise RuntimeError("consumer bug")

    collector = gpu_activity.CuptiCollector(broken)
    records = _as_cupti_records(recording("b16"))[:50]
    collector._buffer_completed(records)  # as CUPTI calls it, on its thread
    assert collector.callback_errors == 1 and "consumer bug" in collector.last_error
    seen = []
    ok = gpu_activity.CuptiCollector(seen.append)
    ok._buffer_completed(records)
    assert len(seen) == 1 and len(seen[0].ops) + len(seen[0].api) == 50
