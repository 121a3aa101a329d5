"""A sink that records nothing and only has every range timed.

Stall reports say how long each open range has been open, from the ``t0`` in
each thread's stack; the tracer reads the clock only for a sink that wants
the times, so without the recorder this one asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.events import RangeInfo, Tracer


class ClockSink:
    """A sink that only asks the tracer to time every range (open ranges' ages for the reports)."""

    timed = True

    def prepare(self, info: RangeInfo) -> None:
        pass

    def close(self, tracer: Tracer) -> None:
        pass
