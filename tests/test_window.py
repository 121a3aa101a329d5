"""The capture window: ranges, recording and the CUDA profiler only for the asked iterations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cupti_fake import build_library
from support import EXAMPLES, REPO, native_under_test, program, run_python, run_with_agent
from verdict_workloads import SCRIPT

from chainer_autoprof.common import gpu_records as gr
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import SettingsError, from_environ
from chainer_autoprof.runtime import cupti_native, cupti_readers
from chainer_autoprof.runtime.device import CountingBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.hotpath import build
from chainer_autoprof.runtime.policies import CaptureWindow, SyncPolicy

LOOP = EXAMPLES / "recorder_custom_loop.py"
TRAINER = EXAMPLES / "train_mnist_synthetic.py"


def launch(tmp: Path, flags: list[str], script: Path, *script_args: str, **kw):
    return run_python(tmp, ["-m", "chainer_autoprof", *flags, str(script), *script_args], **kw)


def trace_iterations(path: Path) -> tuple[list[int], list[dict]]:
    # the program's ranges (the agent's own work, category agent, is no NVTX range)
    xs = [e for e in json.loads(path.read_text())["traceEvents"]
          if e["ph"] == "X" and e.get("cat") != names.AGENT]
    return [e["args"]["iteration"] for e in xs if e["name"] == "iteration"], xs


@pytest.mark.parametrize("window, expected", [("5:9", [5, 6, 7, 8]), ("5:+4", [5, 6, 7, 8]),
                                              ("0:2", [0, 1])])
def test_window_holds_exactly_the_asked_iterations(tmp_path, window, expected):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--iterations", window, "--trace", str(trace)], LOOP,
                 "--iterations", "20")
    assert run.returncode == 0, run.stderr
    iterations, xs = trace_iterations(trace)
    assert iterations == expected
    first = min(e["ts"] for e in xs if e["name"] == "iteration")
    last = max(e["ts"] + e["dur"] for e in xs if e["name"] == "iteration")
    assert all(first <= e["ts"] and e["ts"] + e["dur"] <= last for e in xs)  # nothing outside
    # NVTX: the same ranges as the recording, nothing else
    pushed = [e.text for e in run.events if e.event == "push" and e.domain == "chainer"]
    assert pushed.count("iteration") == len(expected)
    assert sorted(pushed) == sorted(e["name"] for e in xs)
    # the CUDA profiler is started and stopped once, at the window's edges
    assert run.sync_log() == ["profiler_start", "profiler_stop"]


def test_window_with_the_trainer_and_its_extensions(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--iterations", "2:5", "--trace", str(trace)], TRAINER,
                 "--epoch", "1", "--samples", "800", nvtx=False)
    assert run.returncode == 0, run.stderr
    iterations, _ = trace_iterations(trace)
    assert iterations == [2, 3, 4]
    assert run.sync_log() == ["profiler_start", "profiler_stop"]
    # warm-up counts from the start of the run: iteration 2 is still one of the first 3
    assert "2 counted, 1 warm-up excluded" in run.stderr


def test_window_never_reached_records_nothing(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--iterations", "50:60", "--trace", str(trace)], LOOP,
                 "--iterations", "10", nvtx=False)
    assert run.returncode == 0, run.stderr
    iterations, xs = trace_iterations(trace)
    assert iterations == [] and xs == []
    assert run.sync_log() == []
    assert "0 counted" in run.stderr


def test_exit_after_window_ends_the_program_cleanly(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--iterations", "3:+4", "--exit-after-window", "1", "--trace",
                            str(trace)], LOOP, "--iterations", "100", nvtx=False)
    assert run.returncode == 0, run.stderr
    assert "done:" not in run.stdout  # it did not run its 100 iterations
    iterations, _ = trace_iterations(trace)
    assert iterations == [3, 4, 5, 6]
    assert run.sync_log() == ["profiler_start", "profiler_stop"]
    assert run.stderr.count("chainer_autoprof summary") == 1


@pytest.mark.parametrize("value", ["10:5", "abc", "5", "-1:3", "3:3", "2:+0"])
def test_bad_windows_are_one_line_before_the_script_starts(tmp_path, value):
    run = launch(tmp_path, [], LOOP, "--iterations", "3", nvtx=False,
                 env={"CHAINER_PROF_ITERATIONS": value})
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "CHAINER_PROF_ITERATIONS" in lines[0] and repr(value) in lines[0]
    assert "START:STOP" in lines[0]
    with pytest.raises(SettingsError):
        from_environ({"CHAINER_PROF_ITERATIONS": value})


def test_window_policy_on_the_tracer():
    backend = CountingBackend()
    window = CaptureWindow(2, 4, backend, exit_after=False)
    tracer = Tracer(names.PHASE_LEVEL, SyncPolicy(0, backend), window)
    ts = tracer.state()
    emitted = []
    for _ in range(6):
        tracer.begin_iteration(ts, explicit=True)
        emitted.append(ts.iter_tok is not None)
        tracer.end_iteration(ts)
    assert emitted == [False, False, True, True, False, False]
    assert (backend.profiler_starts, backend.profiler_stops) == (1, 1)


def test_exit_after_window_raises_system_exit_at_the_edge():
    backend = CountingBackend()
    window = CaptureWindow(0, 2, backend, exit_after=True)
    tracer = Tracer(names.PHASE_LEVEL, SyncPolicy(0, backend), window)
    ts = tracer.state()
    for _ in range(2):
        tracer.begin_iteration(ts, explicit=True)
        tracer.end_iteration(ts)
    with pytest.raises(SystemExit) as info:
        tracer.begin_iteration(ts, explicit=True)
    assert info.value.code == 0
    assert not ts.iter_busy and not ts.stack  # nothing left open
    assert (backend.profiler_starts, backend.profiler_stops) == (1, 1)


@pytest.mark.skipif(not native_under_test(), reason="native extensions are not under test")
def test_gpu_activity_traces_only_inside_the_window(tmp_path):
    """With GPU activity, CUPTI traces nothing outside the capture window (outside it, GPU
    activity costs nothing): started at CuPy's import, it is switched off at once, on as the
    window opens, off as it closes, after one wait for the GPUs so that every operation
    launched in the window has ended.  The tests' libcupti logs each switch with its time;
    CuPy is a stand-in without a GPU, which Chainer imports."""
    build.build_cupti_in_place()
    cupy = tmp_path / "no_gpu_cupy" / "cupy"
    cupy.mkdir(parents=True)
    (cupy / "__init__.py").write_text(program("gpu_faults_no_gpu_cupy"))
    log, trace = tmp_path / "switches.log", tmp_path / "t.json"
    run = run_with_agent(
        tmp_path, SCRIPT, {"CHAINER_PROF_TRACE": str(trace), "CHAINER_PROF_GPU_ACTIVITY": "1",
                           "CHAINER_PROF_ITERATIONS": "4:8", "CHAINER_PROF_GRANULARITY": "link"},
        script_args=("mlp", "--iterations", "12"), nvtx=False, timeout=180,
        env={"PYTHONPATH": f"{REPO}:{cupy.parent}",
             cupti_native.ENV_CUPTI_LIBRARY: str(build_library()),
             cupti_readers.ENV_CUPTI_READER: "native", "CUPTI_FAKE_LOG": str(log)})
    assert run.returncode == 0, run.stderr
    switches = [(int(t), what, int(key), int(on)) for t, what, key, on in
                (line.split() for line in log.read_text().splitlines())]
    kernels = [(t, on) for t, what, key, on in switches
               if what == "kind" and key == gr.CUPTI_KIND_CONCURRENT_KERNEL]
    # on at CuPy's import and off at once; on as the window opens, off as it closes
    assert [on for _t, on in kernels] == [1, 0, 1, 0], switches
    spans = [(kernels[0][0], kernels[1][0]), (kernels[2][0], kernels[3][0])]
    # every kind and call switched on within those spans, and off again at their end
    state: dict[tuple[str, int], int] = {}
    for t, what, key, on in switches:
        assert any(a <= t <= b for a, b in spans)
        state[what, key] = on
        if t in (kernels[1][0], kernels[3][0]):
            assert not any(state.values())
    assert any(what == "driver" for _t, what, _k, _on in switches)  # the launching calls
    data = json.loads(trace.read_text())
    start = data["otherData"]["chainer_autoprof"]["clock"]["perf_counter_ns_at_start"]
    iterations, _ = trace_iterations(trace)
    assert iterations == [4, 5, 6, 7]
    steps = [e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == "iteration"]
    first = start + min(e["ts"] for e in steps) * 1000
    last = start + max(e["ts"] + e["dur"] for e in steps) * 1000
    assert spans[0][1] < spans[1][0] <= first and last <= spans[1][1]
    # the wait for the GPUs as the window closes, before the CUDA profiler stops
    assert run.sync_log() == ["profiler_start", "sync", "profiler_stop"]
