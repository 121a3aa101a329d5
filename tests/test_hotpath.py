"""The hot path's two implementations: one behaviour, the choice made once and reported.

The same programs run with ``CHAINER_PROF_NATIVE=1`` and ``0`` give the same
NVTX stream (every call, naming included), the same trace (range for range)
and the same summary (but for the times).  The choice is reported in
``--status``, the summary's overhead line and the trace metadata; a build
failure says why in one line.  The recorder's pending blocks are copies any
thread may take; ranges begun and ended from ``gc.callbacks`` nest inside the
hot path's own bookkeeping without unbalancing it.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from nvtx_tool import ranges_by_thread
from streams import GRANULARITIES, check_stream
from support import EXAMPLES, program, run_python, run_with_agent, write_script

from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.runtime import hotpath
from chainer_autoprof.runtime.device import NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.hotpath import build
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder


def _by_thread(events) -> list[list[tuple]]:
    """Every NVTX call per (pid, tid), in order, threads in order of first appearance."""
    threads: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for ev in events:
        threads[(ev.pid, ev.tid)].append((ev.event, ev.domain, ev.text, ev.color, ev.category))
    return list(threads.values())


#: Garbage collections come where allocations trigger them, and the two implementations
#: allocate differently (the native one less): their gc ranges are compared nowhere here.
NO_GC = {"CHAINER_PROF_GC": "0"}


def _both(tmp_path: Path, runner, *args, **kwargs):
    out = {}
    for flag in ("1", "0"):
        where = tmp_path / f"native{flag}"
        where.mkdir()
        out[flag] = runner(where, *args, native=flag, **kwargs)
    return out["1"], out["0"]


def test_same_nvtx_stream_every_scenario_and_granularity(tmp_path: Path, native_module):
    def run(where, native):
        script = write_script(where, "scenarios.py", program("ranges_scenarios"))
        return run_python(where, [str(script), ",".join(GRANULARITIES), "2"], check=True,
                          env={"CHAINER_PROF_NATIVE": native, **NO_GC})

    native, python = _both(tmp_path, run)
    check_stream(native.events)
    assert len(native.events) > 1000
    assert _by_thread(native.events) == _by_thread(python.events)
    assert native.stdout == python.stdout  # the error scenario's own traceback line included


def test_same_nvtx_stream_threads(tmp_path: Path, native_module):
    def run(where, native):
        return run_with_agent(where, program("threads_two_trainers"),
                              {"CHAINER_PROF_GRANULARITY": "function",
                               "CHAINER_PROF_NATIVE": native, **NO_GC})

    native, python = _both(tmp_path, run)
    assert native.returncode == python.returncode == 0, native.stderr + python.stderr
    # threads interleave differently from run to run: compare each thread's own stream
    native_ranges = ranges_by_thread(native.events, "chainer")
    python_ranges = ranges_by_thread(python.events, "chainer")
    assert len(native_ranges) == 3
    assert sorted(native_ranges.values()) == sorted(python_ranges.values())


def _trace_ranges(path: Path) -> list[list[tuple]]:
    data = json.loads(path.read_text())
    threads: dict[int, list[tuple]] = defaultdict(list)
    for ev in data["traceEvents"]:
        if ev.get("ph") == "X":
            threads[ev["tid"]].append((ev["name"], ev.get("cat"), ev["args"].get("depth")))
    return list(threads.values())


def _masked(summary: str) -> list[str]:
    """The summary's lines with every figure masked, before the verdict, without the slowest
    iterations (both timing-driven)."""
    body = summary.split("Verdict:")[0]
    kept, skip = [], False
    for line in body.splitlines()[1:]:
        if not line.startswith(" " * 17):  # a row (else the wrapped rest of the row above)
            skip = "agent overhead" in line or "trace " in line or "the median" in line
        if not skip:
            kept.append(" ".join(re.sub(r"\d[\d,]*(\.\d+)?( ?(ms|s|us|µs)\b)?", "#",
                                        line).split()))
    return sorted(kept)  # the top links are ordered by time


@pytest.mark.parametrize("granularity", ["phase", "function"])
def test_same_trace_and_summary(tmp_path: Path, granularity: str, native_module):
    def run(where, native):
        return run_python(where, ["-m", "chainer_autoprof", "--granularity", granularity,
                                  "--trace", str(where / "run.json"), "--native", native,
                                  str(EXAMPLES / "train_mnist_synthetic.py"), "--samples", "60",
                                  "--batchsize", "10", "--epoch", "1", "--unit", "5",
                                  "--out", str(where / "r")], env=NO_GC, check=True)

    native, python = _both(tmp_path, run)
    assert native.stdout == python.stdout
    assert _by_thread(native.events) == _by_thread(python.events)
    ranges = _trace_ranges(tmp_path / "native1" / "run.json")
    assert sum(len(r) for r in ranges) > 40
    assert ranges == _trace_ranges(tmp_path / "native0" / "run.json")
    assert _masked(native.stderr) == _masked(python.stderr)


def test_choice_reported_in_status_summary_and_trace(tmp_path: Path, native_module):
    script = write_script(tmp_path, "train.py", (EXAMPLES / "train_mnist_synthetic.py")
                          .read_text())
    args = [str(script), "--samples", "20", "--batchsize", "10", "--epoch", "1", "--unit", "5"]
    for flag, name, reason in (("1", "native", ""), ("0", "python", "CHAINER_PROF_NATIVE=0")):
        trace = tmp_path / f"run{flag}.json"
        run = run_python(tmp_path, ["-m", "chainer_autoprof", "--status", "--native", flag,
                                    "--trace", str(trace), *args], check=True)
        described = name + (f" ({reason})" if reason else "")
        assert f"  hot path: {described}\n" in run.stderr  # --status, at start and at exit
        assert run.stderr.count(f"  hot path: {described}\n") == 2
        # the summary names the setting as it was given: a launcher flag here
        summary = " ".join(run.stderr.split("agent overhead")[1].split("\n  sync level")[0]
                           .split())
        flagged = name + (" (--native 0)" if reason else "")
        assert re.search(rf"; {re.escape(flagged)} hot path; calibrated", summary), summary
        meta = json.loads(trace.read_text())["otherData"]["chainer_autoprof"]
        assert meta["implementation"] == {"name": name, "reason": reason}


@pytest.mark.hotpath
def test_unavailable_extension_falls_back_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "chainer_autoprof.runtime.hotpath._native", None)
    chosen = hotpath.select(native=True, explicit=True)
    assert chosen.name == "python"
    assert chosen.reason.startswith("native extension unavailable: ModuleNotFoundError")
    # a test run of the native path never falls back silently
    monkeypatch.setenv(hotpath.ENV_TEST_NATIVE, "1")
    with pytest.raises(hotpath.NativeRequiredError):
        hotpath.select(native=True, explicit=False)
    monkeypatch.setenv(hotpath.ENV_TEST_NATIVE, "0")
    assert hotpath.select(native=True, explicit=False).reason == f"{hotpath.ENV_TEST_NATIVE}=0"


def test_failed_build_is_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(build.BuildError) as info:
        build.compile_to(tmp_path / "native.so")
    assert "\n" not in str(info.value) and str(info.value).startswith("false failed")
    assert not list(tmp_path.iterdir())  # nothing half-built left behind
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(build.BuildError, match="no C compiler"):
        build.compile_to(tmp_path / "native.so")


def test_the_c_code_builds_without_a_single_warning(tmp_path: Path, native_module):
    """-Wall -Wextra, every warning an error: the build CI checks (a user's build goes on)."""
    build.compile_to(tmp_path / "native.so", warnings_fail=True)
    build.compile_cupti_to(tmp_path / "cupti.so", warnings_fail=True)  # the CUPTI reader too
    assert {"-Wall", "-Wextra"} <= set(build.EXTRA_COMPILE_ARGS)


def test_a_warning_fails_the_checked_build_naming_it(tmp_path: Path, monkeypatch, native_module):
    sources = []
    for source in build.SOURCES:
        sources.append(tmp_path / source.name)
        sources[-1].write_text(source.read_text())
    for header in build.HEADERS:
        (tmp_path / header.name).write_text(header.read_text())
    with open(sources[-1], "a") as extra:
        extra.write("\nint chainer_autoprof_sloppy(int used, int forgotten) { return used; }\n")
    monkeypatch.setattr(build, "SOURCES", tuple(sources))
    build.compile_to(tmp_path / "lenient.so")  # a user's build: only a warning
    with pytest.raises(build.BuildError, match=r"failed: .*unused parameter .*forgotten"):
        build.compile_to(tmp_path / "checked.so", warnings_fail=True)


# -- in-process: the recorder's pending blocks, and ranges nested from gc callbacks ----------

def _tracer(impl: hotpath.Implementation, chunk: int = 4096) -> tuple[Tracer, Recorder]:
    tracer = Tracer(names.FUNCTION_LEVEL, SyncPolicy(0, NullBackend()), implementation=impl)
    recorder = Recorder(Config({"summary": True, "trace": None}), tracer, chunk_ranges=chunk)
    tracer.add_sink(recorder)
    return tracer, recorder


def test_pending_blocks_are_copies_any_thread_may_take(implementation: hotpath.Implementation):
    tracer, recorder = _tracer(implementation)
    outer = tracer.info("outer", names.USER)
    inner = tracer.info("inner", names.USER)
    tok = tracer.begin(outer)
    for _ in range(3):
        tracer.end(tracer.begin(inner))
    ((tid, block),) = recorder.pending_blocks()
    assert tid == threading.get_native_id()
    assert block.dtype == np.int64 and block.shape == (3, 4)
    assert list(block[:, 0]) == [inner.index] * 3 and list(block[:, 3]) == [1] * 3
    assert (block[:, 2] >= block[:, 1]).all() and (block[:, 1] > 0).all()
    block[:] = 0  # a copy: the buffer is untouched, and nothing was consumed
    tracer.end(tok)
    assert [b.shape for _, b in recorder.pending_blocks()] == [(4, 4)]
    assert recorder.pending_blocks()[0][1][:3, 0].tolist() == [inner.index] * 3

    # another thread reads while this one records, fills and flushes (chunks of 64)
    tracer, recorder = _tracer(implementation, chunk=64)
    info = tracer.info("r", names.USER)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                for _, block in recorder.pending_blocks():
                    assert block.shape[1] == 4 and (block[:, 0] == info.index).all()
                    seen.append(len(block))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        thread.start()
        for _ in range(5000):
            tracer.end(tracer.begin(info))
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
    assert not errors and all(0 < n <= 64 for n in seen)  # (the reader mostly runs in flushes)
    recorder.flush_all()
    assert recorder.agg.ranges == 5000  # nothing lost, nothing counted twice


GC_PROGRAM = program("hotpath_gc_callback_ranges")


@pytest.mark.parametrize("granularity", ["link", "function"])
def test_ranges_from_gc_callbacks_nest_in_the_hot_path(tmp_path: Path, granularity: str,
                                                       twin: str):
    script = write_script(tmp_path, "gc_ranges.py", GC_PROGRAM)
    run = run_python(tmp_path, [str(script), granularity], check=True)
    loss, used, recorded, empty = run.stdout.split()
    assert (recorded, empty) == ("True", "True")
    check_stream(run.events, user=("gc",))  # balanced: every gc range nests
    pushes = [ev.text for ev in run.events if ev.event == "push"]
    assert pushes.count("gc") > 50 and "iteration" in pushes
    assert used == twin
    assert float(loss) > 0
