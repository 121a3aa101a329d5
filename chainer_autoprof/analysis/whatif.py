"""What a change would buy: the run's timeline as a model of a Chainer step, replayed with
one thing changed.

A training step on a GPU is two workers in step: the host runs each phase (data, forward,
backward, update, the rest) and launches kernels as it goes; the GPU runs them behind it, in
order, no earlier than they were launched.  A synchronization joins the two: the host waits
until the GPU has run everything launched so far (the agent's own, at the end of each
iteration at sync level 1, at every phase boundary at 2, at every range at 3).  Without one
(sync level 0) the host goes on to load the next batch while the GPU still runs, until it is
an iteration ahead and blocks (a full launch queue or the next copy).  The iteration then
takes the longer of the two workers' cycles, plus whatever the dependencies leave idle.

:func:`model` reads, per phase, the host's own time (the agent's waits left out) and the
GPU's time from what the run recorded -- CUPTI kernel time launched in the phase when the
run has it, else the CUDA event span of a phase the GPU ran behind in (sync 0-1), else the
agent's waits at the phase's joins (sync 2-3) -- with the range each may lie in where the
record leaves it open.  :func:`period` simulates that timeline over a run of iterations.
Replaying it unchanged must give the measured median (the *replay error*); each lever is the
same replay with one input changed.  The band around a prediction is the replay with the
open inputs at their ends, widened by the iterations' spread and the replay error.

A pure function of a :class:`~.stats.RunStats`, computed once per run by the verdict
(:attr:`~.verdict.Verdict.whatif`) and read from there by the advice, the summary and the HTML
report alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Protocol, Sequence, TypeVar

from ..common import figures
from .gpu_evidence import BEHIND_MARGIN, GpuEvidence, gather, gpu_activity, on_gpu, waits
from .stats import PHASE_KEYS, RunStats, median, percentile

#: Iterations simulated; the period is read over the second half (the steady state).
SIMULATED = 16
#: Data loading at or above this share of the iteration is worth its ``input free`` line.
INPUT_VISIBLE_SHARE = 0.05
#: How much faster a side gets in the ``2x`` levers, and how much a link's GPU time shrinks.
SPEEDUP = 2.0
#: Counted iterations needed before the model is read (fewer is a sample, not a pattern).
MIN_ITERATIONS = 3

SYNC0 = "sync level 0"
INPUT_FREE = "input free"
HOST_2X = "host 2x faster"
GPU_2X = "GPU 2x faster"

Times = Dict[str, float]


@dataclass
class Timeline:
    """One typical counted iteration, per phase key (ms): the host's own time and the GPU's,
    each with the range the record leaves it in (``*_low``, ``*_high``)."""

    sync_level: int
    host: Times
    host_low: Times
    host_high: Times
    gpu: Times
    gpu_low: Times
    gpu_high: Times
    #: GPU time per iteration of each link: (forward, backward) ms, largest first.
    links: list[tuple[str, float, float]] = field(default_factory=list)
    #: Where the GPU's time came from, in words.
    gpu_source: str = ""
    on_gpu: bool = True
    #: Sync level 0: the host ran ahead of the GPU through the counted iterations (never
    #: blocked): the measured median is the host's pace, not the one a longer run settles at.
    ran_ahead: bool = False

    def scenario(self, which: str) -> tuple[Times, Times]:
        """The host's and the GPU's times at the ``point`` or at the ``low``/``high`` end."""
        if which == "low":
            return self.host_low, self.gpu_low
        if which == "high":
            return self.host_high, self.gpu_high
        return self.host, self.gpu


def period(host: Mapping[str, float], gpu: Mapping[str, float], sync_level: int,
           iterations: int = SIMULATED, bounded: bool = True) -> float:
    """The steady-state iteration time (ms) of a step with these phase times.

    Each phase: the host works ``host[k]``, launching the phase's GPU work as it goes; the
    GPU runs it after what it already had and no earlier than the host started the phase
    (at sync 2-3, where every range starts with a join, no earlier than halfway through the
    host's time in it: a range launches after its own Python work), and finishes no earlier
    than the host's last launch.  Joins: at sync 2-3 at every phase's end, at 1 and above at
    the iteration's end; at 0 the host may run one iteration ahead of the GPU (``bounded``;
    else as far as it goes: a short run whose host never blocked).
    """
    t = gpu_free = 0.0
    behind = 0.0  # sync 0: when the GPU finishes the previous iteration
    ends = []
    for _ in range(iterations):
        for key in PHASE_KEYS:
            start = t
            h = max(0.0, host.get(key, 0.0))
            g = max(0.0, gpu.get(key, 0.0))
            t = start + h
            if g > 0:
                earliest = start + (h / 2.0 if sync_level >= 2 else 0.0)
                gpu_free = max(max(gpu_free, earliest) + g, t)
            if sync_level >= 2 and key != "other":
                t = max(t, gpu_free)
        if sync_level >= 1:
            t = max(t, gpu_free)
        elif bounded:
            t = max(t, behind)
            behind = gpu_free
        ends.append(t)
    half = iterations // 2
    return (ends[-1] - ends[half - 1]) / (iterations - half)


@dataclass
class Prediction:
    """One lever: the iteration now, predicted, and the band the prediction is trusted in."""

    lever: str
    now_ms: float
    predicted_ms: float
    low_ms: float
    high_ms: float

    @property
    def gain_ms(self) -> float:
        return self.now_ms - self.predicted_ms

    def text(self) -> str:
        """``what-if <lever>: <now> -> <predicted> per iteration (<low> to <high>)``."""
        return (f"what-if {self.lever}: {figures.ms(self.now_ms)} -> "
                f"{figures.ms(self.predicted_ms)} per iteration ({figures.ms(self.low_ms)} to "
                f"{figures.ms(self.high_ms)})")


@dataclass
class WhatIf:
    """The model of a run: its timeline, the replay of it unchanged, and the levers."""

    timeline: Timeline
    measured_ms: float
    replay_ms: float
    #: Relative half-width of the middle half of the iterations, and the replay's error.
    spread: float
    replay_error: float
    predictions: list[Prediction] = field(default_factory=list)
    #: The iteration the levers start from: the measured median, or where a run whose host
    #: ran ahead of the GPU would settle (the replay with the run-ahead bounded).
    now_ms: float = 0.0

    @property
    def band(self) -> float:
        """The relative widening of every band: the iterations' spread and the replay error."""
        return self.spread + abs(self.replay_error)

    def get(self, lever: str) -> Prediction | None:
        return next((p for p in self.predictions if p.lever == lever), None)

    def predict(self, lever: str, change: Change) -> Prediction:
        """``change`` applied to the timeline, replayed at the point and at both ends."""
        tl = self.timeline
        values = []
        for which in ("low", "point", "high"):
            host, gpu = tl.scenario(which)
            host, gpu, sync = change(dict(host), dict(gpu), tl.sync_level)
            values.append(period(host, gpu, sync))
        # the replay's error is the model's: a prediction is corrected by as much
        scale = self.measured_ms / self.replay_ms if self.replay_ms > 0 else 1.0
        low, point, high = (v * scale for v in values)
        low, high = min(low, point, high), max(low, point, high)
        return Prediction(lever, self.now_ms or self.measured_ms, point,
                          low / (1.0 + self.band), high * (1.0 + self.band))

    def replay_text(self) -> str:
        """How close the replay of the unchanged timeline comes to the measured median."""
        ahead = ""
        if self.timeline.ran_ahead:
            ahead = (f"; the host ran ahead of the GPU through the counted iterations (never "
                     f"blocked): a longer run settles at about {figures.ms(self.now_ms)}, where "
                     "the levers start")
        return (f"what-if model: the timeline replayed unchanged gives "
                f"{figures.ms(self.replay_ms)} per iteration against the measured median "
                f"{figures.ms(self.measured_ms)} ({_signed_pct(self.replay_error)}); GPU time "
                f"from {self.timeline.gpu_source or 'no GPU'}; band: iterations' spread "
                f"{figures.pct(self.spread)} + replay error{ahead}")


