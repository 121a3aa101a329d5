"""One self-contained HTML page for a recorded run (``report TRACE --html out.html``).

Everything is inline -- CSS, SVG drawn here, a few lines of JavaScript for
tooltips and table sorting -- and a Content-Security-Policy forbids loading
anything, so the page opens offline and never reaches the network.  Sections:
the run's key figures, the verdict and the advice, on a GPU the GPU's phase
times beside the host's (CUDA events, the agent's waits, the busy share),
where the wall time went, a stacked bar of phase times per iteration across
the run (warm-up shaded; the agent's waits for the GPU a segment of their
own), the median iteration drawn as a timeline (with a GPU row and the
agent's waits as labelled segments), and the top links.  Every figure goes
through :mod:`..common.figures`.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ..analysis.gpu_evidence import GpuEvidence
from ..analysis.stats import PHASE_KEYS, percentile
from ..analysis.verdict import Verdict
from ..common import figures, names
from ..common.one_line import write
from ..common.outputs import atomic_text
from ..common.readable import hint_form, launched
from . import whatif_view
from .html_table import drop_empty_columns
from .stall import ended_abnormally
from .summary import IDLE_LABELS, describe_slow, figure_lines

if TYPE_CHECKING:
    from ..analysis.finding import Finding
    from ..analysis.findings import Findings
    from ..analysis.stats import RunStats
    from .tracefile import Trace

#: Bars drawn at most in the per-iteration chart (more iterations are averaged in bins).
MAX_BARS = 600
#: Timeline rows drawn at most (deeper ranges are left out).
MAX_ROWS = 10
#: Links listed in the table.
TABLE_LINKS = 15
CHART_WIDTH = 1100
OTHER_COLOR = "#b8b8b8"
GPU_ROW_COLOR = "#2e7d32"
#: The GPU's idle time by cause (GPU activity).
IDLE_COLORS = {"host": "#3d85c6", "copies": "#a05dd6", "between iterations": "#cfcfcf",
               "launch": "#f0a050", "other": "#e0c060"}
#: The per-iteration key of the agent's waits for the GPU (taken out of the phase they lay in).
WAIT = "wait"
OUTSIDE_COLORS = {"iterations": "#76b900", "warm-up": "#d8e8b0", "startup": "#9e9e9e",
                  "idle": "#e0e0e0", "shutdown": "#cfcfcf", "before window": "#9e9e9e",
                  "after window": "#cfcfcf", "inference": "#3d85c6"}

#: What the per-iteration chart calls its keys.
_KEY_LABELS = {WAIT: "waiting for the GPU (agent)", "other": "rest of iteration"}

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")


def css_color(category: str) -> str:
    """The NVTX colour of ``category`` as ``#rrggbb``."""
    if category == "other":
        return OTHER_COLOR
    if category == WAIT:
        category = names.GPU_WAIT
    argb = names.CATEGORIES.get(category, (0, 0xFF888888))[1]
    return f"#{argb & 0xFFFFFF:06x}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ms(x: float) -> str:
    return figures.ms(x)


# -- per-iteration rows from the trace --------------------------------------------------

@dataclass
class IterationRow:
    """One iteration read from the trace: when, how long, its phases (ms)."""

    number: int
    t0: int
    t1: int
    depth: int
    warm: bool
    phases: dict[str, float] = field(default_factory=dict)
    #: The agent's wait was not recorded but estimated (sync level 1: the iteration's tail).
    wait_estimated: bool = False

    @property
    def ms(self) -> float:
        return (self.t1 - self.t0) / 1e6


def loop_tid(trace: Trace) -> int | None:
    """The thread with the most iteration ranges."""
    counts: dict[int, int] = {}
    for r in trace.ranges:
        if r.category == names.ITERATION:
            counts[r.tid] = counts.get(r.tid, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda tid: counts[tid])


