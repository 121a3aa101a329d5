"""The HTML report: written by ``report TRACE --html``, checked in a real headless browser.

The browser is Debian's ``chromium`` (``apt-get install chromium``), driven
over the DevTools protocol (tests/headless_browser.py): the page must load
with no console error or exception, request nothing but itself, and show the
verdict, the advice, the per-iteration phase chart, the median iteration's
timeline and the links table.  Without chromium the browser tests skip.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys

import pytest
from headless_browser import Browser, find_browser
from support import REPO, clean_env
from verdict_workloads import run_workload
from waiting_gpu import run_waiting

from chainer_autoprof.analysis import advice, whatif
from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.common import figures
from chainer_autoprof.report import html as html_report
from chainer_autoprof.report.tracefile import read_trace
from chainer_autoprof.runtime import hotpath

needs_browser = pytest.mark.skipif(
    find_browser() is None,
    reason="headless browser tests need chromium (Debian: apt-get install -y chromium)")

_RUNS: dict[str, object] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("html")

    def get(name: str, *args: str, env: dict[str, str] | None = None):
        if name not in _RUNS:
            _RUNS[name] = run_workload(base / name, *args, env=env)
        return _RUNS[name]

    return get


LINKS_RUN = ("deep", "--batch", "2", "--iterations", "20", "--evaluator", "standard")
INPUT_BOUND = ("mlp", "--delay", "0.002", "--iterations", "15")


def report(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", *args],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def link_page(runs, tmp_path_factory):
    w = runs("links", *LINKS_RUN, env={"CHAINER_PROF_GRANULARITY": "link"})
    out = tmp_path_factory.mktemp("page") / "report.html"
    report(str(w.trace_path), "--html", str(out))
    return w, out


def test_page_is_self_contained(link_page):
    _w, out = link_page
    page = out.read_text(encoding="utf-8")
    assert "default-src 'none'" in page  # the CSP: nothing may be loaded
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", page)
    assert "@import" not in page and "url(" not in page
    # the only addresses are the SVG namespace and links to Chainer's documentation
    for address in re.findall(r"https?://[^\s\"'<>]+", page):
        assert address.startswith(("http://www.w3.org/2000/svg", "https://docs.chainer.org/"))


@needs_browser
def test_page_loads_cleanly_and_shows_the_run(link_page, tmp_path):
    w, out = link_page
    stats = w.stats
    verdict = vd.decide(stats)
    with Browser() as browser:
        browser.open(out)
        assert browser.evaluate("document.body.dataset.ready") == "1"  # the script ran
        assert browser.problems() == []
        assert browser.requests() == [out.resolve().as_uri()]
        assert browser.evaluate("document.querySelector('#verdict .kind').textContent") \
            == verdict.kind
        assert browser.evaluate("document.body.dataset.verdict") == verdict.kind
        # one stacked bar (at least one segment) per iteration, warm-up included
        bars = browser.evaluate("new Set(Array.from(document.querySelectorAll("
                                "'#phases rect.bar')).map(r => r.getAttribute('x'))).size")
        assert bars == stats.iterations + stats.warmup
        spans = browser.evaluate("Array.from(document.querySelectorAll('#timeline rect.span'))"
                                 ".map(r => r.dataset.tip.split(':')[0])")
        assert "iteration" in spans and "forward" in spans and "backward" in spans
        assert any("(Linear)" in s for s in spans)  # link ranges of that iteration
        heading = browser.evaluate("document.querySelector('#timeline h2').textContent")
        assert f"(median {figures.ms(stats.median())})" in heading
        rows = browser.evaluate("document.querySelectorAll('#links tbody tr').length")
        assert rows == min(html_report.TABLE_LINKS, len(stats.links))
        findings = browser.evaluate("document.querySelectorAll('#advice .finding').length")
        assert findings == len(advice.check(stats))
        # hovering a bar shows its figures in the tooltip
        tip = browser.evaluate("""(() => {
            const bar = document.querySelector('#phases rect.bar');
            const box = bar.getBoundingClientRect();
            bar.dispatchEvent(new MouseEvent('mousemove', {bubbles: true,
                clientX: box.x + 1, clientY: box.y + 1}));
            const tip = document.getElementById('tip');
            return [getComputedStyle(tip).display, tip.textContent];
        })()""")
        assert tip[0] == "block" and tip[1].startswith("iteration ")
        # the links table sorts by a column when its header is clicked
        calls = browser.evaluate("""(() => {
            document.querySelectorAll('#links th')[1].click();
            return Array.from(document.querySelectorAll('#links tbody tr'))
                .map(r => parseFloat(r.cells[1].textContent));
        })()""")
        assert calls == sorted(calls, reverse=True)
        shot = tmp_path / "report.png"
        browser.screenshot(shot)
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1280, 1600)


@needs_browser
def test_replay_pair_page(runs, tmp_path):
    normal = runs("input", *INPUT_BOUND)
    replay = runs("input_replay", *INPUT_BOUND, env={"CHAINER_PROF_REPLAY_BATCH": "1"})
    out = tmp_path / "pair.html"
    text = report(str(replay.trace_path), str(normal.trace_path), "--html", str(out)).stdout
    assert "if data were free (replay run)" in text  # the text comparison too
    with Browser() as browser:
        browser.open(out)
        assert browser.problems() == []
        kind = browser.evaluate("document.querySelector('#verdict .kind').textContent")
        assert kind == "input-bound"  # the page shows the normal run...
        evidence = browser.evaluate("document.querySelector('#verdict').textContent")
        assert "if data were free (replay run)" in evidence  # ...against the replay


def test_many_iterations_are_binned(runs):
    w = runs("input", *INPUT_BOUND)
    trace = read_trace(str(w.trace_path))
    rows = html_report.iteration_rows(trace)
    assert [r.warm for r in rows].count(True) == w.stats.warmup
    many = [html_report.IterationRow(i, 0, 10**6, 0, False, dict(rows[-1].phases))
            for i in range(html_report.MAX_BARS * 3 + 7)]
    svg = html_report.phase_chart(many)
    bars = set(re.findall(r'<rect x="([0-9.]+)" y="[0-9.]+" width="[0-9.]+" height="[0-9.]+" '
                          r'fill="#[0-9a-f]{6}" class="bar"', svg))
    assert len(bars) <= html_report.MAX_BARS
    assert "(4 per bar)" in svg


def test_unwritable_output_is_one_line(runs, tmp_path):
    w = runs("input", *INPUT_BOUND)
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report",
                           str(w.trace_path), "--html", str(tmp_path / "missing" / "r.html")],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot write" in proc.stderr


# -- on a GPU -----------------------------------------------------------------------------------

GPU_TRACES = REPO / "tests" / "data" / "gpu" / "traces"


@needs_browser
def test_gpu_page_shows_the_gpu_beside_the_host(tmp_path):
    """A real GPU recording (batch 512, sync level 1): the verdict of the summary, the GPU's
    phase times beside the host's, a GPU row in the median iteration and the agent's wait at
    the iteration's end as a labelled segment (estimated: this trace predates the recorded
    waits), where the page used to show 22 of 36.8 ms as a blank."""
    trace = GPU_TRACES / "gpu_bound_b512_sync1_phase.json"
    stats = read_trace(str(trace)).stats()
    verdict = vd.decide(stats)
    out = tmp_path / "gpu.html"
    report(str(trace), "--html", str(out))
    with Browser() as browser:
        browser.open(out)
        assert browser.problems() == []
        assert browser.evaluate("document.querySelector('#verdict .kind').textContent") \
            == verdict.kind == "GPU-bound"
        assert browser.evaluate("document.querySelector('#verdict .title').textContent") \
            == verdict.title
        cells = browser.evaluate("Array.from(document.querySelectorAll('#gpu tbody tr'))"
                                 ".map(r => Array.from(r.cells).map(c => c.textContent))")
        by_phase = {row[0]: row for row in cells}
        assert verdict.gpu is not None
        for p in verdict.gpu.phases:
            assert by_phase[p.phase][1] == figures.ms(p.host_ms)
            assert by_phase[p.phase][2] == figures.ms(p.gpu_ms or 0.0)
        assert by_phase["forward"][4] == "GPU-limited" and by_phase["data"][4] == "keeps up"
        gpu_row = browser.evaluate("Array.from(document.querySelectorAll("
                                   "'#timeline rect.span.gpu')).map(r => r.dataset.tip)")
        assert [t.split(":")[0] for t in gpu_row] == ["GPU data", "GPU forward", "GPU backward",
                                                       "GPU update"]
        waits = browser.evaluate("Array.from(document.querySelectorAll("
                                 "'#timeline rect.span.wait')).map(r => r.dataset.tip)")
        assert len(waits) == 1 and waits[0].startswith("wait for GPU (estimated): ")
        waited_ms = float(waits[0].split(": ")[1].split(" ms")[0])
        assert waited_ms > 0.5 * stats.median()
        legend = browser.evaluate("document.querySelector('#phases .legend').textContent")
        assert "waiting for the GPU (agent)" in legend
        figures_text = browser.evaluate("document.querySelector('dl.figures').textContent")
        assert "GPU busy" in figures_text and figures.pct(verdict.gpu.busy_share) in figures_text


@needs_browser
def test_whatif_chart_shows_now_against_each_lever(tmp_path):
    """The what-if predictions as bars beside the iteration now: one per lever of the
    summary, each with its line (the summary's, word for word) as its tooltip."""
    trace = GPU_TRACES / "gpu_bound_b512_sync2_phase.json"
    wf = whatif.model(read_trace(str(trace)).stats())
    assert wf is not None and wf.predictions
    out = tmp_path / "whatif.html"
    report(str(trace), "--html", str(out))
    with Browser() as browser:
        browser.open(out)
        assert browser.problems() == []
        bars = browser.evaluate("Array.from(document.querySelectorAll('#whatif rect.whatif-bar'))"
                                ".map(r => [r.dataset.lever, r.dataset.tip, "
                                "r.getBoundingClientRect().width])")
        assert [b[0] for b in bars] == ["now"] + [p.lever for p in wf.predictions]
        assert [b[1] for b in bars[1:]] == [p.text() for p in wf.predictions]
        # bar lengths in proportion: the sync-0 prediction's shorter than now's
        sync0 = next(b for b in bars if b[0] == whatif.SYNC0)
        assert 0 < sync0[2] < bars[0][2]
        items = browser.evaluate("Array.from(document.querySelectorAll('#whatif li'))"
                                 ".map(li => li.textContent)")
        assert items == [p.text() for p in wf.predictions]


@needs_browser
def test_recorded_waits_are_labelled_segments(tmp_path):
    """A trace with the agent's waits recorded (sync level 2): each is a segment of its own."""
    _stats, trace, _ = run_waiting(tmp_path, 2, hotpath.PYTHON)
    out = tmp_path / "waits.html"
    report(str(trace), "--html", str(out))
    with Browser() as browser:
        browser.open(out)
        assert browser.problems() == []
        tips = browser.evaluate("Array.from(document.querySelectorAll("
                                "'#timeline rect.span.wait')).map(r => r.dataset.tip)")
        names_seen = {t.split(":")[0] for t in tips}
        assert {"wait for GPU (data)", "wait for GPU (forward)",
                "wait for GPU (iteration)"} <= names_seen
        bars = browser.evaluate("Array.from(document.querySelectorAll('#phases rect.bar'))"
                                ".map(r => r.dataset.tip)")
        assert any("waiting for the GPU (agent)" in t for t in bars)
