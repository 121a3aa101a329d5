"""What a run says about its GPU: which phases the GPU was behind in, the agent's own waits,
the GPU's busy share, and what the agent's synchronization cost.

A pure function of a :class:`~.stats.RunStats` (:func:`gather`), read by the verdict, the
advice, the summary and the HTML report, so that all of them say the same.  Thresholds live
in :mod:`.verdict`; docs/verdict.md explains them.

The evidence, by sync level:

* **CUDA event spans** (``gpu_phase_ms``, recorded from the first iteration after a GPU is
  seen): a span is the GPU time between two points of the stream, idle included.  When the
  GPU keeps up with the host, a phase's span equals its host time; when the GPU is the limit
  it runs behind the host, and a phase whose span exceeds its host time had its kernels still
  running after the host had moved on: the GPU was the limit there.  Informative at sync
  levels 0 and 1; at 2 and 3 every phase starts and ends synchronized, so spans equal host
  times and say nothing of it.
* **The agent's waits** (sync level 1 and above): recorded as ``gpu_wait`` ranges by place
  (runs from this version on), or, for older traces, estimated from the run's total
  (``sync_ms``, warm-up included) and, at sync level 1, the rest of the iteration where those
  waits land.  At levels 2 and 3 a phase whose wait at its end exceeds a tenth of its own
  host time is one where the GPU was behind (its span, the phase's time with the wait, holds
  its GPU work).
* **An exact busy share** (kernel time over the iteration, e.g. from CUPTI kernel activity),
  when the run record holds one (:func:`gpu_activity`); it takes precedence.

From these: the GPU's *busy share* (the GPU-limited phases' GPU time over the GPU iteration:
a lower bound on the time the GPU had work queued), the *limit* (``gpu``, ``host``, or
``None`` when the evidence is not enough), and the *sync cost* (the agent's overhead, never
the run's bottleneck).

The thresholds below are the GPU verdict's; :mod:`.verdict` re-exports them beside its own
and docs/verdict.md documents them all in one table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence, TypedDict

from ..common import figures
from .gpu_record import GpuFigures
from .stats import PHASE_KEYS, RunStats, median

#: Phases timed with CUDA events (``other`` has no event of its own).
EVENT_PHASES = PHASE_KEYS[:4]

#: The GPU's busy share (the GPU-limited phases' GPU time over the GPU iteration, or an exact
#: kernel busy share) at or above which the run is GPU-bound: the GPU had work queued for
#: most of the iteration, so it, not the host, sets the pace.
GPU_BOUND_SHARE = 0.5
#: A phase is GPU-limited when its GPU span exceeds the host's own time in it by this share
#: ... (a host-bound phase's span equals its host time within a few microseconds) ...
BEHIND_MARGIN = 0.10
#: ... and by at least this many milliseconds (event resolution and jitter).
BEHIND_MIN_MS = 0.05
#: At sync levels 2-3 (spans equal host times there): a phase is GPU-limited when the agent's
#: waits inside it are at least this share of the host's own time in it.  At level 3 every
#: range boundary's wait also costs the synchronize call itself (microseconds, hundreds of
#: calls per iteration), so a small share is no sign of a GPU behind.
WAIT_BEHIND_SHARE = 0.5
#: Without per-phase evidence: the agent's waits under this share of the iteration mean the
#: GPU finished (nearly) as soon as the host did: it waits for the host.
GPU_WAIT_SHARE = 0.10
#: Without per-phase evidence, with waits between GPU_WAIT_SHARE and GPU_BOUND_SHARE of the
#: iteration: a mean wait per synchronize call under this (ms) is a last kernel's tail and the
#: call's own cost, not a backlog: the GPU had (next to) nothing queued at the boundaries.
WAIT_PER_SYNC_MS = 0.05
#: CUDA event samples needed before their medians are read.
MIN_GPU_SAMPLES = 3
#: Counted iterations needed before any verdict (fewer is one sample, not a pattern).
MIN_ITERATIONS = 3


class GpuActivity(TypedDict, total=False):
    """An exact record of the GPU's work (e.g. CUPTI kernel activity); every key optional.

    ``busy_share``: kernel time over the iteration span (0-1); ``kernel_ms_per_iteration``;
    ``link_ms``: GPU milliseconds per iteration by link name; ``source``: how it was obtained.
    """

    busy_share: float
    kernel_ms_per_iteration: float
    link_ms: dict[str, float]
    source: str


@dataclass
class PhaseGpu:
    """One phase: its host time, its GPU span and the agent's waits in it (ms per iteration)."""

    phase: str
    host_ms: float
    #: The host's own time: ``host_ms`` without the agent's waits inside the phase.
    own_ms: float
    gpu_ms: float | None
    wait_ms: float
    #: The GPU was still working on this phase after the host had finished it.
    behind: bool = False


