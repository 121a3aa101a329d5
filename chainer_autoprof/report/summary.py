"""The time summary: a :class:`~..analysis.stats.RunStats` as plain text (at exit, ``report``).

:func:`format_summary` builds the core block (iterations, phases, time
outside iterations, links, overhead, notes) and then appends, in order:

* the bottleneck verdict and the advice (:func:`verdict_section`), when
  ``advice`` is on;
* every callable in :data:`SECTIONS` (``stats -> str | None``), the
  extension point for further sections;
* one plain sentence saying what dominates (:func:`dominant_sentence`).

A section that raises is left out (with a one-line note): the summary never
fails the program (under the tests it raises: :func:`..common.log.contained`).
The figures and findings come from :mod:`..analysis`, computed once
(:class:`~..analysis.findings.Findings`); only their wording lives here, every
figure through :mod:`..common.figures`.

On a GPU at sync level 1 and above, the agent's own waits for the GPU are a
row of their own (between phases: at an iteration's end, at a phase's start)
and an "of which" row under each phase that holds some, so the rest of the
iteration is the host's own time; waits of a trace that did not record them
are estimated from the run's total and marked ``~``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..analysis.finding import Finding
from ..analysis.findings import Findings, find
from ..analysis.gpu_evidence import Waits
from ..analysis.gpu_record import GpuActivity, GpuFigures
from ..analysis.outliers import OUTLIER_FACTOR, SlowIteration
from ..analysis.stats import (
    AFTER_WINDOW,
    AGENT_OWN,
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
from ..analysis.verdict import Verdict
from ..common import figures, log, names
from ..common.one_line import one_line
from ..common.wording import counted, joined, leaders
from . import whatif_view
from .stall import ended_abnormally

if TYPE_CHECKING:
    from ..analysis.stats import RunStats

#: Extra summary sections: ``stats -> text or None``, appended in order.
SECTIONS: list[Callable[[RunStats], str | None]] = []

#: How many links the summary lists.
TOP_LINKS = 10
#: How many slow iterations the summary lists.
TOP_SLOW = 5
#: How many kernels the summary lists (GPU activity).
TOP_KERNELS = 5

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

#: The agent's own waits for the GPU, between phases (their own row) and inside a phase;
#: without a GPU in use, the synchronize calls' own time (next to nothing, but for a stand-in).
WAIT_LABEL = "waiting for the GPU (agent's sync)"
WAIT_INSIDE_LABEL = "of which waiting for the GPU"
SYNC_LABEL = "the agent's synchronize calls"
SYNC_INSIDE_LABEL = "of which the agent's synchronize"
#: Communication inside the counted iterations (in the phases above: the update's all-reduce).
COMM_LABEL = "of those, communication (comm:*)"

OUTSIDE_LABELS = {
    "wait for GPU": "waiting for the GPU (agent's sync)",
    STARTUP: "start-up (before the first iteration)",
    BEFORE_WINDOW: "before the capture window",
    WARMUP: "warm-up iterations",
    IDLE: "idle (between iterations, no range)",
    SHUTDOWN: "after the last iteration",
    UNFINISHED: "unfinished (the run did not end)",
    AFTER_WINDOW: "after the capture window",
    AGENT_OWN: "the agent's own work (overhead)",
}

#: Outside-iteration keys that are not part of the training loop.
_NOT_LOOP = (STARTUP, BEFORE_WINDOW, WARMUP, SHUTDOWN, AFTER_WINDOW, UNFINISHED, AGENT_OWN)

_OUTSIDE_ORDER = {STARTUP: 0, BEFORE_WINDOW: 0, WARMUP: 1, IDLE: 8, SHUTDOWN: 9, AFTER_WINDOW: 9,
                  UNFINISHED: 9}


def fmt_ms(ms: float) -> str:
    """A duration for people: ``0.123 ms``, ``12.3 ms``, ``2.43 s``, ``1.2 min``."""
    return figures.ms(ms)


def fmt_pct(share: float) -> str:
    return figures.pct(share)


def outside_label(key: str) -> str:
    return OUTSIDE_LABELS.get(key, key)


def _outside_items(stats: RunStats) -> list[tuple[str, float]]:
    return sorted(stats.outside_ms.items(),
                  key=lambda kv: (_OUTSIDE_ORDER.get(kv[0], 5), -kv[1], kv[0]))


def format_summary(run: Findings | RunStats, advice: bool = True,
                   title: str | None = None) -> str:
    """The whole summary block (no trailing newline) of a run's findings (a RunStats: its
    findings computed first, once, :func:`~..analysis.findings.find`)."""
    f = run if isinstance(run, Findings) else find(run, advice=advice)
    stats = f.stats
    lines = [title or _title(stats)]
    lines += ended_abnormally(stats.meta)
    lines += _iteration_lines(f)
    lines += _time_table(f)
    lines += _gpu_lines(f)
    lines += _slow_lines(f)
    lines += _link_lines(f)
    lines += _gc_lines(f)
    lines += _figure_lines(f)
    lines += _agent_lines(f)
    if advice:
        lines += verdict_section(f).split("\n")
    for section in SECTIONS:
        try:
            text = section(stats)
        except Exception as exc:  # our bug: the rest of the summary stands  # noqa: BLE001
            text = "  (" + log.contained(getattr(section, "__qualname__", "section"), exc) + ")"
        if text:
            lines += text.rstrip("\n").split("\n")
    lines.append("  => " + dominant_sentence(f))
    return "\n".join(lines)


def _title(stats: RunStats) -> str:
    meta = stats.meta
    where = f"pid {meta.get('pid', '?')}"
    mpi_rank = (meta.get("process") or {}).get("mpi_rank")
    if mpi_rank is not None:  # rank 0 included; nothing outside an MPI job
        where += f", rank {mpi_rank}"
    command = one_line(str(meta.get("command", "")))  # a trace from elsewhere may hold a newline
    return f"chainer_autoprof summary ({where}): {command}".rstrip(": ")


def _iteration_lines(f: Findings) -> list[str]:
    stats = f.stats
    warm_setting = (stats.meta.get("settings") or {}).get("warmup")
    warm = f"{stats.warmup} warm-up excluded"
    if warm_setting is not None:
        warm += f" (CHAINER_PROF_WARMUP={warm_setting})"
    lines = [f"  iterations      {stats.iterations} counted, {warm}"]
    window = f.window
    if window is not None:
        lines.append(f"  capture window  {window.start}:{window.stop} never reached: "
                     f"{window.progress()}; {window.setting()}")
    if stats.other_thread_iterations:
        lines.append(f"                  (the loop thread's; {stats.other_thread_iterations} more "
                     "on other threads are not in these figures)")
    if not stats.iterations:
        return lines
    rate = f"{figures.fixed(stats.iterations_per_second())} it/s"
    sps = stats.samples_per_second()
    if sps is not None:
        rate += f", {figures.count(round(sps))} samples/s ({stats.samples_text()})"
    lines.append(f"  iteration time  median {fmt_ms(stats.median())}, p95 {fmt_ms(stats.p95())}; "
                 + rate)
    if stats.sample_stride > 1:
        lines.append(f"                  (median/p95 over a uniform sample: 1 in "
                     f"{stats.sample_stride} iterations; totals exact)")
    return lines


def _row(label: str, total: str, iter_share: str, wall_share: str, med: str) -> str:
    return f"    {label:<42} {total:>10} {iter_share:>7} {wall_share:>7} {med:>11}"


def _time_table(f: Findings) -> list[str]:
    stats = f.stats
    lines = ["  " + f"{'time':<44} {'total':>10} {'% iter':>7} {'% wall':>7} {'median/iter':>11}"]
    if stats.iterations:
        lines.append("    in iterations:")
        waited = f.waits
        if stats.has_phases:
            for key in PHASE_KEYS:
                lines += _phase_rows(f, key, waited)
                if key == "data":
                    lines += [f"        {line}" for line in queue_lines(f)]
        else:
            lines.append("      (no phase ranges: granularity iteration)")
            lines += _wait_rows(f, waited, "other")
        lines += _comm_rows(f)
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
    if any("~" in line for line in lines[1:]):
        lines.append("    (~ estimated: the agent's waits were not recorded where they happened; "
                     "they come from the run's total wait)")
    return lines


def _comm_rows(f: Findings) -> list[str]:
    """Communication (ChainerMN's ``comm:*``) inside the phases above, a row of its own."""
    stats, total = f.stats, f.comm_ms
    if total <= 0:
        return []
    share = total / stats.iteration_total_ms if stats.iteration_total_ms > 0 else 0.0
    return [_row("  " + COMM_LABEL, fmt_ms(total), fmt_pct(share),
                 fmt_pct(stats.wall_share(total)), fmt_ms(median(stats.comm_ms)))]


def _phase_rows(f: Findings, key: str, waited: Waits) -> list[str]:
    """A phase's row; with the agent's waits in it, an "of which" row (inside a phase) or,
    for the rest of the iteration, a row of their own and the rest without them."""
    stats = f.stats
    total = stats.phase_total(key)
    med = stats.phase_median(key)
    if key != "other":
        row = _row("  " + PHASE_LABELS[key], fmt_ms(total), fmt_pct(stats.phase_share(key)),
                   fmt_pct(stats.wall_share(total)), fmt_ms(med))
        if waited.source == "recorded":
            return [row, *_wait_rows(f, waited, key, inside=True)]
        return [row]
    lines = _wait_rows(f, waited, "other")
    if waited.source == "estimated" and stats.sync_level >= 2:
        lines += _wait_rows(f, waited, None, inside=True)
    in_rest = waited.by_key.get("other", 0.0)
    if in_rest > 0:
        total = max(0.0, total - in_rest)
        series = stats.wait_phase_ms.get("other", []) if waited.source == "recorded" else []
        values = stats.phase_ms.get("other", [])
        if len(series) == len(values) and series:
            med = median([v - w for v, w in zip(values, series)])
        else:
            med = max(0.0, med - in_rest / stats.iterations)
    mark = "~" if in_rest > 0 and waited.source == "estimated" else ""
    lines.append(_row("  " + PHASE_LABELS["other"], mark + fmt_ms(total),
                      mark + fmt_pct(total / stats.iteration_total_ms
                                     if stats.iteration_total_ms > 0 else 0.0),
                      mark + fmt_pct(stats.wall_share(total)), mark + fmt_ms(med)))
    return lines


def _wait_rows(f: Findings, waited: Waits, key: str | None,
               inside: bool = False) -> list[str]:
    """The agent's waits for the GPU in ``key`` (``None``: all of them, estimated inside the
    phases), as a row of their own or an "of which" row."""
    stats = f.stats
    total = waited.total_ms if key is None else waited.by_key.get(key, 0.0)
    if total <= 0:
        return []
    estimated = waited.source == "estimated"
    mark = "~" if estimated else ""
    series = [] if estimated or key is None else stats.wait_phase_ms.get(key, [])
    med = fmt_ms(median(series)) if series else mark + fmt_ms(total / stats.iterations)
    gpu = f.on_gpu
    if inside and key is not None:
        label = "    " + (WAIT_INSIDE_LABEL if gpu else SYNC_INSIDE_LABEL)
    elif inside:
        label = "  in the phases: " + ("waiting for the GPU" if gpu else "synchronize calls")
    else:
        label = "  " + (WAIT_LABEL if gpu else SYNC_LABEL)
    share = total / stats.iteration_total_ms if stats.iteration_total_ms > 0 else 0.0
    return [_row(label, mark + fmt_ms(total), mark + fmt_pct(share),
                 mark + fmt_pct(stats.wall_share(total)), med)]


def activity(stats: RunStats) -> GpuActivity | None:
    """The run's GPU activity figures (CUPTI), when it has counted iterations of them."""
    fig = stats.gpu_activity
    return fig if fig is not None and fig.iterations else None


#: What each idle cause of the GPU is, in the summary's words.
IDLE_LABELS = {"host": "waiting for the host to launch", "copies": "waiting for copies",
               "between iterations": "between iterations", "launch": "launch latency",
               "other": "other (launched, waiting on a dependency)"}


def _activity_lines(stats: RunStats, fig: GpuFigures) -> list[str]:
    """The GPU's own time (CUPTI kernel activity): busy and idle per iteration, and how the
    idle time splits; the GPU time launched in each phase."""
    n = fig.iterations
    busy = fig.iteration_ms.get("busy") or []
    span = fig.iteration_ms.get("span") or []
    idle = [s - b for s, b in zip(span, busy)]
    lines = [f"  GPU activity    CUPTI kernel activity over {n} counted iterations: busy "
             f"{figures.pct(fig.busy_share or 0.0)} of the GPU's time; per iteration busy "
             f"{fmt_ms(median(busy))}, idle {fmt_ms(median(idle))} (medians)"]
    whole_idle = sum(fig.idle_ms.values())
    if whole_idle > 0:
        lines.append("                  idle, by cause (per iteration): " + ", ".join(
            f"{IDLE_LABELS.get(k, k)} {fmt_ms(v / n)} ({figures.pct(v / fig.span_ms)})"
            for k, v in fig.idle_ms.items() if v > 0))
    per_phase = [(k, fig.phases.get(k)) for k in PHASE_KEYS]
    shown = [(k, p) for k, p in per_phase if p and (p["kernels"] or p["copy_ms"])]
    if shown:
        lines.append("                  GPU time by phase launched in (per iteration): "
                     + ", ".join(f"{PHASE_LABELS[k]} {fmt_ms((p['kernel_ms'] + p['copy_ms']) / n)}"
                                 for k, p in shown))
    outside = fig.warmup_kernel_ms + fig.outside_kernel_ms
    if outside > 0:
        lines.append(f"                  (kernels outside the counted iterations: warm-up "
                     f"{fmt_ms(fig.warmup_kernel_ms)}, outside iterations "
                     f"{fmt_ms(fig.outside_kernel_ms)})")
    for note in stats.gpu_activity.notes if stats.gpu_activity is not None else []:
        lines.append(f"                  note: {note}")
    return lines


def _kernel_lines(fig: GpuFigures) -> list[str]:
    """The kernels with the most GPU time, each with the link that launched it."""
    if not fig.top_kernels:
        return []
    n = fig.iterations
    lines = ["  top kernels by GPU time (per counted iteration; the link whose range launched "
             "each)",
             f"    {'kernel':<50} {'GPU time':>10} {'calls':>7}  link"]
    for k in fig.top_kernels[:TOP_KERNELS]:
        name = k["name"] if len(k["name"]) <= 50 else k["name"][:47] + "..."
        link = names.link_range_text(k["link"], k["backward"]) if k["link"] else "-"
        lines.append(f"    {name:<50} {fmt_ms(k['ms'] / n):>10} "
                     f"{figures.num(k['calls'] / n, grouping=False):>7}  {link}")
    return lines


def _gpu_lines(f: Findings) -> list[str]:
    stats = f.stats
    gpu = stats.gpu_phase_ms
    lines = []
    if gpu:
        parts = [f"{key} {fmt_ms(median(values))}" for key, values in gpu.items() if values]
        n = len(gpu.get("iteration", []))
        lines.append(f"  GPU time (CUDA events, median per iteration over {n}): "
                     + ", ".join(parts))
    if "gpu" in f.errors:
        return [*lines, "  (" + f.errors["gpu"] + ")"]
    ev = f.gpu
    if ev is not None and ev.busy_share is not None and not ev.busy_exact:
        behind = ", ".join(p.phase for p in ev.behind)  # measured: the activity's line
        lines.append(f"  GPU busy        {f.busy}"
                     + (f"; the GPU ran behind the host in {behind}" if behind else ""))
    fig = f.activity
    if fig is not None:
        lines += _activity_lines(stats, fig)
    return lines


def _link_lines(f: Findings) -> list[str]:
    stats, fig = f.stats, f.activity
    if fig is not None and fig.links:
        return _gpu_link_lines(stats, fig) + _kernel_lines(fig)
    if fig is not None:  # GPU activity without link ranges: the kernels still say a lot
        return _host_link_lines(stats) + _kernel_lines(fig)
    return _host_link_lines(stats)


def _host_link_lines(stats: RunStats) -> list[str]:
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


def _gpu_link_lines(stats: RunStats, fig: GpuFigures) -> list[str]:
    """The top links by GPU time (CUPTI kernel activity), the host's times beside."""
    n = fig.iterations
    host = {link.name: link for link in stats.links}
    lines = ["  top links by GPU time (CUPTI kernel activity, per counted iteration: the kernels "
             "launched in each link's own forward range and in its backward range; host "
             "times beside)",
             f"    {'link':<40} {'GPU fwd':>9} {'kernels':>7} {'GPU bwd':>9} {'kernels':>7} "
             f"{'host fwd':>9} {'host bwd':>9}"]
    for x in fig.links[:TOP_LINKS]:
        name = x["name"] if len(x["name"]) <= 40 else "..." + x["name"][-37:]
        h = host.get(x["name"])
        hf = fmt_ms(h.self_ms / stats.iterations) if h and stats.iterations else "-"
        hb = fmt_ms(h.bwd_ms / stats.iterations) if h and stats.iterations else "-"
        lines.append(f"    {name:<40} {fmt_ms(x['fwd_ms'] / n):>9} "
                     f"{figures.num(x['fwd_kernels'] / n, grouping=False):>7} "
                     f"{fmt_ms(x['bwd_ms'] / n):>9} "
                     f"{figures.num(x['bwd_kernels'] / n, grouping=False):>7} {hf:>9} {hb:>9}")
    if len(fig.links) > TOP_LINKS:
        lines.append(f"    ... {len(fig.links) - TOP_LINKS} more links")
    return lines


def queue_lines(f: Findings) -> list[str]:
    """The input queue of each prefetching iterator: how often it was empty when asked."""
    lines = []
    for name, q in sorted((f.facts.get("input_queue") or {}).items()):
        fetches = int(q.get("fetches") or 0)
        ready = list(q.get("ready") or [])
        if not fetches or not ready:
            continue
        mean = sum(n * count for n, count in enumerate(ready)) / fetches
        lines.append(f"input queue ({name}, {q.get('capacity')} prefetched at most): empty at "
                     f"{fmt_pct(ready[0] / fetches)} of {figures.count(fetches)} fetches, "
                     f"{figures.num(mean, 2)} batches ready on average")
    return lines


def describe_slow(item: SlowIteration) -> str:
    """``iteration 812: 310 ms (8.2x the median): gc gen 2 took 270 ms in backward``."""
    head = (f"iteration {item.iteration}: {fmt_ms(item.ms)} ({figures.factor(item.factor)} "
            "the median)")
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


def _slow_lines(f: Findings) -> list[str]:
    slow, share = f.slow, f.stutter
    if not slow or share is None:
        return []
    lines = [f"  slowest iterations ({figures.num(OUTLIER_FACTOR)}x the median or more: "
             f"{share.count} of {share.sampled} counted, {fmt_pct(share.share)} of the "
             "iteration time above the median)"]
    lines += [f"    {describe_slow(item)}" for item in slow[:TOP_SLOW]]
    return lines


def _gc_lines(f: Findings) -> list[str]:
    stats = f.stats
    gc = f.facts.get("gc")
    if not isinstance(gc, dict) or not sum(gc.get("collections") or ()):
        return []
    counts = list(gc.get("collections") or [])
    ms = sum(gc.get("ms") or ())
    per_gen = ", ".join(f"gen {g}: {n}" for g, n in enumerate(counts) if n)
    line = (f"  garbage collection  {figures.count(sum(counts))} collections ({per_gen}), "
            f"{fmt_ms(ms)} ({fmt_pct(stats.wall_share(ms))} of wall), "
            f"{figures.count(sum(gc.get('collected') or ()))} "
            "objects freed")
    if stats.iterations and stats.gc_total_ms > 0:
        line += (f"; {fmt_ms(stats.gc_total_ms)} inside counted iterations "
                 f"({fmt_pct(stats.gc_total_ms / stats.iteration_total_ms)})")
    return [line]


def figure_lines(f: Findings) -> dict[str, list[str]]:
    """Each figure read at each iteration's end (:mod:`..analysis.iteration_figures`), by
    name: each series' median and peak, then what the analysis says of it (a leak, a pool
    that caches)."""
    out = {}
    for judged in f.figures:
        text = judged.figure.unit.text
        rows = [f"{r.label} median {text(r.median)}, peak {text(r.peak)} (iteration "
                f"{r.peak_iteration})" for r in judged.rows] + judged.notes
        out[judged.figure.name] = rows
    return out


def _figure_lines(f: Findings) -> list[str]:
    lines = []
    for name, rows in figure_lines(f).items():
        lines.append(f"  {name:<16}at iteration ends: {rows[0]}")
        lines += ["                  " + row for row in rows[1:]]
    return lines


def _gpu_analysis_lines(gpu: GpuActivity | None) -> list[str]:
    """What attributing and summing CUPTI's records cost the agent's CPU (not in the
    overhead above: it runs on a thread of its own, beside the training)."""
    cpu_us = gpu.collector.get("analysis_cpu_us", 0) if gpu is not None else 0
    ops = sum(gpu.ops.values()) if gpu is not None else 0
    if gpu is None or not cpu_us or not ops:
        return []
    return [f"  GPU analysis    {fmt_ms(cpu_us / 1000)} CPU for {figures.count(ops)} GPU "
            f"operations ({cpu_us / ops:.2f} us each), on a thread of its own"]


def _agent_lines(f: Findings) -> list[str]:
    stats = f.stats
    lines = []
    over = stats.overhead_ms
    lines.append(f"  agent overhead  ~{fmt_ms(over)} ({fmt_pct(stats.wall_share(over))} of wall)"
                 + (f"; {stats.overhead_method}" if stats.overhead_method else ""))
    lines += _gpu_analysis_lines(stats.gpu_activity)
    line = (f"  sync level      {stats.sync_level} "
            f"({counted(figures.count(stats.sync_calls), 'synchronize call')})")
    waited = f.waits
    if waited.total_ms > 0 and stats.iterations:
        mark = "~" if waited.source == "estimated" else ""
        line += (f"; the agent waited {mark}{fmt_ms(waited.total_ms / stats.iterations)} per "
                 f"counted iteration{' for the GPU' if f.on_gpu else ''} ({mark}"
                 f"{fmt_pct(waited.total_ms / stats.iteration_total_ms)})")
        if f.on_gpu:
            ev = f.gpu
            if ev is None and "gpu" in f.errors:
                line += " (" + f.errors["gpu"] + ")"
            elif ev is not None and ev.sync_cost_ms is not None:
                line += (f", costing {'up to' if ev.sync_cost_bound else 'about'} "
                         f"{fmt_ms(ev.sync_cost_ms)} of overlap per iteration (the "
                         "agent's overhead)")
    lines.append(line)
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
        kept = figures.count(stats.ranges - stats.dropped_ranges)
        lines.append(f"  trace           {path} ({kept} ranges)")
    if stats.dropped_ranges:
        lines.append("  note: the trace keeps the newest ranges only: "
                     f"{figures.count(stats.dropped_ranges)} "
                     "older ones dropped (CHAINER_PROF_RECORD_LIMIT); the summary covers the "
                     "whole run")
    return lines


#: The verdict of a run whose host and GPU are both saturated (analysis/verdict.py).
BOTH_KIND = "host- and GPU-bound"


def dominant_sentence(f: Findings) -> str:
    """One plain sentence saying what dominates."""
    stats = f.stats
    window = f.window
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
    if f.on_gpu:
        sentence = _gpu_sentence(f)
        if sentence:
            return sentence
    waited = f.waits
    if waited.total_ms > 0:  # the host's own time: the agent's waits left out
        own = {k: max(0.0, stats.phase_total(k) - waited.by_key.get(k, 0.0)) for k in PHASE_KEYS}
        phase = max(PHASE_KEYS, key=lambda k: own[k])
        share = own[phase] / stats.iteration_total_ms if stats.iteration_total_ms > 0 else 0.0
        what = "waits for the GPU" if f.on_gpu else "synchronize calls"
        tied = leaders({k: own[k] / stats.iteration_total_ms if stats.iteration_total_ms > 0
                        else 0.0 for k in PHASE_KEYS}, fmt_pct)
        words = (f"{joined([PHASE_WORDS[k] for k in tied])} take" if len(tied) > 1
                 else f"{PHASE_WORDS[phase]} takes")
        each = " each" if len(tied) > 1 else ""
        return (f"{words} {fmt_pct(share)} of each iteration{each} (the agent's "
                f"{what}, {fmt_pct(waited.total_ms / stats.iteration_total_ms)}, left out).")
    if f.comm_sentence is not None:
        return f.comm_sentence
    phase = stats.dominant_phase() or "other"
    keys = PHASE_KEYS if stats.has_phases else ("other",)
    tied = leaders({k: stats.phase_share(k) for k in keys}, fmt_pct)
    if len(tied) > 1:  # as printed, a tie: both said, not the first in the order of phases
        return (f"{joined([PHASE_WORDS[k] for k in tied])} take "
                f"{fmt_pct(stats.phase_share(phase))} of each iteration each.")
    return f"{PHASE_WORDS[phase]} takes {fmt_pct(stats.phase_share(phase))} of each iteration."


def _gpu_sentence(f: Findings) -> str | None:
    """On a GPU that sets the pace: the phase (with GPU activity: and the link) with the most
    GPU time; where host and GPU both do, both (as the verdict says)."""
    ev, fig = f.gpu, f.activity
    verdict = f.verdict
    if verdict is not None and verdict.kind == BOTH_KIND:
        host = verdict.figures.get("host_busy_share")
        busy = verdict.gpu.busy_share if verdict.gpu is not None else None
        first = verdict.title.rsplit("; ", 1)[-1] if verdict.title.endswith("pays off first") \
            else "see the what-if lines for which change pays off first"
        return ("the host and the GPU both set the pace"
                + (f" (the GPU busy {figures.pct(busy)}, the host's own work "
                   f"{figures.pct(host)} of each iteration)" if busy is not None and host
                   else "") + f": {first}.")
    if ev is None:
        return None
    if ev.limit == "gpu" and fig is not None:
        n = fig.iterations
        launched = {k: float(p["kernel_ms"]) for k, p in fig.phases.items()}
        phase = max(PHASE_KEYS, key=lambda k: launched.get(k, 0.0))
        phase_ms = launched.get(phase, 0.0) / n
        span = fig.span_ms / n
        tied = leaders({k: launched.get(k, 0.0) / n for k in PHASE_KEYS}, fmt_ms)
        most = (f"{joined([PHASE_WORDS[k] for k in tied])} launch the most GPU time, "
                f"{fmt_ms(phase_ms)} each" if len(tied) > 1 else
                f"{PHASE_WORDS[phase]} launches the most GPU time, {fmt_ms(phase_ms)}")
        text = (f"the GPU sets the pace (busy {figures.pct(fig.busy_share or 0.0)}); "
                f"{most} of a "
                f"{fmt_ms(span)} GPU iteration")
        if fig.links:
            top_link = fig.links[0]
            text += (f", the most of it {top_link['name']} "
                     f"({fmt_ms((top_link['fwd_ms'] + top_link['bwd_ms']) / n)})")
        return text + "."
    top = ev.top_phase() if ev.limit == "gpu" else None
    if top is None:
        return None
    top_ms = ev.gpu_time(top) or 0.0
    whole = ev.gpu_iteration_ms or ev.host_iteration_ms
    return (f"the GPU sets the pace; {PHASE_WORDS[top.phase]} takes the most GPU time, "
            f"{fmt_ms(top_ms)} of a {fmt_ms(whole)} iteration "
            f"({fmt_pct(top_ms / whole if whole > 0 else 0.0)}).")


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


def verdict_section(run: Findings | RunStats, replay: RunStats | None = None) -> str:
    """The verdict, the what-if predictions and the advice, as printed at the end of the
    summary (a RunStats: its findings computed first, with ``replay``)."""
    f = run if isinstance(run, Findings) else find(run, replay)
    if f.verdict is None:
        return "  (" + f.errors.get("verdict", "no verdict was asked for") + ")"
    text = format_verdict(f.verdict)
    levers = whatif_view.summary_text(f.whatif)
    if levers:
        text += "\n" + levers
    if f.advice:
        text += "\n\n" + format_advice(f.advice)
    return text
