"""Findings first, then rendering: the analysis runs once, the summary and the HTML render it.

The recorded GPU traces (GPU evidence, waits, the verdict and its advice) and a CPU trace
are analysed once (:func:`find`); with every analysis entry point then made to raise, the
summary and the HTML page still render, the same text as before: nothing formats a line
by calling back into the analysis.  At a real exit the what-if model, which the verdict,
the advice's costs and the summary all show, is computed once.
"""

from __future__ import annotations

import re

import pytest
from support import REPO, program, run_with_agent

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


#: Put before a training script: every computation of the what-if model, one line in a file.
COUNT_MODELS = """\
import os
from chainer_autoprof.analysis import whatif as _whatif

_model = _whatif.model


def _counted(stats):
    with open(os.environ["WHATIF_CALLS"], "a") as out:
        out.write("model\\n")
    return _model(stats)


_whatif.model = _counted
"""


def test_the_what_if_model_is_computed_once_at_exit(tmp_path):
    """An input-bound CPU run: its verdict, its lever lines and its advice's cost all show the
    model's ``input free`` prediction, and the exit computed the model once for them all."""
    calls = tmp_path / "whatif_calls.txt"
    run = run_with_agent(tmp_path, COUNT_MODELS + program("verdict_workload"),
                         {"CHAINER_PROF_SUMMARY": "1"},
                         script_args=("mlp", "--delay", "0.002", "--iterations", "15"),
                         env={"WHATIF_CALLS": str(calls)}, nvtx=False, timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^Verdict: input-bound", run.stderr, re.M), run.stderr
    shown = [line for line in run.stderr.splitlines() if "what-if input free:" in line]
    # the verdict's evidence, the lever's line, the serial iterator's cost
    assert len(shown) >= 3 and "cost:" in shown[-1], run.stderr
    assert calls.read_text().splitlines() == ["model"]