@dataclass
class GpuEvidence:
    """Everything the verdict and the reports say about the GPU, with how it was obtained."""

    sync_level: int
    #: Counted iterations, and CUDA event samples.
    iterations: int
    event_samples: int
    phases: list[PhaseGpu] = field(default_factory=list)
    host_iteration_ms: float = 0.0
    gpu_iteration_ms: float | None = None
    #: The agent's waits inside the counted iterations, per iteration (mean), and their share.
    wait_ms: float = 0.0
    wait_share: float = 0.0
    #: Waits in the rest of the iteration (between phases, at the iteration's end).
    wait_other_ms: float = 0.0
    #: The mean wait of one synchronize call over the run (``sync_ms`` / calls), if known.
    wait_per_sync_ms: float | None = None
    #: ``recorded`` (gpu_wait ranges), ``estimated`` (old traces), ``none`` (sync level 0).
    wait_source: str = "none"
    wait_method: str = ""
    #: Whether the phases could be told GPU-limited or not (``behind`` means something).
    per_phase: bool = False
    busy_share: float | None = None
    busy_exact: bool = False
    busy_method: str = ""
    #: ``gpu``, ``host``, or ``None``: not enough evidence (``reason`` says why).
    limit: str | None = None
    reason: str = ""
    #: The agent's synchronization cost per iteration (lost overlap), and how it was estimated.
    sync_cost_ms: float | None = None
    sync_cost_method: str = ""
    #: The cost is an upper bound (the GPU's time is known only as at least the waits).
    sync_cost_bound: bool = False

    @property
    def behind(self) -> list[PhaseGpu]:
        return [p for p in self.phases if p.behind]

    def phase(self, name: str) -> PhaseGpu | None:
        return next((p for p in self.phases if p.phase == name), None)

    def top_phase(self) -> PhaseGpu | None:
        """The phase with the most GPU time (its span; at sync 2/3 without events, its time)."""
        timed = [p for p in self.phases if self.gpu_time(p) is not None]
        return max(timed, key=lambda p: self.gpu_time(p) or 0.0, default=None)

    def gpu_time(self, p: PhaseGpu) -> float | None:
        """A phase's GPU time per iteration: its CUDA event span, or at sync level 2-3 (where
        the span equals the phase's time) its host time with the waits."""
        if p.gpu_ms is not None:
            return p.gpu_ms
        return p.host_ms if self.sync_level >= 2 else None


def busy_text(ev: GpuEvidence) -> str:
    """The busy share in words: ``87.0%`` (measured), ``at least 62.3%``, or, when no phase
    is GPU-limited, that the GPU keeps up with the host."""
    if ev.busy_share is None:
        return "not known"
    if ev.busy_exact:
        return f"{figures.pct(ev.busy_share)} of the iteration (measured)"
    if ev.per_phase and not ev.behind and ev.busy_share < GPU_WAIT_SHARE:
        return "no GPU-limited phase: the GPU keeps up with the host"
    return f"at least {figures.pct(ev.busy_share)} of the iteration"


# -- the inputs -----------------------------------------------------------------------------