class Change(Protocol):
    def __call__(self, host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]: ...


def _signed_pct(x: float) -> str:
    return ("+" if x >= 0 else "") + figures.pct(x)


# -- reading the timeline ---------------------------------------------------------------------

def _series(stats: RunStats, key: str) -> list[float]:
    """The host's own time in ``key`` per sampled iteration (the recorded waits left out)."""
    host = stats.phase_ms.get(key) or []
    waited = (stats.wait_phase_ms or {}).get(key) or []
    if stats.waits_recorded and len(waited) == len(host):
        return [max(0.0, h - w) for h, w in zip(host, waited)]
    return list(host)


def timeline(stats: RunStats) -> Timeline | None:
    """The typical iteration of ``stats`` as the model reads it; ``None`` when the run holds
    too little (no phases, fewer than :data:`MIN_ITERATIONS` counted iterations)."""
    n = stats.iterations
    if n < MIN_ITERATIONS or not stats.has_phases or stats.median() <= 0:
        return None
    gpu_run = on_gpu(stats)
    ev = gather(stats) if gpu_run else None
    w = waits(stats)
    estimated = {} if stats.waits_recorded else {k: v / n for k, v in w.by_key.items()}
    behind = {p.phase for p in ev.behind} if ev is not None else set()
    gpu_iteration = ev.gpu_iteration_ms if ev is not None else None
    record = stats.gpu_activity
    if gpu_iteration is None and record is not None and record.iterations and record.span_ms:
        gpu_iteration = record.span_ms / record.iterations
    ran_ahead = (stats.sync_level == 0 and gpu_iteration is not None
                 and stats.median() < gpu_iteration * (1.0 - BEHIND_MARGIN))
    # the GPU set the pace at sync 0: the host blocked on it somewhere in its phases
    blocked = (stats.sync_level == 0 and bool(behind) and not ran_ahead
               and ev is not None and ev.limit == "gpu")
    host, host_low, host_high = {}, {}, {}
    for key in PHASE_KEYS:
        series = _series(stats, key)
        est = estimated.get(key, 0.0)
        if blocked:
            # the GPU ran behind: in part of the iterations the host blocked (a full launch
            # queue, the next copy); those in which it ran ahead show its own time
            point = percentile(series, 10.0)
            host_low[key], host_high[key] = min(series, default=0.0), percentile(series, 25.0)
        else:
            point = max(0.0, median(series) - est)
            host_low[key] = host_high[key] = point
        host[key] = point
    gpu, gpu_low, gpu_high, source = _gpu_times(stats, ev, host, estimated)
    tl = Timeline(stats.sync_level, host, host_low, host_high, gpu, gpu_low, gpu_high,
                  gpu_source=source, on_gpu=gpu_run, ran_ahead=ran_ahead)
    tl.links = _links(stats, n)
    return tl


