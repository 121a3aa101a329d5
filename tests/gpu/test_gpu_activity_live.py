"""On a GPU (tests/gpu/run.sh): the live CUPTI collector and the agent with GPU activity on.
Skipped without CuPy, a CUDA device or cupti-python; never run on the machine that wrote them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chainer_autoprof.report.tracefile import read_trace
from chainer_autoprof.runtime import cupti_readers

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    try:
        import cupy
    except Exception as e:
        pytest.skip(f"cupy not importable: {e!r}")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as e:
        pytest.skip(f"no CUDA device: {e!r}")
    pytest.importorskip("cupti", reason="cupti-python is not installed")
    return cupy


@pytest.mark.parametrize("reader", ["native", "python"])
def test_gpu_collector_ties_each_kernel_to_its_launch_on_this_thread(cp, reader, monkeypatch):
    """Each reader of CUPTI's records (the native one: built with the package)."""
    monkeypatch.setenv(cupti_readers.ENV_CUPTI_READER, reader)
    batches = []
    got = cupti_readers.start(batches.append)
    assert not isinstance(got, str), got
    assert got.reader.startswith(reader)
    a = cp.random.rand(1024, 1024, dtype=cp.float32)
    for _ in range(5):
        a = a @ a / 1024
    cp.cuda.runtime.deviceSynchronize()
    assert got.stop(timeout_s=10) is None
    ops = [b.ops for b in batches]
    api = [b.api for b in batches]
    kernels = sum(int((o.kind == 0).sum()) for o in ops)
    assert kernels >= 5 and got.callback_errors == 0, got.last_error
    me = threading.get_native_id() if got.system_thread_ids else \
        threading.get_ident() & 0xFFFFFFFF
    threads = {int(t) for a_ in api for t in a_.thread.tolist()}
    assert me in threads
    corr = {int(c) for a_ in api for c in a_.correlation.tolist()}
    assert all(int(c) in corr for o in ops for c in o.correlation.tolist())
    assert len(got.clock_pairs) >= 2


@pytest.mark.parametrize("reader", ["native", "python"])
def test_gpu_switched_off_cupti_traces_nothing_and_on_again_everything(cp, reader,
                                                                      monkeypatch):
    """``record(False)`` (a capture window closed, the GPU waited for) switches CUPTI's
    tracing off: kernels launched then are not recorded; those before and after are."""
    monkeypatch.setenv(cupti_readers.ENV_CUPTI_READER, reader)
    phases = {name: cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", name)
              for name in ("before_window", "outside_window", "in_window")}
    a = cp.ones(1 << 20, dtype=cp.float32)
    batches = []
    got = cupti_readers.start(batches.append)
    assert not isinstance(got, str), got

    def launch(name: str, times: int) -> None:
        for _ in range(times):
            phases[name](a)
        cp.cuda.runtime.deviceSynchronize()

    launch("before_window", 5)
    got.record(False)
    launch("outside_window", 7)
    got.record(True)
    launch("in_window", 3)
    assert got.stop(timeout_s=10) is None
    names = [got.names.name(int(n)) for b in batches for n in b.ops.name.tolist() if n >= 0]
    counts = {name: sum(name in n for n in names) for name in phases}
    assert counts == {"before_window": 5, "outside_window": 0, "in_window": 3}, counts


@pytest.mark.parametrize("calls,window", [("all", ""), ("launches", ""),
                                          ("launches", "10:25")])
def test_gpu_the_cnn_trains_with_gpu_activity_and_reports_gpu_time_per_link(cp, tmp_path,
                                                                           calls, window):
    """With CUPTI recording only the launching calls (the default) or every call: every
    kernel attributed; with a capture window, CUPTI traces its iterations only."""
    trace = tmp_path / "b512.json"
    env = dict(os.environ, CHAINER_PROF_TRACE=str(trace), CHAINER_PROF_GRANULARITY="link",
               CHAINER_PROF_GPU_ACTIVITY="1", CHAINER_PROF_WARMUP="5",
               CHAINER_AUTOPROF_CUPTI_CALLS=calls, CHAINER_PROF_ITERATIONS=window)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(HERE / "cnn.py"),
                           "--batch", "512", "--iterations", "30"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 600  # no hang at exit
    assert "GPU activity off" not in proc.stderr, proc.stderr
    assert "top links by GPU time" in proc.stderr and "GPU-bound" in proc.stderr
    stats = read_trace(str(trace)).stats()
    fig = stats.gpu_activity
    assert fig is not None and fig.statuses.get("attributed", {}).get("ops", 0) > 0
    assert "no launch record" not in fig.statuses, fig.statuses  # every call recorded
    top = fig.links[0]["name"]
    assert "conv2" in top, fig.links[:3]
    data = json.loads(trace.read_text())
    assert any(e.get("cat") == "kernel" for e in data["traceEvents"])
    if window:  # nothing traced outside it: every kernel launched in one of its iterations
        assert 10 <= fig.iterations <= 15, fig.iterations
        assert fig.warmup_kernel_ms == 0.0  # iterations 5 to 9 ran untraced
        assert "CUPTI on in the capture window only" in fig.source