def iteration_rows(trace: Trace) -> list[IterationRow]:
    """The loop thread's iterations in time order, each with its phase times."""
    tid = loop_tid(trace)
    if tid is None:
        return []
    mine = sorted((r for r in trace.ranges if r.tid == tid), key=lambda r: (r.t0, r.depth))
    warm_skip = 0 if trace.meta.get("dropped_ranges") else int(trace.meta.get("warmup_skip", 0))
    rows: list[IterationRow] = []
    current: IterationRow | None = None
    waited: dict[int, dict[str, float]] = {}  # row -> the agent's waits per phase key
    ends: dict[int, int] = {}  # row -> the end of its last phase
    for r in mine:
        if r.category == names.ITERATION:
            number = r.iteration if r.iteration is not None else len(rows)
            current = IterationRow(number, r.t0, r.t1, r.depth, len(rows) < warm_skip)
            rows.append(current)
        elif current is None or r.t0 < current.t0 or r.t1 > current.t1:
            continue
        elif r.category in names.PHASES:
            current.phases[r.category] = current.phases.get(r.category, 0.0) + (r.t1 - r.t0) / 1e6
            ends[len(rows) - 1] = max(ends.get(len(rows) - 1, r.t1), r.t1)
        elif r.category == names.GPU_WAIT:
            place = names.gpu_wait_place(r.name)
            key = place if place in names.PHASES else "other"
            mine_w = waited.setdefault(len(rows) - 1, {})
            mine_w[key] = mine_w.get(key, 0.0) + (r.t1 - r.t0) / 1e6
    estimate = not waited and _waits_at_iteration_end(trace)
    for i, row in enumerate(rows):
        row.phases["other"] = max(0.0, row.ms - sum(row.phases.get(k, 0.0)
                                                    for k in names.PHASES))
        waits = waited.get(i, {})
        if estimate and i in ends:  # sync level 1: the tail after the last phase is the wait
            waits = {"other": min(row.phases["other"], (row.t1 - ends[i]) / 1e6)}
            row.wait_estimated = True
        for key, ms in waits.items():
            row.phases[key] = max(0.0, row.phases.get(key, 0.0) - ms)
        if waits:
            row.phases[WAIT] = sum(waits.values())
    return rows


def _waits_at_iteration_end(trace: Trace) -> bool:
    """A GPU run at sync level 1 whose trace did not record the agent's waits: each one is the
    tail of its iteration, after the last phase (estimated so)."""
    meta = trace.meta or {}
    facts = meta.get("facts")
    params = facts.get("params") if isinstance(facts, dict) else None
    gpu = bool(meta.get("devices")) or bool((params or {}).get("gpu"))
    return gpu and meta.get("sync_level") == 1


# -- SVG pieces ---------------------------------------------------------------------------

def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">'
            + "".join(body) + "</svg>")


def _tip(text: str) -> str:
    return f' data-tip="{_e(text)}"'


def phase_chart(rows: Sequence[IterationRow]) -> str:
    """Stacked bars: phase times of every iteration (binned past :data:`MAX_BARS`)."""
    if not rows:
        return '<p class="empty">No iteration ranges in this trace.</p>'
    has_wait = any(WAIT in r.phases for r in rows)
    keys = (*names.PHASES, WAIT, "other") if has_wait else (*names.PHASES, "other")
    bins: list[tuple[int, int, bool, dict[str, float], float]] = []
    per = max(1, -(-len(rows) // MAX_BARS))
    for start in range(0, len(rows), per):
        chunk = rows[start:start + per]
        n = len(chunk)
        mean = {k: sum(r.phases.get(k, 0.0) for r in chunk) / n for k in keys}
        bins.append((chunk[0].number, chunk[-1].number, all(r.warm for r in chunk), mean,
                     sum(r.ms for r in chunk) / n))
    totals = [b[4] for b in bins]
    counted = [b[4] for b in bins if not b[2]] or totals
    top = max(percentile(counted, 99.0) * 1.15, percentile(counted, 50.0) * 1.5, 1e-6)
    top = min(top, max(totals))
    left, bottom, height = 60, 30, 300
    width = CHART_WIDTH
    plot_w = width - left - 10
    bar_w = plot_w / len(bins)
    body = [f'<rect x="{left}" y="10" width="{plot_w}" height="{height}" class="plot"/>']
    for i in range(5):
        value = top * i / 4
        y = 10 + height - height * i / 4
        body.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" '
                    'class="grid"/>')
        body.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="axis" '
                    f'text-anchor="end">{_e(_ms(value))}</text>')
    for i, (first, last, warm, mean, total) in enumerate(bins):
        x = left + i * bar_w
        label = f"iteration {first}" if first == last else f"iterations {first}-{last} (mean)"
        tip = (f"{label}{' (warm-up)' if warm else ''}: {_ms(total)}; "
               + ", ".join(f"{_KEY_LABELS.get(k, k)} {_ms(mean[k])}" for k in keys
                           if mean[k] > 0))
        if warm:
            body.append(f'<rect x="{x:.2f}" y="10" width="{bar_w:.2f}" height="{height}" '
                        'class="warm"/>')
        y = 10 + height
        clipped = False
        for k in keys:
            h = height * mean[k] / top
            if y - h < 10:
                h = y - 10
                clipped = True
            if h <= 0:
                continue
            y -= h
            body.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(bar_w - 0.3, 0.6):.2f}" '
                        f'height="{h:.2f}" fill="{css_color(k)}" class="bar"{_tip(tip)}/>')
        if clipped:
            body.append(f'<path d="M{x:.2f},18 l{bar_w / 2:.2f},-8 l{bar_w / 2:.2f},8 z" '
                        f'class="clip"{_tip(tip)}/>')
    span = f"{bins[0][0]}" if len(bins) == 1 else f"{bins[0][0]} to {bins[-1][1]}"
    body.append(f'<text x="{left + plot_w / 2:.0f}" y="{height + bottom + 2}" class="axis" '
                f'text-anchor="middle">iterations {span}'
                + (f" ({per} per bar)" if per > 1 else "") + "</text>")
    legend = "".join(f'<span class="key"><i style="background:{css_color(k)}"></i>'
                     f'{_e(_KEY_LABELS.get(k, k))}</span>' for k in keys)
    legend += '<span class="key"><i class="warmkey"></i>warm-up</span>'
    legend += '<span class="key">&#9650; clipped (hover for the value)</span>'
    return (_svg(width, height + bottom + 12, body, "phase times per iteration")
            + f'<div class="legend">{legend}</div>')


