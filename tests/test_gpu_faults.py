"""GPU activity's faults: one line saying what is missing, the run goes on with everything
else, never a crash, a hang at exit or a changed result; without GPU activity, ranges and
traces as before.

Real where this machine allows: cupti-python really missing (the test environment), and
really installed without a CUDA driver (installed by pip into a folder of the pytest cache,
skipped when pip cannot reach a package index).  CuPy is not installed here: a package named
``cupy`` that gives no GPU (:data:`NO_GPU_CUPY`, written by the test) is what Chainer
imports, which is when the agent starts CUPTI.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gpu_live_replay import as_cupti_records, replay_live
from support import REPO, native_under_test, program, run_with_agent
from verdict_workloads import SCRIPT

from chainer_autoprof.common.gpu_records import (
    ActivityBatch,
    ApiCalls,
    ExternalIds,
    GpuOps,
    NameTable,
)
from chainer_autoprof.lifecycle import gpu_session
from chainer_autoprof.report import gpu_events
from chainer_autoprof.report.tracefile import read_trace
from chainer_autoprof.runtime import cupti_native, cupti_readers
from chainer_autoprof.runtime.hotpath import build

#: The packages cupti-python 13 brings (numpy is the environment's own).
CUPTI_PACKAGES = ("cupti-python", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-cupti",
                  "pyelftools")
NO_GPU_CUPY = program("gpu_faults_no_gpu_cupy")


def cupy_stand_in(tmp: Path) -> Path:
    folder = tmp / "no_gpu_cupy"
    (folder / "cupy").mkdir(parents=True, exist_ok=True)
    (folder / "cupy" / "__init__.py").write_text(NO_GPU_CUPY)
    return folder


@pytest.fixture(scope="session")
def cupti_site(request, tmp_path_factory) -> Path | None:
    """A folder with cupti-python installed (``None``: this Python has it already)."""
    if importlib.util.find_spec("cupti") is not None:
        return None
    try:
        folder = Path(request.config.cache.mkdir("cupti-python"))
    except Exception:
        folder = tmp_path_factory.mktemp("cupti-python")
    if not (folder / "cupti" / "cupti.pyi").exists():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", "--no-deps", "--target",
                               str(folder), *CUPTI_PACKAGES],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip("cupti-python could not be installed here (no package index?): "
                        + (proc.stderr.strip().splitlines() or ["?"])[-1])
    return folder


def train(tmp: Path, *, gpu_activity: str | None, paths: list[Path],
          reader: str = "python") -> tuple[object, Path]:
    """The MLP under the agent (``reader``: which reader of CUPTI's records is asked for)."""
    tmp.mkdir(parents=True, exist_ok=True)
    trace = tmp / "trace.json"
    settings = {"CHAINER_PROF_SUMMARY": "1", "CHAINER_PROF_TRACE": str(trace),
                "CHAINER_PROF_GRANULARITY": "link"}
    if gpu_activity is not None:
        settings["CHAINER_PROF_GPU_ACTIVITY"] = gpu_activity
    env = {"PYTHONPATH": ":".join([str(REPO), *(str(p) for p in paths)]),
           cupti_readers.ENV_CUPTI_READER: reader}
    run = run_with_agent(tmp, SCRIPT, settings, script_args=("mlp", "--iterations", "12"),
                         nvtx=False, timeout=180, env=env)
    assert run.returncode == 0, run.stderr
    return run, trace


def agent_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("chainer_autoprof: ")]


def names_of(trace: dict) -> list[tuple[str, str, str]]:
    """Each event's phase, name and category, but the garbage collector's: when a collection
    runs depends on what the process allocated (importing cupti-python is enough to move it)."""
    return [(e["ph"], e.get("name"), e.get("cat")) for e in trace["traceEvents"]
            if e.get("cat") != "gc"]


