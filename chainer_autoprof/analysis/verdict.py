"""The bottleneck verdict: which part of the run its time goes to, with the numbers.

Every threshold is documented in docs/verdict.md; they live here, but for the GPU
evidence's, which live in :mod:`.gpu_evidence` and are re-exported here.  The verdict is a
pure function of a :class:`~chainer_autoprof.stats.RunStats` (live or read back from a
trace) and, optionally, the stats of a replay run of the same program
(``CHAINER_PROF_REPLAY_BATCH=1``).

On a GPU the first question is who sets the pace (:mod:`.gpu_evidence`): the GPU (its
work runs behind the host's) or the host (the GPU waits for it).  Then the kinds:

* ``GPU-bound``: the GPU is busy (has work queued) :data:`GPU_BOUND_SHARE` of the iteration
  or more, by CUDA event spans, the agent's waits or an exact activity record;
  ``host- and GPU-bound`` when the GPU's busy share and the host's own work are both
  :data:`BOTH_SHARE` or more (the what-if model says which side pays off first);
* ``extension-bound``: what runs between iterations (extensions such as
  evaluation, snapshots and reports, inference, the loop's own code) takes
  :data:`EXTENSION_SHARE` of the training loop's wall time or more;
* ``input-bound``: the data phase takes :data:`INPUT_SHARE` of the iteration
  time or more (on a GPU, only the part of it the GPU spent waiting for it), at every sync
  level;
* ``gc-bound``: garbage collections inside the counted iterations take
  :data:`GC_SHARE` of the iteration time or more;
* ``host-bound``: forward/backward/update dominate and either the GPU waits for the host,
  or (CPU) each function call is short (under :data:`HOST_US_PER_FUNCTION`, or under the
  time of :data:`HOST_CHECKS_PER_FUNCTION` type checks, over at least
  :data:`HOST_MIN_FUNCTIONS` calls per iteration);
* ``communication-bound``: ChainerMN's ``comm:*`` ranges inside the counted iterations
  (a rank's waits in the gradient all-reduce, inside its update) take :data:`COMM_SHARE`
  of the iteration time or more (:mod:`.communication`);
* ``compute-bound`` (CPU): forward + backward + update take :data:`COMPUTE_SHARE`
  of the iteration time or more (their collections and communication left out);
* ``balanced``: none of the above; the shares are printed;
* ``unknown``: not enough evidence (no or too few counted iterations, no phase ranges, or
  on a GPU nothing that tells GPU-bound from host-bound): what is known, and what to run.

The agent's own synchronization (sync level 1 and above) is never the verdict: its waits
are left out of the host's figures and its cost, the overlap it takes away, is a note.

Beside the kind, the verdict says when slow iterations (at least
:data:`~.outliers.OUTLIER_FACTOR` times the median) hold
:data:`OUTLIER_SHARE` of the iteration time or more, and how many of them
garbage collection explains; an input-bound verdict names the input queue
when it was empty at :data:`QUEUE_DRY_SHARE` of the fetches or more.

When several kinds pass their thresholds the one with the most time behind it
is the verdict and the others are listed under "also".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ..common import figures as fmt
from ..common import log
from ..common.wording import counted
from . import communication, whatif
from .communication import COMM_SHARE as COMM_SHARE

# the GPU evidence's thresholds, re-exported so that every threshold reads ``verdict.NAME``
from .gpu_evidence import BEHIND_MARGIN as BEHIND_MARGIN
from .gpu_evidence import BEHIND_MIN_MS as BEHIND_MIN_MS
from .gpu_evidence import GPU_BOUND_SHARE as GPU_BOUND_SHARE
from .gpu_evidence import GPU_WAIT_SHARE as GPU_WAIT_SHARE
from .gpu_evidence import MIN_GPU_SAMPLES as MIN_GPU_SAMPLES
from .gpu_evidence import MIN_ITERATIONS as MIN_ITERATIONS
from .gpu_evidence import WAIT_BEHIND_SHARE as WAIT_BEHIND_SHARE
from .gpu_evidence import WAIT_PER_SYNC_MS as WAIT_PER_SYNC_MS
from .gpu_evidence import (
    GpuEvidence,
    activity_phases,
    gather,
    gpu_activity,
    idle_split,
    on_gpu,
    waits,
)
from .outliers import OUTLIER_FACTOR, stutter
from .whatif import WhatIf
from .window import unreached

if TYPE_CHECKING:
    from ..common.typedefs import Facts
    from .stats import LinkStat, RunStats

#: Data phase share of the counted iteration time at or above which a run is input-bound.
#: tensorpack's tuning guide treats a data pipeline that cannot keep up as the
#: first thing to rule out; 30 % means training would run at least 1.4x faster
#: with free data.
INPUT_SHARE = 0.30
#: Share of the training loop's wall time (iterations + everything between
#: them; start-up, warm-up and shut-down left out) spent between iterations
#: (extensions, inference, the loop's own code) at or above which a run is
#: extension-bound.
EXTENSION_SHARE = 0.25
#: Forward + backward + update share of the iteration time at or above which
#: the model's own work dominates (compute-bound, or host-bound when calls are short).
COMPUTE_SHARE = 0.50
#: Share of the counted iteration time spent in garbage collections at or above
#: which the collector, not the model, sets the pace (gc-bound).
GC_SHARE = 0.25
#: Mean host time of one function call (forward + backward + update time over
#: the function calls of an iteration) under which the work is mostly Python
#: overhead; Chainer's own per-call cost is tens of microseconds ...
HOST_US_PER_FUNCTION = 100.0
#: ... or, measured in host-speed units, under this many type checks: in the
#: counted iteration, the thread's CPU time per call over the median time of
#: one of their type checks (CPU time ignores preemption, and a slow host slows
#: both alike; one call's own overhead is 10-15 checks).
HOST_CHECKS_PER_FUNCTION = 50
#: Function calls per iteration needed before "many small calls" is claimed.
HOST_MIN_FUNCTIONS = 20
#: The agent's own estimated overhead, as a share of the wall time, above
#: which the verdict warns that the figures are inflated by profiling.
OVERHEAD_NOTE_SHARE = 0.10
#: Links listed for a compute-bound (or GPU-bound, by GPU time) run.
TOP_LINKS = 5
#: Slow iterations' time above the median, as a share of the iteration time, from which
#: the verdict says the run stutters (a tenth of the time lost to a few iterations).
OUTLIER_SHARE = 0.10
#: The gc-bound verdict and the gc advice need at least this many milliseconds of
#: collections inside the counted iterations (a short run's few are not worth a line).
GC_MIN_MS = 100.0
#: An input queue empty at this share of the training fetches or more has run dry.
QUEUE_DRY_SHARE = 0.5
#: The GPU busy and the host's own work each at this share of the iteration or more: both
#: are saturated (host- and GPU-bound), and speeding up one alone buys little.
BOTH_SHARE = 0.9

# -- advice thresholds (chainer_autoprof.advice) ----------------------------------------
#: An estimated cost under this share of the time it is part of is not reported.
ADVICE_MIN_SHARE = 0.05
#: Copies between host and GPU are reported when they happen in at least this
#: share of the training iterations ("every iteration", not a one-off).
TRANSFER_ITERATION_SHARE = 0.5
#: NumPy's BLAS measured under this rate (GFLOP/s, float32 128x128 matmul)
#: counts as unoptimized when its library name is not recognized.
BLAS_SLOW_GFLOPS = 5.0
#: The BLAS advice needs forward + backward + update to take at least this share.
BLAS_MIN_COMPUTE_SHARE = 0.25
#: Warm-up iterations at least this many times slower than the median ...
WARMUP_SLOW_FACTOR = 3.0
#: ... and costing at least this share of the run's training time (loop + warm-up) ...
WARMUP_MIN_SHARE = 0.10
#: ... and at least this many milliseconds (a few ms lost once is not worth a line).
WARMUP_MIN_MS = 100.0

#: What each cause of the GPU's idle time is (GPU activity), in the verdict's words.
IDLE_WORDS = {"host": "waiting for the host to launch", "copies": "waiting for copies",
              "between iterations": "between iterations", "launch": "launch latency",
              "other": "waiting on dependencies"}

#: Outside-iteration keys that are not part of the training loop.
_NOT_LOOP = ("startup", "warm-up", "shutdown", "before window", "after window", "unfinished",
             "agent")  # (the agent's own checks: its overhead, not the loop's)


#: Phase keys of the model's own work.
_COMPUTE = ("forward", "backward", "update")
_KEYS = ("data", "forward", "backward", "update", "other")


@dataclass
class Verdict:
    """The verdict, its evidence (numbers) and what to try."""

    kind: str
    title: str
    evidence: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    also: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The slow iterations, when they hold a significant share of the time.
    stutter: list[str] = field(default_factory=list)
    #: Figures for renderers: shares (0-1) and milliseconds.
    figures: dict[str, float] = field(default_factory=dict)
    #: What the run says about its GPU (``None`` on a CPU run).
    gpu: GpuEvidence | None = None
    #: The what-if model of the run's step (``None``: too little to model), computed once
    #: here and shared: the advice's costs and the renderers read this one.
    whatif: WhatIf | None = None


# -- figures ---------------------------------------------------------------------

def facts_of(stats: RunStats) -> Facts:
    """The run-time facts recorded by the probes (empty when none)."""
    facts = (stats.meta or {}).get("facts") if stats.meta else None
    return facts if isinstance(facts, dict) else {}


def settings_of(stats: RunStats) -> Facts:
    """The settings the run recorded (empty when none): JSON values, read like the facts."""
    settings = (stats.meta or {}).get("settings") if stats.meta else None
    return settings if isinstance(settings, dict) else {}


def is_replay(stats: RunStats) -> bool:
    """Whether ``stats`` comes from a replay-batch run."""
    return bool(settings_of(stats).get("replay_batch")) or "replay" in facts_of(stats)


def extension_ms(stats: RunStats) -> dict[str, float]:
    """Time between the counted iterations, per outside key (ms): extensions, inference,
    user ranges and ``idle`` (no range: the loop's own code, uninstrumented extensions)."""
    return {k: v for k, v in stats.outside_ms.items() if k not in _NOT_LOOP}


def loop_ms(stats: RunStats) -> float:
    """The training loop's wall time: counted iterations plus what ran between them."""
    between = sum(v for k, v in stats.outside_ms.items() if k not in _NOT_LOOP)
    return stats.iteration_total_ms + between


def sync_ms(stats: RunStats) -> float | None:
    """Milliseconds spent in the agent's synchronizations over the whole run, when recorded
    (compared with the counted iterations: warm-up waits make it an upper bound)."""
    value = (stats.meta or {}).get("sync_ms")
    return float(value) if value is not None else None


def per_iteration(stats: RunStats, total_ms: float) -> float:
    return total_ms / stats.iterations if stats.iterations else 0.0


def functions_per_iteration(stats: RunStats) -> int | None:
    """Function applications (forward and those of the backward pass) in one training
    iteration, counted by the probes, if known."""
    value = facts_of(stats).get("functions_per_iteration")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def link_calls_per_iteration(stats: RunStats) -> float:
    return sum(link.calls for link in stats.links) / stats.iterations if stats.iterations else 0.0


#: Links whose own forward is a loss around a predictor: their own time is the loss function
#: (and the accuracy), not a layer.
LOSS_WRAPPERS = ("Classifier",)


def _class_of(link_name: str) -> str:
    """``Linear`` of ``predictor/l1 (Linear) @gpu0``; the unnamed root's name is its class."""
    text = link_name.split(" @")[0]
    return text[text.rfind("(") + 1:-1] if text.endswith(")") and "(" in text else text


def focus_text(top: LinkStat, links: Sequence[LinkStat]) -> str:
    """What to work on first: the link with the most own time, named for what that time is
    where it is not a layer's (a Classifier's own time is its loss function and accuracy)."""
    if _class_of(top.name) not in LOSS_WRAPPERS:
        return f"work on {top.name} first"
    layers = [link for link in sorted(links, key=lambda x: -(x.self_ms + x.bwd_ms))
              if _class_of(link.name) not in LOSS_WRAPPERS
              and not any(other.name.startswith(link.name.split(" (")[0] + "/")
                          for other in links if other is not link)]
    text = (f"{top.name}'s own time is its loss function and its accuracy, not a layer "
            "(model.compute_accuracy = False leaves the accuracy out)")
    if layers:
        text += f"; of the layers, work on {layers[0].name} first"
    return text


def top_links(stats: RunStats, n: int = TOP_LINKS) -> list[LinkStat]:
    """Links with the most exclusive time (own forward + attributed backward)."""
    return sorted(stats.links, key=lambda link: -(link.self_ms + link.bwd_ms))[:n]


def gpu_links(stats: RunStats, n: int = TOP_LINKS) -> tuple[list[tuple[str, float]], str]:
    """The links with the most GPU time (ms per iteration), and how that time was obtained;
    empty when the run cannot tell (link times are host times below sync level 3)."""
    activity = gpu_activity(stats)
    if activity and activity.get("link_ms"):
        ranked = sorted(activity["link_ms"].items(), key=lambda kv: -kv[1])[:n]
        return ranked, f"measured: {activity.get('source') or 'GPU activity records'}"
    if stats.sync_level >= 3 and stats.links and stats.iterations:
        ranked = [(link.name, (link.self_ms + link.bwd_ms) / stats.iterations)
                  for link in top_links(stats, n)]
        return ranked, ("sync level 3: each link range waits for its kernels, so its own "
                        "forward + backward time holds its GPU time")
    return [], ""


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


# -- deciding ---------------------------------------------------------------------

def decide(stats: RunStats, replay: RunStats | None = None) -> Verdict:
    """The verdict for ``stats`` (and the replay run's stats, when given)."""
    if not stats.iterations:
        window = unreached(stats)
        return Verdict("unknown", "no verdict: no training iteration was counted",
                       [f"{stats.warmup} iteration(s) seen, all in the warm-up"
                        if stats.warmup else "no training iteration was seen" if window is None
                        else f"the capture window was never reached: {window.progress()}"])
    gpu = gather(stats) if on_gpu(stats) else None
    try:
        wf = whatif.model(stats)
    except Exception as exc:  # our bug: the verdict stands without its predictions  # noqa: BLE001
        log.warning(log.contained("the what-if model", exc), once=True)
        wf = None
    fig = _figures(stats, gpu)
    candidates = _candidates(stats, fig, gpu)
    if stats.iterations < MIN_ITERATIONS:  # one or two samples: no pattern to read
        verdict = Verdict("unknown", f"not enough evidence: only {stats.iterations} counted "
                          "iteration(s)",
                          [f"median iteration {fmt.ms(stats.median())}"],
                          [f"run at least {MIN_ITERATIONS} iterations past the warm-up "
                           "(CHAINER_PROF_WARMUP)"])
    elif gpu is not None and gpu.limit is None and not candidates:
        verdict = _not_enough(stats, fig, gpu)
    elif not candidates and not stats.has_phases:
        verdict = Verdict("unknown", "no verdict inside the iterations: no phase ranges were "
                          "recorded (granularity iteration)",
                          [f"between iterations (extensions, evaluation): "
                           f"{fmt.pct(fig['extension_share'])} of the training loop"],
                          ["run with CHAINER_PROF_GRANULARITY=phase (the default) or finer"])
    elif not candidates:
        verdict = _balanced(stats, fig, gpu)
    else:
        candidates.sort(key=lambda c: -c[1])
        kind = candidates[0][0]
        verdict = _BUILDERS[kind](stats, fig, gpu, replay, wf)
        # compute-bound is where a CPU run with no other problem lands: not worth an "also"
        verdict.also = [f"{k} ({fmt.pct(share)})" for k, _total, share in candidates[1:]
                        if k != "compute-bound"]
    verdict.figures = fig
    verdict.gpu = gpu
    verdict.whatif = wf
    if gpu is not None and verdict.kind not in ("GPU-bound", "host- and GPU-bound", "unknown"):
        verdict.evidence += _gpu_support(stats, gpu)
    verdict.stutter = _stutter(stats, fig)
    verdict.notes += _notes(stats, fig, gpu)
    if replay is not None and verdict.kind != "input-bound":
        verdict.evidence += compare_replay(stats, replay)
    return verdict


def _figures(stats: RunStats, gpu: GpuEvidence | None) -> dict[str, float]:
    """Shares and milliseconds; the host's figures leave the agent's waits out."""
    total = stats.iteration_total_ms
    fig = {"iteration_median_ms": stats.median(),
           "iteration_mean_ms": stats.mean(),
           "loop_ms": loop_ms(stats),
           "extension_ms": sum(extension_ms(stats).values())}
    waited = waits(stats)
    fig["wait_ms"] = waited.total_ms
    fig["wait_share"] = _share(waited.total_ms, total)
    host_total = max(0.0, total - waited.total_ms)
    fig["host_ms"] = host_total  # the counted iterations without the agent's waits
    for key in _KEYS:
        raw = stats.phase_total(key)
        own = max(0.0, raw - waited.by_key.get(key, 0.0))
        fig[f"{key}_share"] = stats.phase_share(key)
        fig[f"{key}_ms_per_iteration"] = per_iteration(stats, raw)
        fig[f"{key}_own_ms_per_iteration"] = per_iteration(stats, own)
        fig[f"{key}_own_share"] = _share(own, host_total)
    if gpu is not None and gpu.sync_level == 0:
        data = gpu.phase("data")
        if data is not None and data.gpu_ms is not None and stats.phase_median("data") > 0:
            # at sync 0 the host loads data while the GPU may still run earlier work: only
            # the part the GPU spent on the data phase (its span) can have held it up
            scale = min(1.0, data.gpu_ms / stats.phase_median("data"))
            fig["data_own_ms_per_iteration"] *= scale
            fig["data_own_share"] *= scale
    fig["compute_share"] = sum(fig[f"{k}_share"] for k in _COMPUTE)
    fig["compute_own_share"] = sum(fig[f"{k}_own_share"] for k in _COMPUTE)
    fig["gc_ms"] = float(getattr(stats, "gc_total_ms", 0.0) or 0.0)
    fig["gc_share"] = _share(fig["gc_ms"], host_total)
    fig["comm_ms"] = communication.comm_ms(stats)
    fig["comm_share"] = _share(fig["comm_ms"], host_total)
    # the model's own work: the collections and the communication inside the phases are not
    fig["compute_net_share"] = max(0.0, fig["compute_own_share"] - fig["gc_share"]
                                   - fig["comm_share"])
    fig["extension_share"] = _share(fig["extension_ms"], fig["loop_ms"])
    whole = sync_ms(stats)
    if whole is not None:
        fig["sync_ms"] = whole
    fig["overhead_share"] = stats.wall_share(stats.overhead_ms)
    if gpu is not None:
        if gpu.busy_share is not None:
            fig["gpu_busy_share"] = gpu.busy_share
        if gpu.gpu_iteration_ms is not None:
            fig["gpu_iteration_ms"] = gpu.gpu_iteration_ms
        for p in gpu.phases:
            if p.gpu_ms is not None:
                fig[f"gpu_{p.phase}_ms"] = p.gpu_ms
        if gpu.sync_cost_ms is not None:
            fig["sync_cost_ms"] = gpu.sync_cost_ms
    return fig


def _candidates(stats: RunStats, fig: dict[str, float],
                gpu: GpuEvidence | None) -> list[tuple[str, float, float]]:
    """(kind, milliseconds behind it, share) of every kind over its threshold."""
    out: list[tuple[str, float, float]] = []
    if fig["extension_share"] >= EXTENSION_SHARE:
        out.append(("extension-bound", fig["extension_ms"], fig["extension_share"]))
    if fig["comm_share"] >= COMM_SHARE:
        out.append(("communication-bound", fig["comm_ms"], fig["comm_share"]))
    if gpu is not None:
        if gpu.limit == "gpu" and gpu.busy_share is not None:
            # the host's phase times hold its waits for the GPU: no host-side kind applies
            both = _both_share(stats, fig, gpu)
            kind = "host- and GPU-bound" if both is not None else "GPU-bound"
            out.append((kind, gpu.busy_share * stats.iteration_total_ms, gpu.busy_share))
        if gpu.limit != "host":
            # ... but data loading the GPU waited for is input time at every sync level
            out += _input_over_iteration(stats, fig, gpu)
            return out
    if not stats.has_phases:
        return out
    host_total = fig["host_ms"]
    if fig["data_own_share"] >= INPUT_SHARE:
        out.append(("input-bound", fig["data_own_share"] * host_total, fig["data_own_share"]))
    if fig["gc_share"] >= GC_SHARE and fig["gc_ms"] >= GC_MIN_MS:
        out.append(("gc-bound", fig["gc_ms"], fig["gc_share"]))
    if fig["compute_net_share"] >= COMPUTE_SHARE:
        # on a GPU that waits for the host, the model's phases are the host's work
        kind = "host-bound" if gpu is not None or _host_bound(stats, fig) else "compute-bound"
        out.append((kind, fig["compute_net_share"] * host_total, fig["compute_own_share"]))
    return out


def _input_over_iteration(stats: RunStats, fig: dict[str, float],
                          gpu: GpuEvidence) -> list[tuple[str, float, float]]:
    """Input-bound where the GPU sets the pace or the evidence cannot tell: the data phase's
    own time (at sync 0 the part the GPU spent on it) over the whole iteration.  At sync 0
    without the data phase's span the host may have waited there for the GPU: no claim."""
    if not stats.has_phases or fig["iteration_mean_ms"] <= 0:
        return []
    data = gpu.phase("data")
    if gpu.sync_level == 0 and (data is None or data.gpu_ms is None):
        return []
    share = fig["data_own_ms_per_iteration"] / fig["iteration_mean_ms"]
    if share < INPUT_SHARE:
        return []
    fig["data_own_share"] = share
    return [("input-bound", fig["data_own_ms_per_iteration"] * stats.iterations, share)]


def _both_share(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence) -> float | None:
    """The host's own share of the iteration when it and the GPU are both saturated.  The
    iteration is the GPU's when longer (a short run at sync 0 whose host ran ahead of the
    GPU measured the host's pace, not the one the run settles at)."""
    activity = stats.gpu_activity
    span = activity.span_ms / activity.iterations \
        if activity is not None and activity.iterations else 0.0
    pace = max(fig["iteration_mean_ms"], gpu.gpu_iteration_ms or 0.0, span)
    if gpu.busy_share is None or gpu.busy_share < BOTH_SHARE or pace <= 0:
        return None
    host = sum(fig[f"{k}_own_ms_per_iteration"] for k in _KEYS) / pace
    fig["host_busy_share"] = host
    fig["host_own_ms"] = host * pace
    return host if host >= BOTH_SHARE else None


def _host_bound(stats: RunStats, fig: dict[str, float]) -> bool:
    """A CPU run's many short calls."""
    us = us_per_function(stats, fig)
    calls = functions_per_iteration(stats) or 0
    if us is None or calls < HOST_MIN_FUNCTIONS:
        return False
    checks = checks_per_function(stats)
    return us < HOST_US_PER_FUNCTION or (checks is not None
                                         and checks < HOST_CHECKS_PER_FUNCTION)


def checks_per_function(stats: RunStats) -> float | None:
    """In the counted iteration: a call's mean host CPU time over its median type check's."""
    facts = facts_of(stats)
    call, check = facts.get("function_cpu_us"), facts.get("type_check_us")
    if not isinstance(call, (int, float)) or not isinstance(check, (int, float)) or check <= 0:
        return None
    return call / check


def us_per_function(stats: RunStats, fig: dict[str, float]) -> float | None:
    """Host microseconds per function call: forward + backward + update per iteration,
    without their collections and the agent's waits, over the calls of an iteration."""
    calls = functions_per_iteration(stats)
    if not calls:
        return None
    compute_ms = sum(fig[f"{k}_own_ms_per_iteration"] for k in _COMPUTE) \
        - per_iteration(stats, fig.get("gc_ms", 0.0))
    return max(0.0, compute_ms) * 1000.0 / calls


# -- one builder per kind ------------------------------------------------------------

def _extension(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
               replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    ext = sorted(extension_ms(stats).items(), key=lambda kv: -kv[1])
    v = Verdict("extension-bound",
                f"extension-bound: {fmt.pct(fig['extension_share'])} of the training loop runs "
                f"between iterations (threshold {fmt.pct(EXTENSION_SHARE)})")
    v.evidence.append(f"between iterations: {fmt.ms(fig['extension_ms'])} of "
                      f"{fmt.ms(fig['loop_ms'])} loop time (counted iterations "
                      f"{fmt.ms(stats.iteration_total_ms)})")
    for name, ms in ext[:3]:
        label = ("idle (no range: the loop's own code or an uninstrumented extension)"
                 if name == "idle" else name)
        v.evidence.append(f"{label}: {fmt.ms(ms)} ({fmt.pct(ms / fig['loop_ms'])} of the loop)")
    named = [name for name, _ms_ in ext if name != "idle"]
    if not named:  # no extension to run less often: the loop's own code takes the time
        v.suggestions.append("nothing the agent sees runs between iterations: look at the "
                             "loop's own code there (converting or moving the batch outside "
                             "the updater, logging, waits) or an extension it does not "
                             "instrument; chainer_autoprof.annotate(name) around it names it "
                             "here")
        return v
    v.suggestions.append(f"run {named[0]} less often (a larger trigger interval, e.g. "
                         "trainer.extend(ext, trigger=(N, 'epoch'))) or make it cheaper "
                         "(evaluate on a subset, snapshot less often)")
    return v


def _stutter(stats: RunStats, fig: dict[str, float]) -> list[str]:
    """The slow iterations' line, when they hold :data:`OUTLIER_SHARE` of the time or more."""
    st = stutter(stats)
    fig["outlier_share"] = st.share
    if st.share < OUTLIER_SHARE or not st.count:
        return []
    line = (f"{st.count} of {st.sampled} counted iterations take {fmt.num(OUTLIER_FACTOR)}x "
            f"the median ({fmt.ms(st.median_ms)}) or more, and their time above it is "
            f"{fmt.pct(st.share)} of the iteration time")
    if st.gc_count:
        line += (f"; garbage collection explains {st.gc_count} of them (see the slowest "
                 "iterations and the advice)")
    return [line]


def dry_queues(stats: RunStats) -> list[tuple[str, float, int, int]]:
    """(iterator, share of fetches with an empty queue, fetches, capacity) of dry input queues."""
    out = []
    for name, q in sorted((facts_of(stats).get("input_queue") or {}).items()):
        fetches = int(q.get("fetches") or 0)
        ready = q.get("ready") or []
        if fetches and ready and ready[0] / fetches >= QUEUE_DRY_SHARE:
            out.append((name, ready[0] / fetches, fetches, int(q.get("capacity") or 1)))
    return out


def _input(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
           replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    facts = facts_of(stats)
    iterator = facts.get("iterator")
    share = fig["data_own_share"]
    v = Verdict("input-bound",
                f"input-bound: data loading takes {fmt.pct(share)} of the iteration "
                f"time (threshold {fmt.pct(INPUT_SHARE)})")
    v.evidence.append(f"data phase: median {fmt.ms(stats.phase_median('data'))} of a "
                      f"{fmt.ms(stats.median())} median iteration")
    batch = stats.batch_size
    line = f"iterator: {iterator or 'unknown'}"
    data_ms = fig["data_own_ms_per_iteration"]
    if batch:
        line += f", batch size {batch}: {fmt.ms(data_ms / batch)} per example"
    v.evidence.append(line)
    dry = dry_queues(stats)
    for name, dry_share, fetches, capacity in dry:
        v.evidence.append(f"input queue ran dry: {name} had no batch ready at "
                          f"{fmt.pct(dry_share)} of {fmt.count(fetches)} fetches "
                          f"({capacity} prefetched at most)")
    mean = per_iteration(stats, fig["host_ms"])
    rest = mean - data_ms
    free = wf.get(whatif.INPUT_FREE) if wf is not None else None
    if free is not None:  # the step replayed with free data: the GPU's time stays
        v.evidence.append(free.text())
    elif rest > 0:
        v.evidence.append(f"without the data phase an iteration would take about "
                          f"{fmt.ms(rest)} ({fmt.factor(mean / rest)} faster)")
    if iterator == "SerialIterator":
        v.suggestions.append("load in parallel: chainer.iterators.MultiprocessIterator"
                             "(dataset, batch_size, n_processes=N) for CPU-heavy loading, "
                             "MultithreadIterator(dataset, batch_size, n_threads=N) for "
                             "I/O-bound loading")
    elif iterator in ("MultiprocessIterator", "MultithreadIterator") or dry:
        name = iterator if iterator in ("MultiprocessIterator", "MultithreadIterator") \
            else dry[0][0]
        v.suggestions.append(f"{name} cannot keep up: raise n_processes / n_threads and "
                             "n_prefetch, or make each example cheaper (decode once, cache, "
                             "smaller images)")
    else:
        v.suggestions.append("load the next batch while this one trains (a prefetching "
                             "iterator) and make each example cheaper")
    if replay is not None:
        v.evidence += compare_replay(stats, replay)
    elif not is_replay(stats):
        v.suggestions.append("confirm with CHAINER_PROF_REPLAY_BATCH=1 (the first batch fed "
                             "again every iteration) and compare both traces with "
                             "'python -m chainer_autoprof report NORMAL.json REPLAY.json'")
    return v


def _gc(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
        replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    v = Verdict("gc-bound",
                f"gc-bound: garbage collection takes {fmt.pct(fig['gc_share'])} of the "
                f"iteration time (threshold {fmt.pct(GC_SHARE)})")
    counts = (facts_of(stats).get("gc") or {}).get("collections") or []
    line = f"collections inside the counted iterations: {fmt.ms(fig['gc_ms'])}, " \
           f"{fmt.ms(per_iteration(stats, fig['gc_ms']))} per iteration on average"
    if len(counts) == 3:
        line += (f" (in the run: gen 0 {fmt.count(counts[0])}, gen 1 {fmt.count(counts[1])}, "
                 f"gen 2 {fmt.count(counts[2])})")
    v.evidence.append(line)
    v.evidence.append(f"the model's own work (forward, backward, update without the "
                      f"collections): {fmt.pct(fig['compute_net_share'])} of the iteration "
                      "time")
    v.suggestions.append("keep what set-up built out of the collections: gc.freeze() just "
                         "before training, then fewer reference cycles per iteration (see "
                         "the gc advice)")
    return v


def _calls_line(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None) -> str | None:
    calls = functions_per_iteration(stats)
    us = us_per_function(stats, fig)
    if not calls or us is None:
        return None
    what = ("of host time each on average (Chainer's Python, type checks and CuPy's kernel "
            "launches)" if gpu is not None else "each on average")
    line = f"{fmt.count(calls)} function calls per iteration, {fmt.us(us)} {what}"
    checks = checks_per_function(stats)
    if checks is not None:
        line += (f"; in iteration {facts_of(stats).get('functions_counted_in', '?')} a call "
                 f"took the host CPU time of {fmt.num(checks, 2)} type checks on average")
    if gpu is None:
        line += (f" (host-bound under {fmt.num(HOST_US_PER_FUNCTION)} us or "
                 f"{HOST_CHECKS_PER_FUNCTION} type checks)")
    return line


def _host(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
          replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    share = fig["compute_own_share"]
    if gpu is not None:
        title = (f"host-bound: the GPU waits for the host, whose forward/backward/update "
                 f"take {fmt.pct(share)} of the iteration (Python, Chainer and kernel "
                 "launches)")
    else:
        title = (f"host-bound: forward/backward/update take {fmt.pct(share)} of the "
                 "iteration time in many short calls (Python overhead)")
    v = Verdict("host-bound", title)
    line = _calls_line(stats, fig, gpu)
    if line:
        v.evidence.append(line)
    if stats.links:
        v.evidence.append(f"{fmt.num(link_calls_per_iteration(stats))} link calls per "
                          "iteration")
    if gpu is not None:
        batch = f" (now {stats.batch_size})" if stats.batch_size else ""
        v.suggestions.append(f"a larger batch{batch}: each kernel gets more work for the same "
                             "host cost per call, while the GPU waits for the host anyway")
        v.suggestions.append("fewer, larger kernels: fewer and wider layers, fused functions "
                             "(e.g. one F.linear on concatenated inputs instead of many small "
                             "ones)")
    else:
        v.suggestions.append("give each call more work: larger batches, fewer and wider "
                             "layers, fused functions (e.g. one F.linear on concatenated "
                             "inputs instead of many small ones)")
    type_check = (facts_of(stats).get("config") or {}).get("type_check")
    if type_check:
        v.suggestions.append("chainer.config.type_check = False once the model is debugged")
    return v


def _compute(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
             replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    v = Verdict("compute-bound",
                f"compute-bound: forward/backward/update take {fmt.pct(fig['compute_share'])} "
                "of the iteration time")
    v.evidence.append("mean per iteration: " + ", ".join(
        f"{k} {fmt.ms(fig[f'{k}_ms_per_iteration'])} ({fmt.pct(fig[f'{k}_share'])})"
        for k in _COMPUTE))
    us = us_per_function(stats, fig)
    if us is not None:
        v.evidence.append(f"{fmt.count(functions_per_iteration(stats) or 0)} function calls "
                          f"per iteration, {fmt.us(us)} each on average")
    links = top_links(stats)
    if links:
        denom = sum(link.self_ms + link.bwd_ms for link in stats.links) or 1.0
        v.evidence.append("top links (own forward + backward time per iteration):")
        for link in links:
            own = link.self_ms + link.bwd_ms
            v.evidence.append(f"  {link.name}: {fmt.ms(per_iteration(stats, own))} "
                              f"({fmt.pct(own / denom)} of link time), "
                              + counted(fmt.num(link.calls / stats.iterations), "call"))
        v.suggestions.append(focus_text(links[0], stats.links))
    else:
        v.suggestions.append("see which links: run with CHAINER_PROF_GRANULARITY=link")
    return v


def _gpu_bound(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
               replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    assert gpu is not None and gpu.busy_share is not None
    busy = gpu.busy_share
    if gpu.busy_exact:
        title = (f"GPU-bound: the GPU is busy {fmt.pct(busy)} of each iteration "
                 f"(threshold {fmt.pct(GPU_BOUND_SHARE)}); the host waits for it")
    else:
        title = (f"GPU-bound: the GPU is busy at least {fmt.pct(busy)} of each iteration "
                 f"(threshold {fmt.pct(GPU_BOUND_SHARE)}); the host waits for it")
    v = Verdict("GPU-bound", title)
    v.evidence.append(f"GPU busy share {fmt.pct(busy)}, {gpu.busy_method}")
    v.evidence += _gpu_times(stats, gpu)
    top = gpu.top_phase()
    focus = None
    if top is not None:
        top_ms = gpu.gpu_time(top) or 0.0
        whole = gpu.gpu_iteration_ms or gpu.host_iteration_ms
        v.evidence.append(f"most GPU time: {top.phase}, {fmt.ms(top_ms)} per iteration "
                          f"({fmt.pct(_share(top_ms, whole))} of the GPU iteration)")
        focus = top.phase
    else:
        launched = activity_phases(stats)
        if launched:
            phase, ms, share = launched[0]
            v.evidence.append(f"most GPU time launched in {phase}: {fmt.ms(ms)} per iteration "
                              f"({fmt.pct(share)} of the GPU's time; CUPTI kernel activity)")
            focus = phase
    links, how = gpu_links(stats)
    if links:
        v.evidence.append(f"links with the most GPU time per iteration ({how}): " + ", ".join(
            f"{name} {fmt.ms(ms)}" for name, ms in links[:3]))
        focus = links[0][0]
    elif stats.links:
        v.evidence.append(f"link times are host times at sync level {stats.sync_level}: "
                          "each link's GPU time needs sync level 3 (or Nsight Compute, "
                          "see the README)")
    v.evidence += _host_side_of_gpu_bound(stats, gpu)
    v.suggestions += gpu_suggestions(stats, focus)
    return v


def _both(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
          replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    """Host and GPU both saturated: each side's figures, and which one pays off first."""
    v = _gpu_bound(stats, fig, gpu, replay, wf)
    assert gpu is not None and gpu.busy_share is not None
    busy = ("" if gpu.busy_exact else "at least ") + fmt.pct(gpu.busy_share)
    host = fig.get("host_busy_share", 0.0)
    first = whatif.pays_off_first(wf) if wf is not None else None
    v.kind = "host- and GPU-bound"
    v.title = (f"host- and GPU-bound: the GPU is busy {busy} of each iteration and the host's "
               f"own work takes {fmt.pct(host)} (threshold {fmt.pct(BOTH_SHARE)} each): "
               "each side waits little for the other, so speeding up one alone buys little")
    if first is not None and wf is not None:
        side = "the host" if first.lever == whatif.HOST_2X else "the GPU"
        v.title += f"; {side} pays off first"
        v.evidence[:0] = [p.text() for p in (wf.get(whatif.GPU_2X), wf.get(whatif.HOST_2X))
                          if p is not None]
    v.evidence.insert(0, f"host's own work {fmt.ms(fig['host_own_ms'])} per "
                         f"iteration ({fmt.pct(host)}; the agent's waits left out)")
    return v


def _gpu_times(stats: RunStats, gpu: GpuEvidence) -> list[str]:
    """The GPU's time per phase beside the host's (CUDA events, medians)."""
    timed = [p for p in gpu.phases if p.gpu_ms is not None]
    if not timed:
        return []
    head = (f"GPU time per iteration (CUDA events, median over {gpu.event_samples}): "
            + (f"iteration {fmt.ms(gpu.gpu_iteration_ms)}; " if gpu.gpu_iteration_ms else ""))
    return [head + ", ".join(f"{p.phase} {fmt.ms(p.gpu_ms or 0.0)} (host "
                             f"{fmt.ms(p.host_ms)})" for p in timed)]


def _host_side_of_gpu_bound(stats: RunStats, gpu: GpuEvidence) -> list[str]:
    """Where the host's time goes while the GPU sets the pace."""
    out = []
    if gpu.sync_level == 0:
        whole = gpu.gpu_iteration_ms or gpu.host_iteration_ms
        for p in gpu.phases:
            if (p.gpu_ms is not None and p.host_ms > 2 * p.gpu_ms
                    and p.host_ms - p.gpu_ms >= 0.05 * whole):
                out.append(f"{p.phase}: {fmt.ms(p.host_ms)} on the host but "
                           f"{fmt.ms(p.gpu_ms)} on the GPU, which was still running earlier "
                           f"work meanwhile: this host time overlaps the GPU's and costs "
                           f"nothing here")
    elif gpu.wait_source != "none":
        where = ("at each iteration's end" if gpu.sync_level == 1
                 else "at the range boundaries")
        out.append(f"the host waited {fmt.ms(gpu.wait_ms)} per iteration "
                   f"({fmt.pct(gpu.wait_share)}) {where} in the agent's synchronization "
                   f"(sync level {gpu.sync_level}): the GPU's work made visible"
                   + ("" if gpu.wait_source == "recorded" else " (estimated, see the note)"))
    return out


def gpu_suggestions(stats: RunStats, focus: str | None) -> list[str]:
    """What to try on a GPU-bound run, each only where the run shows it applies."""
    facts = facts_of(stats)
    out = []
    cuda = facts.get("cuda") or {}
    cfg = facts.get("config") or {}
    conv = int((facts.get("conv_links") or {}).get("gpu") or 0)
    cudnn_off = cuda.get("cudnn_enabled") is False or cfg.get("use_cudnn") == "never"
    if conv and cudnn_off:
        # how to get it is the cudnn advice's fix, said once (the advice is shown with the
        # verdict, and checks the same facts)
        out.append(f"{conv} convolution link(s) run without cuDNN: see the cudnn advice for how "
                   "to get it for this CuPy")
    elif conv and cfg.get("autotune") is False:
        out.append("chainer.config.autotune = True: cuDNN picks the fastest convolution "
                   "algorithm for each shape (see the autotune advice)")
    params = facts.get("params") or {}
    dtypes = params.get("dtypes") or {}
    if params.get("float64_gpu_examples"):
        out.append("float32 instead of float64 parameters (see the float64_gpu advice)")
    elif dtypes and set(dtypes) <= {"float32"}:
        out.append("mixed precision: chainer.global_config.dtype = chainer.mixed16 (float16 "
                   "arithmetic, float32 master weights) halves memory traffic and uses the "
                   "tensor cores of recent GPUs")
    if focus:
        out.append(f"look into {focus}'s kernels first: Nsight Compute profiles them with "
                   "the agent's ranges as names (ncu --nvtx --print-nvtx-rename kernel, see "
                   "the README)")
    if stats.sync_level >= 2:
        out.append("measure throughput at sync level 0 or 1: levels 2-3 attribute GPU time to "
                   "phases and links at the cost of the overlap")
    return out


def cupy_major(stats: RunStats) -> int | None:
    """The major version of the CuPy the run used, if recorded."""
    version = str(((stats.meta or {}).get("versions") or {}).get("cupy") or "")
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def cudnn_fix(stats: RunStats) -> str:
    """How to get cuDNN for this run's stack (CuPy 14 has none)."""
    major = cupy_major(stats)
    if major is not None and major >= 14:
        return ("CuPy 14 and later have no cuDNN support (CuPy 14 removed it) and Chainer "
                "reaches cuDNN only through CuPy: install CuPy 13 with cuDNN 8 (e.g. pip install "
                "'cupy-cuda12x<14' and cuDNN from conda-forge or "
                "'python -m cupyx.tools.install_library --library cudnn --cuda 12.x'), "
                "then check chainer.print_runtime_info()")
    return ("install cuDNN for this CuPy (CuPy 13 and older load cuDNN 8 when it is "
            "installed: conda-forge's cudnn, or 'python -m cupyx.tools.install_library "
            "--library cudnn --cuda 12.x'), check chainer.print_runtime_info() and leave "
            "use_cudnn at 'auto'")


def _not_enough(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence) -> Verdict:
    v = Verdict("unknown", "not enough evidence to tell GPU-bound from host-bound: "
                + gpu.reason)
    if gpu.busy_share is not None:
        v.evidence.append(f"GPU busy share at least {fmt.pct(gpu.busy_share)}, "
                          f"{gpu.busy_method}")
    v.evidence += _gpu_times(stats, gpu)
    v.evidence.append("iteration shares (host): " + ", ".join(
        f"{k} {fmt.pct(fig[f'{k}_share'])}" for k in _KEYS))
    if gpu.iterations < MIN_ITERATIONS:
        v.suggestions.append(f"run at least {MIN_ITERATIONS} iterations past the warm-up "
                             "(CHAINER_PROF_WARMUP)")
    if gpu.sync_level != 1:
        v.suggestions.append("run with CHAINER_PROF_SYNC_LEVEL=1: CUDA event spans per phase "
                             "and the wait at each iteration's end tell GPU-bound from "
                             "host-bound at the least cost")
    return v


def _gpu_support(stats: RunStats, gpu: GpuEvidence) -> list[str]:
    """The GPU figures behind a host-side verdict on a GPU: why it is not GPU-bound."""
    out = []
    if gpu.busy_exact and gpu.busy_share is not None:
        line = (f"GPU busy share {fmt.pct(gpu.busy_share)}, under {fmt.pct(GPU_BOUND_SHARE)}, "
                f"{gpu.busy_method}")
        idle = idle_split(stats)
        if idle:
            line += "; the GPU's idle time: " + ", ".join(
                f"{IDLE_WORDS.get(k, k)} {fmt.pct(share)}" for k, share in idle.items())
        out.append(line)
    timed = [p for p in gpu.phases if p.gpu_ms is not None]
    if gpu.sync_level <= 1 and timed:
        behind = gpu.behind
        if behind:
            out.append("the GPU was behind the host only in " + ", ".join(
                f"{p.phase} ({fmt.ms(p.gpu_ms or 0.0)} on the GPU, {fmt.ms(p.host_ms)} on "
                "the host)" for p in behind)
                + f": GPU busy at least {fmt.pct(gpu.busy_share or 0.0)} of the iteration, "
                f"under {fmt.pct(GPU_BOUND_SHARE)}")
        else:
            out.append("GPU-limited time: 0.0% of the iteration: every phase's CUDA event "
                       f"span is within {fmt.pct(BEHIND_MARGIN)} of its host time (GPU vs "
                       "host: " + ", ".join(f"{p.phase} {fmt.ms(p.gpu_ms or 0.0)} vs "
                                            f"{fmt.ms(p.host_ms)}" for p in timed) +
                       "), so the GPU finishes each phase's work as soon as it is launched "
                       "and waits for the host (how busy it is then needs kernel activity "
                       "records)")
    if gpu.sync_level >= 1 and gpu.wait_source != "none":
        where = "at each iteration's end" if gpu.sync_level == 1 else "in the synchronizations"
        out.append(f"the host waited {fmt.ms(gpu.wait_ms)} per iteration "
                   f"({fmt.pct(gpu.wait_share)}) {where} for the GPU (the agent's sync level "
                   f"{gpu.sync_level}, left out of the figures above)")
    elif gpu.sync_level >= 1 and gpu.busy_share is not None and not timed:
        out.append(f"GPU busy share at least {fmt.pct(gpu.busy_share)}, {gpu.busy_method}")
    return out


def _balanced(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None) -> Verdict:
    title = "no single bottleneck: no share passes its threshold"
    if gpu is not None:
        title = "no single bottleneck: the GPU waits for the host, and no part of the host's " \
                "time passes its threshold"
    v = Verdict("balanced", title)
    v.evidence.append("iteration shares: " + ", ".join(
        f"{k} {fmt.pct(fig[f'{k}_own_share'])}" for k in _KEYS)
        + (" (the agent's waits left out)" if fig["wait_ms"] > 0 else ""))
    v.evidence.append(f"between iterations (extensions, evaluation): "
                      f"{fmt.pct(fig['extension_share'])} of the training loop")
    if fig["other_own_share"] >= INPUT_SHARE:
        v.evidence.append(f"{fmt.pct(fig['other_own_share'])} of each iteration is outside "
                          "the four phases (the updater's own code, reporting, user code "
                          "between phases)")
    return v


def _communication(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None,
                   replay: RunStats | None, wf: WhatIf | None) -> Verdict:
    return Verdict("communication-bound", communication.title(stats),
                   communication.evidence(stats), communication.suggestions(stats))


_BUILDERS = {"extension-bound": _extension, "input-bound": _input, "gc-bound": _gc,
             "host-bound": _host, "compute-bound": _compute, "GPU-bound": _gpu_bound,
             "host- and GPU-bound": _both, "communication-bound": _communication}


def _notes(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None) -> list[str]:
    notes = []
    if is_replay(stats):
        replay = facts_of(stats).get("replay") or {}
        mode = replay.get("iterator_mode") or "iterator not seen"
        notes.append("this is a replay run (CHAINER_PROF_REPLAY_BATCH=1): the first batch was "
                     f"fed again every iteration ({mode}); its speed is the point, its "
                     "training results are meaningless")
    if gpu is not None and stats.sync_level == 0 and gpu.busy_exact:
        notes.append("sync level 0 on a GPU: the phase times are host times (kernel launches, "
                     "and waits wherever the host blocks); the GPU's own times come from its "
                     "kernel activity")
    elif gpu is not None and stats.sync_level == 0:
        notes.append("sync level 0 on a GPU: the phase times are host times (kernel launches, "
                     "and waits wherever the host blocks), the GPU's are the CUDA event times"
                     + ("" if gpu.event_samples else
                        "; without them run with CHAINER_PROF_SYNC_LEVEL=1 (or "
                        "CHAINER_PROF_GPU_ACTIVITY=1) to tell host-bound from GPU-bound"))
    notes += sync_overhead(stats, fig, gpu)
    if fig["overhead_share"] >= OVERHEAD_NOTE_SHARE:
        notes.append(f"the agent's own overhead is about {fmt.pct(fig['overhead_share'])} of "
                     "the wall time: a coarser CHAINER_PROF_GRANULARITY gives figures closer "
                     "to an unprofiled run")
    return notes


def sync_overhead(stats: RunStats, fig: dict[str, float], gpu: GpuEvidence | None) -> list[str]:
    """The agent's synchronization as its overhead (never the run's bottleneck)."""
    if stats.sync_level < 1 or fig["wait_ms"] <= 0:
        return []
    per = per_iteration(stats, fig["wait_ms"])
    waited = waits(stats)
    line = (f"the agent's own synchronization (sync level {stats.sync_level}) waited "
            f"{fmt.ms(per)} per iteration ({fmt.pct(fig['wait_share'])}"
            + ("" if waited.source == "recorded" else f"; {waited.method}")
            + "): the agent's overhead, not the run's bottleneck, left out of the host's "
            "figures")
    if gpu is not None and gpu.sync_cost_ms is not None:
        cost = gpu.sync_cost_ms
        line += (f"; its cost is the overlap it takes away, "
                 f"{'up to' if gpu.sync_cost_bound else 'about'} {fmt.ms(cost)} per iteration "
                 f"({fmt.pct(_share(cost, gpu.host_iteration_ms))}): {gpu.sync_cost_method}")
    return [line]


# -- the replay comparison --------------------------------------------------------------

def compare_replay(normal: RunStats, replay: RunStats) -> list[str]:
    """Lines comparing a normal run with its replay run (data made free)."""
    if not normal.iterations or not replay.iterations:
        return ["replay comparison: a run without counted iterations"]
    n_med, r_med = normal.median(), replay.median()
    lines = [f"if data were free (replay run): median iteration {fmt.ms(n_med)} -> "
             f"{fmt.ms(r_med)}" + (f" ({fmt.factor(n_med / r_med)} faster)" if r_med > 0 else "")]
    lines.append(f"  data phase per iteration: {fmt.ms(normal.phase_median('data'))} -> "
                 f"{fmt.ms(replay.phase_median('data'))}")
    n_sps, r_sps = normal.samples_per_second(), replay.samples_per_second()
    if n_sps and r_sps:
        lines.append(f"  throughput: {fmt.count(round(n_sps))} -> {fmt.count(round(r_sps))} "
                     "examples/s")
    mode = (facts_of(replay).get("replay") or {}).get("iterator_mode")
    if mode:
        lines.append(f"  replay iterator: {mode}")
    return lines


def pick_replay(first: RunStats, second: RunStats) -> tuple[RunStats, RunStats] | None:
    """(normal, replay) when exactly one of two runs is a replay run."""
    a, b = is_replay(first), is_replay(second)
    if a == b:
        return None
    return (second, first) if a else (first, second)

