"""The in-process recorder: aggregation, bounded memory, GPU phase timing.

The vectorized :class:`Aggregator` is checked against a plain per-range
implementation of the documented rules on random, well-formed range streams,
cut into blocks at random places (the live recorder aggregates in blocks, a
trace is read in one go: both must give the same numbers).
"""

from __future__ import annotations

import functools
import json
import random
import tracemalloc

import numpy as np
import pytest
from support import EXAMPLES, program, run_with_agent

from chainer_autoprof.analysis.aggregate import Aggregator
from chainer_autoprof.analysis.outliers import slow_iterations
from chainer_autoprof.analysis.series import Series
from chainer_autoprof.analysis.stats import PHASE_KEYS
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.lifecycle.finish import report_run
from chainer_autoprof.lifecycle.processes import trace_path
from chainer_autoprof.runtime.device import CountingBackend, NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import CHUNK_RANGES, Recorder

# -- a plain implementation of the aggregation rules (the oracle) ----------------------


def reference(threads: dict[int, list[tuple]], warmup: int, end_ns: int) -> dict:
    """Per-range, obviously-correct aggregation of ``(name, cat, t0, t1, depth)`` rows."""
    seen = counted = 0
    iteration_ms, phase_rows = [], []
    links: dict[str, list[int]] = {}
    outside_by_thread, iterations_by_thread = {}, {}
    for tid, rows in threads.items():
        phases = dict.fromkeys(PHASE_KEYS[:4], 0)
        child: dict[int, int] = {}
        pending: dict[str, list[int]] = {}
        outside: dict[str, int] = {}
        last_end, gap_pending, seen_iter = 0, 0, False
        named_pending: dict[str, int] = {}  # named ranges after the last iteration so far
        nested_counted = nested_warm = nested = 0
        n_iter = 0
        for name, cat, t0, t1, depth in rows:
            dur = t1 - t0
            if cat == names.LINK:
                s = pending.setdefault(name, [0, 0, 0, 0, 0])
                s[0] += 1
                s[1] += dur
                s[2] += dur - child.pop(depth, 0)
                if depth:
                    child[depth - 1] = child.get(depth - 1, 0) + dur
            else:
                child.pop(depth, None)
            if cat in names.PHASES:
                phases[cat] += dur
            elif cat == names.LINK_BACKWARD:
                s = pending.setdefault(name[:-len(" backward")], [0, 0, 0, 0, 0])
                s[3] += 1
                s[4] += dur
            elif cat in (names.EXTENSION, names.INFERENCE):
                pending = {}
            if name == names.NO_UPDATE:  # its phases were no iteration's
                phases = dict.fromkeys(PHASE_KEYS[:4], 0)
            is_counted = False
            if cat == names.ITERATION:
                seen += 1
                n_iter += 1
                is_counted = seen > warmup
                if is_counted:
                    counted += 1
                    ph = [phases[k] for k in PHASE_KEYS[:4]]
                    iteration_ms.append(dur)
                    phase_rows.append([*ph, dur - sum(ph)])
                    for key, s in pending.items():
                        total = links.setdefault(key, [0, 0, 0, 0, 0])
                        for i in range(5):
                            total[i] += s[i]
                pending = {}
                phases = dict.fromkeys(PHASE_KEYS[:4], 0)
                if depth:
                    nested += 1
                    if is_counted:
                        nested_counted += dur
                    else:
                        nested_warm += dur
            if depth == 0:
                gap = t0 - last_end
                if gap > 0:
                    if seen_iter:
                        gap_pending += gap
                    else:
                        outside["startup"] = outside.get("startup", 0) + gap
                last_end = max(last_end, t1)
                # an iteration, or a range holding some: what came since the last one was
                # between iterations
                if cat == names.ITERATION or nested:
                    if seen_iter and gap_pending:
                        outside["idle"] = outside.get("idle", 0) + gap_pending
                    for key, ns in named_pending.items():
                        outside[key] = outside.get(key, 0) + ns
                    named_pending = {}
                    gap_pending = 0
                    seen_iter = True
                if cat == names.ITERATION:
                    if not is_counted:
                        outside["warm-up"] = outside.get("warm-up", 0) + dur
                else:
                    key = f"user:{name}" if cat == names.USER else name
                    own = dur - nested_counted - nested_warm
                    if nested:
                        outside[key] = outside.get(key, 0) + own
                    elif not seen_iter:  # before the first iteration: start-up
                        outside["startup"] = outside.get("startup", 0) + own
                    else:  # between iterations once another one follows
                        named_pending[key] = named_pending.get(key, 0) + own
                    if nested_warm:
                        outside["warm-up"] = outside.get("warm-up", 0) + nested_warm
                nested_counted = nested_warm = nested = 0
        tail = max(0, end_ns - last_end) + gap_pending + sum(named_pending.values())
        if tail:
            label = "shutdown" if seen_iter else "startup"
            outside[label] = outside.get(label, 0) + tail
        outside_by_thread[tid] = outside
        iterations_by_thread[tid] = n_iter
    loop = max(iterations_by_thread, key=lambda t: (iterations_by_thread[t], -t))
    return {
        "iterations": counted, "warmup": seen - counted,
        "iteration_ms": [v / 1e6 for v in iteration_ms],
        "phase_ms": {k: [row[i] / 1e6 for row in phase_rows] for i, k in enumerate(PHASE_KEYS)},
        "outside_ms": {k: v / 1e6 for k, v in outside_by_thread[loop].items() if v > 0},
        "links": {k: [s[0], s[1] / 1e6, s[2] / 1e6, s[3], s[4] / 1e6]
                  for k, s in links.items()},
    }


