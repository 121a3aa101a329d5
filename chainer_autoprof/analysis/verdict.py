"""The bottleneck verdict: which part of the run its time goes to, with the numbers.

Every threshold lives here (docs/verdict.md explains each).  The verdict is a
pure function of a :class:`~chainer_autoprof.stats.RunStats` (live or read
back from a trace) and, optionally, the stats of a replay run of the same
program (``CHAINER_PROF_REPLAY_BATCH=1``).

Kinds:

* ``extension-bound``: what runs between iterations (extensions such as
  evaluation, snapshots and reports, inference, the loop's own code) takes
  :data:`EXTENSION_SHARE` of the training loop's wall time or more;
* ``input-bound``: the data phase takes :data:`INPUT_SHARE` of the iteration
  time or more;
* ``gc-bound``: garbage collections inside the counted iterations take
  :data:`GC_SHARE` of the iteration time or more;
* ``synchronization-bound``: at sync level 2 or 3 the agent's own GPU
  synchronizations take :data:`SYNC_SHARE` of the iteration time or more;
* ``host-bound``: forward/backward/update dominate but each function call is
  short (under :data:`HOST_US_PER_FUNCTION`, or under the time of
  :data:`HOST_CHECKS_PER_FUNCTION` type checks, over at least
  :data:`HOST_MIN_FUNCTIONS` calls per iteration), or on a GPU at sync level
  1 the host almost never waits for the GPU (under :data:`GPU_WAIT_SHARE`);
* ``compute-bound``: forward + backward + update take :data:`COMPUTE_SHARE`
  of the iteration time or more (their collections left out);
* ``balanced``: none of the above; the shares are printed.

Beside the kind, the verdict says when slow iterations (at least
:data:`~.outliers.OUTLIER_FACTOR` times the median) hold
:data:`OUTLIER_SHARE` of the iteration time or more, and how many of them
garbage collection explains; an input-bound verdict names the input queue
when it was empty at :data:`QUEUE_DRY_SHARE` of the fetches or more.

When several kinds pass their thresholds the one with the most time behind it
is the verdict and the others are listed under "also"; synchronization-bound
goes before host- and compute-bound, whose phase times include its waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .outliers import OUTLIER_FACTOR, stutter
from .stats import median
from .window import unreached

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
#: Share of the counted iteration time spent waiting in the agent's own GPU
#: synchronizations (sync level 2 or 3) at or above which a run is
#: synchronization-bound.
SYNC_SHARE = 0.20
#: Sync level from which synchronizations are placed inside the iteration.
SYNC_INSIDE_LEVEL = 2
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
#: On a GPU at sync level 1: share of the iteration time the host waits at the
#: iteration boundary for the GPU, under which the GPU is the one waiting.
GPU_WAIT_SHARE = 0.10
#: The agent's own estimated overhead, as a share of the wall time, above
#: which the verdict warns that the figures are inflated by profiling.
OVERHEAD_NOTE_SHARE = 0.10
#: Links listed for a compute-bound run.
TOP_LINKS = 5
#: Slow iterations' time above the median, as a share of the iteration time, from which
#: the verdict says the run stutters (a tenth of the time lost to a few iterations).
OUTLIER_SHARE = 0.10
#: The gc-bound verdict and the gc advice need at least this many milliseconds of
#: collections inside the counted iterations (a short run's few are not worth a line).
GC_MIN_MS = 100.0
#: An input queue empty at this share of the training fetches or more has run dry.
QUEUE_DRY_SHARE = 0.5

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

#: Outside-iteration keys that are not part of the training loop.
_NOT_LOOP = ("startup", "warm-up", "shutdown", "before window", "after window", "unfinished")


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


# -- figures ---------------------------------------------------------------------

def facts_of(stats: Any) -> dict[str, Any]:
    """The run-time facts recorded by the probes (empty when none)."""
    facts = (stats.meta or {}).get("facts") if stats.meta else None
    return facts if isinstance(facts, dict) else {}


def settings_of(stats: Any) -> dict[str, Any]:
    settings = (stats.meta or {}).get("settings") if stats.meta else None
    return settings if isinstance(settings, dict) else {}


def is_replay(stats: Any) -> bool:
    """Whether ``stats`` comes from a replay-batch run."""
    return bool(settings_of(stats).get("replay_batch")) or "replay" in facts_of(stats)


def on_gpu(stats: Any) -> bool:
    """Whether the model ran on a GPU (parameters seen there, or GPU devices in use)."""
    params = facts_of(stats).get("params") or {}
    return bool(params.get("gpu")) or bool((stats.meta or {}).get("devices"))


def extension_ms(stats: Any) -> dict[str, float]:
    """Time between the counted iterations, per outside key (ms): extensions, inference,
    user ranges and ``idle`` (no range: the loop's own code, uninstrumented extensions)."""
    return {k: v for k, v in stats.outside_ms.items() if k not in _NOT_LOOP}


def loop_ms(stats: Any) -> float:
    """The training loop's wall time: counted iterations plus what ran between them."""
    between = sum(v for k, v in stats.outside_ms.items() if k not in _NOT_LOOP)
    return stats.iteration_total_ms + between


def sync_ms(stats: Any) -> float | None:
    """Milliseconds spent in the agent's synchronizations over the whole run, when recorded
    (compared with the counted iterations: warm-up waits make it an upper bound)."""
    value = (stats.meta or {}).get("sync_ms")
    return float(value) if value is not None else None


def per_iteration(stats: Any, total_ms: float) -> float:
    return total_ms / stats.iterations if stats.iterations else 0.0


def functions_per_iteration(stats: Any) -> int | None:
    """Function applications (forward and those of the backward pass) in one training
    iteration, counted by the probes, if known."""
    value = facts_of(stats).get("functions_per_iteration")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def link_calls_per_iteration(stats: Any) -> float:
    return sum(link.calls for link in stats.links) / stats.iterations if stats.iterations else 0.0


def top_links(stats: Any, n: int = TOP_LINKS) -> list[Any]:
    """Links with the most exclusive time (own forward + attributed backward)."""
    return sorted(stats.links, key=lambda link: -(link.self_ms + link.bwd_ms))[:n]


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if x < 10 else f"{x:.1f} ms"


# -- deciding ---------------------------------------------------------------------

def decide(stats: Any, replay: Any = None) -> Verdict:
    """The verdict for ``stats`` (and the replay run's stats, when given)."""
    if not stats.iterations:
        window = unreached(stats)
        return Verdict("unknown", "no verdict: no training iteration was counted",
                       [f"{stats.warmup} iteration(s) seen, all in the warm-up"
                        if stats.warmup else "no training iteration was seen" if window is None
                        else f"the capture window was never reached: {window.progress()}"])
    figures = _figures(stats)
    candidates = _candidates(stats, figures)
    if not candidates and not stats.has_phases:
        verdict = Verdict("unknown", "no verdict inside the iterations: no phase ranges were "
                          "recorded (granularity iteration)",
                          [f"between iterations (extensions, evaluation): "
                           f"{_pct(figures['extension_share'])} of the training loop"],
                          ["run with CHAINER_PROF_GRANULARITY=phase (the default) or finer"])
    elif not candidates:
        verdict = _balanced(stats, figures)
    else:
        candidates.sort(key=lambda c: -c[1])
        kinds = [c[0] for c in candidates]
        if "synchronization-bound" in kinds:  # the others' figures include its waits
            first = min(i for i, k in enumerate(kinds) if k in _INSIDE_PHASES)
            candidates.insert(first, candidates.pop(kinds.index("synchronization-bound")))
        kind = candidates[0][0]
        verdict = _BUILDERS[kind](stats, figures, replay)
        # compute-bound is where a run with no other problem lands: not worth an "also"
        verdict.also = [f"{k} ({_pct(share)})" for k, _total, share in candidates[1:]
                        if k != "compute-bound"]
    verdict.figures = figures
    verdict.stutter = _stutter(stats, figures)
    verdict.notes += _notes(stats, figures)
    if replay is not None and verdict.kind != "input-bound":
        verdict.evidence += compare_replay(stats, replay)
    return verdict


def _figures(stats: Any) -> dict[str, float]:
    total = stats.iteration_total_ms
    fig = {"iteration_median_ms": stats.median(),
           "iteration_mean_ms": stats.mean(),
           "loop_ms": loop_ms(stats),
           "extension_ms": sum(extension_ms(stats).values())}
    for key in ("data", "forward", "backward", "update", "other"):
        fig[f"{key}_share"] = stats.phase_share(key)
        fig[f"{key}_ms_per_iteration"] = per_iteration(stats, stats.phase_total(key))
    fig["compute_share"] = fig["forward_share"] + fig["backward_share"] + fig["update_share"]
    fig["gc_ms"] = float(getattr(stats, "gc_total_ms", 0.0) or 0.0)
    fig["gc_share"] = fig["gc_ms"] / total if total > 0 else 0.0
    # the model's own work: the collections inside the phases are the collector's
    fig["compute_net_share"] = max(0.0, fig["compute_share"] - fig["gc_share"])
    fig["extension_share"] = fig["extension_ms"] / fig["loop_ms"] if fig["loop_ms"] > 0 else 0.0
    waited = sync_ms(stats)
    if waited is not None:
        fig["sync_ms"] = waited
        fig["sync_share"] = waited / total if total > 0 else 0.0
    fig["overhead_share"] = stats.wall_share(stats.overhead_ms)
    return fig


def _candidates(stats: Any, fig: dict[str, float]) -> list[tuple[str, float, float]]:
    """(kind, milliseconds behind it, share) of every kind over its threshold."""
    out: list[tuple[str, float, float]] = []
    total = stats.iteration_total_ms
    if fig["extension_share"] >= EXTENSION_SHARE:
        out.append(("extension-bound", fig["extension_ms"], fig["extension_share"]))
    if not stats.has_phases:
        return out
    if fig["data_share"] >= INPUT_SHARE:
        out.append(("input-bound", stats.phase_total("data"), fig["data_share"]))
    if fig["gc_share"] >= GC_SHARE and fig["gc_ms"] >= GC_MIN_MS:
        out.append(("gc-bound", fig["gc_ms"], fig["gc_share"]))
    if (stats.sync_level >= SYNC_INSIDE_LEVEL and fig.get("sync_share", 0.0) >= SYNC_SHARE):
        out.append(("synchronization-bound", fig["sync_ms"], fig["sync_share"]))
    if fig["compute_net_share"] >= COMPUTE_SHARE:
        kind = "host-bound" if _host_bound(stats, fig) else "compute-bound"
        # the waits of sync levels 2-3 fall inside the phases: not the model's own time
        waits = fig.get("sync_ms", 0.0) if stats.sync_level >= SYNC_INSIDE_LEVEL else 0.0
        out.append((kind, fig["compute_net_share"] * total - waits, fig["compute_share"]))
    return out


def _host_bound(stats: Any, fig: dict[str, float]) -> bool:
    if on_gpu(stats) and stats.sync_level == 1 and "sync_share" in fig:
        return fig["sync_share"] < GPU_WAIT_SHARE
    us = us_per_function(stats, fig)
    calls = functions_per_iteration(stats) or 0
    if us is None or calls < HOST_MIN_FUNCTIONS:
        return False
    checks = checks_per_function(stats)
    return us < HOST_US_PER_FUNCTION or (checks is not None
                                         and checks < HOST_CHECKS_PER_FUNCTION)


def checks_per_function(stats: Any) -> float | None:
    """In the counted iteration: a call's mean host CPU time over its median type check's."""
    facts = facts_of(stats)
    call, check = facts.get("function_cpu_us"), facts.get("type_check_us")
    if not isinstance(call, (int, float)) or not isinstance(check, (int, float)) or check <= 0:
        return None
    return call / check


def us_per_function(stats: Any, fig: dict[str, float]) -> float | None:
    calls = functions_per_iteration(stats)
    if not calls:
        return None
    compute_ms = (fig["forward_ms_per_iteration"] + fig["backward_ms_per_iteration"]
                  + fig["update_ms_per_iteration"]) - per_iteration(stats, fig.get("gc_ms", 0.0))
    return max(0.0, compute_ms) * 1000.0 / calls


# -- one builder per kind ------------------------------------------------------------

def _extension(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    ext = sorted(extension_ms(stats).items(), key=lambda kv: -kv[1])
    v = Verdict("extension-bound",
                f"extension-bound: {_pct(fig['extension_share'])} of the training loop runs "
                f"between iterations (threshold {_pct(EXTENSION_SHARE)})")
    v.evidence.append(f"between iterations: {_ms(fig['extension_ms'])} of "
                      f"{_ms(fig['loop_ms'])} loop time (counted iterations "
                      f"{_ms(stats.iteration_total_ms)})")
    for name, ms in ext[:3]:
        label = ("idle (no range: the loop's own code or an uninstrumented extension)"
                 if name == "idle" else name)
        v.evidence.append(f"{label}: {_ms(ms)} ({_pct(ms / fig['loop_ms'])} of the loop)")
    named = [name for name, _ms_ in ext if name != "idle"]
    top = named[0] if named else "the extensions"
    v.suggestions.append(f"run {top} less often (a larger trigger interval, e.g. "
                         "trainer.extend(ext, trigger=(N, 'epoch'))) or make it cheaper "
                         "(evaluate on a subset, snapshot less often)")
    return v


def _stutter(stats: Any, fig: dict[str, float]) -> list[str]:
    """The slow iterations' line, when they hold :data:`OUTLIER_SHARE` of the time or more."""
    st = stutter(stats)
    fig["outlier_share"] = st.share
    if st.share < OUTLIER_SHARE or not st.count:
        return []
    line = (f"{st.count} of {st.sampled} counted iterations take {OUTLIER_FACTOR:g}x the median "
            f"({_ms(st.median_ms)}) or more, and their time above it is {_pct(st.share)} of "
            "the iteration time")
    if st.gc_count:
        line += (f"; garbage collection explains {st.gc_count} of them (see the slowest "
                 "iterations and the advice)")
    return [line]


def dry_queues(stats: Any) -> list[tuple[str, float, int, int]]:
    """(iterator, share of fetches with an empty queue, fetches, capacity) of dry input queues."""
    out = []
    for name, q in sorted((facts_of(stats).get("input_queue") or {}).items()):
        fetches = int(q.get("fetches") or 0)
        ready = q.get("ready") or []
        if fetches and ready and ready[0] / fetches >= QUEUE_DRY_SHARE:
            out.append((name, ready[0] / fetches, fetches, int(q.get("capacity") or 1)))
    return out


def _input(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    facts = facts_of(stats)
    iterator = facts.get("iterator")
    v = Verdict("input-bound",
                f"input-bound: data loading takes {_pct(fig['data_share'])} of the iteration "
                f"time (threshold {_pct(INPUT_SHARE)})")
    v.evidence.append(f"data phase: median {_ms(stats.phase_median('data'))} of a "
                      f"{_ms(stats.median())} median iteration")
    batch = stats.batch_size
    line = f"iterator: {iterator or 'unknown'}"
    if batch:
        line += (f", batch size {batch}: {_ms(fig['data_ms_per_iteration'] / batch)} per "
                 "example")
    v.evidence.append(line)
    dry = dry_queues(stats)
    for name, share, fetches, capacity in dry:
        v.evidence.append(f"input queue ran dry: {name} had no batch ready at {_pct(share)} "
                          f"of {fetches} fetches ({capacity} prefetched at most)")
    rest = fig["iteration_mean_ms"] - fig["data_ms_per_iteration"]
    if rest > 0:
        v.evidence.append(f"without the data phase an iteration would take about {_ms(rest)} "
                          f"({fig['iteration_mean_ms'] / rest:.2f}x faster)")
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


def _gc(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    v = Verdict("gc-bound",
                f"gc-bound: garbage collection takes {_pct(fig['gc_share'])} of the iteration "
                f"time (threshold {_pct(GC_SHARE)})")
    counts = (facts_of(stats).get("gc") or {}).get("collections") or []
    line = f"collections inside the counted iterations: {_ms(fig['gc_ms'])}, " \
           f"{_ms(per_iteration(stats, fig['gc_ms']))} per iteration on average"
    if len(counts) == 3:
        line += f" (in the run: gen 0 {counts[0]}, gen 1 {counts[1]}, gen 2 {counts[2]})"
    v.evidence.append(line)
    v.evidence.append(f"the model's own work (forward, backward, update without the "
                      f"collections): {_pct(fig['compute_net_share'])} of the iteration time")
    v.suggestions.append("keep what set-up built out of the collections: gc.freeze() just "
                         "before training, then fewer reference cycles per iteration (see "
                         "the gc advice)")
    return v


def _sync(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    calls = per_iteration(stats, stats.sync_calls)
    v = Verdict("synchronization-bound",
                f"synchronization-bound: sync level {stats.sync_level} waits take "
                f"{_pct(fig['sync_share'])} of the iteration time (threshold {_pct(SYNC_SHARE)})")
    v.evidence.append(f"{calls:.0f} synchronizations per iteration, "
                      f"{_ms(per_iteration(stats, fig['sync_ms']))} per iteration waiting in them")
    v.suggestions.append("these waits are the profiler's: they stop the host from queueing "
                         "work ahead of the GPU; measure throughput at sync level 1 "
                         "(CHAINER_PROF_SYNC_LEVEL=1) or 0 and keep level 2-3 for attributing "
                         "time to phases and links")
    return v


def _host(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    v = Verdict("host-bound",
                f"host-bound: forward/backward/update take {_pct(fig['compute_share'])} of the "
                "iteration time in many short calls (Python overhead)")
    calls = functions_per_iteration(stats)
    us = us_per_function(stats, fig)
    if calls and us is not None:
        line = f"{calls} function calls per iteration, {us:.0f} us each on average"
        checks = checks_per_function(stats)
        if checks is not None:
            line += (f"; in iteration {facts_of(stats).get('functions_counted_in', '?')} a "
                     f"call took the host CPU time of {checks:.0f} type checks on average")
        v.evidence.append(line + f" (host-bound under {HOST_US_PER_FUNCTION:.0f} us or "
                                 f"{HOST_CHECKS_PER_FUNCTION} type checks)")
    if stats.links:
        v.evidence.append(f"{link_calls_per_iteration(stats):.0f} link calls per iteration")
    if on_gpu(stats):
        if "sync_share" in fig and stats.sync_level == 1:
            v.evidence.append(f"sync level 1: the host waits {_pct(fig['sync_share'])} of the "
                              f"iteration for the GPU (under {_pct(GPU_WAIT_SHARE)}: the GPU "
                              "waits for the host)")
        gpu = _gpu_medians(stats)
        if gpu:
            v.evidence.append("GPU event times (median per iteration): " + gpu)
    v.suggestions.append("give each call more work: larger batches, fewer and wider layers, "
                         "fused functions (e.g. one F.linear on concatenated inputs instead of "
                         "many small ones)")
    type_check = (facts_of(stats).get("config") or {}).get("type_check")
    if type_check:
        v.suggestions.append("chainer.config.type_check = False once the model is debugged")
    return v


def _compute(stats: Any, fig: dict[str, float], replay: Any) -> Verdict:
    v = Verdict("compute-bound",
                f"compute-bound: forward/backward/update take {_pct(fig['compute_share'])} of "
                "the iteration time")
    v.evidence.append("mean per iteration: " + ", ".join(
        f"{k} {_ms(fig[f'{k}_ms_per_iteration'])} ({_pct(fig[f'{k}_share'])})"
        for k in ("forward", "backward", "update")))
    us = us_per_function(stats, fig)
    if us is not None:
        v.evidence.append(f"{functions_per_iteration(stats)} function calls per iteration, "
                          f"{us:.0f} us each on average")
    gpu = _gpu_medians(stats)
    if gpu:
        v.evidence.append("GPU event times (median per iteration): " + gpu)
    links = top_links(stats)
    if links:
        denom = sum(link.self_ms + link.bwd_ms for link in stats.links) or 1.0
        v.evidence.append("top links (own forward + backward time per iteration):")
        for link in links:
            own = link.self_ms + link.bwd_ms
            v.evidence.append(f"  {link.name}: {_ms(per_iteration(stats, own))} "
                              f"({_pct(own / denom)} of link time), "
                              f"{link.calls / stats.iterations:.3g} calls")
        v.suggestions.append(f"work on {links[0].name} first")
    else:
        v.suggestions.append("see which links: run with CHAINER_PROF_GRANULARITY=link")
    return v


def _balanced(stats: Any, fig: dict[str, float]) -> Verdict:
    v = Verdict("balanced", "no single bottleneck: no share passes its threshold")
    v.evidence.append("iteration shares: " + ", ".join(
        f"{k} {_pct(fig[f'{k}_share'])}" for k in ("data", "forward", "backward", "update",
                                                    "other")))
    v.evidence.append(f"between iterations (extensions, evaluation): "
                      f"{_pct(fig['extension_share'])} of the training loop")
    if fig["other_share"] >= INPUT_SHARE:
        v.evidence.append(f"{_pct(fig['other_share'])} of each iteration is outside the four "
                          "phases (the updater's own code, reporting, user code between "
                          "phases)")
    return v


#: Kinds measured inside the phases, where the sync waits of levels 2-3 fall.
_INSIDE_PHASES = ("synchronization-bound", "host-bound", "compute-bound")

_BUILDERS = {"extension-bound": _extension, "input-bound": _input, "gc-bound": _gc,
             "synchronization-bound": _sync, "host-bound": _host, "compute-bound": _compute}


def _gpu_medians(stats: Any) -> str:
    gpu = stats.gpu_phase_ms or {}
    parts = [f"{k} {_ms(median(gpu[k]))}" for k in ("iteration", "data", "forward", "backward",
                                                     "update") if gpu.get(k)]
    return ", ".join(parts)


def _notes(stats: Any, fig: dict[str, float]) -> list[str]:
    notes = []
    if is_replay(stats):
        replay = facts_of(stats).get("replay") or {}
        mode = replay.get("iterator_mode") or "iterator not seen"
        notes.append("this is a replay run (CHAINER_PROF_REPLAY_BATCH=1): the first batch was "
                     f"fed again every iteration ({mode}); its speed is the point, its "
                     "training results are meaningless")
    if on_gpu(stats) and stats.sync_level == 0:
        notes.append("sync level 0 on a GPU: phase times are host times, and GPU work queued "
                     "in one phase can be waited for in another (e.g. the data phase's copy to "
                     "the GPU); run with CHAINER_PROF_SYNC=1 to tell host-bound from GPU-bound")
    if fig["overhead_share"] >= OVERHEAD_NOTE_SHARE:
        notes.append(f"the agent's own overhead is about {_pct(fig['overhead_share'])} of the "
                     "wall time: a coarser CHAINER_PROF_GRANULARITY gives figures closer to an "
                     "unprofiled run")
    return notes


# -- the replay comparison --------------------------------------------------------------

def compare_replay(normal: Any, replay: Any) -> list[str]:
    """Lines comparing a normal run with its replay run (data made free)."""
    if not normal.iterations or not replay.iterations:
        return ["replay comparison: a run without counted iterations"]
    n_med, r_med = normal.median(), replay.median()
    lines = [f"if data were free (replay run): median iteration {_ms(n_med)} -> {_ms(r_med)}"
             + (f" ({n_med / r_med:.2f}x faster)" if r_med > 0 else "")]
    lines.append(f"  data phase per iteration: {_ms(normal.phase_median('data'))} -> "
                 f"{_ms(replay.phase_median('data'))}")
    n_sps, r_sps = normal.samples_per_second(), replay.samples_per_second()
    if n_sps and r_sps:
        lines.append(f"  throughput: {n_sps:.0f} -> {r_sps:.0f} examples/s")
    mode = (facts_of(replay).get("replay") or {}).get("iterator_mode")
    if mode:
        lines.append(f"  replay iterator: {mode}")
    return lines


def pick_replay(first: Any, second: Any) -> tuple[Any, Any] | None:
    """(normal, replay) when exactly one of two runs is a replay run."""
    a, b = is_replay(first), is_replay(second)
    if a == b:
        return None
    return (second, first) if a else (first, second)