@dataclass
class _Span:
    """A segment drawn in the timeline: a recorded range, or one the page adds."""

    name: str
    category: str
    t0: int
    t1: int
    row: int
    note: str = ""


def timeline(trace: Trace, rows: Sequence[IterationRow],
             stats: RunStats | None = None) -> tuple[str, str]:
    """(heading, SVG) of the counted iteration closest to the median.

    On a GPU, a last row shows the GPU's phase spans (CUDA events) of that iteration; their
    positions are estimated (a phase starts on the GPU when the host launched it or when the
    GPU finished the phase before, whichever is later).  The agent's waits for the GPU are
    their own labelled segments (recorded, or at sync level 1 estimated: the iteration's tail).
    """
    counted = [r for r in rows if not r.warm] or list(rows)
    if not counted:
        return "Median iteration", '<p class="empty">No iteration ranges in this trace.</p>'
    med = percentile([r.ms for r in counted], 50.0)
    it = min(counted, key=lambda r: (abs(r.ms - med), r.number))
    tid = loop_tid(trace)
    spans = [_Span(r.name, r.category, r.t0, r.t1, r.depth - it.depth)
             for r in trace.ranges if r.tid == tid and r.t0 >= it.t0 and r.t1 <= it.t1
             and r.depth - it.depth < MAX_ROWS]
    phases = sorted((sp for sp in spans if sp.category in names.PHASES), key=lambda sp: sp.t0)
    if it.wait_estimated and phases:
        tail = max(sp.t1 for sp in phases)
        if it.t1 > tail:
            spans.append(_Span("wait for GPU (estimated)", names.GPU_WAIT, tail, it.t1, 1,
                               "the agent's sync level 1 wait at the iteration's end, "
                               "estimated: this trace did not record it"))
    depth = max((sp.row for sp in spans), default=0) + 1
    gpu_spans = _gpu_row(stats, counted, it, phases, depth) if stats is not None else []
    spans += gpu_spans
    rows_drawn = depth + (1 if gpu_spans else 0)
    spans.sort(key=lambda sp: (sp.row, sp.t0))
    left, row_h = 10, 22
    width = CHART_WIDTH
    plot_w = width - 2 * left
    span = max(it.t1 - it.t0, max((sp.t1 for sp in spans), default=it.t1) - it.t0, 1)
    body = []
    if gpu_spans:
        y = 4 + depth * row_h
        body.append(f'<line x1="{left}" x2="{width - left}" y1="{y - 1.5}" y2="{y - 1.5}" '
                    'class="grid"/>')
    for sp in spans:
        x = left + plot_w * (sp.t0 - it.t0) / span
        w = max(plot_w * (sp.t1 - sp.t0) / span, 0.5)
        y = 4 + sp.row * row_h
        dur = (sp.t1 - sp.t0) / 1e6
        tip = f"{sp.name}: {_ms(dur)} (at +{_ms((sp.t0 - it.t0) / 1e6)})"
        if sp.note:
            tip += f"; {sp.note}"
        cls = {"gpu": "span gpu", names.GPU_WAIT: "span wait"}.get(sp.category, "span")
        fill = GPU_ROW_COLOR if sp.category == "gpu" else css_color(sp.category)
        body.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 3}" '
                    f'fill="{fill}" class="{cls}"{_tip(tip)}/>')
        chars = int(w / 6.6)
        if chars >= 4:
            text = sp.name if len(sp.name) <= chars else sp.name[:chars - 1] + "\u2026"
            body.append(f'<text x="{x + 3:.2f}" y="{y + 14}" class="label">{_e(text)}</text>')
    axis_y = 4 + rows_drawn * row_h + 12
    total_ms = span / 1e6
    for i in range(6):
        x = left + plot_w * i / 5
        body.append(f'<text x="{x:.1f}" y="{axis_y}" class="axis" text-anchor="'
                    f'{"start" if i == 0 else "end" if i == 5 else "middle"}">'
                    f'{_e(_ms(total_ms * i / 5))}</text>')
    heading = f"Median iteration: iteration {it.number}, {_ms(it.ms)} (median {_ms(med)})"
    svg = _svg(width, axis_y + 6, body, "timeline of the median iteration")
    if gpu_spans:
        svg += ('<p class="legend">Last row: the GPU\'s time per phase in this iteration (CUDA '
                "events; where each starts is estimated: when the host launched the phase or "
                "when the GPU finished the one before, whichever is later).</p>")
    return heading, svg


