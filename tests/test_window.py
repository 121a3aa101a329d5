"""The capture window: ranges, recording and the CUDA profiler only for the asked iterations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import EXAMPLES, run_python

from chainer_autoprof.common import names
from chainer_autoprof.common.settings import SettingsError, from_environ
from chainer_autoprof.runtime.device import CountingBackend
from chainer_autoprof.runtime.events import Tracer
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