def _gpu_times(stats: RunStats, ev: GpuEvidence | None, host: Times,
               estimated: Times) -> tuple[Times, Times, Times, str]:
    """The GPU's time per phase (point, low, high) and where it came from."""
    zero = dict.fromkeys(PHASE_KEYS, 0.0)
    if ev is None:
        return zero, dict(zero), dict(zero), ""
    exact = _activity_times(stats)
    if exact is not None:
        return exact, dict(exact), dict(exact), ("CUPTI kernel activity (kernel time launched "
                                                 "in each phase)")
    point, low, high = dict(zero), dict(zero), dict(zero)
    n = stats.iterations
    short = gpu_activity(stats)
    if short and "busy_share" in short:
        # only the busy share: the GPU's time shared over the phases as their spans are
        spans = {p.phase: (p.gpu_ms if p.gpu_ms is not None else p.host_ms) for p in ev.phases}
        whole = sum(spans.values())
        busy = short["busy_share"] * stats.median()
        shared = {k: busy * spans.get(k, 0.0) / whole if whole > 0 else 0.0 for k in PHASE_KEYS}
        return shared, dict(shared), dict(shared), \
            f"the measured busy share ({short.get('source') or 'GPU activity'})"
    if stats.sync_level <= 1 and ev.per_phase:
        first = True
        for p in ev.phases:
            span = p.gpu_ms or 0.0
            high[p.phase] = span
            if p.behind:
                point[p.phase] = span
                # after a join the GPU starts empty: part of the first span may be the GPU
                # waiting for the host's first launches
                low[p.phase] = span - host[p.phase] / 2.0 if stats.sync_level == 1 and first \
                    else span
                first = False
        if first:  # no phase the GPU ran behind in: each phase's GPU time is open
            return point, low, high, ("CUDA event spans: the GPU kept up in every phase, its "
                                      "time there open up to the span")
        return point, low, high, "CUDA event spans of the phases the GPU ran behind in"
    if stats.sync_level >= 2 and ev.wait_source != "none":
        recorded = stats.wait_phase_total_ms or {}
        for p in ev.phases:
            waited = recorded.get(p.phase, 0.0) / n if stats.waits_recorded \
                else estimated.get(p.phase, 0.0)
            own = host[p.phase]
            if waited > 0:
                # the GPU was busy at least while the host waited at the join, at most the
                # whole phase: the middle, as if each range launched halfway through its work
                low[p.phase], point[p.phase], high[p.phase] = waited, waited + own / 2.0, \
                    waited + own
            else:
                high[p.phase] = p.gpu_ms if p.gpu_ms is not None else own
        return point, low, high, f"the agent's waits at the joins ({ev.wait_source})"
    for p in ev.phases:
        high[p.phase] = p.gpu_ms if p.gpu_ms is not None else host[p.phase]
    return point, low, high, "nothing recorded (the GPU's time is open)"


