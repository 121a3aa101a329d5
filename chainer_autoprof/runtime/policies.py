"""Policies that sit between events and sinks: GPU sync level and capture window.

They know nothing of Chainer and nothing of NVTX.  The tracer asks them two
questions on the hot path, both answered by plain attributes:
``SyncPolicy.below`` (sync at the boundaries of ranges with a level below it)
and ``CaptureWindow.open`` (emit at all).
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Callable, Iterable

from .device import DeviceBackend


class SyncPolicy:
    """Synchronize every GPU in use at the boundaries of coarse-enough ranges.

    ``level`` follows chainer_profutil: 0 none, 1 iteration boundaries, 2 also
    phase boundaries, 3 also every finer range emitted.  ``devices`` is the set
    of GPU ids that hold the model's arrays; patches add to it as they see
    links on new devices.

    ``on_wait`` (set by the recorder, :meth:`watch`) is told of each wait,
    ``(t0, t1)`` in ``perf_counter_ns``, on the thread that waited and inside
    the tracer's begin or end: a wait at a range's start lies in its parent,
    one at a range's end inside the range.
    """

    __slots__ = ("backend", "calls", "devices", "level", "on_wait", "seconds")

    def __init__(self, level: int, backend: DeviceBackend) -> None:
        self.level = level
        self.backend = backend
        self.devices: set[int] = set()
        self.calls = 0
        self.seconds = 0.0
        self.on_wait: Callable[[int, int], None] | None = None

    def add_devices(self, ids: Iterable[int]) -> None:
        self.devices.update(ids)

    def watch(self, on_wait: Callable[[int, int], None] | None) -> None:
        """Call ``on_wait(t0_ns, t1_ns)`` after every wait from now on (``None``: stop)."""
        self.on_wait = on_wait

    def synchronize(self) -> None:
        self.calls += 1
        t0 = perf_counter_ns()
        self.backend.synchronize(self.devices)
        t1 = perf_counter_ns()
        self.seconds += (t1 - t0) * 1e-9  # time waited, the whole run (old traces' estimate)
        on_wait = self.on_wait
        if on_wait is not None:
            on_wait(t0, t1)


class CaptureWindow:
    """Emit ranges only for iterations ``start <= n < stop``.

    At the window's edges the CUDA profiler is started and stopped through the
    device backend, so ``nvprof --profile-from-start off`` and
    ``nsys --capture-range=cudaProfilerApi`` capture exactly the window.
    ``on_open`` and ``on_close`` (given, or set later by whoever composes it) are called
    right after the profiler is started at the window's opening (not at construction), and
    right before it is stopped.
    """

    __slots__ = ("backend", "done", "exit_after", "on_close", "on_open", "open", "start",
                 "stop")

    def __init__(self, start: int, stop: int, backend: DeviceBackend, exit_after: bool,
                 on_open: Callable[[], None] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.start = start
        self.stop = stop
        self.backend = backend
        self.exit_after = exit_after
        self.open = start == 0
        self.done = False
        self.on_open = on_open
        self.on_close = on_close
        if self.open:
            backend.profiler_start()

    def at_iteration(self, n: int) -> None:
        """Called before iteration ``n`` begins (n counts from 0)."""
        if n == self.start and not self.open and not self.done:
            self.open = True
            self.backend.profiler_start()
            if self.on_open is not None:
                self.on_open()
        elif n == self.stop and self.open:
            self.open = False
            self.done = True
            if self.on_close is not None:
                self.on_close()
            self.backend.profiler_stop()
            if self.exit_after:
                sys.exit(0)

