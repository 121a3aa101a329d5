"""The time summary: a :class:`~..analysis.stats.RunStats` as plain text (at exit, ``report``).

:func:`format_summary` builds the core block (iterations, phases, time
outside iterations, links, overhead, notes) and then appends, in order:

* the bottleneck verdict and the advice (:func:`verdict_section`), when
  ``advice`` is on;
* every callable in :data:`SECTIONS` (``stats -> str | None``), the
  extension point for further sections;
* one plain sentence saying what dominates (:func:`dominant_sentence`).

A section that raises is left out (with a one-line note): the summary never
fails the program.  The figures and findings come from :mod:`..analysis`;
only their wording lives here.
"""

from __future__ import annotations

from typing import Any, Callable

from ..analysis.advice import Finding, check
from ..analysis.outliers import OUTLIER_FACTOR, SlowIteration, slow_iterations, stutter
from ..analysis.stats import (
    AFTER_WINDOW,
    BEFORE_WINDOW,
    IDLE,
    PHASE_KEYS,
    SHUTDOWN,
    STARTUP,
    UNFINISHED,
    WARMUP,
    RunStats,
    median,
)
from ..analysis.verdict import Verdict, decide, facts_of
from ..analysis.window import unreached
from .stall import ended_abnormally

#: Extra summary sections: ``stats -> text or None``, appended in order.
SECTIONS: list[Callable[[RunStats], str | None]] = []

#: How many links the summary lists.
TOP_LINKS = 10
#: How many slow iterations the summary lists.
TOP_SLOW = 5

PHASE_LABELS = {
    "data": "data",
    "forward": "forward",
    "backward": "backward",
    "update": "update",
    "other": "rest of iteration",
}

#: What each phase is, in the one-sentence verdict.
PHASE_WORDS = {
    "data": "data loading",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "update": "the parameter update",
    "other": "time in the iteration outside data/forward/backward/update",
}

OUTSIDE_LABELS = {
    STARTUP: "start-up (before the first iteration)",
    BEFORE_WINDOW: "before the capture window",
    WARMUP: "warm-up iterations",
    IDLE: "idle (between iterations, no range)",
    SHUTDOWN: "after the last iteration",
    UNFINISHED: "unfinished (the run did not end)",
    AFTER_WINDOW: "after the capture window",
}

#: Outside-iteration keys that are not part of the training loop.
_NOT_LOOP = (STARTUP, BEFORE_WINDOW, WARMUP, SHUTDOWN, AFTER_WINDOW, UNFINISHED)

_OUTSIDE_ORDER = {STARTUP: 0, BEFORE_WINDOW: 0, WARMUP: 1, IDLE: 8, SHUTDOWN: 9, AFTER_WINDOW: 9,
                  UNFINISHED: 9}


def fmt_ms(ms: float) -> str:
    """A duration for people: ``0.123 ms``, ``12.3 ms``, ``2.43 s``, ``1.2 min``."""
    if ms >= 120_000:
        return f"{ms / 60_000:.1f} min"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


def fmt_pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def outside_label(key: str) -> str:
    return OUTSIDE_LABELS.get(key, key)


def _outside_items(stats: RunStats) -> list[tuple[str, float]]:
    return sorted(stats.outside_ms.items(),
                  key=lambda kv: (_OUTSIDE_ORDER.get(kv[0], 5), -kv[1], kv[0]))


def format_summary(stats: RunStats, advice: bool = True, title: str | None = None) -> str:
    """The whole summary block (no trailing newline)."""
    lines = [title or _title(stats)]
    lines += ended_abnormally(stats.meta)
    lines += _iteration_lines(stats)
    lines += _time_table(stats)
    lines += _gpu_lines(stats)
    lines += _slow_lines(stats)
    lines += _link_lines(stats)
    lines += _gc_lines(stats)
    lines += _agent_lines(stats)
    sections: list[Callable[[RunStats], str | None]] = [verdict_section] if advice else []
    sections += SECTIONS
    for section in sections:
        try:
            text = section(stats)
        except Exception as exc:
            name = getattr(section, "__qualname__", "section")
            text = f"  ({name} left out: {type(exc).__name__}: {exc})"
        if text:
            lines += text.rstrip("\n").split("\n")
    lines.append("  => " + dominant_sentence(stats))
    return "\n".join(lines)


