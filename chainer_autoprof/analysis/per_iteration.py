"""Figures read at each iteration's end: what one is, how its samples are kept and judged.

A figure read once per iteration (never per link) -- memory in use, say -- is one
:class:`IterationFigure`: how it is read, what its series are called, their unit, what
the analysis says of its samples (notes under its summary row, advice).  Everything else
follows from that declaration, registered in :mod:`.iteration_figures`: the recorder reads
each registered figure as an iteration ends and keeps the counted iterations' samples
(:class:`SampleTrack`, bounded); the run record holds them as :class:`Samples` under the
figure's name (:attr:`~.stats.RunStats.per_iteration`); the findings judge them
(:func:`judge`); the summary, ``report`` and the HTML report show each figure's median and
peak with the notes; the trace has a counter track per figure under the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Sequence

import numpy as np

from ..common import figures
from .shapes import Annotated, F, Int, ListOf, MapOf

if TYPE_CHECKING:
    from .finding import Finding


@dataclass(frozen=True)
class Unit:
    """How a figure's values read: in words, and on its counter track."""

    #: A value in words (``12.4 MiB``).
    text: Callable[[float], str]
    #: The counter track's values are the figure's divided by this, in ``counter_unit``.
    counter_scale: float = 1.0
    counter_unit: str = ""


BYTES = Unit(figures.size, 1 << 20, "MiB")
COUNT = Unit(figures.count)


@dataclass
class Samples:
    """A figure at each counted iteration's end (analysis/per_iteration.py)."""

    iteration: Annotated[List[int], F("each sample's iteration (from 0)")] = \
        field(default_factory=list)
    at_ns: Annotated[List[int], F("when it ended (time.perf_counter_ns())", "ns")] = \
        field(default_factory=list)
    values: Annotated[Dict[str, List[int]], F(
        "per series, its value at each sample (in the figure's unit; -1: not read then)",
        kind=MapOf(ListOf(Int(-1)), key="series"))] = field(default_factory=dict)
    peak: Annotated[Dict[str, int], F("each series' highest value (exact)", key="series")] = \
        field(default_factory=dict)
    peak_iteration: Annotated[Dict[str, int], F("the iteration it was reached in",
                                                key="series")] = field(default_factory=dict)
    sample_stride: Annotated[int, F("the lists hold every N-th counted iteration",
                                    kind=Int(1))] = 1

    def median(self, series: str) -> float:
        """The median of a series over the counted iterations (0.0 without)."""
        values = [v for v in self.values.get(series, ()) if v >= 0]
        return float(np.median(values)) if values else 0.0


class IterationFigure:
    """One figure read at each iteration's end (a subclass per figure, registered in
    :mod:`.iteration_figures`)."""

    #: Its name: the record's key, the summary row's label, the counter track's name.
    name = ""
    #: What it is, for the trace format's documentation.
    doc = ""
    #: Its series, in the order :meth:`read` gives them, and each in words.
    series: tuple[str, ...] = ()
    labels: Mapping[str, str] = {}
    unit = COUNT

    def read(self) -> tuple[int, ...]:
        """Its value per series now, as an iteration ends (-1: not here).  Cheap: it runs at
        every iteration's end on the training thread, inside the recorder's callback, and it
        keeps the GIL (no blocking I/O: :mod:`.memory` reads ``/proc`` through libc with the
        GIL held).  Raising stops the figure (one line); the training goes on."""
        raise NotImplementedError

    def shown(self, samples: Samples) -> list[str]:
        """The series the summary shows (default: every one read)."""
        return [s for s in self.series if samples.values.get(s)]

    def notes(self, samples: Samples) -> list[str]:
        """What the analysis says of the samples, a line each under the figure's rows."""
        return []

    def advice(self, samples: Samples) -> list[Finding]:
        """Advice the samples call for."""
        return []


class SampleTrack:
    """One figure's samples over the counted iterations, bounded: past ``max_kept``, every
    other one is dropped and the stride doubles (the peaks stay exact)."""

    def __init__(self, figure: IterationFigure, warm_skip: int, max_kept: int) -> None:
        self.figure = figure
        self.warm_skip = warm_skip
        self.max_kept = max(2, max_kept)
        self.seen = 0
        self.stride = 1
        self.rows: list[tuple[int, int, tuple[int, ...]]] = []
        self.peaks: dict[int, tuple[int, int]] = {}

    def add(self, iteration: int, at_ns: int, values: tuple[int, ...]) -> None:
        """One iteration's end: ``values`` in the figure's series order (-1: not read)."""
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

    def result(self) -> Samples | None:
        """The samples (``None``: no counted iteration, or nothing readable)."""
        if not self.rows or not self.peaks:
            return None
        series = self.figure.series
        return Samples(iteration=[row[0] for row in self.rows],
                       at_ns=[row[1] for row in self.rows],
                       values={series[i]: [row[2][i] for row in self.rows]
                               for i in sorted(self.peaks)},
                       peak={series[i]: v for i, (v, _) in sorted(self.peaks.items())},
                       peak_iteration={series[i]: n for i, (_, n) in sorted(self.peaks.items())},
                       sample_stride=self.stride)


@dataclass
class Row:
    """One series as the summary shows it."""

    label: str
    median: float
    peak: int
    peak_iteration: int


@dataclass
class Judged:
    """A figure of a run, judged: what the renderers show of it."""

    figure: IterationFigure
    rows: list[Row]
    notes: list[str]


def judge(figures_: Sequence[IterationFigure], held: Mapping[str, Samples]) -> list[Judged]:
    """Each figure of ``figures_`` the run holds samples of, judged (in that order)."""
    out = []
    for fig in figures_:
        samples = held.get(fig.name)
        if samples is None:
            continue
        rows = [Row(fig.labels.get(s, s), samples.median(s), samples.peak[s],
                    samples.peak_iteration[s])
                for s in fig.shown(samples) if s in samples.peak]
        if rows:
            out.append(Judged(fig, rows, fig.notes(samples)))
    return out
