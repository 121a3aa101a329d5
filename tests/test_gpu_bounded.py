"""GPU activity at scale: a synthetic stream of a million kernels keeps memory and the trace
bounded, and its figures exact."""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
import pytest
from keeper_reference import attributed_ops

from chainer_autoprof.analysis.gpu_analysis import AttributedKeeper, GpuAnalysis, Limits
from chainer_autoprof.analysis.gpu_attribution import AttributedOps
from chainer_autoprof.analysis.gpu_clock import fit
from chainer_autoprof.analysis.stats import DEPTH_BITS
from chainer_autoprof.common.gpu_records import (
    DRIVER,
    KERNEL,
    ActivityBatch,
    ApiCalls,
    ClockPairs,
    ExternalIds,
    GpuOps,
    NameTable,
)
from chainer_autoprof.report import gpu_events

TID = 4242
CUPTI_THREAD = 0xABCDE6C0
LINKS = 10
KERNELS_PER_RANGE = 5          # per link, forward and backward: 100 kernels an iteration
PERIOD = 1_000_000             # ns per iteration
KERNEL_NS = 3_000
LAG = 20_000                   # the GPU runs each kernel this long after its launch
WARMUP = 3
BLOCK = 100                    # iterations per block of ranges and of activity


def names() -> list[tuple[str, str]]:
    out = [("iteration", "iteration"), ("forward", "forward"), ("backward", "backward")]
    out += [(f"model/l{j} (Linear)", "link") for j in range(LINKS)]
    out += [(f"model/l{j} (Linear) backward", "link_backward") for j in range(LINKS)]
    return out


def ranges(first: int, count: int) -> np.ndarray:
    """Rows (index, t0, t1, depth) of iterations first..first+count, in end order."""
    rows = []
    for i in range(first, first + count):
        t = i * PERIOD
        for j in range(LINKS):
            s = t + 20_000 + j * 35_000
            rows.append((3 + j, s, s + 30_000, 2))
        rows.append((1, t + 10_000, t + 400_000, 1))
        for j in range(LINKS):
            s = t + 460_000 + j * 40_000
            rows.append((3 + LINKS + (LINKS - 1 - j), s, s + 35_000, 2))
        rows.append((2, t + 450_000, t + 900_000, 1))
        rows.append((0, t, t + 950_000, 0 | ((i + 1) << DEPTH_BITS)))
    return np.asarray(rows, dtype=np.int64)