def _title(stats: RunStats) -> str:
    meta = stats.meta
    where = f"pid {meta.get('pid', '?')}"
    mpi_rank = (meta.get("process") or {}).get("mpi_rank")
    if mpi_rank is not None:  # rank 0 included; nothing outside an MPI job
        where += f", rank {mpi_rank}"
    command = meta.get("command", "")
    return f"chainer_autoprof summary ({where}): {command}".rstrip(": ")


def _iteration_lines(stats: RunStats) -> list[str]:
    warm_setting = (stats.meta.get("settings") or {}).get("warmup")
    warm = f"{stats.warmup} warm-up excluded"
    if warm_setting is not None:
        warm += f" (CHAINER_PROF_WARMUP={warm_setting})"
    lines = [f"  iterations      {stats.iterations} counted, {warm}"]
    window = unreached(stats)
    if window is not None:
        lines.append(f"  capture window  {window.start}:{window.stop} never reached: "
                     f"{window.progress()}; {window.setting()}")
    if stats.other_thread_iterations:
        lines.append(f"                  (the loop thread's; {stats.other_thread_iterations} more "
                     "on other threads are not in these figures)")
    if not stats.iterations:
        return lines
    rate = f"{stats.iterations_per_second():.1f} it/s"
    sps = stats.samples_per_second()
    if sps is not None:
        rate += f", {sps:,.0f} samples/s (batch {stats.batch_size})"
    lines.append(f"  iteration time  median {fmt_ms(stats.median())}, p95 {fmt_ms(stats.p95())}; "
                 + rate)
    if stats.sample_stride > 1:
        lines.append(f"                  (median/p95 over a uniform sample: 1 in "
                     f"{stats.sample_stride} iterations; totals exact)")
    return lines


def _row(label: str, total: str, iter_share: str, wall_share: str, med: str) -> str:
    return f"    {label:<42} {total:>10} {iter_share:>7} {wall_share:>7} {med:>11}"


def _time_table(stats: RunStats) -> list[str]:
    lines = ["  " + f"{'time':<44} {'total':>10} {'% iter':>7} {'% wall':>7} {'median/iter':>11}"]
    if stats.iterations:
        lines.append("    in iterations:")
        if stats.has_phases:
            for key in PHASE_KEYS:
                total = stats.phase_total(key)
                lines.append(_row("  " + PHASE_LABELS[key], fmt_ms(total),
                                  fmt_pct(stats.phase_share(key)), fmt_pct(stats.wall_share(total)),
                                  fmt_ms(stats.phase_median(key))))
                if key == "data":
                    lines += [f"        {line}" for line in queue_lines(stats)]
        else:
            lines.append("      (no phase ranges: granularity iteration)")
        total = stats.iteration_total_ms
        lines.append(_row("  all counted iterations", fmt_ms(total), "100%",
                          fmt_pct(stats.wall_share(total)), fmt_ms(stats.median())))
    items = _outside_items(stats)
    if items:
        lines.append("    outside iterations:")
        for key, ms in items:
            lines.append(_row("  " + outside_label(key)[:40], fmt_ms(ms), "",
                              fmt_pct(stats.wall_share(ms)), ""))
    lines.append(_row("wall (agent start to exit)", fmt_ms(stats.wall_ms), "", "100%", ""))
    return lines


def _gpu_lines(stats: RunStats) -> list[str]:
    gpu = stats.gpu_phase_ms
    if not gpu:
        return []
    parts = [f"{key} {fmt_ms(median(values))}" for key, values in gpu.items() if values]
    n = len(gpu.get("iteration", []))
    return [f"  GPU time (CUDA events, median per iteration over {n}): " + ", ".join(parts)]


def _link_lines(stats: RunStats) -> list[str]:
    if not stats.links:
        return []
    lines = ["  top links by time (forward inclusive / self; backward attributed to the link "
             "whose forward created each function)",
             f"    {'link':<40} {'calls':>7} {'fwd incl':>10} {'fwd self':>10} "
             f"{'bwd calls':>9} {'bwd':>10}"]
    ordered = sorted(stats.links, key=lambda s: (-s.total_ms, s.name))
    for link in ordered[:TOP_LINKS]:
        name = link.name if len(link.name) <= 40 else "..." + link.name[-37:]
        lines.append(f"    {name:<40} {link.calls:>7} {fmt_ms(link.incl_ms):>10} "
                     f"{fmt_ms(link.self_ms):>10} {link.bwd_calls:>9} {fmt_ms(link.bwd_ms):>10}")
    if len(ordered) > TOP_LINKS:
        lines.append(f"    ... {len(ordered) - TOP_LINKS} more links")
    return lines


