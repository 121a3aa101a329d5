"""A bounded per-iteration series: every iteration's row up to a cap, then a uniform sample.

The aggregation's per-iteration figures, the GPU phase timer's and the GPU
figures' windows keep their rows in one, so that median and p95 stay
representative over millions of iterations in a fixed amount of memory.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


class Series:
    """Per-iteration rows: all of them up to ``cap``, then a uniform sample.

    Row ``i`` (counted from the first) is kept when ``i % stride == 0``;
    reaching ``cap`` kept rows halves them and doubles ``stride``.  Feeding
    rows one by one or in blocks gives the same result.
    """

    __slots__ = ("cap", "skip", "stride", "values")

    def __init__(self, cap: int, width: int) -> None:
        self.cap = max(2, cap + (cap & 1))
        self.stride = 1
        self.skip = 0  # rows to pass over before the next kept one
        self.values = [array("d") for _ in range(width)]

    def extend(self, rows: ArrayLike) -> None:
        """Add the rows of a 2-D float array (one row per iteration)."""
        rows = np.asarray(rows, dtype=np.float64)
        k = len(rows)
        pos = 0
        while pos < k:
            start = pos + self.skip
            if start >= k:
                self.skip = start - k
                return
            room = self.cap - len(self.values[0])
            picked = np.arange(start, k, self.stride)[:room]
            for column, values in zip(self.values, rows[picked].T):
                column.frombytes(np.ascontiguousarray(values).tobytes())
            last = int(picked[-1])
            if len(self.values[0]) >= self.cap:
                self.values = [column[::2] for column in self.values]
                self.skip = self.stride - 1
                self.stride *= 2
                pos = last + 1
            else:
                self.skip = last + self.stride - k
                return
