"""Threads still inside ranges when the process ends: NVTX balanced, the summary sane.

Daemon threads still training when the main thread returns, and worker
threads training at SIGTERM, leave iterations and phases open.  Each thread
pops its own NVTX ranges (a pop belongs to the thread that pushed) at its
next instrumented call while the exiting thread waits briefly; the recorder
ends them at the exit time.  The summary stays arithmetic: counted
iterations within the wall time, the warm-up within its setting, the
agent's share of the wall below 100%.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvtx_tool import build_injection_library, nvtx_env, ranges_by_thread, read_events
from support import clean_env, program, write_script
from traces import check_nesting, trace_threads

TRAINING = program("thread_exit_training")


def _run(tmp: Path, mode: str, **settings: str) -> tuple[subprocess.CompletedProcess, list]:
    script = write_script(tmp, "threads.py", TRAINING)
    build_injection_library()
    env = clean_env(CHAINER_PROF_GRANULARITY="link", CHAINER_PROF_TRACE="t.json",
                    **nvtx_env(tmp / "nvtx.%p.tsv"), **settings)
    proc = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", str(script), mode],
                            env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "training\n"
        if mode == "term":
            time.sleep(0.5)  # some iterations on every thread
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return result, read_events(tmp / "nvtx.*.tsv")


def _check_summary(stderr: str) -> None:
    counted = re.search(r"iterations\s+(\d+) counted, (\d+) warm-up excluded", stderr)
    assert counted, stderr
    assert int(counted.group(1)) > 0 and int(counted.group(2)) <= 3  # CHAINER_PROF_WARMUP
    share = re.search(r"all counted iterations\s+\S+ \S+\s+100%\s+([\d.]+)% ", stderr)
    assert share and float(share.group(1)) <= 100.0, stderr
    overhead = re.search(r"agent overhead\s+~\S+ \S+ \(([\d.]+)% of wall\)", stderr)
    assert overhead and float(overhead.group(1)) < 100.0, stderr
    assert "more on other threads are not in these figures" in stderr


def _check_trace(path: Path) -> None:
    data = json.loads(path.read_text())
    duration_us = data["otherData"]["chainer_autoprof"]["clock"]["duration_ns"] / 1000
    threads = trace_threads(path)
    assert {"worker-0", "worker-1", "worker-2"} <= set(threads)
    for rows in threads.values():
        check_nesting(rows)
        assert all(t1 <= duration_us + 1e-3 for _n, _t0, t1, _d in rows)


def test_daemon_threads_training_when_the_main_thread_returns(tmp_path: Path):
    run, events = _run(tmp_path, "daemon")
    assert run.returncode == 0, run.stderr
    by_thread = ranges_by_thread(events, "chainer")  # raises on a range left open
    assert sum(1 for ranges in by_thread.values() if ranges) >= 3
    _check_summary(run.stderr)
    _check_trace(tmp_path / "t.json")


def test_worker_threads_training_at_sigterm(tmp_path: Path):
    run, events = _run(tmp_path, "term")
    assert run.returncode == -signal.SIGTERM, run.stderr
    ranges_by_thread(events, "chainer")  # balanced on every thread
    _check_summary(run.stderr)
    _check_trace(tmp_path / "t.json")


@pytest.mark.parametrize("mode", ["daemon", "term"])
def test_threads_training_at_exit_while_the_agent_watches(tmp_path: Path, mode: str):
    """The watchdog, the background writes and the dump server stop before the threads'
    ranges end: NVTX balanced, the summary sane, the final trace replaces the trace so far."""
    run, events = _run(tmp_path, mode, CHAINER_PROF_STALL="30",
                       CHAINER_PROF_FLUSH_INTERVAL="0.05")
    assert run.returncode == (0 if mode == "daemon" else -signal.SIGTERM), run.stderr
    ranges_by_thread(events, "chainer")
    _check_summary(run.stderr)
    _check_trace(tmp_path / "t.json")
    assert not (tmp_path / "t.json.partial").exists()


TEARDOWN = program("thread_exit_teardown")


def test_instrumented_call_in_a_threads_teardown(tmp_path):
    """A Link called from a thread-local's finalizer, as the thread ends, after the thread's
    own state is gone: it runs (a state made anew), nothing freed is touched (debug
    allocator), NVTX stays balanced on every thread."""
    script = write_script(tmp_path, "teardown.py", TEARDOWN)
    env = clean_env(CHAINER_PROF_GRANULARITY="link", CHAINER_PROF_SUMMARY="0",
                    PYTHONMALLOC="debug", **nvtx_env(tmp_path / "nvtx.%p.tsv"))
    build_injection_library()
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(script)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "done\n"
    ranges = ranges_by_thread(read_events(tmp_path / "nvtx.*.tsv"), "chainer")
    linear = [name for stream in ranges.values() for _, name, _ in stream if "Linear" in name]
    assert len(linear) == 100  # each thread's call and its finalizer's
