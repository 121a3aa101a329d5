"""The real device backends: CuPy's, bound at once or when the program imports CuPy.

The only module besides :mod:`.gpu_activity` (CUPTI) that talks to CUDA, and
only through the CuPy the program imported (``'cupy' in sys.modules``): it
never imports CuPy, and CUDA is touched only on the first real call.
"""

from __future__ import annotations

import sys
import warnings
from collections import deque
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .device_api import DEFAULT_MAX_PENDING, EventTimer, NullEventTimer, Result

if TYPE_CHECKING:
    from types import ModuleType


# --------------------------------------------------------------------------
# CuPy
# --------------------------------------------------------------------------


def imported_cupy() -> Any:
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
            cp = imported_cupy()
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
            cp = imported_cupy()
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