# -- random training-like programs ------------------------------------------------------------

class Program:
    """Ranges of a made-up training program, in end order, with a moving clock."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.t = rng.randint(1, 1000)
        self.rows: list[tuple] = []

    def tick(self) -> int:
        self.t += self.rng.randint(1, 300)
        return self.t

    def range(self, name: str, cat: str, depth: int, body=None) -> None:
        t0 = self.tick()
        if body is not None:
            body(depth + 1)
        self.rows.append((name, cat, t0, self.tick(), depth))

    def functions(self, depth: int, suffix: str = "forward") -> None:
        for _ in range(self.rng.randint(0, 2)):
            self.range(f"linear.{suffix}", names.FUNCTION, depth)

    def model(self, depth: int) -> None:
        def predictor(d):
            for layer in ("l1", "l2")[: self.rng.randint(1, 2)]:
                self.range(f"predictor/{layer} (Linear)", names.LINK, d,
                           lambda dd: self.functions(dd))
            self.functions(d)
        self.range("Classifier", names.LINK, depth,
                   lambda d: self.range("predictor (MLP)", names.LINK, d, predictor))

    def backward(self, depth: int) -> None:
        for link in ("Classifier", "predictor/l2 (Linear)", "predictor/l1 (Linear)"):
            if self.rng.random() < 0.8:
                self.range(f"{link} backward", names.LINK_BACKWARD, depth,
                           lambda d: self.functions(d, "backward"))

    def iteration(self, depth: int) -> None:
        def body(d):
            if self.rng.random() < 0.9:
                self.range("data", names.DATA, d)
            self.range("forward", names.FORWARD, d, self.model)
            self.range("backward", names.BACKWARD, d, self.backward)
            if self.rng.random() < 0.2:
                self.range("step", names.USER, d)
            self.range("update", names.UPDATE, d)
        self.range("iteration", names.ITERATION, depth, body)

    def run(self, items: int) -> list[tuple]:
        for _ in range(items):
            r = self.rng.random()
            if r < 0.6:
                self.iteration(0)
            elif r < 0.7:
                self.range("extension:validation (Evaluator)", names.EXTENSION, 0,
                           self.model)
            elif r < 0.78:
                self.range("inference", names.INFERENCE, 0, self.model)
            elif r < 0.88:
                def epoch(d):
                    for _ in range(self.rng.randint(1, 3)):
                        self.iteration(d)
                self.range("epoch", names.USER, 0, epoch)
            elif r < 0.93:
                self.range("relu.forward", names.FUNCTION, 0)
            elif r < 0.96:  # began as an iteration, reached no update
                def no_update(d):
                    self.range("data", names.DATA, d)
                    self.range("forward", names.FORWARD, d, self.model)
                self.range(names.NO_UPDATE, names.INFERENCE, 0, no_update)
            else:
                self.tick()
        return self.rows


def aggregate(threads: dict[int, list[tuple]], warmup: int, end_ns: int,
              rng: random.Random, max_kept: int = 1 << 16):
    agg = Aggregator(0, warmup, max_kept=max_kept)
    index: dict[tuple[str, str], int] = {}
    for rows in threads.values():
        for name, cat, *_ in rows:
            if (name, cat) not in index:
                index[(name, cat)] = len(index)
                agg.add_name(index[(name, cat)], name, cat)
    feeds = {tid: [(index[(n, c)], t0, t1, d) for n, c, t0, t1, d in rows]
             for tid, rows in threads.items()}
    positions = dict.fromkeys(feeds, 0)
    while any(positions[tid] < len(rows) for tid, rows in feeds.items()):
        for tid, rows in feeds.items():  # threads interleaved, blocks of random size
            start = positions[tid]
            stop = min(len(rows), start + rng.choice([1, 2, 3, 7, 50, 500]))
            if start < stop:
                agg.feed(tid, np.array(rows[start:stop], dtype=np.int64))
                positions[tid] = stop
    return agg.result(end_ns, main_tid=min(threads))


def _iterations_with_gc(durations_ms: list[int], gc_ms: list[int]) -> np.ndarray:
    """Rows (in end order) of back-to-back iterations, each with a collection of ``gc_ms``."""
    rows, t = [], 0
    for duration, collection in zip(durations_ms, gc_ms):
        if collection:
            rows.append((1, t + 1000, t + 1000 + collection * 1_000_000, 1))
        rows.append((0, t, t + duration * 1_000_000, 0))
        t += duration * 1_000_000 + 1000
    return np.array(rows, dtype=np.int64)


def test_slow_iterations_and_gc_time_are_the_loop_threads():
    """Threads training at once: the slowest iterations and the collection time are the
    loop thread's, as every other figure of the summary (they add up to its wall time)."""
    agg = Aggregator(0, 0)
    agg.add_name(0, "iteration", names.ITERATION)
    agg.add_name(1, names.gc_text(2), names.GC)
    agg.feed(1, _iterations_with_gc([10] * 19 + [50], [0] * 19 + [40]))
    agg.feed(2, _iterations_with_gc([10, 10, 500], [0, 0, 400]))  # another thread's
    stats = agg.result(10 ** 10, main_tid=1)
    assert stats.iterations == 20 and stats.other_thread_iterations == 3
    assert stats.gc_total_ms == pytest.approx(40)
    assert stats.gc_ms == pytest.approx([0] * 19 + [40])
    assert max(item["ms"] for item in stats.slowest) == pytest.approx(50)
    assert [(item.iteration, item.cause, item.generation) for item in slow_iterations(stats)] \
        == [(19, "gc", 2)]