def _gpu_row(stats: RunStats, counted: Sequence[IterationRow], it: IterationRow,
             phases: Sequence[_Span], row: int) -> list[_Span]:
    """The GPU's phase spans of iteration ``it`` (its CUDA events, else their medians)."""
    series = stats.gpu_phase_ms or {}
    if not series or not phases:
        return []
    n = len(series.get("iteration") or ())
    index = None
    if n and stats.sample_stride == 1 and n <= len(counted) and it in counted:
        index = counted.index(it) - (len(counted) - n)  # the events time the last n counted
    out = []
    ready = it.t0  # the GPU's queue is taken as empty at the iteration's start
    first: dict[str, _Span] = {}  # a phase's events add up its ranges (data: fetch, convert)
    for sp in phases:
        first.setdefault(sp.category, sp)
    for sp in first.values():
        values = series.get(sp.category) or []
        if not values:
            continue
        if index is not None and 0 <= index < len(values):
            ms, how = values[index], "this iteration's CUDA events"
        else:
            ms, how = percentile(values, 50.0), "the median of the CUDA events"
        start = max(sp.t0, ready)
        end = start + int(ms * 1e6)
        ready = end
        out.append(_Span(f"GPU {sp.category}", "gpu", start, end, row,
                         f"{how}; the start is estimated"))
    return out


def wall_bar(stats: RunStats) -> str:
    """One bar: the wall time split into iterations and what ran outside them."""
    parts = [("iterations", stats.iteration_total_ms)]
    parts += sorted(stats.outside_ms.items(), key=lambda kv: -kv[1])
    wall = max(stats.wall_ms, sum(v for _k, v in parts), 1e-9)
    width, left = CHART_WIDTH, 10
    plot_w = width - 2 * left
    x: float = left
    body, legend = [], []
    ext_color = css_color(names.EXTENSION)
    for key, ms in parts:
        if ms <= 0:
            continue
        w = plot_w * ms / wall
        color = OUTSIDE_COLORS.get(key) or (ext_color if key.startswith("extension:")
                                            else css_color(names.USER))
        tip = f"{key}: {_ms(ms)} ({figures.pct(ms / wall)} of the wall time)"
        body.append(f'<rect x="{x:.2f}" y="4" width="{max(w, 0.5):.2f}" height="28" '
                    f'fill="{color}" class="seg"{_tip(tip)}/>')
        x += w
        legend.append(f'<span class="key"><i style="background:{color}"></i>{_e(key)} '
                      f'{_e(_ms(ms))}</span>')
    return (_svg(width, 36, body, "wall time") + f'<div class="legend">{"".join(legend)}</div>')


# -- tables and text -----------------------------------------------------------------------

def links_table(stats: RunStats) -> str:
    if not stats.links:
        return ('<p class="empty">No link ranges in this trace (recorded at granularity '
                f'{_e(stats.meta.get("granularity", "?"))}; run with '
                'CHAINER_PROF_GRANULARITY=link to see them).</p>')
    n = max(stats.iterations, 1)
    own_total = sum(link.self_ms + link.bwd_ms for link in stats.links) or 1.0
    ordered = sorted(stats.links, key=lambda link: -(link.self_ms + link.bwd_ms))
    rows = []
    for link in ordered[:TABLE_LINKS]:
        own = link.self_ms + link.bwd_ms
        rows.append(
            f"<tr><td class=\"name\">{_e(link.name)}</td>"
            f"<td>{figures.num(link.calls / n, grouping=False)}</td>"
            f"<td>{figures.fixed(link.incl_ms / n, 3, grouping=False)}</td>"
            f"<td>{figures.fixed(link.self_ms / n, 3, grouping=False)}</td>"
            f"<td>{figures.fixed(link.bwd_ms / n, 3, grouping=False)}</td>"
            f"<td>{figures.fixed(100 * own / own_total, 1, grouping=False)}</td></tr>")
    more = (f'<p class="more">{len(ordered) - TABLE_LINKS} more links not shown.</p>'
            if len(ordered) > TABLE_LINKS else "")
    return ('<table class="sortable"><thead><tr><th>link</th><th>calls / iter</th>'
            '<th>fwd incl ms / iter</th><th>fwd self ms / iter</th><th>bwd ms / iter</th>'
            '<th>% of link time</th></tr></thead><tbody>' + "".join(rows)
            + "</tbody></table>" + more)