def _activity_times(stats: RunStats) -> Times | None:
    """With CUPTI kernel activity: the kernel time launched in each phase per iteration,
    stretched by the GPU's idle time the host cannot remove (launch latency, dependencies,
    copies)."""
    record = stats.gpu_activity
    if record is None or record.iterations <= 0:
        return None
    n = record.iterations
    kernel = {k: float(p["kernel_ms"]) / n if (p := record.phases.get(k)) else 0.0
              for k in PHASE_KEYS}
    busy = sum(kernel.values())
    if busy <= 0:
        return None
    idle = record.idle_ms
    gaps = sum(float(idle.get(k) or 0.0) for k in ("other", "copies")) / n
    stretch = 1.0 + gaps / busy
    return {k: v * stretch for k, v in kernel.items()}


def _links(stats: RunStats, n: int) -> list[tuple[str, float, float]]:
    """Each link's GPU time per iteration, forward and backward (CUPTI, or sync level 3)."""
    record = stats.gpu_activity
    if record is not None and record.links and record.iterations:
        k = float(record.iterations)
        out = [(x["name"], x["fwd_ms"] / k, x["bwd_ms"] / k) for x in record.links]
    elif (activity := gpu_activity(stats)) and activity.get("link_ms"):
        out = [(name, ms, 0.0) for name, ms in activity["link_ms"].items()]
    elif stats.sync_level >= 3 and stats.links:
        out = [(link.name, link.self_ms / n, link.bwd_ms / n) for link in stats.links]
    else:
        return []
    return sorted(out, key=lambda x: -(x[1] + x[2]))


def _spread(stats: RunStats) -> float:
    """Half the middle half of the iterations, relative to the median."""
    mid = stats.median()
    if mid <= 0:
        return 0.0
    return (percentile(stats.iteration_ms, 75.0) - percentile(stats.iteration_ms, 25.0)) \
        / (2.0 * mid)


# -- the levers --------------------------------------------------------------------------------

