"""The only place in :mod:`chainer_autoprof` that talks to CUDA.

Everything here is stdlib-only at import time and never imports CuPy: CuPy is
used only once the user's own code has imported it (``'cupy' in
sys.modules``), and CUDA is touched only on the first real call.

Synchronization rule: CuPy arrays living on GPU device ``d`` mean that device
``d`` must be synchronized before a host timestamp is meaningful; NumPy (and
any other host) arrays need nothing.  Use :func:`array_device_ids` to get the
set of ids to pass to :meth:`DeviceBackend.synchronize`.

Backends:

* :class:`CupyBackend` -- the real one (CuPy already imported).
* :class:`LazyBackend` -- behaves as :class:`NullBackend` until CuPy shows up
  in ``sys.modules``, then binds a :class:`CupyBackend`.
* :class:`NullBackend` -- no-ops (NumPy-only runs).
* :class:`CountingBackend` -- CPU test stand-in that counts (and optionally
  logs) calls; selected by ``CHAINER_AUTOPROF_TEST_DEVICE=counting``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, Callable, Protocol, Tuple, runtime_checkable

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "DEFAULT_MAX_PENDING",
    "ENV_TEST_DEVICE",
    "ENV_TEST_DEVICE_LOG",
    "CountingBackend",
    "CupyBackend",
    "CupyEventTimer",
    "DeviceBackend",
    "EventTimer",
    "HostEventTimer",
    "LazyBackend",
    "LazyEventTimer",
    "NullBackend",
    "NullEventTimer",
    "array_device_ids",
    "device_names",
    "get_backend",
    "reset_backend",
]

#: Set to ``counting`` to make :func:`get_backend` return a CountingBackend.
ENV_TEST_DEVICE = "CHAINER_AUTOPROF_TEST_DEVICE"
#: File the env-selected CountingBackend appends to (``%p`` -> pid).
ENV_TEST_DEVICE_LOG = "CHAINER_AUTOPROF_TEST_DEVICE_LOG"
#: Default bound on not-yet-completed (begin, end) event pairs per timer.
DEFAULT_MAX_PENDING = 4096

Result = Tuple[Hashable, float]


# --------------------------------------------------------------------------
# Interfaces
# --------------------------------------------------------------------------


@runtime_checkable
class EventTimer(Protocol):
    """Non-blocking GPU range timer.

    ``token = t.begin(key)`` records a start event on the current stream,
    ``t.end(token)`` records the end event and queues the pair.
    ``t.drain()`` returns ``[(key, elapsed_ms), ...]`` for pairs that have
    completed, in completion-queue order, without blocking (``block=True``
    waits for all pending pairs).  Pending pairs are bounded; overflow drops
    the oldest pair and increments ``dropped``.
    """

    @property
    def dropped(self) -> int: ...

    def begin(self, key: Hashable) -> Any: ...

    def end(self, token: Any) -> None: ...

    def drain(self, block: bool = False) -> list[Result]: ...

    @property
    def pending(self) -> int: ...


@runtime_checkable
class DeviceBackend(Protocol):
    """What the profiler needs from the device layer."""

    def synchronize(self, devices: Iterable[int]) -> None:
        """Wait for all work on each GPU device id; empty -> nothing to do."""
        ...

    def profiler_start(self) -> None:
        """cudaProfilerStart (``nvprof --profile-from-start off``,
        ``nsys --capture-range=cudaProfilerApi``)."""
        ...

    def profiler_stop(self) -> None:
        """cudaProfilerStop."""
        ...

    def event_timer(self, max_pending: int = DEFAULT_MAX_PENDING) -> EventTimer:
        """A new :class:`EventTimer`."""
        ...


# --------------------------------------------------------------------------
# Null
# --------------------------------------------------------------------------


class NullEventTimer:
    """Timer that records nothing; ``drain`` always returns ``[]``."""

    dropped = 0
    pending = 0

    def begin(self, key: Hashable) -> None:
        return None

    def end(self, token: Any) -> None:
        return None

    def drain(self, block: bool = False) -> list[Result]:
        return []


class NullBackend:
    """No-op backend for NumPy-only runs."""

    name = "null"

    def synchronize(self, devices: Iterable[int]) -> None:
        return None

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def event_timer(self, max_pending: int = DEFAULT_MAX_PENDING) -> EventTimer:
        return NullEventTimer()


# --------------------------------------------------------------------------
# CuPy
# --------------------------------------------------------------------------


def _imported_cupy() -> Any:
    """The user's already-imported ``cupy`` module, or ``None``."""
    return sys.modules.get("cupy")