def launches(first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Launch times and link (0..9 forward, 10..19 backward) of every kernel."""
    t = (np.arange(first, first + count) * PERIOD)[:, None, None]
    j = np.arange(LINKS)[None, :, None]
    k = np.arange(KERNELS_PER_RANGE)[None, None, :]
    fwd = t + 20_000 + j * 35_000 + 1_000 + k * 5_000
    bwd = t + 460_000 + (LINKS - 1 - j) * 40_000 + 1_000 + k * 5_000
    times = np.concatenate([fwd.reshape(count, -1), bwd.reshape(count, -1)], axis=1)
    link = np.concatenate([np.repeat(np.arange(LINKS), KERNELS_PER_RANGE),
                           LINKS + np.repeat(np.arange(LINKS), KERNELS_PER_RANGE)])
    return times.reshape(-1), np.tile(link, count)


def activity(first: int, count: int, table: NameTable) -> tuple[GpuOps, ApiCalls]:
    launch, _link = launches(first, count)
    n = len(launch)
    corr = first * 100 + np.arange(n, dtype=np.int64) + 1
    ops = GpuOps.from_columns(n, {
        "kind": np.full(n, KERNEL), "start": launch + LAG, "end": launch + LAG + KERNEL_NS,
        "correlation": corr, "device": np.zeros(n), "context": np.ones(n),
        "stream": 7 + (np.arange(n) % 2), "name": np.arange(n) % 7})
    api = ApiCalls.from_columns(n, {
        "domain": np.full(n, DRIVER), "start": launch, "end": launch + 2_000,
        "correlation": corr, "cbid": np.full(n, 307), "thread": np.full(n, CUPTI_THREAD)})
    return ops, api


#: Small limits, so that the short stream already fills every bounded store.
LIMITS = Limits(max_api=1 << 14, max_pending=1 << 14, max_pool=1 << 13, max_ranges=1 << 14)


def run(iterations: int, record_limit: int) -> tuple[GpuAnalysis, int, float]:
    """Feed the stream block by block: ranges, then activity, stream 8's buffers one block
    late and each block's API calls after its kernels; returns (analysis, peak bytes, s)."""
    table = NameTable(f"kernel_{i}" for i in range(7))
    clock = fit(ClockPairs.from_rows([(0, 0), (10**15, 10**15)]))
    tracemalloc.start()
    t0 = time.perf_counter()
    analysis = GpuAnalysis(clock, table, WARMUP, record_limit=record_limit, loop_tid=TID,
                           limits=LIMITS)
    for i, (name, category) in enumerate(names()):
        analysis.add_name(i, name, category)
    analysis.map_thread(CUPTI_THREAD, TID)
    late_ops: GpuOps | None = None
    for first in range(0, iterations, BLOCK):
        analysis.feed_ranges(TID, ranges(first, BLOCK))
        ops, api = activity(first, BLOCK, table)
        seven = ops.stream == 7
        parts = [ops.take(seven)] + ([late_ops] if late_ops is not None else [])
        analysis.feed_activity(ActivityBatch(GpuOps.concat(parts), ApiCalls.empty(),
                                             ExternalIds.empty(), table))
        analysis.feed_activity(ActivityBatch(GpuOps.empty(), api, ExternalIds.empty(), table))
        late_ops = ops.take(~seven)
    analysis.feed_activity(ActivityBatch(late_ops, ApiCalls.empty(), ExternalIds.empty(),
                                         table))
    analysis.thread_finished(TID)
    analysis.finish()
    seconds = time.perf_counter() - t0
    _now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return analysis, peak, seconds


def test_a_million_kernels_in_bounded_memory_with_exact_figures():
    _small, small_peak, _ = run(1_000, record_limit=20_000)       # 100,000 kernels
    big, big_peak, seconds = run(10_000, record_limit=20_000)    # 1,000,000 kernels
    print(f"100k kernels: peak {small_peak / 1e6:.1f} MB; 1M kernels: peak "
          f"{big_peak / 1e6:.1f} MB in {seconds:.1f} s")
    # memory does not grow with the stream: ten times the kernels, about the same peak
    assert big_peak < 1.2 * small_peak + 2e6
    assert big_peak < 48e6
    assert seconds < 180  # about 10-20 s alone; the machine is shared
    fig = big.finish()
    counted = 10_000 - WARMUP
    assert fig.iterations == counted and fig.late_ops == 0
    assert fig.ops == {"kernel": 1_000_000, "memcpy": 0, "memset": 0}
    assert fig.statuses == {"attributed": {"ops": 1_000_000, "ms": pytest.approx(3_000.0)}}
    # every kernel on its link, forward and backward
    for link in fig.links:
        assert link["fwd_kernels"] == link["bwd_kernels"] == KERNELS_PER_RANGE * counted
        assert link["fwd_ms"] == link["bwd_ms"] == pytest.approx(
            KERNELS_PER_RANGE * counted * KERNEL_NS / 1e6)
    assert len(fig.links) == LINKS
    # 100 kernels of 3 us in each 1 ms iteration window (the last one ends with its kernels)
    assert fig.busy_share == pytest.approx(100 * KERNEL_NS / PERIOD, rel=1e-4)
    assert fig.iteration_ms["span"][0] == pytest.approx(PERIOD / 1e6)
    assert fig.busy_ms + sum(fig.idle_ms.values()) == pytest.approx(fig.span_ms)
    assert fig.phases["forward"]["kernels"] == fig.phases["backward"]["kernels"] == 50 * counted
    # per-iteration lists stay within their cap; the trace keeps the newest record_limit ops
    assert len(fig.iteration_ms["busy"]) == counted
    kept = big.records()
    assert len(kept) == 20_000 and big.keeper.dropped == 1_000_000 - 20_000
    assert kept.ops.start.min() > (10_000 - 201) * PERIOD  # the newest ones
    events = gpu_events.encode(kept, pid=1, start_ns=0, names=big.names,
                               range_names=big.range_names, link_keys=big.link_keys)
    assert 20_000 < len(events) <= 4 * 20_000 + 16  # the metadata and every text


def test_a_million_kernels_through_the_live_path_keep_memory_and_the_trace_bounded(tmp_path):
    """The same stream through the agent's own path: the recorder's blocks and CUPTI's
    batches queued, drained by the session's thread, the exit, the trace writer."""
    from chainer_autoprof.common import names as range_names
    from chainer_autoprof.common.settings import from_environ
    from chainer_autoprof.lifecycle import gpu_session
    from chainer_autoprof.lifecycle.finish import report_run
    from chainer_autoprof.runtime.device import CountingBackend
    from chainer_autoprof.runtime.events import Tracer
    from chainer_autoprof.runtime.gpu_activity import CuptiCollector
    from chainer_autoprof.runtime.policies import SyncPolicy
    from chainer_autoprof.sinks.recorder import Recorder

    iterations, limit = 10_000, 20_000
    path = tmp_path / "trace.json"
    cfg = from_environ({}, overrides={"trace": str(path), "summary": False, "warmup": WARMUP,
                                      "record_limit": limit, "gc": False, "granularity": "link",
                                      "flush_interval": 0})
    tracer = Tracer(range_names.GRANULARITY_LEVEL["link"], SyncPolicy(0, CountingBackend()),
                    clock=iter([0, iterations * PERIOD + PERIOD]).__next__)
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)
    index = np.array([tracer.info(n, c).index for n, c in names()], dtype=np.int64)

    def start(on_batch, table):
        collector = CuptiCollector(on_batch, names=table)
        collector._pairs = [(0, 0, 0), (10**15, 10**15, 0)]
        collector.running = True
        return collector

    session = gpu_session.GpuSession(recorder, record_limit=limit, warmup_skip=WARMUP,
                                     window=False, main_tid=TID, start_collector=start,
                                     limits=LIMITS)  # every bound reached in the first tenth
    tracer.on_new_thread = session.thread_started  # the agent's composition
    recorder.gpu_handover = session.handover
    tracemalloc.start()
    t0 = time.perf_counter()
    session.start()
    session._threads.append((CUPTI_THREAD, TID))  # told at the loop thread's state's creation
    peaks: list[int] = []
    table = session.names
    for name in (f"kernel_{i}" for i in range(7)):
        table.intern(name)
    for first in range(0, iterations, BLOCK):
        rows = ranges(first, BLOCK)
        rows[:, 0] = index[rows[:, 0]]
        for i in range(0, len(rows), 4096):  # as the recorder's buffer fills
            recorder._absorb(TID, [tuple(r) for r in rows[i:i + 4096].tolist()])
        ops, api = activity(first, BLOCK, table)
        session._on_batch(ActivityBatch(ops, api, ExternalIds.empty(), table))
        if first // BLOCK % 10 == 9:  # CUPTI hands buffers over about once a second
            while session.queued:
                time.sleep(0.01)
            _now, window_peak = tracemalloc.get_traced_memory()  # each 100,000 kernels' peak
            peaks.append(window_peak)
            tracemalloc.reset_peak()
    tracer.close()
    outcome = session.finish()
    report_run(recorder, tracer, cfg, hits=1, trace_path=lambda: str(path), gpu=outcome)
    seconds = time.perf_counter() - t0
    _now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    size = path.stat().st_size
    print("1M kernels through the live path: peak per 100,000 kernels "
          + ", ".join(f"{p / 1e6:.1f}" for p in peaks) + f" MB, {peak / 1e6:.1f} MB with the "
          f"exit; {seconds:.1f} s, trace {size / 1e6:.1f} MB")
    # the bounded stores fill over the first few hundred thousand kernels, then memory stays: the
    # last half million kernels peak no higher than the first half million, but for what one
    # drain's passing work adds when it finds more queued (up to 15 MB here, with the timing); a
    # store that grew by 40 bytes a kernel would add 20 MB
    assert max(peaks[5:]) < max(peaks[:5]) + 20e6
    assert max(peaks) < 120e6
    assert outcome is not None and session.dropped_ops == session.dropped_ranges == 0
    fig = outcome.figures
    assert fig.ops["kernel"] == 1_000_000 and fig.iterations == iterations - WARMUP
    assert fig.statuses == {"attributed": {"ops": 1_000_000, "ms": pytest.approx(3_000.0)}}
    assert fig.busy_share == pytest.approx(100 * KERNEL_NS / PERIOD, rel=1e-4)
    assert peak < 120e6  # the recorder's kept ranges, the analysis' bounded state, the writer
    events = json.loads(path.read_text())["traceEvents"]
    gpu = [e for e in events if gpu_events.is_gpu_event(e) and e["ph"] != "M"]
    steps = [e for e in gpu if e.get("cat") == "user_annotation"]
    assert len(gpu) - len(steps) <= limit  # four events at most per kept operation
    assert len([e for e in gpu if e.get("cat") == "kernel"]) == limit // 4
    assert size < 30e6


