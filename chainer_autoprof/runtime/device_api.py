"""The device layer's interfaces (:class:`EventTimer`, :class:`DeviceBackend`) and the null
backend of NumPy-only runs: what every backend of :mod:`.device` implements.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, Protocol, Tuple, runtime_checkable

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
