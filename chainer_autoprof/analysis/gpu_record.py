"""The GPU figures' record, declared once: :class:`GpuActivity`, the run record's
``gpu_activity`` and ``RunStats.gpu_activity``, one typed object end to end.

:class:`~.gpu_figures.GpuFigureBuilder` makes the :class:`GpuFigures`; the live
session and a trace's reader add how they were obtained (:func:`activity_record`);
the run record's declaration (:mod:`.record`) derives its section, its check and
its documentation from these classes, and turns the object into JSON only where
the record is built and back where it is checked.  All times in ms, totals over
the counted iterations unless said; the per-iteration lists hold one value per
counted iteration, thinned to a uniform sample beyond
:data:`~.stats.MAX_KEPT_ITERATIONS`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, TypedDict, TypeVar

from .shapes import INT, NUMBER, Annotated, F, Int, MapOf, Ms, Number

_Figures = TypeVar("_Figures", bound="GpuFigures")

#: A share of the counted windows' time (null: no window).
Share = Annotated[Optional[float], F(kind=Number(0, 1))]
#: The kernels launched in the range of the time beside it.
Kernels = Annotated[int, F("kernels launched there")]


class LinkGpuDict(TypedDict):
    """One link's GPU time over the counted iterations."""

    name: Annotated[str, F("the link (its key in the summary's link table)")]
    fwd_ms: Annotated[Ms, F("kernel time launched in its forward range")]
    fwd_kernels: Kernels
    bwd_ms: Annotated[Ms, F("kernel time launched in its backward range")]
    bwd_kernels: Kernels
    copy_ms: Annotated[Ms, F("copy and memset time launched in either")]


class PhaseGpuDict(TypedDict):
    """One phase's GPU time over the counted iterations (by launch)."""

    kernel_ms: Annotated[Ms, F("kernel time launched in the phase")]
    kernels: Kernels
    copy_ms: Annotated[Ms, F("copy and memset time launched there")]


class KernelGpuDict(TypedDict):
    """One of the kernels with the most time, with the link that launched it."""

    name: Annotated[str, F("the kernel")]
    link: Annotated[Optional[str], F("the link that launched it (null: none)")]
    backward: Annotated[bool, F("launched in that link's backward range")]
    ms: Annotated[Ms, F("its time over the counted iterations")]
    calls: Annotated[int, F("its launches there")]


class TimelineDict(TypedDict):
    """One GPU's timeline over the counted iterations."""

    device: Annotated[int, F("CUDA device number")]
    windows: Annotated[int, F("counted iteration windows on its timeline")]
    span_ms: Annotated[Ms, F("their time")]
    busy_ms: Annotated[Ms, F("a kernel running")]
    idle_ms: Annotated[Dict[str, Ms], F("idle time by cause", "ms", key="cause")]


@dataclass
class GpuFigures:
    """The GPU figures of a run."""

    iterations: Annotated[int, F("counted iteration windows on the GPU's timeline")] = 0
    warmup_skip: Annotated[int, F("warm-up iterations left out")] = 0
    span_ms: Annotated[Ms, F("the counted windows' time")] = 0.0
    busy_ms: Annotated[Ms, F("a kernel running (the union over streams)")] = 0.0
    busy_share: Annotated[Share, F("busy over span (null: no window)")] = None
    active_share: Annotated[Share, F("kernels or copies running over span")] = None
    idle_ms: Annotated[Dict[str, Ms], F(
        "idle time by cause: host (launched late), copies (only copies ran), between "
        "iterations (launched late, at an iteration's start), launch (launched in time, a gap "
        "under 30 us), other", "ms", key="cause")] = field(default_factory=dict)
    iteration_ms: Annotated[Dict[str, List[float]], F(
        "per counted iteration: span, busy and each idle cause (a sample beyond 65,536)", "ms",
        key="key")] = field(default_factory=dict)
    sample_stride: Annotated[int, F("the lists hold every N-th counted iteration",
                                    kind=Int(1))] = 1
    devices: Annotated[List[TimelineDict], F("per GPU")] = field(default_factory=list)
    phases: Annotated[Dict[str, PhaseGpuDict], F("per phase (and other)", key="phase")] = \
        field(default_factory=dict)
    links: Annotated[List[LinkGpuDict], F("per link, the most GPU time first")] = \
        field(default_factory=list)
    top_kernels: Annotated[List[KernelGpuDict], F("the kernels with the most time")] = \
        field(default_factory=list)
    warmup_kernel_ms: Annotated[Ms, F("kernel time launched in warm-up iterations")] = 0.0
    outside_kernel_ms: Annotated[Ms, F("kernel time launched outside iterations")] = 0.0
    ops: Annotated[Dict[str, int], F("operations recorded: kernel, memcpy, memset",
                                     key="kind")] = field(default_factory=dict)
    statuses: Annotated[Dict[str, Dict[str, float]], F(
        "operations and their time (ms) by attribution status: attributed, no launch record, "
        "unknown thread, ranges dropped, ranges still open",
        kind=MapOf(MapOf(NUMBER, key="figure"), key="status"))] = field(default_factory=dict)
    late_ops: Annotated[int, F("operations that arrived behind the placed timeline (left off "
                               "it)")] = 0
    clock: Annotated[Dict[str, float], F(
        "CUPTI's clock on the agent's: pairs, drift_ppm, residual_ns, read_ns, bound_ns",
        key="figure")] = field(default_factory=dict)

    def per_iteration(self, ms: float) -> float:
        """A total over the counted iterations, per counted iteration."""
        return ms / self.iterations if self.iterations else 0.0

    def link(self, name: str) -> LinkGpuDict | None:
        for entry in self.links:
            if entry["name"] == name:
                return entry
        return None

    def to_dict(self) -> dict[str, object]:
        """As JSON (the run record's build does this itself)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[_Figures], data: Mapping[str, object]) -> _Figures:
        """The figures a run record holds (unknown keys ignored, missing ones default)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]


@dataclass
class GpuActivity(GpuFigures):
    """GPU activity from CUPTI, each operation tied to the range that launched it
    (analysis/gpu_figures.py)."""

    source: Annotated[str, F("how the figures were obtained (the verdict names it)")] = ""
    collector: Annotated[Dict[str, int], F(
        "what the collection saw: buffers, records, dropped records, incomplete operations, "
        "callback errors, operations and ranges its queues dropped, and the CPU time (us) "
        "its analysis took (attributing and summing, on its own thread)", key="count",
        kind=MapOf(INT, key="count"))] = field(default_factory=dict)
    notes: Annotated[List[str], F("what is missing from the figures, one line each")] = \
        field(default_factory=list)


def activity_record(figures: GpuFigures, source: str, collector: Mapping[str, int],
                    notes: list[str]) -> GpuActivity:
    """``figures`` with how they were obtained: the run record's ``gpu_activity``."""
    own = {f.name: getattr(figures, f.name) for f in dataclasses.fields(GpuFigures)}
    return GpuActivity(**own, source=source,
                       collector={k: int(v) for k, v in collector.items()}, notes=list(notes))
