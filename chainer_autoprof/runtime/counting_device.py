"""The CPU test stand-in for the device-sync call: it counts (and logs) the calls a GPU
would get (``CHAINER_AUTOPROF_TEST_DEVICE=counting``, :func:`.device.get_backend`)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Hashable, Iterable

from .device_api import DEFAULT_MAX_PENDING, EventTimer, Result

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
