"""Memory at each iteration's end, and the leak every Chainer user writes once.

The recorder reads memory once per iteration, as the iteration ends (never per
link): the process's resident memory (``/proc/self/statm``) and, where the
program imported CuPy, its default memory pool's bytes in use and held, and
its pinned memory pool's held bytes where the pool tells them (CuPy's own
``PinnedMemoryPool`` has no byte count: that figure is then absent).
:class:`MemoryTrack` keeps them for the counted iterations (a uniform sample
beyond the recorder's ``max_kept``, the peaks exact); :class:`Memory` is what
:class:`~.stats.RunStats` and the run record hold.

:func:`leak` tells the leak from the rest: memory that grows steadily across the
counted iterations -- ``sum_loss += loss`` keeping every iteration's graph alive,
Variables appended to a list -- still growing at the end, by enough to matter.
:func:`caching` tells a pool that grew in the first iterations and then held:
CuPy keeps freed blocks for reuse, which is not a leak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from .shapes import Annotated, F, Int

#: The figures, in the order of :class:`MemoryTrack`'s rows.
RSS, POOL_USED, POOL_HELD, PINNED_HELD = "rss", "pool used", "pool held", "pinned held"
COLUMNS = (RSS, POOL_USED, POOL_HELD, PINNED_HELD)
#: What each figure is, in the summary's words.
LABELS = {RSS: "resident", POOL_USED: "CuPy pool in use", POOL_HELD: "CuPy pool held",
          PINNED_HELD: "CuPy pinned pool held"}
#: Counted iterations needed before growth is judged.
MIN_SAMPLES = 8
#: Growth over the counted iterations below this is no leak (allocator noise, caches).
LEAK_MIN_BYTES = 8 << 20
#: Growth at the end, as a share of the rate over the whole growth, to call it steady.
STEADY_SHARE = 0.5
#: A pool that grew by this much and then held is said to cache.
CACHE_MIN_BYTES = 1 << 20


@dataclass
class Memory:
    """Memory at each counted iteration's end (analysis/memory.py)."""

    iteration: Annotated[List[int], F("each sample's iteration (from 0)")] = \
        field(default_factory=list)
    at_ns: Annotated[List[int], F("when it ended (time.perf_counter_ns())", "ns")] = \
        field(default_factory=list)
    bytes: Annotated[Dict[str, List[int]], F(
        "per sample: rss (the process's resident memory), and where CuPy is in use pool used, "
        "pool held (its default memory pool) and pinned held (its pinned memory pool)",
        "bytes", key="figure")] = field(default_factory=dict)
    peak_bytes: Annotated[Dict[str, int], F("each figure's highest value (exact)", "bytes",
                                            key="figure")] = field(default_factory=dict)
    peak_iteration: Annotated[Dict[str, int], F("the iteration it was reached in",
                                                key="figure")] = field(default_factory=dict)
    sample_stride: Annotated[int, F("the lists hold every N-th counted iteration",
                                    kind=Int(1))] = 1

    def median(self, column: str) -> float:
        """The median of a figure over the counted iterations (bytes; 0.0 without)."""
        values = self.bytes.get(column)
        return float(np.median(values)) if values else 0.0


class MemoryTrack:
    """The samples of the counted iterations, bounded: past ``max_kept``, every other one is
    dropped and the stride doubles (the peaks stay exact)."""

    def __init__(self, warm_skip: int, max_kept: int) -> None:
        self.warm_skip = warm_skip
        self.max_kept = max(2, max_kept)
        self.seen = 0
        self.stride = 1
        self.rows: list[tuple[int, int, tuple[int, ...]]] = []
        self.peaks: dict[int, tuple[int, int]] = {}

    def add(self, iteration: int, at_ns: int, values: tuple[int, ...]) -> None:
        """One iteration's end: ``values`` in :data:`COLUMNS` order (a figure the platform or
        the run lacks: -1)."""
        self.seen += 1
        counted = self.seen - self.warm_skip
        if counted <= 0:
            return
        for i, v in enumerate(values):
            if v >= 0 and v > self.peaks.get(i, (-1, 0))[0]:
                self.peaks[i] = (v, iteration)
        if (counted - 1) % self.stride:
            return
        self.rows.append((iteration, at_ns, values))
        if len(self.rows) > self.max_kept:
            self.rows = self.rows[::2]
            self.stride *= 2

    def result(self) -> Memory | None:
        """The figures (``None``: no counted iteration, or nothing readable)."""
        if not self.rows or not self.peaks:
            return None
        columns = {COLUMNS[i]: [row[2][i] for row in self.rows] for i in sorted(self.peaks)}
        return Memory(iteration=[row[0] for row in self.rows],
                      at_ns=[row[1] for row in self.rows], bytes=columns,
                      peak_bytes={COLUMNS[i]: v for i, (v, _) in sorted(self.peaks.items())},
                      peak_iteration={COLUMNS[i]: n for i, (_, n) in sorted(self.peaks.items())},
                      sample_stride=self.stride)