def verdict_html(verdict: Verdict) -> str:
    items = "".join(f"<li>{_e(line.strip())}</li>" for line in verdict.evidence)
    tries = "".join(f"<li>{_e(line)}</li>" for line in verdict.suggestions)
    also = (f'<p class="also">Also over threshold: {_e("; ".join(verdict.also))}</p>'
            if verdict.also else "")
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in verdict.notes)
    notes = "".join(f'<p class="stutter">Slow iterations: {_e(n)}</p>'
                    for n in verdict.stutter) + notes
    return (f'<p class="kind">{_e(verdict.kind)}</p><p class="title">{_e(verdict.title)}</p>'
            f'<ul class="evidence">{items}</ul>'
            + (f'<h3>What to try</h3><ul class="suggest">{tries}</ul>' if tries else "")
            + also + notes)


def advice_html(findings: Sequence[Finding]) -> str:
    if not findings:
        return '<p class="empty">Nothing in this run\'s configuration to change.</p>'
    out = []
    for f in findings:
        out.append(f'<article class="finding" id="advice-{_e(f.key)}"><h3>{_e(f.title)}</h3>'
                   f"<dl><dt>seen</dt><dd>{_e(f.seen)}</dd><dt>cost</dt><dd>{_e(f.cost)}</dd>"
                   f"<dt>fix</dt><dd>{_e(f.fix)}</dd><dt>doc</dt>"
                   f'<dd><a href="{_e(f.link)}">{_e(f.link)}</a></dd></dl></article>')
    return "".join(out)


def key_figures(f: Findings) -> str:
    stats = f.stats
    meta = stats.meta or {}
    shown = [("iterations", f"{stats.iterations} counted + {stats.warmup} warm-up")]
    if stats.iterations:
        shown.append(("iteration time", f"median {_ms(stats.median())}, "
                                        f"p95 {_ms(stats.p95())}"))
        sps = stats.samples_per_second()
        rate = f"{figures.fixed(stats.iterations_per_second())} it/s"
        if sps:
            rate += f", {figures.count(round(sps))} samples/s ({stats.samples_text()})"
        shown.append(("throughput", rate))
    shown.append(("wall time", _ms(stats.wall_ms)))
    for name, rows in figure_lines(f).items():
        shown.append((name, "at iteration ends: " + " ".join(rows)))
    settings = meta.get("settings") or {}
    shown.append(("sync level", f"{stats.sync_level} ({figures.count(stats.sync_calls)} "
                                "synchronize calls)"))
    shown.append(("granularity",
                  str(meta.get("granularity") or settings.get("granularity", "?"))))
    devices = meta.get("devices") or []
    shown.append(("devices", ", ".join(f"GPU {d.get('id')} {d.get('name', '')}".strip()
                                       for d in devices) or "CPU"))
    if f.busy is not None:
        shown.append(("GPU busy", f.busy))
    versions = meta.get("versions") or {}
    if versions:
        shown.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items())))
    clock = meta.get("clock") or {}
    if clock.get("unix_time_ns_at_start"):
        start = time.strftime("%Y-%m-%d %H:%M:%S",
                              time.localtime(clock["unix_time_ns_at_start"] / 1e9))
        shown.append(("started", f"{start} on {meta.get('host', '?')}"))
    return "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in shown)