def kept_ops(iteration: list[int], first_corr: int, tid: int = TID,
             warmup: int = WARMUP) -> AttributedOps:
    """Attributed operations, one per entry of ``iteration`` (its ordinal, -1: none)."""
    return attributed_ops(iteration, first_corr, tid, warmup)


def test_the_trace_keeps_whole_iterations_before_what_ran_outside_them():
    """Over the limit the keeper drops what ran outside any iteration first (newer or not),
    then warm-up iterations, then the oldest iterations, whole; an iteration's operations
    that arrive after it was dropped are dropped too; memory stays within twice the limit."""
    keeper = AttributedKeeper(100)
    keeper.add(kept_ops([-1] * 10, 0))                       # start-up
    for i in range(8):                                        # 3 warm-up, 5 counted
        keeper.add(kept_ops([i] * 15 + [i + 1] * 5, 100 * (i + 1)))  # the next one begins
    keeper.add(kept_ops([-1] * 40, 5000))                     # an evaluation after training
    kept = keeper.records()
    iterations = sorted(set(kept.attr.iteration.tolist()))
    # outside (start-up, then the evaluation) and warm-up went first, then iteration 3 whole
    assert iterations == [4, 5, 6, 7, 8]
    assert keeper.complete_iterations() == {(TID, 1000 * i) for i in iterations}
    assert len(kept) == keeper.kept == 4 * 20 + 5
    assert keeper.dropped_by == [10 + 40, 15 + 2 * 20, 20]
    # the oldest iterations go whole when more come; late operations of a dropped one too
    keeper.add(kept_ops([9] * 20 + [10] * 20, 9000))
    keeper.add(kept_ops([4] * 3, 9900))
    kept = keeper.records()
    assert sorted(set(kept.attr.iteration.tolist())) == [6, 7, 8, 9, 10]
    assert not (kept.attr.iteration == 4).any() and keeper.dropped_by[2] == 3 * 20 + 3
    assert keeper.dropped_iterations == 6
    assert sum(len(b.items) for b in keeper.blocks) <= 2 * keeper.limit
    # an iteration alone larger than the limit keeps its newest operations, and is not whole
    keeper.add(kept_ops([11] * 150, 20_000))
    kept = keeper.records()
    assert len(kept) == 100 and (kept.attr.iteration == 11).all()
    assert kept.ops.correlation.min() == 20_050
    assert keeper.complete_iterations() == set()
    note = keeper.note()
    assert note == ("the trace keeps 0 whole iterations' GPU operations (record limit); "
                    f"left out: 12 iterations' ({sum(keeper.dropped_by[1:])}), 50 outside any "
                    "iteration; the figures count all")


def test_the_trace_keeper_over_a_long_run_drops_what_the_reference_did():
    """NumPy's keeper (no C extension) over a long run at its limit keeps and drops, buffer
    after buffer, what its reference (one object and heap entry a group) did."""
    from keeper_reference import ReferenceKeeper, keeper_state, long_run_buffers

    reference, keeper = ReferenceKeeper(400), AttributedKeeper(400)
    for items in long_run_buffers(8, 120):
        reference.add(items)
        keeper.add(items)
        assert keeper_state(keeper) == keeper_state(reference)
    assert reference.dropped_iterations > 150 and reference.dropped_by[0] > 200