def queue_lines(stats: RunStats) -> list[str]:
    """The input queue of each prefetching iterator: how often it was empty when asked."""
    lines = []
    for name, q in sorted((facts_of(stats).get("input_queue") or {}).items()):
        fetches = int(q.get("fetches") or 0)
        ready = list(q.get("ready") or [])
        if not fetches or not ready:
            continue
        mean = sum(n * count for n, count in enumerate(ready)) / fetches
        lines.append(f"input queue ({name}, {q.get('capacity')} prefetched at most): empty at "
                     f"{fmt_pct(ready[0] / fetches)} of {fetches:,} fetches, "
                     f"{mean:.2g} batches ready on average")
    return lines


def describe_slow(item: SlowIteration) -> str:
    """``iteration 812: 310 ms (8.2x the median): gc gen 2 took 270 ms in backward``."""
    head = f"iteration {item.iteration}: {fmt_ms(item.ms)} ({item.factor:.1f}x the median)"
    if item.cause == "gc":
        gen = f"gc gen {item.generation}" if item.generation is not None else "gc"
        where = f" in {item.phase}" if item.phase and item.phase != "other" else \
            " between phases"
        if item.collections > 1:
            return (f"{head}: {item.collections} collections took {fmt_ms(item.cause_ms)}, the "
                    f"longest {gen} ({fmt_ms(item.longest_ms)}){where}")
        return f"{head}: {gen} took {fmt_ms(item.cause_ms)}{where}"
    if item.cause == "range":
        return f"{head}: {item.name} took {fmt_ms(item.cause_ms)} in {item.phase}"
    if item.cause:
        label = PHASE_LABELS.get(item.cause, item.cause)
        return (f"{head}: {label} took {fmt_ms(item.cause_ms)} (median "
                f"{fmt_ms(item.median_ms)})")
    return f"{head}: every phase a little slower, no single cause"


def _slow_lines(stats: RunStats) -> list[str]:
    slow = slow_iterations(stats)
    if not slow:
        return []
    share = stutter(stats)
    lines = [f"  slowest iterations ({OUTLIER_FACTOR:g}x the median or more: {share.count} of "
             f"{share.sampled} counted, {fmt_pct(share.share)} of the iteration time above "
             "the median)"]
    lines += [f"    {describe_slow(item)}" for item in slow[:TOP_SLOW]]
    return lines


def _gc_lines(stats: RunStats) -> list[str]:
    gc = facts_of(stats).get("gc")
    if not isinstance(gc, dict) or not sum(gc.get("collections") or ()):
        return []
    counts = list(gc.get("collections") or [])
    ms = sum(gc.get("ms") or ())
    per_gen = ", ".join(f"gen {g}: {n}" for g, n in enumerate(counts) if n)
    line = (f"  garbage collection  {sum(counts):,} collections ({per_gen}), {fmt_ms(ms)} "
            f"({fmt_pct(stats.wall_share(ms))} of wall), {sum(gc.get('collected') or ()):,} "
            "objects freed")
    if stats.iterations and stats.gc_total_ms > 0:
        line += (f"; {fmt_ms(stats.gc_total_ms)} inside counted iterations "
                 f"({fmt_pct(stats.gc_total_ms / stats.iteration_total_ms)})")
    return [line]


