"""Tests for chainer_autoprof.runtime.device (CPU tests + ``gpu``-marked CuPy tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from chainer_autoprof.runtime import device

ROOT = Path(__file__).resolve().parents[1]

# Subprocess preamble: the device layer alone (the package's __init__ imports neither
# Chainer nor CuPy: checked here, so that what the tests see of CuPy is the device's doing).
_LOAD = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from chainer_autoprof.runtime import device
assert not {{"chainer", "cupy"}} & set(sys.modules), sorted(sys.modules)
"""


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith("CHAINER_AUTOPROF_")
    }
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD + textwrap.dedent(code)],
        env=full_env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(autouse=True)
def _clean_backend(monkeypatch):
    monkeypatch.delenv(device.ENV_TEST_DEVICE, raising=False)
    monkeypatch.delenv(device.ENV_TEST_DEVICE_LOG, raising=False)
    device.reset_backend()
    yield
    device.reset_backend()


# ---------------------------------------------------------------- fake CuPy


class _FakeClock:
    t = 0.0
    all_done = False


class _FakeEvent:
    created = 0

    def __init__(self):
        _FakeEvent.created += 1
        self.t = None
        self._done = False

    def record(self, stream=None):
        _FakeClock.t += 1.0
        self.t = _FakeClock.t
        self._done = False

    @property
    def done(self):
        return self._done or _FakeClock.all_done

    def synchronize(self):
        self._done = True


def _make_fake_cupy(device_count: int = 1, with_profiler_module: bool = True):
    log: list = []

    class FakeND:
        def __init__(self, dev):
            self.device = types.SimpleNamespace(id=dev)

    class FakeDevice:
        def __init__(self, i):
            log.append(("Device", i))
            self.id = i

        def synchronize(self):
            log.append(("sync", self.id))

    def _elapsed(a, b):
        return b.t - a.t

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: device_count,
        getDevice=lambda: 0,
        profilerStart=lambda: log.append("rt_start"),
        profilerStop=lambda: log.append("rt_stop"),
    )
    cuda = types.SimpleNamespace(
        Device=FakeDevice, Event=_FakeEvent, runtime=runtime, get_elapsed_time=_elapsed
    )
    if with_profiler_module:
        cuda.profiler = types.SimpleNamespace(
            start=lambda: log.append("prof_start"), stop=lambda: log.append("prof_stop")
        )
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeND
    fake.cuda = cuda
    return fake, log


@pytest.fixture
def fake_cupy(monkeypatch):
    fake, log = _make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    _FakeClock.t = 0.0
    _FakeClock.all_done = False
    return fake, log


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)


# ---------------------------------------------------------------- CPU tests


def test_protocols_satisfied():
    for b in (
        device.NullBackend(),
        device.CountingBackend(),
        device.LazyBackend(),
        device.CupyBackend(),
    ):
        assert isinstance(b, device.DeviceBackend)
    for t in (device.NullEventTimer(), device.HostEventTimer()):
        assert isinstance(t, device.EventTimer)


def test_null_backend_does_nothing():
    b = device.NullBackend()
    assert b.synchronize([0, 1]) is None
    assert b.synchronize([]) is None
    b.profiler_start()
    b.profiler_stop()
    t = b.event_timer()
    t.end(t.begin("k"))
    assert t.drain() == [] and t.drain(block=True) == []
    assert t.pending == 0 and t.dropped == 0


def test_counting_backend_counts():
    b = device.CountingBackend()
    b.synchronize([])
    b.synchronize({1, 0})
    b.synchronize([0, 0])
    b.profiler_start()
    b.profiler_stop()
    b.profiler_stop()
    assert b.sync_calls == 3
    assert b.synced_devices == [(), (0, 1), (0,)]
    assert b.device_syncs == 2
    assert (b.profiler_starts, b.profiler_stops) == (1, 2)


def test_host_event_timer():
    t = device.CountingBackend().event_timer(max_pending=2)
    for k in "abc":
        t.end(t.begin(k))
    out = t.drain()
    assert [k for k, _ in out] == ["b", "c"] and t.dropped == 1
    assert all(ms >= 0.0 for _, ms in out)
    assert t.drain() == []


def test_get_backend_counting_from_env_in_process(monkeypatch, tmp_path):
    log = tmp_path / "dev-%p.log"
    monkeypatch.setenv(device.ENV_TEST_DEVICE, "counting")
    monkeypatch.setenv(device.ENV_TEST_DEVICE_LOG, str(log))
    b = device.get_backend()
    assert isinstance(b, device.CountingBackend)
    assert device.get_backend() is b
    b.synchronize([1, 0])
    path = tmp_path / f"dev-{os.getpid()}.log"
    assert path.read_text().splitlines() == ["sync 0,1"]