def same_as_without(trace: Path, tmp: Path) -> None:
    """The trace holds what a run without GPU activity holds: the same kinds of events, the
    same ranges, no GPU tracks, no Kineto fields, no figures."""
    _run, plain = train(tmp / "plain", gpu_activity=None, paths=[])
    a, b = json.loads(trace.read_text()), json.loads(plain.read_text())
    assert set(a) == set(b) == {"displayTimeUnit", "otherData", "traceEvents"}
    assert not any(gpu_events.is_gpu_event(e) for e in a["traceEvents"])
    assert names_of(a) == names_of(b)
    assert a["otherData"]["chainer_autoprof"]["gpu_activity"] is None
    assert b["otherData"]["chainer_autoprof"]["gpu_activity"] is None
    assert read_trace(str(trace)).stats().gpu_activity is None


def test_without_cupti_python_one_line_and_the_run_goes_on(tmp_path):
    if importlib.util.find_spec("cupti") is not None:
        pytest.skip("cupti-python is installed in this environment")
    run, trace = train(tmp_path / "on", gpu_activity="1", paths=[cupy_stand_in(tmp_path)])
    lines = agent_lines(run.stderr)
    gpu = [line for line in lines if "GPU activity" in line]
    assert gpu == ["chainer_autoprof: GPU activity off: cupti-python is not installed (No module "
                   "named 'cupti'): pip install chainer-autoprof[cupti]"]
    assert "chainer_autoprof summary" in run.stderr and "Verdict:" in run.stderr
    same_as_without(trace, tmp_path)


def test_cupti_installed_without_a_driver_one_line_and_the_run_goes_on(tmp_path, cupti_site):
    paths = [cupy_stand_in(tmp_path)] + ([cupti_site] if cupti_site is not None else [])
    run, trace = train(tmp_path / "on", gpu_activity="1", paths=paths)
    gpu = [line for line in agent_lines(run.stderr) if "GPU activity" in line]
    assert len(gpu) == 1, run.stderr
    assert gpu[0].startswith("chainer_autoprof: GPU activity off: no CUDA driver for CUPTI: "
                             "NotSupportedError: CUDA driver is not found")
    same_as_without(trace, tmp_path)


@pytest.mark.skipif(not native_under_test(),
                    reason="native extensions are not under test (CHAINER_AUTOPROF_TEST_NATIVE=0)")
def test_the_native_reader_without_a_driver_one_line_and_the_run_goes_on(tmp_path):
    """The native reader on the nvidia-cuda-cupti wheel's libcupti, on this machine without a
    CUDA driver: one line naming the missing driver, the run as without GPU activity."""
    build.build_cupti_in_place()
    if not any("/nvidia/" in p for p in cupti_native.libcupti_candidates()):
        pytest.skip("no nvidia-cuda-cupti wheel installed")
    run, trace = train(tmp_path / "on", gpu_activity="1", paths=[cupy_stand_in(tmp_path)],
                       reader="native")
    gpu = [line for line in agent_lines(run.stderr) if "GPU activity" in line]
    assert len(gpu) == 1, run.stderr
    assert gpu[0].startswith("chainer_autoprof: GPU activity off: no CUDA driver for CUPTI: "
                             "NativeCuptiError: ") and "libcuda.so.1" in gpu[0]
    same_as_without(trace, tmp_path)


def test_cupti_held_by_another_tool_and_other_cupti_errors_are_named(cupti_site):
    """cupti-python's own error objects (``cuptiError(status)``) as CUPTI raises them."""
    code = ("from cupti import cupti\n"
            "from chainer_autoprof.runtime.gpu_activity import describe_error\n"
            "for status in (39, 35, 15, 999):\n"
            "    print(describe_error(cupti.cuptiError(status)))\n")
    path = ":".join([str(REPO)] + ([str(cupti_site)] if cupti_site else []))
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    nsight, privileges, device, other = proc.stdout.splitlines()
    assert nsight.startswith("CUPTI is already in use by another tool (Nsight Systems or "
                             "Nsight Compute attached?)")
    assert "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)" in nsight
    assert privileges.startswith("CUPTI needs permission to profile the GPU")
    assert device.startswith("no CUDA device for CUPTI") and "NOT_INITIALIZED" in device
    assert other.startswith("CUPTI could not start") and "UNKNOWN" in other


