"""The what-if predictions (:mod:`..analysis.whatif`) as the summary's lines and the HTML
report's bar chart: the iteration now beside each lever's prediction, with its band."""

from __future__ import annotations

from html import escape

from ..analysis import whatif
from ..analysis.whatif import WhatIf
from ..common import figures, log

#: The chart's size (px): a label column, then the bars.
WIDTH, LABEL_W, BAR_H, GAP = 820, 330, 18, 6
NOW_COLOR, LEVER_COLOR, BAND_COLOR = "#757575", "#1565c0", "#0d2a4d"


def summary_text(wf: WhatIf | None) -> str:
    """The levers' lines under a heading (empty when the model has nothing to say)."""
    if wf is None or not wf.predictions:
        return ""
    head = ("What-if (this run's step replayed with one change; band: the iterations' "
            f"spread {figures.pct(wf.spread)} and the replay's error "
            f"{figures.pct(abs(wf.replay_error))}):")
    return "\n".join([head] + [f"  {line}" for line in whatif.lines(wf)])


def chart_html(wf: WhatIf | None) -> str:
    """An SVG bar per lever beside the iteration now, each with its band as a whisker;
    empty when the model has nothing to say (or, under a bug of ours, one line)."""
    try:
        return _chart(wf)
    except Exception as exc:  # our bug: the rest of the page stands  # noqa: BLE001
        return f'<p class="note">{escape(log.contained("the what-if chart", exc))}</p>'


def _chart(wf: WhatIf | None) -> str:
    if wf is None or not wf.predictions:
        return ""
    now = wf.predictions[0].now_ms
    bars = [("now", now, now, now)] + [(p.lever, p.predicted_ms, p.low_ms, p.high_ms)
                                        for p in wf.predictions]
    top = max(b[3] for b in bars) or 1.0
    plot = WIDTH - LABEL_W - 70
    body = []
    for i, (label, ms, low, high) in enumerate(bars):
        y = i * (BAR_H + GAP) + 4
        w = plot * ms / top
        color = NOW_COLOR if i == 0 else LEVER_COLOR
        tip = (f"{label}: {figures.ms(ms)} per iteration" if i == 0 else
               f"what-if {label}: {figures.ms(now)} -> {figures.ms(ms)} per iteration "
               f"({figures.ms(low)} to {figures.ms(high)})")
        body.append(f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 5}" text-anchor="end" '
                    f'font-size="12">{escape(_short(label))}</text>')
        body.append(f'<rect class="whatif-bar" x="{LABEL_W}" y="{y}" width="{max(w, 0.5):.2f}" '
                    f'height="{BAR_H}" fill="{color}" data-lever="{escape(label)}" '
                    f'data-ms="{ms:.6g}" data-tip="{escape(tip)}"/>')
        if i:
            x0, x1 = LABEL_W + plot * low / top, LABEL_W + plot * high / top
            mid = y + BAR_H / 2
            body.append(f'<line x1="{x0:.2f}" x2="{x1:.2f}" y1="{mid}" y2="{mid}" '
                        f'stroke="{BAND_COLOR}" stroke-width="2"/>')
        right = LABEL_W + plot * max(ms, high) / top  # the value past the band's whisker
        body.append(f'<text x="{right + 5:.2f}" y="{y + BAR_H - 5}" font-size="12">'
                    f"{escape(figures.ms(ms))}</text>")
    height = len(bars) * (BAR_H + GAP) + 8
    x_now = LABEL_W + plot * now / top  # now, as a rule across the levers
    body.append(f'<line x1="{x_now:.2f}" x2="{x_now:.2f}" y1="{BAR_H + GAP}" '
                f'y2="{height - 4}" stroke="{NOW_COLOR}" stroke-dasharray="3 3"/>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="what-if predictions">'
           + "".join(body) + "</svg>")
    lines = "".join(f"<li>{escape(line)}</li>" for line in whatif.lines(wf))
    return (f'<section id="whatif"><h2>What-if</h2>{svg}<ul class="whatif">{lines}</ul>'
            f'<p class="note">{escape(wf.replay_text())}</p></section>')


def _short(label: str, most: int = 46) -> str:
    """A lever's name that fits the label column: a link by its last path part."""
    if len(label) > most and "/" in label:
        label = label.rsplit("/", 1)[1]
    return label if len(label) <= most else label[:most - 1] + "\u2026"