def test_get_backend_counting_logs_in_subprocess(tmp_path):
    proc = _run(
        """
        import os
        b = device.get_backend()
        assert isinstance(b, device.CountingBackend), b
        b.synchronize([0, 1])
        b.synchronize([])
        b.profiler_start()
        b.profiler_stop()
        print(os.getpid())
        """,
        env={
            "CHAINER_AUTOPROF_TEST_DEVICE": "counting",
            "CHAINER_AUTOPROF_TEST_DEVICE_LOG": str(tmp_path / "log-%p.txt"),
        },
    )
    pid = proc.stdout.strip()
    lines = (tmp_path / f"log-{pid}.txt").read_text().splitlines()
    assert lines == ["sync 0,1", "sync", "profiler_start", "profiler_stop"]


def test_lazy_backend_never_imports_cupy_in_subprocess():
    _run(
        """
        import sys
        assert "cupy" not in sys.modules
        b = device.get_backend()
        assert isinstance(b, device.LazyBackend), b
        b.synchronize([])
        b.profiler_start()
        b.profiler_stop()
        t = b.event_timer()
        t.end(t.begin("x"))
        assert t.drain() == [] and t.drain(block=True) == []
        assert device.array_device_ids([1, None]) == set()
        assert not b.bound
        assert "cupy" not in sys.modules, "device module imported cupy"
        """
    )


def test_null_paths_do_not_import_cupy(no_cupy):
    b = device.get_backend()
    assert isinstance(b, device.LazyBackend)
    b.synchronize([])
    b.profiler_start()
    b.profiler_stop()
    assert "cupy" not in sys.modules


def test_cupy_backend_construction_is_lazy(no_cupy):
    b = device.CupyBackend()  # no cupy, no CUDA: must not raise
    b.synchronize([])  # nothing to do -> no cupy needed
    with pytest.raises(RuntimeError):
        b.synchronize([0])
    assert "cupy" not in sys.modules


def test_array_device_ids_ignores_numpy(no_cupy):
    arrs = [np.zeros(3), np.float32(1.0), None, 3]
    assert device.array_device_ids(arrs) == set()


def test_array_device_ids_with_cupy_arrays(fake_cupy):
    fake, _ = fake_cupy
    arrs = [np.zeros(3), fake.ndarray(0), fake.ndarray(1), fake.ndarray(1), None]
    assert device.array_device_ids(arrs) == {0, 1}
    assert device.array_device_ids(iter([np.ones(2)])) == set()


def test_get_backend_picks_cupy_when_imported(fake_cupy):
    assert isinstance(device.get_backend(), device.CupyBackend)


def test_cupy_backend_caches_devices(fake_cupy):
    _, log = fake_cupy
    b = device.CupyBackend()
    assert log == []  # nothing touched at construction
    b.synchronize([0, 1])
    b.synchronize({1})
    b.synchronize([])
    assert log == [("Device", 0), ("sync", 0), ("Device", 1), ("sync", 1), ("sync", 1)]


def test_cupy_backend_profiler_module_or_runtime(monkeypatch):
    fake, log = _make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    b = device.CupyBackend()
    b.profiler_start()
    b.profiler_stop()
    assert log == ["prof_start", "prof_stop"]

    fake2, log2 = _make_fake_cupy(with_profiler_module=False)
    monkeypatch.setitem(sys.modules, "cupy", fake2)
    b2 = device.CupyBackend()
    b2.profiler_start()
    b2.profiler_stop()
    assert log2 == ["rt_start", "rt_stop"]


def test_cupy_backend_profiler_failure_warns_once(fake_cupy):
    fake, _ = fake_cupy

    def boom():
        raise RuntimeError("no CUDA driver")

    fake.cuda.profiler = types.SimpleNamespace(start=boom, stop=boom)
    b = device.CupyBackend()
    with pytest.warns(RuntimeWarning, match="cudaProfilerStart"):
        b.profiler_start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.profiler_stop()


def test_cupy_backend_no_gpu_gives_null_timer(monkeypatch):
    fake, _ = _make_fake_cupy(device_count=0)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert isinstance(device.CupyBackend().event_timer(), device.NullEventTimer)