class CudaEvent(Protocol):
    """What the timer uses of a ``cupy.cuda.Event``."""

    @property
    def done(self) -> bool: ...

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class CupyEventTimer:
    """:class:`EventTimer` built on ``cupy.cuda.Event`` (polled via ``done``).

    Events are pooled per device and reused once their pair was drained.
    Not thread-safe: use one timer per thread.
    """

    def __init__(self, cupy: ModuleType, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        cuda = cupy.cuda
        self._Event: Callable[[], CudaEvent] = cuda.Event
        self._get_device: Callable[[], int] = cuda.runtime.getDevice
        self._elapsed: Callable[[CudaEvent, CudaEvent], float] = cuda.get_elapsed_time
        self.max_pending = max(1, int(max_pending))
        # (key, start_event, end_event, device_id)
        self._pending: deque[tuple[Hashable, CudaEvent, CudaEvent, int]] = deque()
        self._ready: list[Result] = []
        self._pool: dict[int, list[CudaEvent]] = {}
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _new_event(self, dev: int) -> CudaEvent:
        pool = self._pool.get(dev)
        if pool:
            return pool.pop()
        return self._Event()

    def begin(self, key: Hashable) -> tuple[Hashable, CudaEvent, int]:
        dev = self._get_device()
        ev = self._new_event(dev)
        ev.record()
        return (key, ev, dev)

    def end(self, token: tuple[Hashable, CudaEvent, int]) -> None:
        key, start, dev = token
        ev = self._new_event(dev)
        ev.record()
        self._pending.append((key, start, ev, dev))
        if len(self._pending) > self.max_pending:
            self._poll(False)
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1

    def _poll(self, block: bool) -> None:
        pending = self._pending
        while pending:
            key, start, stop, dev = pending[0]
            if block:
                start.synchronize()
                stop.synchronize()
            elif not stop.done:
                break
            pending.popleft()
            try:
                ms = self._elapsed(start, stop)
            except Exception:  # an event not complete or gone: the pair waits or drops  # noqa: BLE001
                if not block and not start.done:  # start on another stream
                    pending.appendleft((key, start, stop, dev))
                    break
                self.dropped += 1  # e.g. range crossed devices
                continue
            self._ready.append((key, float(ms)))
            pool = self._pool.setdefault(dev, [])
            pool.append(start)
            pool.append(stop)

    def drain(self, block: bool = False) -> list[Result]:
        self._poll(block)
        out, self._ready = self._ready, []
        return out


class CupyBackend:
    """Real backend on an already-imported CuPy; lazy and cheap per call.

    Never imports CuPy: raises ``RuntimeError`` on use if ``cupy`` is not in
    ``sys.modules``.  Device objects / bound ``synchronize`` methods are
    cached per id.  Profiler start/stop failures (e.g. no GPU) warn once
    instead of raising; synchronize errors propagate (they are real CUDA
    errors of the user's work).
    """

    name = "cupy"

    def __init__(self) -> None:
        self._cupy: Any = None
        self._sync_fns: dict[int, Any] = {}
        self._prof_start: Any = None
        self._prof_stop: Any = None
        self._available: bool | None = None
        self._warned = False

    def _module(self) -> Any:
        cp = self._cupy
        if cp is None:
            cp = _imported_cupy()
            if cp is None:
                raise RuntimeError("CupyBackend used but cupy is not imported")
            self._cupy = cp
        return cp

    def available(self) -> bool:
        """Whether at least one CUDA device is usable (cached)."""
        if self._available is None:
            try:
                self._available = self._module().cuda.runtime.getDeviceCount() > 0
            except Exception:  # no usable CUDA runtime: no GPU  # noqa: BLE001
                self._available = False
        return self._available

    def synchronize(self, devices: Iterable[int]) -> None:
        fns = self._sync_fns
        for d in devices:
            fn = fns.get(d)
            if fn is None:
                fn = fns[d] = self._module().cuda.Device(d).synchronize
            fn()

    def _bind_profiler(self) -> None:
        cuda = self._module().cuda
        prof = getattr(cuda, "profiler", None)
        start = getattr(prof, "start", None)
        stop = getattr(prof, "stop", None)
        if start is None or stop is None:
            rt = cuda.runtime
            start, stop = rt.profilerStart, rt.profilerStop
        self._prof_start, self._prof_stop = start, stop

    def _profiler_call(self, which: str) -> None:
        if self._prof_start is None:
            self._bind_profiler()
        fn = self._prof_start if which == "start" else self._prof_stop
        try:
            fn()
        except Exception as e:  # the profiler API is optional: warned once  # noqa: BLE001
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"chainer_autoprof: cudaProfiler{which.title()} failed: {e!r}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def profiler_start(self) -> None:
        self._profiler_call("start")

    def profiler_stop(self) -> None:
        self._profiler_call("stop")

    def event_timer(self, max_pending: int = DEFAULT_MAX_PENDING) -> EventTimer:
        """A :class:`CupyEventTimer`, or a null timer when no GPU is usable."""
        if not self.available():
            return NullEventTimer()
        return CupyEventTimer(self._module(), max_pending)


# --------------------------------------------------------------------------
# Lazy (binds to CuPy once the user imports it)
# --------------------------------------------------------------------------


class LazyEventTimer:
    """Null timer until CuPy is imported, then delegates to a real one."""

    def __init__(self, backend: LazyBackend, max_pending: int) -> None:
        self._backend = backend
        self._max_pending = max_pending
        self._real: EventTimer | None = None

    def _resolve(self) -> EventTimer | None:
        if self._real is None:
            backend = self._backend._bind()
            if backend is not None:
                self._real = backend.event_timer(self._max_pending)
        return self._real

    @property
    def dropped(self) -> int:
        return self._real.dropped if self._real is not None else 0

    @property
    def pending(self) -> int:
        return self._real.pending if self._real is not None else 0

    def begin(self, key: Hashable) -> Any:
        real = self._real or self._resolve()
        return None if real is None else (real, real.begin(key))

    def end(self, token: Any) -> None:
        if token is not None:
            token[0].end(token[1])

    def drain(self, block: bool = False) -> list[Result]:
        return [] if self._real is None else self._real.drain(block)


class LazyBackend:
    """:class:`NullBackend` until ``'cupy' in sys.modules``, then CuPy.

    Each call checks ``sys.modules`` (a dict lookup) until CuPy appears; then
    a :class:`CupyBackend` is bound and its methods replace this instance's,
    so later calls go straight to it.  Never imports CuPy itself.
    """

    name = "lazy"

    def __init__(self) -> None:
        self._real: CupyBackend | None = None

    def _bind(self) -> CupyBackend | None:
        if self._real is None:
            cp = _imported_cupy()
            if cp is None or not hasattr(cp, "cuda"):
                return None
            real = CupyBackend()
            self._real = real
            self.synchronize = real.synchronize  # type: ignore[method-assign]
            self.profiler_start = real.profiler_start  # type: ignore[method-assign]
            self.profiler_stop = real.profiler_stop  # type: ignore[method-assign]
        return self._real

    @property
    def bound(self) -> bool:
        """Whether CuPy has been seen and the real backend bound."""
        return self._real is not None

    def synchronize(self, devices: Iterable[int]) -> None:
        real = self._bind()
        if real is not None:
            real.synchronize(devices)

    def profiler_start(self) -> None:
        real = self._bind()
        if real is not None:
            real.profiler_start()

    def profiler_stop(self) -> None:
        real = self._bind()
        if real is not None:
            real.profiler_stop()

    def event_timer(self, max_pending: int = DEFAULT_MAX_PENDING) -> EventTimer:
        real = self._bind()
        if real is not None:
            return real.event_timer(max_pending)
        return LazyEventTimer(self, max_pending)


# --------------------------------------------------------------------------
# Counting (CPU test stand-in)
# --------------------------------------------------------------------------


class HostEventTimer:
    """CPU stand-in timer: host ``perf_counter`` ms, ready immediately."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.max_pending = max(1, int(max_pending))
        self._ready: deque[Result] = deque()
        self.dropped = 0
        self.pending = 0

    def begin(self, key: Hashable) -> tuple[Hashable, float]:
        return (key, time.perf_counter())

    def end(self, token: tuple[Hashable, float]) -> None:
        key, t0 = token
        self._ready.append((key, (time.perf_counter() - t0) * 1e3))
        if len(self._ready) > self.max_pending:
            self._ready.popleft()
            self.dropped += 1

    def drain(self, block: bool = False) -> list[Result]:
        out = list(self._ready)
        self._ready.clear()
        return out


class CountingBackend:
    """Counts calls instead of touching a GPU (for CPU tests).

    ``sync_calls`` counts every ``synchronize`` call, ``synced_devices``
    holds the sorted, de-duplicated ids of each call (``()`` for an empty
    one); ``device_syncs`` counts only calls with at least one id.  If
    ``log_path`` is given, one line per call is appended to it (``%p`` is
    replaced by the pid at call time): ``sync 0,1`` (``sync`` alone when
    empty), ``profiler_start``, ``profiler_stop``.
    """

    name = "counting"

    def __init__(self, log_path: str | None = None) -> None:
        self.log_path = log_path
        self.sync_calls = 0
        self.synced_devices: list[tuple[int, ...]] = []
        self.profiler_starts = 0
        self.profiler_stops = 0
        self.timers_created = 0

    @property
    def device_syncs(self) -> int:
        return sum(1 for ids in self.synced_devices if ids)

    def _log(self, line: str) -> None:
        if self.log_path:
            path = self.log_path.replace("%p", str(os.getpid()))
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def synchronize(self, devices: Iterable[int]) -> None:
        ids = tuple(sorted(set(devices)))
        self.sync_calls += 1
        self.synced_devices.append(ids)
        self._log(("sync " + ",".join(map(str, ids))) if ids else "sync")

    def profiler_start(self) -> None:
        self.profiler_starts += 1
        self._log("profiler_start")

    def profiler_stop(self) -> None:
        self.profiler_stops += 1
        self._log("profiler_stop")

    def event_timer(self, max_pending: int = DEFAULT_MAX_PENDING) -> EventTimer:
        self.timers_created += 1
        return HostEventTimer(max_pending)


# --------------------------------------------------------------------------
# Selection and helpers
# --------------------------------------------------------------------------

_cache: tuple[tuple[str, str], DeviceBackend] | None = None


def get_backend() -> DeviceBackend:
    """The process-wide backend (cached per test-env setting).

    ``CHAINER_AUTOPROF_TEST_DEVICE=counting`` -> :class:`CountingBackend`
    (logging to ``CHAINER_AUTOPROF_TEST_DEVICE_LOG`` if set); else
    :class:`CupyBackend` if CuPy is already imported; else a
    :class:`LazyBackend` (no-op until the script imports CuPy).
    """
    global _cache
    key = (os.environ.get(ENV_TEST_DEVICE, ""), os.environ.get(ENV_TEST_DEVICE_LOG, ""))
    if _cache is not None and _cache[0] == key:
        return _cache[1]
    backend: DeviceBackend
    if key[0].strip().lower() == "counting":
        backend = CountingBackend(key[1] or None)
    elif _imported_cupy() is not None:
        backend = CupyBackend()
    else:
        backend = LazyBackend()
    _cache = (key, backend)
    return backend


def reset_backend() -> None:
    """Forget the cached backend (tests)."""
    global _cache
    _cache = None


def array_device_ids(arrays: Iterable[Any]) -> set[int]:
    """GPU device ids of the CuPy ndarrays among ``arrays``.

    NumPy arrays, ``None`` and anything else are ignored; without an imported
    CuPy the result is always empty (CuPy is never imported here).
    """
    cp = _imported_cupy()
    nd = getattr(cp, "ndarray", None) if cp is not None else None
    if nd is None:
        return set()
    return {a.device.id for a in arrays if isinstance(a, nd)}


def device_names(ids: Iterable[int]) -> list[dict[str, Any]]:
    """The GPUs in use: id and name (the name only where the program imported CuPy)."""
    out: list[dict[str, Any]] = []
    cupy = _imported_cupy()
    for dev in sorted(ids):
        entry: dict[str, Any] = {"id": dev}
        if cupy is not None:
            try:
                props = cupy.cuda.runtime.getDeviceProperties(dev)
                name = props.get("name", b"")
                entry["name"] = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:  # a device's name is optional  # noqa: BLE001
                pass
        out.append(entry)
    return out