def gpu_section(f: Findings, gpu: GpuEvidence | None, verdict: Verdict) -> str:
    """The GPU's phase times beside the host's, the agent's waits, the busy share."""
    if gpu is None:
        return '<p class="empty">The model ran on a GPU, but no iteration was counted.</p>'
    dash = "&ndash;"
    rows = []
    for p in gpu.phases:
        state = ("GPU-limited" if p.behind else "keeps up") if gpu.per_phase else dash
        rows.append([_e(p.phase), _e(_ms(p.host_ms)),
                     _e(_ms(p.gpu_ms)) if p.gpu_ms is not None else dash,
                     _e(_ms(p.wait_ms)) if gpu.wait_source == "recorded" else dash, state])
    if gpu.phases:
        rows.append(["iteration", _e(_ms(gpu.host_iteration_ms)),
                     _e(_ms(gpu.gpu_iteration_ms)) if gpu.gpu_iteration_ms else dash,
                     _e(_ms(gpu.wait_ms)) if gpu.wait_source != "none" else dash, ""])
    heads = ["phase", "host, median", "GPU, median (CUDA events)",
             "the agent's waits, per iteration", "the phase on the GPU"]
    heads, rows = drop_empty_columns(heads, rows, empty=(dash, ""))
    table = ('<table class="gputable"><thead><tr>'
             + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr></thead><tbody>"
             + "".join(('<tr class="total">' if n == len(rows) - 1 else "<tr>")
                       + f'<td class="name">{row[0]}</td>'
                       + "".join(f"<td>{cell}</td>" for cell in row[1:]) + "</tr>"
                       for n, row in enumerate(rows))
             + "</tbody></table>" if rows else "")
    lines = []
    if gpu.busy_share is not None:
        lines.append(f"GPU busy: {f.busy}; {gpu.busy_method}")
    if gpu.limit is None and gpu.reason:
        lines.append(f"Not enough evidence to tell GPU-bound from host-bound: {gpu.reason}")
    if gpu.wait_source == "estimated":
        lines.append(f"The agent's waits: {gpu.wait_method}")
    lines += [line for line in verdict.notes if line.startswith("the agent's own sync")]
    text = "".join(f'<p class="gpunote">{_e(line)}</p>' for line in lines)
    return table + text


def activity_html(f: Findings) -> str:
    """The GPU's own time from its kernel activity (CUPTI): busy and idle by cause, GPU time
    by phase, the top links and kernels by GPU time; empty without GPU activity."""
    stats, fig = f.stats, f.activity
    if fig is None:
        return ""
    n = fig.iterations
    parts = [("busy", fig.busy_ms, GPU_ROW_COLOR)]
    parts += [(IDLE_LABELS.get(k, k), v, IDLE_COLORS.get(k, OTHER_COLOR))
              for k, v in fig.idle_ms.items()]
    span = max(fig.span_ms, 1e-9)
    width, left = CHART_WIDTH, 10
    plot_w = width - 2 * left
    x = float(left)
    body, legend = [], []
    for label, ms, color in parts:
        if ms <= 0:
            continue
        w = plot_w * ms / span
        tip = (f"{label}: {_ms(ms / n)} per iteration ({figures.pct(ms / span)} of the GPU's "
               "time)")
        body.append(f'<rect x="{x:.2f}" y="4" width="{max(w, 0.5):.2f}" height="24" '
                    f'fill="{color}" class="seg"{_tip(tip)}/>')
        x += w
        legend.append(f'<span class="key"><i style="background:{color}"></i>{_e(label)} '
                      f'{_e(_ms(ms / n))}</span>')
    bar = _svg(width, 32, body, "the GPU's time per iteration") + \
        f'<div class="legend">{"".join(legend)}</div>'
    phase_rows = "".join(
        f'<tr><td class="name">{_e(k)}</td><td>{_e(_ms(stats.phase_median(k)))}</td>'
        f"<td>{_e(_ms(p['kernel_ms'] / n))}</td>"
        f"<td>{figures.num(p['kernels'] / n, grouping=False)}</td>"
        f"<td>{_e(_ms(p['copy_ms'] / n))}</td></tr>"
        for k, p in ((k, fig.phases.get(k)) for k in PHASE_KEYS) if p)
    link_rows = "".join(
        f'<tr><td class="name">{_e(x["name"])}</td>'
        f"<td>{figures.fixed(x['fwd_ms'] / n, 3, grouping=False)}</td>"
        f"<td>{figures.num(x['fwd_kernels'] / n, grouping=False)}</td>"
        f"<td>{figures.fixed(x['bwd_ms'] / n, 3, grouping=False)}</td>"
        f"<td>{figures.num(x['bwd_kernels'] / n, grouping=False)}</td>"
        f"<td>{figures.fixed(x['copy_ms'] / n, 3, grouping=False)}</td></tr>"
        for x in fig.links[:TABLE_LINKS])
    kernel_rows = "".join(
        f'<tr><td class="name">{_e(k["name"])}</td>'
        f"<td>{figures.fixed(k['ms'] / n, 3, grouping=False)}</td>"
        f"<td>{figures.num(k['calls'] / n, grouping=False)}</td>"
        f'<td class="name">'
        f'{_e(names.link_range_text(k["link"], k["backward"]) if k["link"] else "-")}'
        "</td></tr>" for k in fig.top_kernels)
    notes = "".join(f'<p class="gpunote">{_e(line)}</p>' for line in fig.notes)
    return (f'<div id="gpu-activity"><h3>GPU activity</h3>'
            f'<p class="gpunote">Busy {_e(figures.pct(fig.busy_share or 0.0))} of the GPU\'s '
            f"time over {n} counted iterations ({_e(fig.source)}).</p>{bar}"
            '<table class="gputable"><thead><tr><th>phase</th><th>host, median</th>'
            "<th>GPU kernel time launched, per iteration</th><th>kernels / iter</th>"
            "<th>copies, per iteration</th></tr></thead><tbody>" + phase_rows
            + '</tbody></table><h3>Top links by GPU time</h3><table class="sortable gpulinks">'
            "<thead><tr><th>link</th><th>GPU fwd ms / iter</th><th>fwd kernels / iter</th>"
            "<th>GPU bwd ms / iter</th><th>bwd kernels / iter</th><th>copies ms / iter</th>"
            "</tr></thead><tbody>" + link_rows + "</tbody></table>"
            '<h3>Top kernels by GPU time</h3><table class="sortable gpukernels"><thead><tr>'
            "<th>kernel</th><th>ms / iter</th><th>calls / iter</th><th>launched by link</th>"
            "</tr></thead><tbody>" + kernel_rows + "</tbody></table>" + notes + "</div>")


