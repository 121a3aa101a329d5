"""CUPTI's timestamps on the agent's clock (``time.perf_counter_ns``), from clock pairs.

CUPTI stamps its records with its own clock (on Linux the realtime clock, which NTP may
slew); the agent's ranges are on ``perf_counter_ns`` (CLOCK_MONOTONIC).  Pairs of both
read together (:class:`~..common.gpu_records.ClockPairs`) give the map: a straight line
fitted through the pairs by least squares (through both exactly when there are two, an
offset alone when there is one), in integer nanoseconds relative to the first pair so
that no precision is lost on 64-bit timestamps.

Error bound (:attr:`ClockMap.bound_ns`), for timestamps inside the span of the pairs:
the largest residual of the fit at a pair (how far the two clocks stray from a line
between pairs; 0 with two pairs, measured with more) plus the largest time one pair's
reads took (the pair itself is only known that closely).  Outside the span the line is
extrapolated: add the drift it cannot see (:meth:`ClockMap.bound_at`).  The live
collector reads a pair at the start, at every buffer it receives and at the end, so all
records fall inside the span and the residuals measure the clocks' drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..common.gpu_records import ClockPairs

Int64Array = npt.NDArray[np.int64]

#: Extrapolation beyond the pairs: the drift assumed unseen, in parts per million
#: (crystal oscillators stay within tens of ppm; NTP slews at most 500 ppm).
UNSEEN_DRIFT_PPM = 50.0


@dataclass(frozen=True)
class ClockMap:
    """``perf = perf0 + round((cupti - cupti0) * slope + offset)`` (all in ns)."""

    cupti0: int
    perf0: int
    slope: float
    offset: float
    residual_ns: int     # largest |fit - pair| at a pair
    read_ns: int         # largest duration of a pair's reads (0 when unknown)
    first_ns: int        # CUPTI time of the first and last pair
    last_ns: int
    pairs: int

    def __init__(self, cupti0: int, perf0: int, slope: float, offset: float,
                 residual_ns: int, read_ns: int, first_ns: int, last_ns: int,
                 pairs: int) -> None:
        # (the dataclass's own __init__ sets each field through object.__setattr__, some
        # 1,000 instructions each; a map is made at every buffer: its fields written at once)
        self.__dict__.update(cupti0=cupti0, perf0=perf0, slope=slope, offset=offset,
                             residual_ns=residual_ns, read_ns=read_ns, first_ns=first_ns,
                             last_ns=last_ns, pairs=pairs)

    @property
    def bound_ns(self) -> int:
        """Error bound of a mapped timestamp inside the span of the pairs."""
        return self.residual_ns + self.read_ns

    def bound_at(self, cupti_ns: int) -> int:
        """Error bound at ``cupti_ns``, also outside the span (the unseen drift added)."""
        outside = max(0, self.first_ns - cupti_ns, cupti_ns - self.last_ns)
        return self.bound_ns + int(outside * UNSEEN_DRIFT_PPM * 1e-6)

    def to_agent(self, cupti_ns: Int64Array) -> Int64Array:
        """CUPTI nanoseconds -> ``perf_counter_ns`` nanoseconds (int64 arrays)."""
        c = np.asarray(cupti_ns, dtype=np.int64)
        delta = (c - self.cupti0).astype(np.float64)
        perf: Int64Array = self.perf0 + np.rint(delta * self.slope + self.offset).astype(np.int64)
        return perf

    def to_agent_one(self, cupti_ns: int) -> int:
        return int(self.to_agent(np.array([cupti_ns], dtype=np.int64))[0])

    def to_dict(self) -> dict[str, float | int]:
        """What a run record says of the map: its slope (ppm off 1), pairs and bound."""
        return {"pairs": self.pairs, "drift_ppm": (self.slope - 1.0) * 1e6,
                "residual_ns": self.residual_ns, "read_ns": self.read_ns,
                "bound_ns": self.bound_ns}


def fit(pairs: ClockPairs) -> ClockMap:
    """The map through ``pairs`` (ValueError without any pair)."""
    n = len(pairs)
    if n == 0:
        raise ValueError("no clock pairs: CUPTI's timestamps cannot be put on the agent's clock")
    order = np.argsort(pairs.cupti_ns, kind="stable")
    c = pairs.cupti_ns[order]
    p = pairs.perf_ns[order]
    cupti0, perf0 = int(c[0]), int(p[0])
    x = (c - cupti0).astype(np.float64)
    y = (p - perf0).astype(np.float64)
    if n == 1 or float(x[-1] - x[0]) == 0.0:
        slope = 1.0
        offset = float(np.mean(y - x))
    else:
        xm, ym = float(x.mean()), float(y.mean())
        slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
        offset = ym - slope * xm
    fitted = np.rint(x * slope + offset)
    residual = int(np.abs(fitted - y).max()) if n else 0
    reads = pairs.read_ns[pairs.read_ns >= 0]
    return ClockMap(cupti0, perf0, slope, offset, residual,
                    int(reads.max()) if len(reads) else 0, int(c[0]), int(c[-1]), n)