@pytest.mark.parametrize("seed", range(12))
def test_block_aggregation_agrees_with_the_plain_rules(seed):
    rng = random.Random(seed)
    main = Program(rng).run(rng.randint(5, 60))
    helper = Program(rng)  # a second thread: links and user ranges, no iterations
    for _ in range(rng.randint(0, 10)):
        helper.range("prefetch", names.USER, 0, helper.model)
    threads = {100: main, 200: helper.rows}
    end_ns = max(r[3] for r in main) + rng.randint(0, 500)
    warmup = rng.randint(0, 4)
    expected = reference(threads, warmup, end_ns)
    stats = aggregate(threads, warmup, end_ns, rng)

    assert stats.iterations == expected["iterations"]
    assert stats.warmup == expected["warmup"]
    assert stats.iteration_ms == pytest.approx(expected["iteration_ms"])
    for key in PHASE_KEYS:
        assert stats.phase_ms[key] == pytest.approx(expected["phase_ms"][key]), key
    assert stats.outside_ms == pytest.approx(expected["outside_ms"])
    assert {s.name: [s.calls, s.incl_ms, s.self_ms, s.bwd_calls, s.bwd_ms]
            for s in stats.links} == expected["links"]
    assert stats.ranges == len(main) + len(helper.rows)
    # wall time is fully accounted for on the loop thread
    assert stats.iteration_total_ms + sum(stats.outside_ms.values()) == \
        pytest.approx(stats.wall_ms)


