"""Slow iterations: which ones, and what made each slow compared with the median iteration.

While ranges are aggregated, :class:`SlowestIterations` keeps the few
slowest counted iterations with what ran inside them (their phases, each
garbage collection with its generation and phase, the named ranges such as
communication, extensions or your own annotations).  Afterwards
:func:`slow_iterations` keeps those at least :data:`OUTLIER_FACTOR` times the
median and names the cause of each against the median iteration:
a collection, or the phase or named range that grew.  :func:`stutter`
measures how much of the iteration time the outliers hold (verdict, advice).

Everything here works on plain values (a :class:`~.stats.RunStats` and the
details dictionaries), live and from a saved trace alike.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .stats import PHASE_KEYS, median

if TYPE_CHECKING:
    from .stats import RunStats

#: An iteration at least this many times the median iteration is slow.
OUTLIER_FACTOR = 2.0
#: Slow iterations kept with their details while aggregating.
KEEP_SLOWEST = 10
#: A cause explains an iteration when it holds at least this share of its excess over the median.
CAUSE_SHARE = 0.5
#: Below this share of the excess, the biggest growth is not named as the cause.
SPREAD_SHARE = 0.25


class SlowestIterations:
    """The :data:`KEEP_SLOWEST` slowest iterations seen, each with its details (a dict)."""

    def __init__(self, keep: int = KEEP_SLOWEST) -> None:
        self.keep = keep
        self._heap: list[tuple[int, int, dict[str, Any]]] = []  # (ns, order, details)
        self._order = 0

    def threshold(self) -> int:
        """An iteration must take longer than this (ns) to be kept (-1: any is kept)."""
        return self._heap[0][0] if len(self._heap) >= self.keep else -1

    def add(self, ns: int, details: dict[str, Any]) -> None:
        self._order += 1
        item = (ns, self._order, details)
        if len(self._heap) < self.keep:
            heapq.heappush(self._heap, item)
        elif ns > self._heap[0][0]:
            heapq.heapreplace(self._heap, item)

    def items(self) -> list[dict[str, Any]]:
        """The kept details, slowest first."""
        return [d for _ns, _o, d in sorted(self._heap, key=lambda x: (-x[0], x[1]))]


@dataclass
class SlowIteration:
    """A slow iteration and what made it slow."""

    iteration: int
    ms: float
    factor: float
    #: ``gc``, a phase key, ``range`` (a named range), or ``""`` when nothing stands out
    cause: str
    #: For ``gc``: the biggest collection's generation, its phase, and all collections' time.
    generation: int | None = None
    phase: str | None = None
    cause_ms: float = 0.0
    median_ms: float = 0.0
    collections: int = 0
    longest_ms: float = 0.0
    name: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _phase_medians(stats: RunStats) -> dict[str, float]:
    return {key: median(stats.phase_ms.get(key, [])) for key in PHASE_KEYS}


def explain(details: dict[str, Any], stats: RunStats) -> SlowIteration:
    """What made the iteration in ``details`` slow, against the median iteration of ``stats``."""
    med = stats.median()
    ms = float(details.get("ms", 0.0))
    out = SlowIteration(int(details.get("iteration", -1)), ms, ms / med if med > 0 else 0.0, "")
    excess = ms - med
    if excess <= 0:
        return out
    gc_rows = details.get("gc") or []
    gc_ms = float(details.get("gc_ms", 0.0))
    gc_median = median(getattr(stats, "gc_ms", []) or [])
    # a phase's growth net of the collections inside it: those are the collector's
    phases = details.get("phases") or {}
    gc_by_phase: dict[str, float] = {}
    for _gen, gms, phase in gc_rows:
        gc_by_phase[phase] = gc_by_phase.get(phase, 0.0) + gms
    medians = _phase_medians(stats)
    growth = {key: float(phases.get(key, 0.0)) - gc_by_phase.get(key, 0.0) - medians[key]
              for key in PHASE_KEYS}
    candidates: list[tuple[float, str]] = [(gc_ms - gc_median, "gc")]
    candidates += [(g, key) for key, g in growth.items()]
    grown, cause = max(candidates)
    if grown < SPREAD_SHARE * excess:  # spread over everything: no single cause
        return out
    out.cause, out.cause_ms = cause, grown
    if cause == "gc":
        biggest = max(gc_rows, key=lambda row: row[1]) if gc_rows else (None, gc_ms, "other")
        out.generation = None if biggest[0] is None else int(biggest[0])
        out.phase = biggest[2]
        out.cause_ms = gc_ms
        out.longest_ms = float(biggest[1])
        out.collections = len(gc_rows)
        return out
    out.phase = cause
    out.median_ms = medians[cause]
    out.cause_ms = float(phases.get(cause, 0.0))
    named = [row for row in details.get("ranges") or () if row[2] == cause]
    if named:
        name, rms, _phase = max(named, key=lambda row: row[1])
        if rms >= CAUSE_SHARE * grown:
            out.cause, out.name, out.cause_ms = "range", str(name), float(rms)
    return out


def slow_iterations(stats: RunStats, factor: float = OUTLIER_FACTOR) -> list[SlowIteration]:
    """The kept iterations at least ``factor`` times the median, slowest first, each explained."""
    med = stats.median()
    if med <= 0 or not stats.iterations:
        return []
    slow = [d for d in getattr(stats, "slowest", []) or () if d.get("ms", 0.0) >= factor * med]
    out = [explain(d, stats) for d in slow]
    for item, details in zip(out, slow):
        item.details = details
    return out


@dataclass
class Stutter:
    """How much of the counted iteration time the slow iterations hold."""

    count: int = 0             # slow iterations (in the per-iteration sample)
    sampled: int = 0           # iterations in the sample
    share: float = 0.0         # their time above the median, over all iteration time
    excess_ms: float = 0.0     # their time above the median (scaled to the whole run)
    gc_count: int = 0          # slow iterations where collections hold half the excess or more
    median_ms: float = 0.0


def stutter(stats: RunStats, factor: float = OUTLIER_FACTOR) -> Stutter:
    """The slow iterations' share of the iteration time; how many of them collections explain."""
    values = stats.iteration_ms
    med = stats.median()
    out = Stutter(sampled=len(values), median_ms=med)
    if not values or med <= 0:
        return out
    gc = list(getattr(stats, "gc_ms", []) or [])
    total = sum(values)
    for i, ms in enumerate(values):
        if ms < factor * med:
            continue
        out.count += 1
        extra = ms - med
        out.excess_ms += extra
        if i < len(gc) and gc[i] >= CAUSE_SHARE * extra:
            out.gc_count += 1
    out.share = out.excess_ms / total if total > 0 else 0.0
    out.excess_ms = out.share * stats.iteration_total_ms
    return out