# -- the page ---------------------------------------------------------------------------------

def render(trace: Trace, f: Findings) -> str:
    """The whole HTML page for ``trace`` (``f``: the findings of its statistics)."""
    stats = f.stats
    verdict = f.verdict or Verdict("unknown", "no verdict",
                                   [f.errors.get("verdict", "no verdict was made")])
    findings = f.advice
    rows = iteration_rows(trace)
    heading, line = timeline(trace, rows, stats)
    meta = stats.meta or {}
    command = meta.get("command", "")
    data = {"verdict": verdict.kind, "iterations": stats.iterations,
            "median_ms": round(stats.median(), 4), "advice": [f.key for f in findings],
            "ended_normally": not meta.get("partial")}
    gpu = verdict.gpu
    if gpu is not None and gpu.busy_share is not None:
        data["gpu_busy_share"] = round(gpu.busy_share, 4)
    gpu_html = (f'<section id="gpu"><h2>GPU</h2>{gpu_section(f, gpu, verdict)}'
                f"{activity_html(f)}</section>"
                if gpu is not None or f.on_gpu or stats.gpu_activity else "")
    fig = f.activity
    if fig is not None:
        data["gpu_activity_busy_share"] = round(fig.busy_share or 0.0, 4)
        data["gpu_top_link"] = fig.links[0]["name"] if fig.links else None
    abnormal = "".join(f"<p>{_e(line.strip())}</p>" for line in ended_abnormally(meta))
    if abnormal:
        abnormal = f'<section id="abnormal" class="abnormal">{abnormal}</section>'
    slow = f.slow
    slow_html = ("<section id=\"slow\"><h2>Slowest iterations</h2><ul>"
                 + "".join(f"<li>{_e(describe_slow(item))}</li>" for item in slow[:10])
                 + "</ul></section>") if slow else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>chainer_autoprof report: {_e(command or trace.path)}</title>