def test_lazy_backend_binds_when_cupy_imported_later(no_cupy, monkeypatch):
    b = device.LazyBackend()
    t_early = b.event_timer()
    tok = t_early.begin("before")  # cupy absent: no-op
    b.synchronize([0])  # no cupy -> nothing (arrays cannot be on a GPU)
    assert not b.bound
    fake, log = _make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    t_early.end(tok)  # range started before binding is ignored
    b.synchronize([0])
    assert b.bound and log == [("Device", 0), ("sync", 0)]
    b.profiler_start()
    assert log[-1] == "prof_start"
    _FakeClock.all_done = True
    t_early.end(t_early.begin("after"))
    assert [k for k, _ in t_early.drain()] == ["after"]
    assert isinstance(b.event_timer(), device.CupyEventTimer)


def test_cupy_event_timer_polls_without_blocking(fake_cupy):
    t = device.CupyBackend().event_timer(max_pending=3)
    assert isinstance(t, device.CupyEventTimer)
    outer = t.begin("outer")
    inner = t.begin("inner")
    t.end(inner)
    t.end(outer)
    assert t.pending == 2
    assert t.drain() == []  # nothing done yet: returns at once
    assert t.pending == 2
    _FakeClock.all_done = True
    assert t.drain() == [("inner", 1.0), ("outer", 3.0)]
    assert t.pending == 0
    # events are recycled from the pool
    created = _FakeEvent.created
    t.end(t.begin("again"))
    assert _FakeEvent.created == created
    assert [k for k, _ in t.drain()] == ["again"]


def test_cupy_event_timer_block_and_bound(fake_cupy):
    t = device.CupyBackend().event_timer(max_pending=2)
    for k in "abcd":
        t.end(t.begin(k))
    assert t.pending == 2 and t.dropped == 2
    out = t.drain(block=True)
    assert [k for k, _ in out] == ["c", "d"] and all(ms > 0 for _, ms in out)
    assert t.pending == 0


# ---------------------------------------------------------------- GPU tests


@pytest.fixture
def cp():
    try:
        import cupy
    except Exception as e:
        pytest.skip(f"cupy not importable: {e!r}")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        pytest.skip(f"no CUDA device: {e!r}")
    if n < 1:
        pytest.skip("no CUDA device")
    return cupy


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


@pytest.mark.gpu
def test_gpu_get_backend_is_cupy(cp):
    b = device.get_backend()
    assert isinstance(b, device.CupyBackend)
    assert b.available()


@pytest.mark.gpu
def test_gpu_synchronize_after_kernel(cp):
    a = cp.random.rand(2048, 2048, dtype=cp.float32)
    c = a @ a
    ids = device.array_device_ids([c, np.zeros(2), a])
    assert ids == {0}
    b = device.CupyBackend()
    b.synchronize(ids)
    assert cp.cuda.get_current_stream().done
    b.synchronize(ids)  # cached path
    b.synchronize([])


@pytest.mark.gpu
def test_gpu_profiler_start_stop(cp):
    b = device.CupyBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.profiler_start()
        b.profiler_stop()


@pytest.mark.gpu
def test_gpu_event_timer_matmul(cp):
    b = device.CupyBackend()
    t = b.event_timer()
    a = cp.random.rand(2048, 2048, dtype=cp.float32)
    (a @ a).sum()  # warm-up (cuBLAS handle etc.)
    tok = t.begin("matmul")
    c = a @ a
    t.end(tok)
    out = t.drain(block=True)
    assert len(out) == 1
    key, ms = out[0]
    assert key == "matmul" and ms > 0.0
    assert t.pending == 0 and t.dropped == 0
    del c


@pytest.mark.gpu
def test_gpu_drain_nonblocking_returns_immediately(cp):
    spin = cp.RawKernel(_SPIN, "spin")
    spin((1,), (1,), (cp.int64(1000),))  # compile + warm up
    cp.cuda.Device(0).synchronize()
    cycles = 500_000_000  # ~0.25-0.5 s at 1-2 GHz SM clocks
    t = device.CupyBackend().event_timer()
    tok = t.begin("spin")
    spin((1,), (1,), (cp.int64(cycles),))
    t.end(tok)
    t0 = time.perf_counter()
    out = t.drain(block=False)
    waited = time.perf_counter() - t0
    assert out == [] and t.pending == 1
    assert waited < 0.05, waited
    out = t.drain(block=True)
    assert len(out) == 1 and out[0][0] == "spin" and out[0][1] > 50.0