@dataclass
class Growth:
    """Steady growth of one figure across the counted iterations."""

    column: str
    #: Bytes per counted iteration, from the iteration it started.
    per_iteration: float
    #: The iteration it started in, and the figure then; the last one, and the figure then.
    start_iteration: int
    start_bytes: int
    end_iteration: int
    end_bytes: int


@dataclass
class Cache:
    """A pool that grew (in warm-up, or the first counted iterations) and then held."""

    column: str
    held_bytes: int
    #: The iteration by which it had grown (to within 5%).
    until_iteration: int


def leak(memory: Memory | None) -> Growth | None:
    """The figure that grows steadily (resident memory first, then CuPy's pool in use), or
    ``None``.

    Steady: from a start (the flat stretch before it left out, found as the split that fits
    best), the figure rises along a line by at least :data:`LEAK_MIN_BYTES`, and it still
    rises over the last quarter of the counted iterations at :data:`STEADY_SHARE` of that
    line's rate or more (a cache that filled, then held, does not).
    """
    if memory is None:
        return None
    for column in (RSS, POOL_USED):
        found = _growth(memory, column)
        if found is not None:
            return found
    return None


def _growth(memory: Memory, column: str) -> Growth | None:
    values = memory.bytes.get(column) or []
    n = len(values)
    if n < MIN_SAMPLES:
        return None
    x = np.asarray(memory.iteration[:n], dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    start = _start(x, y)
    xs, ys = x[start:], y[start:]
    slope = float(np.polyfit(xs, ys, 1)[0]) if len(xs) >= 2 and xs[-1] > xs[0] else 0.0
    if slope <= 0 or slope * (xs[-1] - xs[0]) < LEAK_MIN_BYTES:
        return None
    q = max(2, n // 4)
    tail_x, tail_y = x[-q:], y[-q:]
    tail = float(np.polyfit(tail_x, tail_y, 1)[0]) if tail_x[-1] > tail_x[0] else 0.0
    if tail < STEADY_SHARE * slope:
        return None
    return Growth(column, slope, int(xs[0]), int(ys[0]), int(x[-1]), int(y[-1]))


def _start(x: np.ndarray, y: np.ndarray) -> int:  # type: ignore[type-arg]
    """Where the growth starts: the earliest split (among at most 64, in the first three
    quarters) after which a line, and before which a flat level, fit (nearly) best."""
    n = len(y)
    errors: list[tuple[int, float]] = []
    for i in sorted(set(np.linspace(0, 3 * n // 4, num=min(64, 3 * n // 4 + 1),
                                    dtype=int).tolist())):
        before = y[:i]
        err = float(((before - before.mean()) ** 2).sum()) if i else 0.0
        xs, ys = x[i:], y[i:]
        if len(xs) >= 2 and xs[-1] > xs[0]:
            fit = np.polyval(np.polyfit(xs, ys, 1), xs)
            err += float(((ys - fit) ** 2).sum())
        errors.append((i, err))
    best = min(err for _, err in errors)
    # the earliest split nearly as good: a flat stretch of one or two samples fits any line
    return next(i for i, err in errors if err <= 1.25 * best + 1.0)


def caching(memory: Memory | None) -> Cache | None:
    """CuPy's pool holding what it grew to in the first iterations, with no steady growth
    since (caching freed blocks for reuse, not a leak), or ``None``."""
    if memory is None:
        return None
    values = memory.bytes.get(POOL_HELD) or []
    if len(values) < MIN_SAMPLES or _growth(memory, POOL_HELD) is not None:
        return None
    last = values[-1]
    if last < CACHE_MIN_BYTES or max(values) > last * 1.05:
        return None  # small, or it shrank (freed to the device): not a pool that holds
    until = next(i for i, v in zip(memory.iteration, values) if v >= 0.95 * last)
    return Cache(POOL_HELD, last, until)
