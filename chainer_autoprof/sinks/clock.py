"""A sink that records nothing and only has every range timed.

Stall reports say how long each open range has been open, from the ``t0`` in
each thread's stack; the tracer reads the clock only for a sink that wants
the times, so without the recorder this one asks for them.
"""

from __future__ import annotations

from typing import Any


class ClockSink:
    """A sink that only asks the tracer to time every range (open ranges' ages for the reports)."""

    timed = True

    def prepare(self, info: Any) -> None:
        pass

    def close(self, tracer: Any) -> None:
        pass