def _agent_lines(stats: RunStats) -> list[str]:
    lines = []
    over = stats.overhead_ms
    lines.append(f"  agent overhead  ~{fmt_ms(over)} ({fmt_pct(stats.wall_share(over))} of wall)"
                 + (f"; {stats.overhead_method}" if stats.overhead_method else ""))
    lines.append(f"  sync level      {stats.sync_level} ({stats.sync_calls:,} synchronize calls)")
    gpu_in_use = bool(stats.meta.get("devices")) or bool(stats.gpu_phase_ms)
    if gpu_in_use and stats.sync_level >= 3:
        lines.append("  warning: sync level 3 waits for the GPU at every link/function range: the "
                     "GPU can no longer run ahead, so all times are inflated; use it to locate "
                     "hot spots and level 0-2 to measure")
    elif gpu_in_use and stats.sync_level == 2:
        lines.append("  warning: sync level 2 waits for the GPU at every phase boundary: phases "
                     "add up but their overlap is removed, so iteration times are inflated")
    if gpu_in_use and stats.sync_level < 2:
        lines.append("  note: times are host wall time; with GPU arrays and no synchronization at "
                     "phase boundaries they measure kernel launch, not GPU execution "
                     + ("(see the GPU line)" if stats.gpu_phase_ms
                        else "(CHAINER_PROF_SYNC_LEVEL=2 to wait at phase boundaries)"))
    if stats.iterations and stats.iteration_total_ms > 0 and over > 0.05 * stats.wall_ms:
        lines.append(f"  warning: the agent's own overhead is {fmt_pct(stats.wall_share(over))} of "
                     "the run; a coarser CHAINER_PROF_GRANULARITY lowers it")
    path = stats.meta.get("trace_path")
    if path:
        lines.append(f"  trace           {path} ({stats.ranges - stats.dropped_ranges:,} ranges)")
    if stats.dropped_ranges:
        lines.append(f"  note: the trace keeps the newest ranges only: {stats.dropped_ranges:,} "
                     "older ones dropped (CHAINER_PROF_RECORD_LIMIT); the summary covers the "
                     "whole run")
    return lines


def dominant_sentence(stats: RunStats) -> str:
    """One plain sentence saying what dominates."""
    window = unreached(stats)
    if window is not None:
        return (f"nothing was recorded: the capture window {window.start}:{window.stop} was never "
                f"reached; {window.progress()}.")
    if stats.ranges == 0:
        return "nothing was recorded: no Chainer training or inference ran under the agent."
    if stats.iterations == 0:
        if stats.warmup:
            return (f"only {stats.warmup} iterations ran, all of them warm-up: run longer or "
                    "lower CHAINER_PROF_WARMUP to get statistics.")
        biggest = max(stats.outside_ms.items(), key=lambda kv: kv[1], default=None)
        text = "no training iterations were seen"
        if biggest is not None and stats.wall_ms > 0:
            text += (f"; {outside_label(biggest[0])} takes {fmt_pct(stats.wall_share(biggest[1]))}"
                     " of the run")
        return text + "."
    between = {k: v for k, v in stats.outside_ms.items() if k not in _NOT_LOOP}
    loop = stats.iteration_total_ms + sum(between.values())
    in_iterations = stats.iteration_total_ms / loop if loop > 0 else 1.0
    if in_iterations < 0.5 and between:
        key, ms = max(between.items(), key=lambda kv: kv[1])
        return (f"{outside_label(key)} takes {fmt_pct(ms / loop)} of the training loop "
                f"(iterations only {fmt_pct(in_iterations)}).")
    if not stats.has_phases:
        return (f"iterations take {fmt_pct(in_iterations)} of the training loop (no phase "
                "ranges: use granularity phase or finer to see inside them).")
    phase = stats.dominant_phase() or "other"
    return f"{PHASE_WORDS[phase]} takes {fmt_pct(stats.phase_share(phase))} of each iteration."


# -- the verdict and the advice ---------------------------------------------------------

def format_verdict(v: Verdict) -> str:
    """The verdict with its evidence, suggestions and notes."""
    lines = [f"Verdict: {v.title}"]
    lines += [f"  {line}" for line in v.evidence]
    lines += [f"  slow iterations: {line}" for line in v.stutter]
    lines += [f"  -> {line}" for line in v.suggestions]
    if v.also:
        lines.append("  also over threshold: " + "; ".join(v.also))
    lines += [f"  note: {line}" for line in v.notes]
    return "\n".join(lines)


def format_advice(findings: list[Finding]) -> str:
    """The advice block: each finding with what was seen, its cost, the fix and the doc."""
    lines = ["Advice (CHAINER_PROF_ADVICE=0 turns this off):"]
    for f in findings:
        lines.append(f"  [{f.key}] {f.title}")
        lines.append(f"      seen: {f.seen}")
        lines.append(f"      cost: {f.cost}")
        lines.append(f"      fix:  {f.fix}")
        lines.append(f"      doc:  {f.link}")
    return "\n".join(lines)


def verdict_section(stats: RunStats, replay: Any = None) -> str:
    """The verdict and the advice, as printed at the end of the summary."""
    verdict = decide(stats, replay)
    text = format_verdict(verdict)
    findings = check(stats, verdict)
    if findings:
        text += "\n\n" + format_advice(findings)
    return text
