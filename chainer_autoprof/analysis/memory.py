"""Memory at each iteration's end, and the leak every Chainer user writes once.

:data:`MEMORY` is the figure (:mod:`.per_iteration`), read once per iteration as it ends
(never per link): the process's resident memory (``/proc/self/statm``) and, where the
program imported CuPy, its default memory pool's bytes in use and held, and its pinned
memory pool's held bytes where the pool tells them (CuPy's own ``PinnedMemoryPool`` has
no byte count: that series is then absent).

:func:`leak` tells the leak from the rest: memory that grows steadily across the
counted iterations -- ``sum_loss += loss`` keeping every iteration's graph alive,
Variables appended to a list -- still growing at the end, by enough to matter (the
advice names the usual causes).  :func:`caching` tells a pool that grew in the first
iterations and then held: CuPy keeps freed blocks for reuse, which is not a leak.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np

from ..common import figures
from .finding import Finding
from .per_iteration import BYTES, IterationFigure, Samples

#: The series, in the order :meth:`Memory.read` gives them.
RSS, POOL_USED, POOL_HELD, PINNED_HELD = "rss", "pool used", "pool held", "pinned held"
COLUMNS = (RSS, POOL_USED, POOL_HELD, PINNED_HELD)
#: What each series is, in the summary's words.
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
#: The resident memory's line (pages: size, resident, ...).
STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: No CuPy pool figures (CuPy not in use): pool used, pool held, pinned held.
_NO_POOLS = (-1, -1, -1)
UNCHAIN_DOC = ("https://docs.chainer.org/en/stable/reference/generated/chainer.Variable.html"
               "#chainer.Variable.unchain_backward")


_Libc = Tuple[Callable[[bytes, int], int], Callable[[int, object, int], int],
              Callable[[int], int]]


def _libc_keeping_the_gil() -> _Libc | None:
    """libc's ``open``, ``read``, ``close`` called with the GIL held (``ctypes.PyDLL``).

    ``os.read`` lets other threads run while it reads; at an iteration's end, inside the
    recorder's callback, that hands the interpreter to the program's other threads in the
    middle of the agent's bookkeeping, which a read of a few bytes from ``/proc`` does not
    need."""
    try:
        libc = ctypes.PyDLL(None)
        calls = (libc.open, libc.read, libc.close)
    except (OSError, AttributeError):
        return None
    calls[0].argtypes, calls[0].restype = (ctypes.c_char_p, ctypes.c_int), ctypes.c_int
    calls[1].argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    calls[1].restype = ctypes.c_ssize_t
    calls[2].argtypes, calls[2].restype = (ctypes.c_int,), ctypes.c_int
    return calls


_LIBC = _libc_keeping_the_gil()
_STATM_BUF = ctypes.create_string_buffer(128)


def _read_statm() -> bytes | None:
    """STATM's line (opened, read and closed: no descriptor is held across the program's
    code, which may close and reuse any), ``None`` where there is none."""
    if _LIBC is None:
        try:
            fd = os.open(STATM, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, 128)
        finally:
            os.close(fd)
    open_, read, close = _LIBC
    fd = open_(STATM.encode(), os.O_RDONLY | os.O_CLOEXEC)
    if fd < 0:
        return None
    try:
        n = read(fd, _STATM_BUF, 127)
    finally:
        close(fd)
    return _STATM_BUF.raw[:n] if n > 0 else None


class Memory(IterationFigure):
    """Memory in use at each iteration's end."""

    name = "memory"
    doc = ("the process's resident memory (rss), and where CuPy is in use its default memory "
           "pool's bytes in use and held (pool used, pool held) and its pinned pool's held "
           "bytes (pinned held); bytes")
    series = COLUMNS
    labels = LABELS
    unit = BYTES

    def __init__(self) -> None:
        self._statm_ok = True

    def read(self) -> tuple[int, ...]:
        """The resident size (STATM read with the GIL held), and CuPy's pools where the program
        imported CuPy (their own bookkeeping: no CUDA call)."""
        rss = -1
        if self._statm_ok:
            line = _read_statm()
            if line is None:
                self._statm_ok = False  # not Linux: no resident figure
            else:
                rss = int(line.split()[1]) * _PAGE
        pools = _NO_POOLS
        cupy = sys.modules.get("cupy")
        if cupy is not None and hasattr(cupy, "get_default_memory_pool"):
            pool = cupy.get_default_memory_pool()
            pinned = getattr(cupy.get_default_pinned_memory_pool(), "total_bytes", None)
            pools = (int(pool.used_bytes()), int(pool.total_bytes()),
                     int(pinned()) if pinned is not None else -1)
        return (rss, *pools)

    def shown(self, samples: Samples) -> list[str]:
        """Resident memory, and the pools that ever held anything."""
        return [c for c in COLUMNS if samples.values.get(c)
                and (c == RSS or samples.peak.get(c, 0) > 0)]

    def notes(self, samples: Samples) -> list[str]:
        lines = []
        grown = leak(samples)
        if grown is not None:
            lines.append(f"{LABELS[grown.column]} grows {figures.size(grown.per_iteration)} per "
                         f"iteration since iteration {grown.start_iteration}, steadily: a leak")
        cache = caching(samples)
        if cache is not None:
            lines.append(f"CuPy's pool holds {figures.size(cache.held_bytes)} since iteration "
                         f"{cache.until_iteration}: freed blocks kept for reuse (caching, not a "
                         "leak)")
        return lines

    def advice(self, samples: Samples) -> list[Finding]:
        grown = leak(samples)
        if grown is None:
            return []
        rate = figures.size(grown.per_iteration)
        return [Finding(
            "memory_leak", f"memory grows by {rate} per iteration (since iteration "
            f"{grown.start_iteration}): something keeps every iteration's objects alive",
            f"{LABELS[grown.column]} memory at each iteration's end went from "
            f"{figures.size(grown.start_bytes)} (iteration {grown.start_iteration}) to "
            f"{figures.size(grown.end_bytes)} (iteration {grown.end_iteration}), steadily, and "
            "still grows at the end",
            f"{figures.size(grown.per_iteration * 1000)} more per 1,000 iterations, until the "
            "process runs out of memory",
            "keep no Variable across iterations: accumulate float(loss.array) (or loss.array), "
            "not loss (sum_loss += loss keeps every iteration's graph alive); call "
            "loss.unchain_backward() on a Variable you keep; evaluate under "
            "chainer.no_backprop_mode(); do not append Variables to a list",
            UNCHAIN_DOC)]


MEMORY = Memory()


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


def leak(memory: Samples | None) -> Growth | None:
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


def _growth(memory: Samples, column: str) -> Growth | None:
    values = memory.values.get(column) or []
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


def caching(memory: Samples | None) -> Cache | None:
    """CuPy's pool holding what it grew to in the first iterations, with no steady growth
    since (caching freed blocks for reuse, not a leak), or ``None``."""
    if memory is None:
        return None
    values = memory.values.get(POOL_HELD) or []
    if len(values) < MIN_SAMPLES or _growth(memory, POOL_HELD) is not None:
        return None
    last = values[-1]
    if last < CACHE_MIN_BYTES or max(values) > last * 1.05:
        return None  # small, or it shrank (freed to the device): not a pool that holds
    until = next(i for i, v in zip(memory.iteration, values) if v >= 0.95 * last)
    return Cache(POOL_HELD, last, until)