def test_without_cupy_one_line_at_exit(tmp_path):
    run, trace = train(tmp_path / "on", gpu_activity="1", paths=[])
    gpu = [line for line in agent_lines(run.stderr) if "GPU activity" in line]
    assert gpu == ["chainer_autoprof: GPU activity: CuPy was never imported, so no GPU was in "
                   "use: no GPU figures (CHAINER_PROF_GPU_ACTIVITY=1)"]
    assert not any(gpu_events.is_gpu_event(e) for e in json.loads(trace.read_text())["traceEvents"])


def test_a_buffer_that_cannot_be_read_is_one_note_and_the_rest_stands(tmp_path):
    """A CUPTI error mid-run (a record the conversion cannot read): that buffer is left out,
    counted and said; the other buffers' figures stand."""

    class Broken:
        kind = 10  # a kernel whose fields cannot be read

        @property
        def start(self) -> int:
            raise RuntimeError("CUPTI_ERROR_INVALID_KIND")

    def records(rec: object) -> list[object]:
        out = as_cupti_records(rec)
        return [*out[:len(out) // 2], Broken(), *out[len(out) // 2:]]

    run = replay_live("b16", tmp_path, collector_records=records, pace_s=0.02)
    assert run.outcome is not None
    notes = run.outcome.notes + run.stats.gpu_activity.notes
    assert any("1 CUPTI buffer(s) could not be read (RuntimeError: CUPTI_ERROR_INVALID_KIND)"
               in n for n in notes)
    assert run.stats.gpu_activity.collector["callback_errors"] == 1
    fig = run.outcome.figures
    assert 0 < fig.ops["kernel"] < int((run.recording.batch.ops.kind == 0).sum())
    assert fig.iterations > 0


def _session(start_collector=None) -> tuple[gpu_session.GpuSession, object, object]:
    from chainer_autoprof.common import names
    from chainer_autoprof.common.settings import from_environ
    from chainer_autoprof.runtime.device import CountingBackend
    from chainer_autoprof.runtime.events import Tracer
    from chainer_autoprof.runtime.gpu_activity import CuptiCollector
    from chainer_autoprof.runtime.policies import SyncPolicy
    from chainer_autoprof.sinks.recorder import Recorder

    cfg = from_environ({}, overrides={"summary": True})
    tracer = Tracer(names.GRANULARITY_LEVEL["link"], SyncPolicy(0, CountingBackend()))
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)

    def start(on_batch, table):
        collector = CuptiCollector(on_batch, names=table)
        collector.running = True
        return collector

    session = gpu_session.GpuSession(recorder, record_limit=4000, warmup_skip=0,
                                     window=False, main_tid=None,
                                     start_collector=start_collector or start)
    tracer.on_new_thread = session.thread_started  # the agent's composition
    recorder.gpu_handover = session.handover
    return session, recorder, tracer


def test_a_drain_that_falls_behind_drops_and_counts_never_grows():
    session, _recorder, _tracer = _session()
    session.start()
    table = NameTable(["k"])
    ops = GpuOps.from_columns(3, {"kind": [0, 0, 0], "start": [1, 2, 3], "end": [2, 3, 4],
                                  "name": [0, 0, 0], "device": [0, 0, 0]})
    with session._lock:  # the drain is busy: buffers keep coming on CUPTI's thread
        for _ in range(gpu_session.MAX_QUEUED_BATCHES + 5):
            session._on_batch(ActivityBatch(ops, ApiCalls.empty(), ExternalIds.empty(), table))
        assert session.queued == gpu_session.MAX_QUEUED_BATCHES
        assert session.dropped_ops == 5 * 3
    session.stop(timeout_s=5)
    assert session.state == "finished" and session.queued == 0


def test_exit_never_waits_longer_than_its_bound_for_a_stuck_analysis():
    """A drain still running at exit (here: one that holds the analysis for 3 s) is given up
    after the bound, with one line; nothing waits for it."""
    session, _recorder, _tracer = _session()
    session.start()
    held = threading.Event()

    def stuck() -> None:
        with session._lock:
            held.set()
            time.sleep(3)

    threading.Thread(target=stuck, daemon=True).start()
    held.wait(5)
    session._stop.set()  # the drain thread now waits for the lock, as a stuck drain would
    t0 = time.monotonic()
    outcome = session.finish(timeout_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert outcome is None and "did not finish within 0.5 s" in session.broken


def test_a_start_that_fails_switches_everything_off():
    session, recorder, tracer = _session(start_collector=lambda on_batch, names: "no driver")
    tracer.state()  # a thread before the start: in the thread map
    assert len(session._threads) == 1
    session.start()
    assert session.state == "off" and session.why_off == "no driver"
    _hand_over_a_block_and_a_thread(recorder)
    assert session.queued == 0 and not session._threads  # nothing taken any more
    assert session.finish() is None  # nothing more is said at exit


def test_cupti_that_cannot_be_switched_on_as_a_window_opens_is_one_line(capsys):
    """A CUPTI error as the capture window opens never reaches the program (the switch is
    made as its iteration begins): one line, GPU activity off from then on, CUPTI stopped,
    nothing more said at exit."""
    from chainer_autoprof.runtime.gpu_activity import CuptiCollector

    class Refusing(CuptiCollector):
        def _enable(self) -> None:
            raise RuntimeError("CUPTI_ERROR_UNKNOWN")

    def start(on_batch, table):
        collector = Refusing(on_batch, names=table)
        collector.running = True
        return collector

    session, recorder, _tracer = _session(start_collector=start)
    session.recording = False  # a window that opens later
    session.start()
    assert session.state == "running" and not session.collector.recording
    session.record(True)  # what the agent calls as the window opens
    assert session.state == "off" and not session.collector.running
    assert session.why_off == "CUPTI could not be switched on (CUPTI_ERROR_UNKNOWN)"
    _hand_over_a_block_and_a_thread(recorder)
    assert session.queued == 0
    assert session.finish() is None
    lines = [line for line in capsys.readouterr().err.splitlines() if "GPU activity" in line]
    assert lines == ["chainer_autoprof: GPU activity off: CUPTI could not be switched on "
                     "(CUPTI_ERROR_UNKNOWN)"]


def test_a_window_that_closed_before_cupys_import_leaves_cupti_off():
    """CUPTI starts at CuPy's import: a capture window that opened and closed before it (the
    agent tells the waiting session) starts it switched off; one that opens later, on."""
    session, _recorder, _tracer = _session()
    session.record(True)
    session.record(False)  # both before CuPy's import
    session.start()
    assert session.state == "running" and not session.collector.recording
    session.record(True)
    assert session.collector.recording
    session.stop(timeout_s=5)


def _hand_over_a_block_and_a_thread(recorder) -> None:
    """What the recorder and the tracer tell the session: a block, a new thread's state."""
    recorder.gpu_handover((1, np.zeros((1, 4), dtype=np.int64)))
    thread = threading.Thread(target=recorder.tracer.state)
    thread.start()
    thread.join()


def test_a_forked_child_records_no_gpu_activity():
    session, recorder, _tracer = _session()
    session.start()
    with session._lock:  # the drain waits: what is handed over stays queued
        _hand_over_a_block_and_a_thread(recorder)
        assert session.queued == 2  # the block, and the thread's end
        session.after_fork()  # what the agent calls in the child
    assert session.state == "off" and session.queued == 0
    _hand_over_a_block_and_a_thread(recorder)
    assert session.queued == 0 and not session._threads and session.collector.closed
    assert session.finish() is None


def test_every_cupti_call_the_collector_makes_fits_the_installed_cupti_python(cupti_site):
    """The real cupti-python checks each call's arguments before it finds no driver: every call
    the collector makes, made as it makes it, gets that far (never a TypeError), and every
    name it looks up exists."""
    code = program("gpu_faults_every_cupti_call")
    path = ":".join([str(REPO)] + ([str(cupti_site)] if cupti_site else []))
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    reached = [line.split()[0] for line in proc.stdout.splitlines()]
    assert len(reached) == 10 and "activity_get_num_dropped_records" in reached