def _sync0(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
    return host, gpu, 0


def _input_free(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
    host["data"] = 0.0
    return host, gpu, sync


def _host_faster(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
    return {k: v / SPEEDUP for k, v in host.items()}, gpu, sync


def _gpu_faster(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
    return host, {k: v / SPEEDUP for k, v in gpu.items()}, sync


def host_saving(share: Mapping[str, float]) -> Change:
    """The host's own time in each phase key cut by ``share[key]`` (0-1)."""
    def change(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
        return {k: v * (1.0 - min(1.0, max(0.0, share.get(k, 0.0)))) for k, v in host.items()}, \
            gpu, sync
    return change


def link_halved(tl: Timeline, name: str) -> Change:
    """The link's GPU time halved, forward and backward (taken out of those phases)."""
    fwd, bwd = next(((f, b) for n, f, b in tl.links if n == name), (0.0, 0.0))
    total = sum(tl.gpu.values())
    measured = fwd + bwd

    def change(host: Times, gpu: Times, sync: int) -> tuple[Times, Times, int]:
        # in the phase's GPU time as read (the stretch of CUPTI figures, a range's ends)
        scale = sum(gpu.values()) / total if total > 0 and measured > 0 else 1.0
        gpu["forward"] = max(0.0, gpu.get("forward", 0.0) - fwd * scale / SPEEDUP)
        gpu["backward"] = max(0.0, gpu.get("backward", 0.0) - bwd * scale / SPEEDUP)
        return host, gpu, sync
    return change


def model(stats: RunStats) -> WhatIf | None:
    """The what-if model of ``stats`` with the levers that matter for it; ``None`` when the
    run holds too little."""
    tl = timeline(stats)
    if tl is None:
        return None
    measured = stats.median()
    replayed = period(tl.host, tl.gpu, tl.sync_level, bounded=not tl.ran_ahead)
    error = (replayed - measured) / measured if measured > 0 else 0.0
    wf = WhatIf(tl, measured, replayed, _spread(stats), error)
    wf.now_ms = period(tl.host, tl.gpu, tl.sync_level) * measured / replayed \
        if tl.ran_ahead and replayed > 0 else measured
    levers: list[tuple[str, Change]] = []
    if tl.on_gpu and tl.sync_level >= 1:
        levers.append((SYNC0, _sync0))
    if tl.host.get("data", 0.0) >= INPUT_VISIBLE_SHARE * measured:
        levers.append((INPUT_FREE, _input_free))
    if tl.on_gpu:
        levers += [(HOST_2X, _host_faster), (GPU_2X, _gpu_faster)]
        if tl.links and tl.links[0][1] + tl.links[0][2] > 0:
            levers.append((link_lever(tl.links[0][0]), link_halved(tl, tl.links[0][0])))
    wf.predictions = [wf.predict(name, change) for name, change in levers]
    return wf


def link_lever(name: str) -> str:
    return f"{name} GPU time halved"


# -- the advice's costs ------------------------------------------------------------------------

class HasCost(Protocol):
    key: str
    cost: str


F = TypeVar("F", bound=HasCost)


def advice_prediction(wf: WhatIf, key: str, stats: RunStats) -> Prediction | None:
    """The lever a piece of advice pulls (by its key), predicted; ``None`` when it has none
    the model can play."""
    if key == "serial_iterator":
        return wf.get(INPUT_FREE) or wf.predict(INPUT_FREE, _input_free)
    if key == "cudnn":
        convs = [name for name, _f, _b in wf.timeline.links if "Convolution" in name]
        if convs:
            return wf.get(link_lever(convs[0])) or wf.predict(link_lever(convs[0]),
                                                             link_halved(wf.timeline, convs[0]))
        return None
    if key == "type_check":
        facts = (stats.meta or {}).get("facts") or {}
        calls, check = facts.get("functions_per_iteration"), facts.get("type_check_us")
        compute = sum(wf.timeline.host.get(k, 0.0) for k in ("forward", "backward", "update"))
        if not isinstance(calls, (int, float)) or not isinstance(check, (int, float)) \
                or calls <= 0 or compute <= 0:
            return None
        share = min(1.0, calls * check / 1000.0 / compute)
        return wf.predict("type checks off", host_saving(
            {"forward": share, "backward": share, "update": share}))
    if key == "gc" and stats.iterations:
        per_iteration = stats.gc_total_ms / stats.iterations
        host = sum(wf.timeline.host.values())
        if per_iteration <= 0 or host <= 0:
            return None
        share = min(1.0, per_iteration / host)
        return wf.predict("no garbage collection",
                          host_saving(dict.fromkeys(PHASE_KEYS, share)))
    return None


def with_predictions(stats: RunStats, findings: Sequence[F], wf: WhatIf | None) -> list[F]:
    """The findings with their lever's prediction in ``wf`` (the verdict's model of ``stats``)
    in their cost, the largest predicted gain first (those without a prediction after them,
    in their order)."""
    if wf is None:
        return list(findings)
    gains: list[tuple[float, int, F]] = []
    rest: list[F] = []
    for i, finding in enumerate(findings):
        prediction = advice_prediction(wf, finding.key, stats)
        if prediction is None:
            rest.append(finding)
            continue
        finding.cost = f"{finding.cost}; {prediction.text()}"
        gains.append((prediction.gain_ms, i, finding))
    gains.sort(key=lambda g: (-g[0], g[1]))
    return [f for _gain, _i, f in gains] + rest


def lines(wf: WhatIf | None) -> list[str]:
    """The levers' lines, in the order the model played them."""
    return [p.text() for p in wf.predictions] if wf is not None else []


def pays_off_first(wf: WhatIf) -> Prediction | None:
    """Of the host and the GPU made faster, the one that buys more."""
    both = [p for p in (wf.get(HOST_2X), wf.get(GPU_2X)) if p is not None]
    return min(both, key=lambda p: p.predicted_ms, default=None)