def gpu_activity(stats: RunStats) -> GpuActivity | None:
    """The run's exact GPU activity record, if it has one (a ``gpu_activity`` entry of the
    statistics or of the run's metadata); ``None`` otherwise or when it is not well formed.

    The agent's own record (:class:`~.gpu_figures.GpuActivityRecord`, CUPTI kernel activity
    over the counted iterations) gives the busy share, the kernel time per iteration and each
    link's GPU time per iteration (forward and backward); a record in the short form of
    :class:`GpuActivity` is read as it is.
    """
    value = getattr(stats, "gpu_activity", None)
    if isinstance(value, GpuFigures):
        return _from_figures(value)
    if value is None:
        value = (getattr(stats, "meta", None) or {}).get("gpu_activity")
    if not isinstance(value, Mapping):
        return None
    out: GpuActivity = {}
    share = _number(value.get("busy_share"))
    if share is not None and 0.0 <= share <= 1.0:
        out["busy_share"] = share
    kernel = _number(value.get("kernel_ms_per_iteration"))
    iterations = _number(value.get("iterations"))
    phases = value.get("phases")
    if kernel is None and iterations and isinstance(phases, Mapping):
        total = [_number(p.get("kernel_ms")) for p in phases.values() if isinstance(p, Mapping)]
        kernel = sum(t for t in total if t is not None) / iterations
    if kernel is not None and kernel >= 0:
        out["kernel_ms_per_iteration"] = kernel
    links = value.get("link_ms")
    if not isinstance(links, Mapping) and iterations and isinstance(value.get("links"), list):
        links = {str(x.get("name")): ((_number(x.get("fwd_ms")) or 0.0)
                                      + (_number(x.get("bwd_ms")) or 0.0)) / iterations
                 for x in value["links"] if isinstance(x, Mapping)}
    if isinstance(links, Mapping):
        times = {str(k): _number(v) for k, v in links.items()}
        out["link_ms"] = {k: v for k, v in times.items() if v is not None and v >= 0}
    source = value.get("source")
    if isinstance(source, str):
        out["source"] = source
    if "busy_share" in out and not iterations and "iterations" in value:
        del out["busy_share"]  # no counted window: nothing measured
    return out or None


def _from_figures(fig: GpuFigures) -> GpuActivity | None:
    """The short form of the agent's own GPU figures."""
    out: GpuActivity = {}
    if fig.busy_share is not None and fig.iterations:
        out["busy_share"] = fig.busy_share
    if fig.iterations:
        out["kernel_ms_per_iteration"] = sum(p["kernel_ms"] for p in fig.phases.values()) \
            / fig.iterations
        out["link_ms"] = {x["name"]: (x["fwd_ms"] + x["bwd_ms"]) / fig.iterations
                          for x in fig.links}
    source = getattr(fig, "source", "")
    if source:
        out["source"] = source
    return out or None


def _figures(stats: RunStats) -> GpuFigures | None:
    value = getattr(stats, "gpu_activity", None)
    return value if isinstance(value, GpuFigures) else None


def idle_split(stats: RunStats) -> dict[str, float]:
    """With GPU activity: the GPU's idle time over the counted iterations by cause, each as a
    share of the GPU's time there (largest first); empty without."""
    fig = _figures(stats)
    span = fig.span_ms if fig is not None else 0.0
    if fig is None or not span:
        return {}
    shares = {str(k): v / span for k, v in fig.idle_ms.items()}
    return dict(sorted(((k, v) for k, v in shares.items() if v > 0), key=lambda kv: -kv[1]))


def activity_phases(stats: RunStats) -> list[tuple[str, float, float]]:
    """With GPU activity: ``(phase, kernel ms per iteration, share of the GPU's time)`` per
    phase the kernels were launched in, the most first; empty without."""
    fig = _figures(stats)
    if fig is None or not fig.iterations or not fig.span_ms:
        return []
    n, span = fig.iterations, fig.span_ms
    out = [(str(k), p["kernel_ms"] / n, p["kernel_ms"] / span) for k, p in fig.phases.items()]
    return sorted((x for x in out if x[1] > 0), key=lambda x: -x[1])


