"""GPU activity's cost in instructions: CUPTI's records from buffer completion to the per-range
sums, replayed from the real recordings (tests/data/gpu/cupti) through the live path.

Each reader of CUPTI's records runs as in a live run, in one process per recording under
``valgrind --tool=callgrind --instr-atstart=no``, which counts only the measured segments
(every thread), with no garbage collection while they run:

* ``native``: the C reader (``runtime/cupti_native.c``) on the tests' libcupti
  (``tests/cupti_fake``), whose buffers are filled beforehand (CUPTI's own work while the
  program runs) and handed over on its own thread: ``reading`` is the walk of each buffer in
  C (CUPTI's ``cuptiActivityGetNextRecord`` included: the test library's) into the
  extension's queue, on CUPTI's thread, without the GIL; ``attributing and summing`` is the
  session's drain: the queued tables handed to Python (one call per buffer), every operation
  tied to its launching range and added to the per-link and per-phase sums
  (``LaunchAttributor`` and ``GpuFigureBuilder.add``).
* ``launches``: the native reader with CUPTI recording only the launching calls
  (``CHAINER_AUTOPROF_CUPTI_CALLS=launches``): fewer records for the same operations, so
  its figure per record is higher and per operation lower.
* ``python``: the cupti-python reader fed the same records (those CUPTI records with the
  agent's quiet calls off) as cupti-python's record objects, made beforehand: ``reading`` is
  ``batch_from_records`` and the queue.  cupti-python's own making of one Python object per
  record is not counted, so this figure is below what that path costs.

The ranges are fed first (as the recorded loop thread handed them over), so each buffer's
operations are attributed as they come.  Buffers: ``live``, one, as CUPTI hands such a
recording over in a live run (one 8 MiB buffer per second at most: each recording, 15
iterations and a few hundred kilobytes of records, is one); ``trainer``, that buffer with
each iteration but the last ended 1% of its time early, so that some three operations after
each come outside any iteration, between iterations, as in every buffer of a run driven by
Chainer's Trainer (its extensions run after each update: LogReport sums the reported values,
on the GPU); ``12``, the tests' cut (a cost per buffer weighs twelve times); ``x10``, the
recording ten times over (each copy later, its correlation ids after the last) in one
buffer, as a longer run fills it (each copy's start-up operations come between iterations
too); ``limit``, those ten copies in ten buffers with the trace bounded to about two
iterations' operations, so that at every buffer the keeper drops whole iterations (a long
run's steady state).  ``at exit`` (the figures' making, once per run) is counted apart.
The verdict is on ``native-live`` and ``native-trainer``, the higher.

The training thread: what GPU activity adds to it is the recorder's handover of each block
of ranges to the session (a deque append): counted as the recorder's absorbing of the
recorded loop's ranges with and without the handover, per iteration (four times each, the
least taken: the same code's turns differ by up to 1% of the segment, a few thousand
instructions per iteration).

    python benchmarks/gpu_activity.py            # both recordings, ~10 minutes
    python benchmarks/gpu_activity.py b16        # one
    python benchmarks/gpu_activity.py --runs native-x10 b16   # the live buffers and those

Target: at most 250 instructions per record (native reader, live buffers, a Trainer's too),
per recording.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TESTS = REPO / "tests"
#: Instructions per record the native path must not pass.
TARGET = 250
RECORDINGS = ("b16", "b512")
#: (label, reader, buffers, copies of the recording): ``live``, one buffer as CUPTI hands
#: such a recording over in a live run; ``12``, the tests' cut; ``x10``, a run ten times as
#: long in one buffer (the cost per record where a fixed cost per buffer weighs little);
#: ``limit``, that run in ten buffers with the trace full from the first one on (its keeper
#: dropping whole iterations at every buffer, as through most of a long run); ``trainer``,
#: the live buffer with a few operations outside any iteration after each iteration (the last
#: :data:`TRAINER_SHARE` of its time), as a Trainer's extensions launch them.
RUNS = (("native-live", "native", 1, 1), ("native-trainer", "native", 1, 1),
        ("native-12", "native", 12, 1),
        ("native-x10", "native", 1, 10), ("launches-live", "native:launches", 1, 1),
        ("python-live", "python", 1, 1),
        ("python-12", "python", 12, 1), ("python-x10", "python", 1, 10),
        ("native-limit", "native", 10, 10))
#: The trace's bound in ``native-limit``: the operations of about two iterations, so that in
#: every buffer after the first the keeper drops whole iterations, as in a long run.
LIMIT_RECORDS = 4 * 200
#: The share of each iteration's time that ``native-trainer`` moves out of it: some 3 or 4
#: operations of the recordings' ~105 an iteration, as LogReport's sums of a loss.
TRAINER_SHARE = 0.01

def _paths() -> None:
    for path in (str(REPO), str(TESTS), str(HERE)):
        if path not in sys.path:
            sys.path.insert(0, path)


class Primed:
    """A live session of recording ``name`` with every range fed, its reader started and
    the records ready to be handed over (nothing measured yet)."""

    def __init__(self, name: str, reader: str, folder: Path, cache: dict[str, Any],
                 tile: int = 1, record_limit: int = 200_000, between: float = 0.0) -> None:
        import numpy as np
        from gpu_live_replay import DATA, as_cupti_records, environ, replay_clock

        from chainer_autoprof.common import names as range_names
        from chainer_autoprof.common.gpu_records import read_recording
        from chainer_autoprof.common.settings import from_environ
        from chainer_autoprof.lifecycle import gpu_session
        from chainer_autoprof.report.tracefile import read_trace
        from chainer_autoprof.runtime import cupti_native, cupti_readers, gpu_activity
        from chainer_autoprof.runtime.device import CountingBackend
        from chainer_autoprof.runtime.events import Tracer
        from chainer_autoprof.runtime.policies import SyncPolicy
        from chainer_autoprof.sinks.recorder import Recorder

        if name not in cache:
            cache[name] = (read_trace(str(DATA / name / "agent_trace.json")),
                           read_recording(str(DATA / name / "cupti_activity.json.gz")))
        trace, rec = cache[name]
        span = int(trace.meta["clock"]["duration_ns"]) + 1_000_000
        rec = tiled(rec, tile, span)
        self.rec = rec
        meta = trace.meta
        start = int(meta["clock"]["perf_counter_ns_at_start"])
        cfg = from_environ({}, overrides={"granularity": "link", "summary": False,
                                          "record_limit": 200_000 * tile,
                                          "warmup": int(meta["warmup_skip"]),
                                          "gpu_activity": True, "gc": False,
                                          "flush_interval": 0})
        self.tracer = Tracer(range_names.GRANULARITY_LEVEL["link"],
                             SyncPolicy(0, CountingBackend()),
                             clock=replay_clock(start, start + int(meta["clock"]["duration_ns"])))
        self.recorder = Recorder(cfg, self.tracer)
        self.tracer.add_sink(self.recorder)
        recorded, rows = trace.range_rows()
        index = np.array([self.tracer.info(n, c).index for n, c in recorded], dtype=np.int64)
        (self.tid, block), = rows.items()
        block = tiled_ranges(block, tile, span)
        if between:
            block = between_iterations(block, np.isin(block[:, 0], [
                i for i, (_n, c) in enumerate(recorded) if c == range_names.ITERATION]), between)
        block[:, 0] = index[block[:, 0]]
        self.blocks = [[tuple(r) for r in block[i:i + 4096].tolist()]
                       for i in range(0, len(block), 4096)]
        iteration = [i for i, (_n, c) in zip(index.tolist(), recorded)
                     if c == range_names.ITERATION]
        self.iterations = int(np.isin(block[:, 0], iteration).sum())
        threads = np.unique(rec.batch.api.thread, return_counts=True)
        main_thread = int(threads[0][threads[1].argmax()])
        gpu_session.DRAIN_INTERVAL_S = 1e6  # the measured drain is called here, not timed
        self.fake = None
        self.records: list[Any] = []
        pairs = [tuple(int(x) for x in row) for row in zip(
            rec.clock.cupti_ns, rec.clock.perf_ns, rec.clock.read_ns)]
        box: list[gpu_activity.CuptiCollector] = []
        reader, _, calls = reader.partition(":")
        if reader == "native":
            from cupti_fake import FakeCupti

            self.fake = FakeCupti(rec, folder)
            starter: Callable[..., Any] = gpu_session.start_cupti
        else:
            quiet = _quiet_mask(rec)
            self.records = [r for r, q in zip(as_cupti_records(rec), _record_order_quiet(
                rec, quiet)) if not q]

            def starter(on_batch: Callable[..., None], names: Any) -> Any:
                collector = gpu_activity.CuptiCollector(on_batch, names=names)
                collector._pairs = list(pairs)
                collector.running = True
                box.append(collector)
                return collector
        self.session = gpu_session.GpuSession(
            self.recorder, record_limit=record_limit, warmup_skip=self.recorder.warm_skip,
            window=False, main_tid=self.tid, start_collector=starter)
        self.tracer.on_new_thread = self.session.thread_started  # the agent's composition
        self.recorder.gpu_handover = self.session.handover
        with environ({cupti_native.ENV_CUPTI_LIBRARY: str(self.fake.path) if self.fake else None,
                      cupti_readers.ENV_CUPTI_READER: reader,
                      cupti_native.ENV_CUPTI_CALLS: calls or "all"}):
            self.session.start()
        assert self.session.state == "running", self.session.why_off
        if self.fake is not None:
            self.session.collector._pairs[:0] = pairs  # type: ignore[union-attr]
        self.session._threads.append((main_thread, self.tid))
        self.collector = self.session.collector if self.fake else box[0]
        for rows_ in self.blocks:  # the loop thread's ranges, handed over
            self.recorder._absorb(self.tid, rows_)
        assert self.session._drain_safely()

    def served(self) -> int:
        """The records handed over so far."""
        return self.fake.served if self.fake is not None else len(self.records)

    def hand_over(self, buffers: int) -> None:
        """CUPTI's thread hands over the records in ``buffers`` buffers."""
        if self.fake is not None:
            self.fake.serve(buffers, 0.0, prepared=True)
            self.fake.wait()
            return
        import threading

        n = len(self.records)
        cut = [n * i // buffers for i in range(buffers + 1)]
        collector = self.collector

        def cupti_thread() -> None:
            for i in range(buffers):
                collector._buffer_completed(self.records[cut[i]:cut[i + 1]])

        thread = threading.Thread(target=cupti_thread)
        thread.start()
        thread.join()


def tiled(rec: Any, times: int, span_ns: int) -> Any:
    """``rec`` as a run ``times`` as long would record it: each copy later by ``span_ns``,
    its correlation ids after the previous copy's."""
    if times == 1:
        return rec
    from dataclasses import replace

    from chainer_autoprof.common.gpu_records import ActivityBatch, ApiCalls, GpuOps

    b = rec.batch
    step = int(max(b.ops.correlation.max(), b.api.correlation.max())) + 1
    ops, api = [], []
    for j in range(times):
        o = b.ops.take(slice(None))
        o.start, o.end = o.start + j * span_ns, o.end + j * span_ns
        o.correlation = o.correlation + j * step
        a = b.api.take(slice(None))
        a.start, a.end = a.start + j * span_ns, a.end + j * span_ns
        a.correlation = a.correlation + j * step
        ops.append(o)
        api.append(a)
    batch = ActivityBatch(GpuOps.concat(ops), ApiCalls.concat(api), b.external, b.names)
    return replace(rec, batch=batch)


def tiled_ranges(block: Any, times: int, span_ns: int) -> Any:
    """The loop thread's ranges of ``times`` copies of the run (as :func:`tiled`): each
    copy's iterations numbered after the previous copy's."""
    import numpy as np

    from chainer_autoprof.analysis.stats import DEPTH_BITS

    packed = block[:, 3] >> DEPTH_BITS
    iterations = int(packed.max())
    out = []
    for j in range(times):
        b = block.copy()
        b[:, 1] += j * span_ns
        b[:, 2] += j * span_ns
        numbered = packed > 0
        b[numbered, 3] += (j * iterations) << DEPTH_BITS
        out.append(b)
    return np.concatenate(out)


def between_iterations(block: Any, is_iteration: Any, share: float) -> Any:
    """The loop thread's ranges with each iteration but the last ended ``share`` of its time
    early (the ranges in it cut there, those after it gone): the operations launched in that
    last part come outside any iteration, between iterations, as a Trainer's extensions
    launch theirs after each update (LogReport summing the reported values on the GPU).
    (The last one whole: the ranges reach past every launch, as the next iteration's do.)"""
    import numpy as np

    from chainer_autoprof.analysis.stats import DEPTH_MASK

    block = block.copy()
    keep = np.ones(len(block), dtype=bool)
    for row in np.flatnonzero(is_iteration & ((block[:, 3] & DEPTH_MASK) == 0))[:-1].tolist():
        t0, t1 = int(block[row, 1]), int(block[row, 2])
        cut = t1 - int((t1 - t0) * share)
        inside = (block[:, 1] >= t0) & (block[:, 2] <= t1)
        keep &= ~(inside & (block[:, 1] >= cut))
        block[inside & (block[:, 2] > cut), 2] = cut
    block = block[keep]
    return block[np.argsort(block[:, 2], kind="stable")]  # (end order: a range after those in it)


def _quiet_mask(rec: Any) -> Any:
    """The recording's API calls the agent turns off in CUPTI (not recorded live)."""
    import numpy as np

    from chainer_autoprof.common.gpu_records import DRIVER, RUNTIME
    from chainer_autoprof.runtime import cupti_native

    ext = cupti_native.load_extension()
    api = rec.batch.api
    return (np.isin(api.cbid, list(ext.RUNTIME_CBIDS.values())) & (api.domain == RUNTIME)) | \
        (np.isin(api.cbid, list(ext.DRIVER_CBIDS.values())) & (api.domain == DRIVER))


def _record_order_quiet(rec: Any, quiet: Any) -> list[bool]:
    """For each record of ``as_cupti_records(rec)`` (ops and calls by end time, stable),
    whether it is a quiet call."""
    import numpy as np

    b = rec.batch
    ends = np.concatenate([b.ops.end, b.api.end])
    flags = np.concatenate([np.zeros(len(b.ops), dtype=bool), quiet])
    return flags[np.argsort(ends, kind="stable")].tolist()  # type: ignore[no-any-return]


def child(name: str, runs: tuple[str, ...] = ()) -> None:
    """One recording's segments, each between callgrind's start and dump; prints labels
    (``runs``: only those of :data:`RUNS`; none given: all, and the launch attribution
    alone)."""
    _paths()
    import ctypes

    from hotpath import build_control

    from chainer_autoprof.runtime.hotpath import build

    build.build_cupti_in_place()
    library = ctypes.CDLL(str(build_control()))
    # its functions bound before the first segment: a ctypes library looks a name up on
    # first use (some 14,000 instructions), which would count in the segment it ends
    control = argparse.Namespace(start=library.start, dump=library.dump, stop=library.stop)
    cache: dict[str, Any] = {}
    import gc  # collections fall where allocations push them: none while segments run

    gc.collect()
    gc.disable()
    with tempfile.TemporaryDirectory() as tmp:
        for label, reader, buffers, tile in RUNS:
            if runs and label not in runs:
                continue
            primed = Primed(name, reader, Path(tmp) / label, cache, tile,
                            LIMIT_RECORDS if label == "native-limit" else 200_000,
                            TRAINER_SHARE if label == "native-trainer" else 0.0)
            if primed.fake is not None:  # CUPTI fills its buffers as the program runs
                primed.fake.prepare(buffers)
            control.start()
            primed.hand_over(buffers)
            control.dump(f"read:{label}".encode())
            control.stop()
            records = primed.served()  # (asked after the segment: the harness's own call)
            control.start()
            assert primed.session._drain_safely()
            control.dump(f"attribute:{label}".encode())
            control.stop()
            analysis = primed.session.analysis
            assert analysis is not None and analysis.attributor.pending == 0
            control.start()
            primed.session.stop()
            control.dump(f"finish:{label}".encode())
            control.stop()
            for part in ("read", "attribute", "finish"):
                print(f"segment {part}:{label} {records} {len(primed.rec.batch.ops)}",
                      flush=True)
        for turn in ("off", "on") * 4:  # the training thread's part, per iteration
            primed = Primed(name, "native", Path(tmp) / f"thread-{turn}", cache)
            recorder = primed.recorder
            recorder.gpu_handover = None if turn == "off" else primed.session._queue.append
            control.start()
            for rows_ in primed.blocks:
                recorder._absorb(primed.tid, rows_)
            control.dump(f"thread:{turn}".encode())
            control.stop()
            print(f"segment thread:{turn} {primed.iterations}", flush=True)
            primed.session.stop()
        if runs and "native-x10" not in runs:
            return
        # the launch attribution alone (the per-range sums left out): where the cost lies
        primed = Primed(name, "native", Path(tmp) / "attribution-only", cache, 10)
        primed.fake.prepare(1)  # type: ignore[union-attr]
        primed.hand_over(1)
        analysis = primed.session.analysis
        assert analysis is not None
        analysis.builder.add = lambda items: None  # type: ignore[method-assign]
        control.start()
        assert primed.session._drain_safely()
        control.dump(b"launches:native-x10")
        control.stop()
        print(f"segment launches:native-x10 {primed.fake.served}", flush=True)  # type: ignore[union-attr]
        primed.session.stop()


def _dumps(out: Path) -> list[int]:
    totals = []
    for path in sorted(out.parent.glob(out.name + ".*"), key=lambda p: int(p.suffix[1:])):
        text = path.read_text()  # totals: summary wraps below zero with several threads
        found = re.search(r"^totals:\s*(\d+)", text, re.M) or \
            re.search(r"^summary:\s*(\d+)", text, re.M)
        totals.append(int(found.group(1)) if found else 0)
    return totals


Segment = tuple[str, int, int, int]


def measure(name: str, runs: tuple[str, ...] = ()) -> list[Segment]:
    """``(segment, instructions, records or iterations, operations)`` of one recording's
    process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), str(HERE)]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, str(Path(__file__).resolve()), "--child", name,
             *(["--runs", ",".join(runs)] if runs else [])],
            env=env, capture_output=True, text=True, check=False, cwd=str(REPO))
        if proc.returncode != 0:
            raise SystemExit(f"callgrind run ({name}): exit {proc.returncode}\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        totals = _dumps(out)
    labels = re.findall(r"^segment (\S+) (\d+)(?: (\d+))?$", proc.stdout, re.M)
    if len(labels) != len(totals):
        raise SystemExit(f"{len(labels)} segments but {len(totals)} callgrind dumps")
    return [(label, total, int(n), int(ops or 0))
            for (label, n, ops), total in zip(labels, totals)]


def report(name: str, segments: list[Segment]) -> bool:
    """Print one recording's figures; whether the target is met."""
    by = {label: (total, n) for label, total, n, _ops in segments}
    ops_of = {label: ops for label, _total, _n, ops in segments}
    print(f"recording {name}:")

    def per(label: str) -> tuple[float, float, float]:
        read, records = by[f"read:{label}"]
        attribute, _ = by[f"attribute:{label}"]
        return (read + attribute) / records, read / records, attribute / records

    for label, _reader, buffers, _tile in RUNS:
        if f"read:{label}" not in by:
            continue
        total, read, attribute = per(label)
        records = by[f"read:{label}"][1]
        finish = by[f"finish:{label}"][0]
        ops = ops_of[f"read:{label}"]
        print(f"  {label:<13} {records:>6} records in {buffers:>2} buffer(s): {total:7.0f} "
              f"instructions per record = {read:6.0f} reading + {attribute:6.0f} attributing "
              f"and summing ({total * records / ops:.0f} per operation); at exit "
              f"{finish / 1e6:.1f} M once")
    native, trainer = per("native-live")[0], per("native-trainer")[0]
    met = max(native, trainer) <= TARGET
    print(f"  instructions per record: {native:.0f} (native reader, buffer completion to the "
          f"per-range sums, buffers as live; {trainer:.0f} with a Trainer's operations between "
          f"iterations; target <= {TARGET}: {'met' if met else 'not met'}; today's cupti-python "
          f"path: {per('python-live')[0]:.0f}, its record objects' making not counted)")
    if "launches:native-x10" not in by:
        _thread_part(segments, by)
        return met
    launches, records = by["launches:native-x10"]
    print(f"  of the attributing and summing ({per('native-x10')[2]:.0f} per record in native-x10):"
          f" {launches / records:.0f} the launch attribution (LaunchAttributor), "
          f"{per('native-x10')[2] - launches / records:.0f} the per-range sums "
          "(GpuFigureBuilder.add)")
    _thread_part(segments, by)
    return met


def _thread_part(segments: list[Segment], by: dict[str, tuple[int, int]]) -> bool:
    """Print what GPU activity adds to the training thread; whether under 1%."""
    offs = [t / n for label, t, n, _ in segments if label == "thread:off"]
    ons = [t / n for label, t, n, _ in segments if label == "thread:on"]
    added = min(ons) - min(offs)
    iterations = by["thread:off"][1]
    held = by["read:native-live"][0] + by["attribute:native-live"][0]
    print(f"  training thread: {added:+.0f} instructions per iteration added on it (the "
          f"recorder's handover of its blocks; its part without: {min(offs):.0f}: "
          f"{'met' if added <= 0.01 * min(offs) else 'not met'} under 1%); off it, on CUPTI's "
          f"and the analysis' threads (the GIL held but for the C walk): "
          f"{held / iterations / 1e6:.2f} M per iteration (native), "
          f"{(by['read:python-live'][0] + by['attribute:python-live'][0]) / iterations / 1e6:.2f}"
          " M (cupti-python)")
    return added <= 0.01 * min(offs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--runs", default="",
                        help="only these runs, comma-separated (always native-live, "
                             "native-trainer and python-live; without native-x10 no launch "
                             "attribution alone)")
    parser.add_argument("recordings", nargs="*", default=list(RECORDINGS))
    args = parser.parse_args(argv)
    runs = tuple(dict.fromkeys(["native-live", "native-trainer", "python-live",
                                *filter(None, args.runs.split(","))])) if args.runs else ()
    if args.child:
        child(args.child, runs)
        return 0
    ok = True
    for name in args.recordings:
        ok = report(name, measure(name, runs)) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