def test_iteration_lists_stay_bounded_and_sample_uniformly():
    rng = random.Random(1)
    rows = np.arange(10_000 * 6, dtype=np.float64).reshape(-1, 6)
    one_by_one, blocks = Series(64, 6), Series(64, 6)
    for row in rows:
        one_by_one.extend(row[None, :])
    start = 0
    while start < len(rows):
        stop = start + rng.randint(1, 700)
        blocks.extend(rows[start:stop])
        start = stop
    assert one_by_one.stride == blocks.stride
    assert [list(c) for c in one_by_one.values] == [list(c) for c in blocks.values]
    kept = np.array(blocks.values[0]) / 6
    assert len(kept) <= 64
    assert np.all(kept % blocks.stride == 0)  # every stride-th iteration, from the first
    assert kept[-1] > len(rows) - 2 * blocks.stride  # up to the end of the run


# -- the recorder sink on a real tracer -----------------------------------------------------

def drive(tracer: Tracer, iterations: int, links: bool = True) -> None:
    """What the patches do for a custom loop: iteration, phases, a link, a function."""
    ts = tracer.state()
    link = tracer.info("predictor/l1 (Linear)", names.LINK)
    func = tracer.info("linear.forward", names.FUNCTION)
    for _ in range(iterations):
        tracer.begin_phase(ts, names.DATA)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.FORWARD)
        if links:
            tok = tracer.begin(link, ts)
            ftok = tracer.begin(func, ts)
            tracer.end(ftok, ts)
            tracer.end(tok, ts)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.UPDATE)
        tracer.end_phase(ts)
        tracer.end_iteration(ts)


def make(tmp_path, record_limit=1000, trace=True, granularity=names.FUNCTION_LEVEL, **kw):
    tracer = Tracer(granularity, SyncPolicy(0, NullBackend()))
    cfg = Config({"trace": str(tmp_path / "t.json") if trace else None, "summary": False,
                  "record_limit": record_limit, "warmup": 2})
    recorder = Recorder(cfg, tracer, **kw)
    tracer.add_sink(recorder)
    _settings[id(recorder)] = cfg
    return tracer, recorder


_settings: dict[int, Config] = {}


def close(tracer, recorder, cfg=None):
    """The end of the run as the agent does it: close the tracer, then report from the recorder."""
    tracer.close()
    cfg = cfg or _settings[id(recorder)]
    return report_run(recorder, tracer, cfg, hits=0,
                      trace_path=functools.partial(trace_path, cfg.trace or "", None))


def test_trace_keeps_the_newest_ranges_and_counts_the_dropped(tmp_path):
    tracer, recorder = make(tmp_path, record_limit=1000, chunk_ranges=256)
    drive(tracer, 700)  # 6 ranges per iteration: 4200 ranges
    stats = close(tracer, recorder)
    assert recorder.retained_ranges == 1000
    assert recorder.dropped == 4200 - 1000
    assert stats.iterations == 698 and stats.warmup == 2  # the summary covers the whole run
    data = json.loads((tmp_path / "t.json").read_text())
    ranges = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(ranges) == 1000
    meta = data["otherData"]["chainer_autoprof"]
    assert meta["dropped_ranges"] == 3200
    numbers = [e["args"]["iteration"] for e in ranges if e["name"] == "iteration"]
    assert numbers == list(range(700 - len(numbers), 700))  # the newest ones