def _number(x: object) -> float | None:
    """``x`` as a float when it is a finite JSON number, else ``None``."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def on_gpu(stats: RunStats) -> bool:
    """Whether the model ran on a GPU (parameters seen there, or GPU devices in use)."""
    facts = (stats.meta or {}).get("facts") if stats.meta else None
    params = (facts or {}).get("params") if isinstance(facts, dict) else None
    return bool((params or {}).get("gpu")) or bool((stats.meta or {}).get("devices"))


def sync_ms_total(stats: RunStats) -> float | None:
    """The agent's synchronizations' total wait over the whole run (warm-up included)."""
    return _number((stats.meta or {}).get("sync_ms"))


def _event_median(stats: RunStats, key: str) -> float | None:
    values = (stats.gpu_phase_ms or {}).get(key)
    return median(values) if values else None


def _net_median(host: Sequence[float], waits: Sequence[float]) -> float:
    """Median of ``host - waits`` per iteration (the same sample)."""
    if waits and len(waits) == len(host):
        return median([h - w for h, w in zip(host, waits)])
    return median(host)


# -- gathering ------------------------------------------------------------------------------

def gather(stats: RunStats) -> GpuEvidence:
    """The GPU evidence of ``stats`` (call only for a run on a GPU, :func:`on_gpu`)."""
    n = stats.iterations
    events = stats.gpu_phase_ms or {}
    samples = len(events.get("iteration") or ())
    ev = GpuEvidence(stats.sync_level, n, samples, host_iteration_ms=stats.median())
    if not n:
        ev.reason = "no training iteration was counted"
        return ev
    _waits(stats, ev)
    enough_events = samples >= MIN_GPU_SAMPLES
    if enough_events:
        ev.gpu_iteration_ms = _event_median(stats, "iteration")
    recorded = stats.waits_recorded
    wait_series = stats.wait_phase_ms or {}
    for key in EVENT_PHASES if stats.has_phases else ():
        host = stats.phase_median(key)
        waited = (stats.wait_phase_total_ms or {}).get(key, 0.0) / n if recorded else 0.0
        own = _net_median(stats.phase_ms.get(key, []), wait_series.get(key, [])) \
            if recorded else host
        gpu = _event_median(stats, key) if enough_events else None
        ev.phases.append(PhaseGpu(key, host, own, gpu, waited))
    ev.per_phase = bool(ev.phases) and _per_phase(ev, enough_events, recorded)
    _behind(stats, ev, enough_events, recorded)
    _busy(stats, ev, enough_events, recorded)
    _limit(stats, ev, enough_events, recorded)
    _sync_cost(ev)
    return ev


@dataclass
class Waits:
    """The agent's own waits inside the counted iterations (ms in all), and where they fell."""

    total_ms: float = 0.0
    #: Per phase key (the phase they lay in; ``other`` between phases).
    by_key: dict[str, float] = field(default_factory=dict)
    #: ``recorded`` (gpu_wait ranges), ``estimated`` (from the run's total), ``none``.
    source: str = "none"
    method: str = ""


def waits(stats: RunStats) -> Waits:
    """The agent's waits inside the counted iterations: recorded, or estimated.

    Estimated (a trace without the waits recorded, or a run with no GPU in use): the run's
    total wait (``sync_ms``, warm-up included) shared evenly over its iterations; at sync
    level 1 they fall in the rest of the iteration (and no more than it holds), at 2-3 in
    forward, backward and update, split by their times (most boundaries are theirs).
    """
    n = stats.iterations
    out = Waits()
    if not n:
        return out
    if stats.waits_recorded:
        out.by_key = {k: float(v) for k, v in (stats.wait_phase_total_ms or {}).items()}
        out.total_ms = sum(out.by_key.values())
        out.source = "recorded"
        out.method = "the agent's waits, recorded where they happened"
        return out
    whole = sync_ms_total(stats)
    if stats.sync_level < 1 or whole is None or whole <= 0:
        return out
    seen = n + stats.warmup
    share = whole * n / seen if seen else whole
    out.source = "estimated"
    if stats.sync_level == 1:
        out.total_ms = min(stats.phase_total("other"), share)
        out.by_key = {"other": out.total_ms}
        out.method = (f"estimated from the run's total wait, {figures.ms(whole)} over "
                      f"{seen} iterations, warm-up included; at sync level 1 it falls in the "
                      "rest of the iteration")
    else:
        out.total_ms = min(stats.iteration_total_ms, share)
        compute = {k: stats.phase_total(k) for k in ("forward", "backward", "update")}
        inside = sum(compute.values())
        out.by_key = {k: out.total_ms * v / inside for k, v in compute.items()} if inside \
            else {"other": out.total_ms}
        out.method = (f"estimated from the run's total wait, {figures.ms(whole)} over "
                      f"{seen} iterations, warm-up included, counted in forward, backward "
                      "and update")
    return out


