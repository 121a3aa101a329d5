"""Findings first, then rendering: the analysis runs once, the summary and the HTML render it.

The recorded GPU traces (GPU evidence, waits, the verdict and its advice) and a CPU trace
are analysed once (:func:`find`); with every analysis entry point then made to raise, the
summary and the HTML page still render, the same text as before: nothing formats a line
by calling back into the analysis.
"""

from __future__ import annotations

import pytest
from support import REPO

from chainer_autoprof.analysis import (
    advice,
    communication,
    gpu_evidence,
    memory,
    outliers,
    per_iteration,
    verdict,
    whatif,
    window,
)
from chainer_autoprof.analysis.findings import Findings, find
from chainer_autoprof.report import html as html_report
from chainer_autoprof.report import summary
from chainer_autoprof.report.tracefile import read_trace

TRACES = sorted((REPO / "tests" / "data" / "gpu" / "traces").glob("*.json"))
#: Every analysis function the renderers used to call while they formatted lines.
ENTRY_POINTS = {
    verdict: ("decide", "facts_of", "pick_replay"),
    advice: ("check",),
    gpu_evidence: ("gather", "on_gpu", "waits", "busy_text"),
    outliers: ("slow_iterations", "stutter"),
    window: ("unreached",),
    memory: ("leak", "caching"),
    per_iteration: ("judge",),
    whatif: ("model",),
    communication: ("comm_ms", "sentence", "comm_share"),
}


def _no_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry point raises, where it is defined and wherever a renderer holds it."""
    def forbidden(*_args, **_kwargs):
        raise AssertionError("a renderer called back into the analysis")

    for module, names in ENTRY_POINTS.items():
        for name in names:
            monkeypatch.setattr(module, name, forbidden)
            for renderer in (summary, html_report):
                if hasattr(renderer, name):
                    monkeypatch.setattr(renderer, name, forbidden)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_summary_and_the_page_render_the_findings_alone(path, monkeypatch):
    trace = read_trace(str(path))
    stats = trace.stats()
    expected = summary.format_summary(stats)
    findings = find(stats)
    assert isinstance(findings, Findings) and findings.verdict is not None
    assert findings.on_gpu and findings.gpu is not None  # the GPU evidence is in it
    _no_analysis(monkeypatch)
    assert summary.format_summary(findings) == expected
    page = html_report.render(trace, findings)
    assert f"kind-{findings.verdict.kind}" in page
    for finding in findings.advice:
        assert f"[{finding.key}]" in expected and finding.key in page