def test_memory_stays_flat_over_a_long_run(tmp_path):
    tracer, recorder = make(tmp_path, record_limit=1000, chunk_ranges=512, max_kept=256)
    drive(tracer, 2000)  # past every bound: record limit, chunk, kept iterations
    tracemalloc.start()
    try:
        drive(tracer, 3000)
        first, _ = tracemalloc.get_traced_memory()
        drive(tracer, 12000)
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 72,000 more ranges (about 2.3 MB at 32 bytes each) and 12,000 more iterations
    assert second - first < 150_000
    assert recorder.retained_ranges == 1000
    stats = close(tracer, recorder)
    assert stats.iterations == 17000 - 2
    assert len(stats.iteration_ms) <= 256
    assert stats.sample_stride > 1


def test_summary_only_keeps_no_ranges(tmp_path):
    tracer, recorder = make(tmp_path, trace=False, chunk_ranges=64)
    drive(tracer, 100)
    assert recorder.retained_ranges == 0 and not recorder.retained
    assert close(tracer, recorder).iterations == 98


def test_buffers_are_per_thread_and_aggregated_in_chunks(tmp_path):
    tracer, recorder = make(tmp_path, chunk_ranges=CHUNK_RANGES)
    drive(tracer, 10)
    ts = tracer.state()
    assert len(ts.record) == 60  # not aggregated yet: one chunk fills first
    assert recorder.agg.ranges == 0
    drive(tracer, CHUNK_RANGES // 6)
    assert recorder.agg.ranges >= CHUNK_RANGES


def test_gpu_phase_timing_through_the_event_timer(tmp_path):
    """The CUDA-event path, with the counting backend's host timer standing in for events."""
    backend = CountingBackend()
    tracer = Tracer(names.PHASE_LEVEL, SyncPolicy(0, backend))
    cfg = Config({"summary": False, "trace": None, "warmup": 3})
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)
    drive(tracer, 1, links=False)
    assert recorder.gpu is None  # no GPU in use: nothing timed
    tracer.sync.add_devices([0])  # the patches saw the model's arrays on GPU 0
    drive(tracer, 12, links=False)
    stats = close(tracer, recorder, cfg)
    assert backend.timers_created == 1
    gpu = stats.gpu_phase_ms
    assert gpu is not None
    # the first iteration ran before the GPU was seen; warm-up skips two more
    assert len(gpu["iteration"]) == 12 - 2
    for i in range(len(gpu["iteration"])):
        phases = sum(gpu[k][i] for k in ("data", "forward", "backward", "update"))
        assert phases <= gpu["iteration"][i]


def test_gpu_line_in_a_real_run(tmp_path):
    run = run_with_agent(tmp_path, (EXAMPLES / "recorder_custom_loop.py").read_text(),
                         settings={"CHAINER_PROF_SUMMARY": "1"},
                         env={"CHAINER_AUTOPROF_TEST_EVENTS": "1"},
                         script_args=("--iterations", "12"), nvtx=False)
    assert run.returncode == 0, run.stderr
    line = next(ln for ln in run.stderr.splitlines() if "GPU time (CUDA events" in ln)
    assert "over 9)" in line  # 12 iterations, the first 3 left out as warm-up


@pytest.mark.gpu
def test_cuda_events_time_the_phases_on_a_gpu(tmp_path):
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception:
        pytest.skip("no CUDA device")
    source = program("recorder_cuda_events_on_a_gpu")
    trace = tmp_path / "gpu.json"
    run = run_with_agent(tmp_path, source, settings={"CHAINER_PROF_SUMMARY": "1",
                                                     "CHAINER_PROF_TRACE": str(trace)},
                         nvtx=False, count_device=False)
    assert run.returncode == 0, run.stderr
    assert "GPU time (CUDA events" in run.stderr
    meta = json.loads(trace.read_text())["otherData"]["chainer_autoprof"]
    gpu = meta["gpu_phase_ms"]
    assert len(gpu["iteration"]) >= 20
    assert all(v > 0 for v in gpu["iteration"])
    assert meta["devices"][0]["id"] == 0