<style>{_CSS}</style></head>
<body>
<header><h1>chainer_autoprof report</h1><p class="cmd">{_e(command)}</p>
<dl class="figures">{key_figures(f)}</dl></header>
{abnormal}
<section id="verdict" class="verdict kind-{_e(verdict.kind)}"><h2>Verdict</h2>
{verdict_html(verdict)}</section>
<section id="advice"><h2>Advice</h2>{advice_html(findings)}</section>
{whatif_view.chart_html(f.whatif)}
{gpu_html}
<section id="wall"><h2>Where the wall time went</h2>{wall_bar(stats)}</section>
<section id="phases"><h2>Phase times per iteration</h2>{phase_chart(rows)}</section>
{slow_html}
<section id="timeline"><h2>{_e(heading)}</h2>{line}</section>
<section id="links"><h2>Top links</h2>{links_table(stats)}</section>
<footer>chainer_autoprof {_e(meta.get("version", ""))} &middot; trace {_e(trace.path)}</footer>
<div id="tip" role="tooltip"></div>
<script type="application/json" id="report-data">{_json(data)}</script>
<script>{_JS}</script>
</body></html>
"""


#: What the embedded JSON escapes so that no text in it is markup in any of the HTML
#: parser's script states (``</script``, ``<!--``, ``<script`` and the ``-->`` that ends
#: them; ``&`` for good measure) or a line end to an old JavaScript parser.
_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                0x2028: "\\u2028", 0x2029: "\\u2029"}


def _json(data: object) -> str:
    return json.dumps(data).translate(_SCRIPT_SAFE)


def write_report(out_path: str, trace: Trace, f: Findings) -> None:
    """Write the page for ``trace`` and its findings to ``out_path`` (``report`` picks the run:
    of a normal run and its replay run, the normal one, compared with the replay)."""
    page = render(trace, f)
    with atomic_text(out_path) as out:  # whole or not at all; a regular file only
        # no control character of a name reaches the page raw; hints as the run was started
        write(out, hint_form(page, launched(f.stats.meta)))


_CSS = """
:root{--fg:#1d1d1f;--muted:#666;--line:#e3e3e3;--bg:#fafafa;--accent:#76b900}
*{box-sizing:border-box}
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg);margin:0;padding:20px 28px;max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}
h3{font-size:14px;margin:8px 0 4px}
section,header{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 18px;
margin:0 0 16px}
.cmd{font-family:ui-monospace,"DejaVu Sans Mono",monospace;color:var(--muted);margin:0 0 10px;
word-break:break-all}
dl.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));
gap:6px 18px;margin:0}
dl.figures dt{color:var(--muted);font-size:12px}dl.figures dd{margin:0;font-weight:600}
.verdict{border-left:6px solid var(--accent)}
.verdict .kind{display:inline-block;background:var(--accent);color:#fff;border-radius:4px;
padding:1px 8px;font-weight:700;margin:0 0 6px}
.kind-input-bound{border-left-color:#a05dd6}.kind-input-bound .kind{background:#a05dd6}
.kind-extension-bound{border-left-color:#ff8c00}.kind-extension-bound .kind{background:#ff8c00}
.kind-GPU-bound{border-left-color:#2e7d32}.kind-GPU-bound .kind{background:#2e7d32}
.kind-host-bound{border-left-color:#3d85c6}.kind-host-bound .kind{background:#3d85c6}
.kind-gc-bound{border-left-color:#5a5a5a}.kind-gc-bound .kind{background:#5a5a5a}
.kind-communication-bound{border-left-color:#8b4513}
.kind-communication-bound .kind{background:#8b4513}
.kind-balanced .kind,.kind-unknown .kind{background:#888}
.verdict .title{font-size:15px;font-weight:600;margin:0 0 6px}
.evidence li,.suggest li{margin:2px 0}.note,.also{color:var(--muted);margin:6px 0 0}
.finding{border-top:1px solid var(--line);padding:6px 0}.finding:first-of-type{border-top:0}
.finding dl{display:grid;grid-template-columns:48px 1fr;gap:2px 10px;margin:0}
.finding dt{color:var(--muted)}.finding dd{margin:0}
.empty{color:var(--muted);margin:0}
.abnormal{border-left:6px solid #e60012}.abnormal p{margin:2px 0}.stutter{margin:6px 0 0}
svg{display:block;max-width:100%;height:auto}
.plot{fill:#fff;stroke:var(--line)}.grid{stroke:#eee}.axis{font-size:11px;fill:var(--muted)}
.warm{fill:#f1f1f1}.clip{fill:#333}.label{font-size:11px;fill:#111;pointer-events:none}
.span,.bar,.seg{stroke:#fff;stroke-width:.4}.span:hover,.bar:hover,.seg:hover{opacity:.75}
.legend{margin:6px 0 0;font-size:12px;color:var(--muted)}
.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;
vertical-align:-1px}
.warmkey{background:#f1f1f1;border:1px solid #ccc}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:right}
th{cursor:pointer;user-select:none;background:#f4f4f4}th:first-child,td.name{text-align:left}
td.name{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;
overflow-wrap:anywhere}
.more{color:var(--muted);font-size:12px}
.gputable td,.gputable th{text-align:right}.gputable tr.total td{font-weight:600}
.gpunote{margin:6px 0 0}.span.gpu{opacity:.9}
footer{color:var(--muted);font-size:12px}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;
padding:4px 8px;border-radius:4px;max-width:460px;display:none;z-index:9}
"""

_JS = """
(function () {
  "use strict";
  var tip = document.getElementById("tip");
  document.addEventListener("mousemove", function (ev) {
    var el = ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (!el) { tip.style.display = "none"; return; }
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = x + "px";
    tip.style.top = (ev.clientY + 16) + "px";
  });
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    var heads = table.querySelectorAll("th");
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var desc = th.getAttribute("data-desc") !== "1";
        rows.sort(function (a, b) {
          var x = a.cells[col].textContent, y = b.cells[col].textContent;
          var nx = parseFloat(x), ny = parseFloat(y);
          var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
          return desc ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
        th.setAttribute("data-desc", desc ? "1" : "0");
      });
    });
  });
  var data = JSON.parse(document.getElementById("report-data").textContent);
  document.body.setAttribute("data-verdict", data.verdict);
  document.body.setAttribute("data-ready", "1");
})();
"""