def _waits(stats: RunStats, ev: GpuEvidence) -> None:
    w = waits(stats)
    n = stats.iterations
    total = stats.iteration_total_ms
    ev.wait_source = w.source
    ev.wait_method = w.method
    ev.wait_ms = w.total_ms / n
    ev.wait_other_ms = w.by_key.get("other", 0.0) / n
    ev.wait_share = w.total_ms / total if total > 0 else 0.0
    whole = sync_ms_total(stats)
    if whole is not None and stats.sync_calls > 0:
        ev.wait_per_sync_ms = whole / stats.sync_calls


def _per_phase(ev: GpuEvidence, enough_events: bool, recorded: bool) -> bool:
    """Whether the phases can be told GPU-limited or not: by their CUDA event spans at sync
    levels 0-1, by the agent's recorded waits at their ends at 2-3."""
    return enough_events if ev.sync_level <= 1 else recorded


def _behind(stats: RunStats, ev: GpuEvidence, enough_events: bool, recorded: bool) -> None:
    """Mark the phases the GPU was behind in (still working on after the host finished)."""
    if not _per_phase(ev, enough_events, recorded):
        return
    for p in ev.phases:
        if ev.sync_level <= 1:
            if p.gpu_ms is None:
                continue
            # the span exceeds the host's time: the kernels ran on after the host moved on
            p.behind = (p.gpu_ms > p.host_ms * (1.0 + BEHIND_MARGIN)
                        and p.gpu_ms - p.host_ms >= BEHIND_MIN_MS)
        else:
            # the host waited at the phase's end for a good part of its own time
            p.behind = (p.wait_ms >= WAIT_BEHIND_SHARE * p.own_ms
                        and p.wait_ms >= BEHIND_MIN_MS)


def _busy(stats: RunStats, ev: GpuEvidence, enough_events: bool, recorded: bool) -> None:
    """The GPU's busy share the verdict rests on, and how it was obtained.

    Exact when the run has an activity record; else the larger of two lower bounds on the
    time the GPU had work: the GPU-limited phases' GPU time over the GPU iteration, and (sync
    level 1 and above) the agent's waits over the iteration.
    """
    activity = gpu_activity(stats)
    if activity and "busy_share" in activity:
        ev.busy_share = activity["busy_share"]
        ev.busy_exact = True
        ev.busy_method = f"measured: {activity.get('source') or 'GPU activity records'}"
        return
    candidates: list[tuple[float, str]] = []
    iteration = ev.gpu_iteration_ms or ev.host_iteration_ms
    if _per_phase(ev, enough_events, recorded) and iteration > 0:
        behind = ev.behind
        share = min(1.0, sum(ev.gpu_time(p) or 0.0 for p in behind) / iteration)
        if ev.sync_level <= 1:
            source = ("from CUDA event spans, the GPU-limited phases' GPU time over the GPU "
                      "iteration")
            each = [f"{p.phase} {figures.ms(p.gpu_ms or 0.0)} on the GPU against "
                    f"{figures.ms(p.host_ms)} on the host" for p in behind]
            none = f"no phase's GPU span exceeds its host time by {figures.pct(BEHIND_MARGIN)}"
        else:
            source = ("from the agent's waits at the phases' ends, the GPU-limited phases' "
                      "time over the iteration")
            each = [f"{p.phase} waited {figures.ms(p.wait_ms)} after {figures.ms(p.own_ms)} "
                    "of its own" for p in behind]
            none = f"no phase waited {figures.pct(WAIT_BEHIND_SHARE)} of its own time"
        candidates.append((share, f"{source}: " + (", ".join(each) if each else none)))
    if ev.sync_level >= 1 and ev.wait_source != "none":
        where = "at the iteration end" if ev.sync_level == 1 else "at the range boundaries"
        candidates.append((ev.wait_share, f"from the agent's waits {where}, "
                                          f"{ev.wait_source} (the GPU was busy at least while "
                                          "the host waited)"))
    if candidates:
        share, how = max(candidates, key=lambda c: c[0])
        ev.busy_share = share
        ev.busy_method = f"{how}; a lower bound"


def _limit(stats: RunStats, ev: GpuEvidence, enough_events: bool, recorded: bool) -> None:
    """GPU-bound, host-bound, or not enough evidence (``reason``)."""
    if ev.iterations < MIN_ITERATIONS:
        ev.reason = (f"only {ev.iterations} counted iteration(s): run at least "
                     f"{MIN_ITERATIONS} past the warm-up")
        return
    busy = ev.busy_share
    if ev.busy_exact and busy is not None:
        ev.limit = "gpu" if busy >= GPU_BOUND_SHARE else "host"
        return
    if busy is None:
        if ev.sync_level == 0 and not stats.has_phases:
            ev.reason = ("granularity iteration at sync level 0: no phase to compare the GPU's "
                         "time with the host's")
        elif ev.sync_level == 0:
            ev.reason = ("sync level 0 without CUDA event times: the host's phase times are "
                         "kernel launch times and say nothing of the GPU")
        else:
            ev.reason = "neither CUDA event times nor the agent's waits were recorded"
        return
    if busy >= GPU_BOUND_SHARE:
        ev.limit = "gpu"
    elif _per_phase(ev, enough_events, recorded):
        ev.limit = "host"  # the GPU-limited phases hold under half the iteration
    elif ev.wait_share < GPU_WAIT_SHARE:
        ev.limit = "host"  # the GPU finished (nearly) as soon as the host did
    elif ev.wait_per_sync_ms is not None and ev.wait_per_sync_ms < WAIT_PER_SYNC_MS:
        ev.limit = "host"  # many short waits: kernels' tails, no backlog at any boundary
        ev.busy_method += (f"; each of the {stats.sync_calls} synchronize calls waited "
                           f"{figures.ms(ev.wait_per_sync_ms)} on average: a kernel's tail "
                           "and the call itself, no backlog, so the GPU keeps up")
    else:
        ev.reason = (f"the agent's waits take {figures.pct(ev.wait_share)} of the iteration: "
                     f"the GPU was busy at least that long, which is neither under "
                     f"{figures.pct(GPU_WAIT_SHARE)} (the GPU keeps up) nor "
                     f"{figures.pct(GPU_BOUND_SHARE)} or more (the GPU is the limit), and "
                     "at this sync level nothing tells the phases apart"
                     + (f" (a synchronize call waited {figures.ms(ev.wait_per_sync_ms)} on "
                        "average)" if ev.wait_per_sync_ms is not None else ""))


def _sync_cost(ev: GpuEvidence) -> None:
    """The agent's synchronization cost per iteration: the overlap it takes away.

    Without the waits, host and GPU would overlap and an iteration would take about
    max(GPU time, host time): the GPU time is at least that of the GPU-limited phases (or
    the waits), the host's own time is the iteration without the waits.
    """
    if ev.sync_level == 0 or ev.wait_source == "none":
        return
    iteration = ev.host_iteration_ms
    host_own = max(0.0, iteration - ev.wait_ms)
    gpu = sum(ev.gpu_time(p) or 0.0 for p in ev.behind)
    gpu_from = "the GPU-limited phases' GPU time"
    if gpu < ev.wait_ms:
        gpu, gpu_from = ev.wait_ms, "the waits (the GPU's time is at least theirs)"
        ev.sync_cost_bound = True
    ev.sync_cost_ms = max(0.0, iteration - max(gpu, host_own))
    ev.sync_cost_method = (f"the {figures.ms(iteration)} iteration against the larger of the "
                           f"host's own time ({figures.ms(host_own)}) and {gpu_from} "
                           f"({figures.ms(gpu)}), which without the waits would overlap")


def compare_sync(a: RunStats, b: RunStats) -> list[str]:
    """Two runs (of one program) at different sync levels: what the higher level costs."""
    if a.sync_level == b.sync_level or not a.iterations or not b.iterations:
        return []
    low, high = (a, b) if a.sync_level < b.sync_level else (b, a)
    lo_ms, hi_ms = low.median(), high.median()
    delta = max(0.0, hi_ms - lo_ms)
    return [f"the agent's synchronization: the median iteration takes {figures.ms(hi_ms)} at "
            f"sync level {high.sync_level}, {figures.ms(lo_ms)} at sync level "
            f"{low.sync_level}: level {high.sync_level} costs {figures.ms(delta)} per iteration "
            f"more ({figures.pct(delta / hi_ms if hi_ms > 0 else 0.0)}), the agent's overhead, "
            "not the run's"]
