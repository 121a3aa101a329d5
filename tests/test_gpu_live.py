"""GPU time per link without synchronizing, in the agent: the real CUPTI recordings replayed
through the live path (recorder blocks and CUPTI buffers queued, attributed on the session's
own thread, the exit sequence, the trace written through the codec), then read back by
``report``, the HTML page, ``merge`` and HolisticTraceAnalysis."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter

import pytest
from gpu_live_replay import (
    forward_kernel_time_by_link,
    hta_as_written,
    hta_figures,
    idle_shares,
    replay_live,
    short,
    with_evaluation,
)
from headless_browser import Browser, find_browser
from support import clean_env, native_under_test
from traces import check_trace_file, nest_per_track

from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.analysis import whatif
from chainer_autoprof.analysis.gpu_figures import IDLE_KEYS, GpuFigures
from chainer_autoprof.common.gpu_records import KERNEL
from chainer_autoprof.report import gpu_events, trace_events
from chainer_autoprof.report.merge import merge
from chainer_autoprof.report.summary import IDLE_LABELS, format_summary
from chainer_autoprof.report.tracefile import open_trace, read_trace

RECORDINGS = ("b512", "b16")
#: Both readers of CUPTI's records: the native one (the tests' libcupti serving the recording
#: as CUPTI's structs; not in the run for a machine that cannot build C) and cupti-python's.
READERS = ("native", "python") if native_under_test() else ("python",)
_REPLAYS: dict[tuple[str, str], object] = {}


def _replayed(name: str, reader: str, tmp_path_factory):
    """Each recording replayed once per reader for the module."""
    if (name, reader) not in _REPLAYS:
        _REPLAYS[name, reader] = replay_live(
            name, tmp_path_factory.mktemp(f"live_{name}_{reader}"), reader=reader)
    return _REPLAYS[name, reader]


@pytest.fixture(scope="module", params=[(n, r) for r in READERS for n in RECORDINGS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def live(request, tmp_path_factory):
    return _replayed(*request.param, tmp_path_factory)


# (recording, reader) pairs: the readers are CUPTI's, not the hot path's twins
@pytest.fixture(scope="module", params=[("b512", r) for r in READERS], ids=lambda p: p[1])
def b512(request, tmp_path_factory):
    return _replayed(*request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[("b16", r) for r in READERS], ids=lambda p: p[1])
def b16(request, tmp_path_factory):
    return _replayed(*request.param, tmp_path_factory)


def figures_of(run) -> GpuFigures:
    assert run.outcome is not None
    return run.outcome.figures


# -- the figures, through the live path ----------------------------------------------------------

def test_every_record_went_through_the_queues_and_was_attributed(live):
    fig = figures_of(live)
    session = live.session
    ops = len(live.recording.batch.ops)
    assert fig.ops["kernel"] + fig.ops["memcpy"] + fig.ops["memset"] == ops
    assert fig.statuses == {"attributed": {"ops": ops, "ms": pytest.approx(
        fig.statuses["attributed"]["ms"])}}
    # the thread map told at the thread state's creation, not a guess by containment
    assert session.analysis.attributor.thread_map[live.main_thread] == live.trace.meta["main_tid"]
    # every range block reached the analysis; nothing was dropped on the way
    assert session.ranges_received == len(live.trace.ranges)
    assert session.dropped_ranges == session.dropped_ops == 0
    assert session.drains >= 3  # the drain thread fed the analysis while the run went on
    assert live.outcome.notes == [] and live.stats.gpu_activity.notes == []
    counts = live.stats.gpu_activity.collector
    assert counts["buffers"] == 12 and counts["callback_errors"] == 0
    assert 0 < counts["analysis_cpu_us"] * 1000 == pytest.approx(session.drain_cpu_ns, abs=999)
    if live.reader == "native":  # what the tests' libcupti served: the quiet calls are off
        assert live.session.reader.startswith("native (")
        assert counts["records"] == live.served > ops
    else:
        assert counts["records"] == ops + len(live.recording.batch.api)


def test_forward_time_per_link_agrees_with_the_recordings_external_ids(live):
    """Attributed by launch (not by the external ids), each link's forward kernel time
    agrees with the external-id attribution of the same kernels for >= 99% of its time."""
    ours, theirs, both = forward_kernel_time_by_link(live.outcome.analysis, live.recording)
    assert set(ours) == set(theirs) >= {"conv1", "conv2", "conv3", "fc1", "fc2", "fc3"}
    for link in theirs:
        assert both[link] >= 0.99 * max(theirs[link], ours[link]), (live.name, link)


def test_b512_conv2_and_conv3_and_a_gpu_that_sets_the_pace(b512):
    fig = figures_of(b512)
    per = {short(x["name"]): fig.per_iteration(x["fwd_ms"]) for x in fig.links}
    assert per["conv2"] == pytest.approx(5.9, rel=0.05)
    assert per["conv3"] == pytest.approx(2.9, rel=0.05)
    assert fig.busy_share > 0.95 and fig.iterations == 12
    assert short(fig.links[0]["name"]) == "conv2"


def test_b16_busy_share_near_22_percent_and_a_gpu_that_waits_for_the_host(b16):
    fig = figures_of(b16)
    assert fig.busy_share == pytest.approx(0.22, abs=0.05)  # 18.7% over this recording
    idle = fig.span_ms - fig.busy_ms
    assert fig.idle_ms["host"] > 0.6 * idle
    assert fig.busy_ms + sum(fig.idle_ms.values()) == pytest.approx(fig.span_ms, abs=1e-3)
    for i in range(fig.iterations):
        cols = fig.iteration_ms
        assert cols["busy"][i] + sum(cols[k][i] for k in IDLE_KEYS) == \
            pytest.approx(cols["span"][i], abs=1e-5)


# -- summary and verdict ---------------------------------------------------------------------------

def test_summary_ranks_links_by_gpu_time_and_shows_the_gpus_own_figures(live):
    text = format_summary(live.stats)
    fig = figures_of(live)
    n = fig.iterations
    assert "top links by GPU time (CUPTI kernel activity" in text
    assert "top links by time (forward inclusive" not in text
    table = text.split("top links by GPU time")[1].split("top kernels by GPU time")[0]
    rows = [line.split()[0] for line in table.splitlines()[2:] if line.startswith("    ")]
    assert rows[0] == fig.links[0]["name"].split()[0]
    totals = [x["fwd_ms"] + x["bwd_ms"] for x in fig.links]
    assert totals == sorted(totals, reverse=True)
    assert f"busy {figures_pct(fig.busy_share)} of the GPU's time" in text
    assert "idle, by cause (per iteration): " in text
    assert "waiting for the host to launch" in text or fig.idle_ms["host"] == 0
    assert "GPU time by phase launched in (per iteration): " in text
    top = fig.top_kernels[0]
    kernels = text.split("top kernels by GPU time")[1]
    assert top["name"][:40] in kernels and (top["link"] or "-") in kernels
    assert f"{figures_ms(top['ms'] / n)}" in kernels
    # what the analysis of the records cost, beside the agent's overhead
    ops = sum(fig.ops.values())
    cpu_us = live.stats.gpu_activity.collector["analysis_cpu_us"]
    line = next(x for x in text.splitlines() if x.startswith("  GPU analysis "))
    assert line.endswith(f" CPU for {ops:,} GPU operations ({cpu_us / ops:.2f} us each), on "
                         "a thread of its own")
    assert figures_ms(cpu_us / 1000) in line


def figures_pct(x: float) -> str:
    from chainer_autoprof.common import figures
    return figures.pct(x)


def figures_ms(x: float) -> str:
    from chainer_autoprof.common import figures
    return figures.ms(x)


def test_the_verdict_rests_on_the_measured_busy_share(live):
    v = vd.decide(live.stats)
    fig = figures_of(live)
    assert v.gpu is not None and v.gpu.busy_exact
    assert v.gpu.busy_share == pytest.approx(fig.busy_share)
    said = "\n".join([v.title, *v.evidence])
    assert "CUPTI kernel activity" in said
    if live.name == "b512":
        assert v.kind == "GPU-bound"
        assert f"busy {figures_pct(fig.busy_share)}" in v.title
        assert "predictor/conv2" in said  # the link with the most GPU time
    else:
        assert v.kind == "host-bound"
        assert "waiting for the host to launch" in said


def test_the_what_if_model_replays_the_run_from_its_kernel_activity(live):
    """With CUPTI the GPU's time per phase is measured: the unchanged replay gives the run's
    median, and the levers' bands stay narrow where nothing is left open."""
    wf = whatif.model(live.stats)
    assert wf is not None and wf.timeline.gpu_source.startswith("CUPTI kernel activity")
    median = live.stats.median()
    assert abs(wf.replay_ms - median) <= 0.05 * median, wf.replay_text()
    gpu2 = wf.get(whatif.GPU_2X)
    host2 = wf.get(whatif.HOST_2X)
    assert gpu2 is not None and host2 is not None
    if live.name == "b512":
        # 12 iterations whose host never blocked: the levers start where the run settles,
        # the GPU's pace (31.4 ms of kernel time per iteration measured there)
        assert wf.timeline.ran_ahead and 29.0 < wf.now_ms < 35.0
        assert gpu2.predicted_ms < 0.6 * gpu2.now_ms and host2.gain_ms < 0.02 * host2.now_ms
        assert wf.timeline.links[0][0].startswith("predictor/conv2")
    else:
        assert host2.predicted_ms < 0.6 * host2.now_ms and gpu2.gain_ms < 0.02 * gpu2.now_ms
        assert host2.high_ms < 0.7 * host2.now_ms  # the GPU's share measured, not open


# -- the trace ------------------------------------------------------------------------------------

def test_the_live_trace_follows_the_viewers_rules_and_reads_back(live, tmp_path):
    data = json.loads(live.path.read_text())
    events = data["traceEvents"]
    kinds = Counter(trace_events.kind_of(e).name if trace_events.kind_of(e) else None
                    for e in events)
    fig = figures_of(live)
    assert kinds["kernel"] == fig.ops["kernel"] and kinds["gpu_memcpy"] == fig.ops["memcpy"]
    assert kinds["launch flow start"] == kinds["launch flow end"] > 0
    assert kinds["profiler step"] == 15
    assert data["distributedInfo"]["rank"] == 0 and data["schemaVersion"] == 1
    assert {"deviceProperties", "baseTimeNanoseconds"} <= set(data)
    pid = data["otherData"]["chainer_autoprof"]["pid"]
    assert {e["pid"] for e in events if e.get("cat") == "kernel"} == {gpu_events.gpu_pid(pid, 0)}
    nest_per_track(events)  # Perfetto and chrome://tracing draw each track as a stack
    # the GPU events never read as ranges: the agent's reader sees the ranges it wrote
    trace = read_trace(str(live.path))
    assert {r.category for r in trace.ranges}.isdisjoint(
        {"kernel", "gpu_memcpy", "cuda_runtime", "cuda_driver", "user_annotation"})
    assert len(trace.ranges) == len(live.trace.ranges)
    assert len(trace.events["kernel"]) == fig.ops["kernel"]
    assert len(trace.events["cuda_driver"]) + len(trace.events["cuda_runtime"]) == \
        kinds["launch flow start"]
    stripped = tmp_path / "ranges.json"
    stripped.write_text(json.dumps({**data, "traceEvents": [
        e for e in events if not gpu_events.is_gpu_event(e)]}))
    check_trace_file(stripped)
    saved = trace.stats()
    assert saved.iterations == live.stats.iterations
    assert saved.gpu_activity.to_dict() == json.loads(json.dumps(live.stats.gpu_activity.to_dict()))


def test_report_on_the_saved_trace_gives_the_same_gpu_figures(live, tmp_path):
    """From the saved figures, and, when a trace holds only the GPU events, by attributing
    them again to its ranges."""
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", str(live.path)],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "top links by GPU time" in proc.stdout
    assert "CUPTI kernel activity" in proc.stdout
    data = open_trace(str(live.path))
    data["otherData"]["chainer_autoprof"].pop("gpu_activity")
    bare = tmp_path / "events_only.json"
    bare.write_text(json.dumps(data))
    again = read_trace(str(bare)).stats().gpu_activity
    assert again is not None and again.source.startswith("the trace's GPU kernel events")
    live_fig = live.stats.gpu_activity
    for key in ("links", "phases", "top_kernels", "iterations", "ops", "idle_ms", "busy_ms"):
        assert _rounded(getattr(again, key)) == _rounded(getattr(live_fig, key)), key


def _rounded(value):
    """Figures through the trace's microseconds with 3 decimals: equal to the nanosecond."""
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_holistic_trace_analysis_reads_the_live_trace(live, tmp_path):
    """HTA loads the agent's trace, finds its iterations by their ProfilerStep marks, and its
    temporal and idle-time breakdowns over the counted iterations give a busy share within 5
    points of the agent's, and each idle category a share within 5 points of the agent's."""
    pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (it comes with the test extra: "
               "pip install -e '.[test]')")
    data = json.loads(live.path.read_text())
    hta = hta_figures(data, tmp_path / "hta")
    skip = data["otherData"]["chainer_autoprof"]["warmup_skip"]
    assert hta["steps"] == list(range(skip, 15))
    fig = figures_of(live)
    assert abs(hta["busy"] - fig.busy_share) < 0.05
    assert abs(hta["active"] - fig.active_share) < 0.05
    assert sum(hta["idle"].values()) == pytest.approx(hta["idle_us"], rel=0.01)
    # the idle time splits alike: host wait, kernel wait (launch latency), other
    shares = idle_shares(fig.idle_ms, hta["idle"])
    for category, (theirs, ours) in shares.items():
        assert abs(theirs - ours) < 0.05, (category, shares)
    # and on the whole trace as written, with HTA's default options
    assert hta_as_written(live.path, tmp_path / "as_written")["steps"] == list(range(14))
    print(f"{live.name}: HTA busy {hta['busy']:.4f}, active {hta['active']:.4f}; ours busy "
          f"{fig.busy_share:.4f}, active {fig.active_share:.4f}; HTA idle (us) {hta['idle']}")


def test_merge_keeps_gpu_tracks_and_flows_apart_across_ranks(live, tmp_path):
    """Two processes' traces merged: each GPU's tracks move with their process, flow ids stay
    unique, and the launching calls never count as ranges in the per-rank figures."""
    first = open_trace(str(live.path))
    second = json.loads(json.dumps(first))
    meta = second["otherData"]["chainer_autoprof"]
    old_pid, meta["pid"] = meta["pid"], meta["pid"] + 1
    for e in second["traceEvents"]:
        if e.get("pid") == old_pid:
            e["pid"] = old_pid + 1
        elif trace_events.is_gpu_pid(e.get("pid")):
            e["pid"] = gpu_events.gpu_pid(old_pid + 1, 0)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    out = tmp_path / "merged.json"
    summary = merge([str(a), str(b)], str(out))
    assert [r["iterations"] for r in summary["ranks"]] == [live.stats.iterations] * 2
    events = json.loads(out.read_text())["traceEvents"]
    kernel_pids = {e["pid"] for e in events if e.get("cat") == "kernel"}
    assert kernel_pids == {gpu_events.gpu_pid(1, 0), gpu_events.gpu_pid(2, 0)}
    gpu_names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"
                 and trace_events.is_gpu_pid(e["pid"])]
    assert {e["pid"] for e in gpu_names} == kernel_pids
    streams = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M"
               and e["name"] == "thread_name" and trace_events.is_gpu_pid(e["pid"])}
    assert {(e["pid"], e["tid"]) for e in events if e.get("cat") == "kernel"} <= streams
    starts = [e["id"] for e in events if e["ph"] == "s"]
    ends = [e["id"] for e in events if e["ph"] == "f"]
    assert len(set(starts)) == len(starts) and set(starts) == set(ends)
    calls = {e["pid"] for e in events if e.get("cat") in ("cuda_driver", "cuda_runtime")}
    assert calls == {1, 2}
    nest_per_track(events)


# -- the HTML page -----------------------------------------------------------------------------

@pytest.mark.skipif(find_browser() is None,
                    reason="headless browser tests need chromium (apt-get install chromium)")
def test_html_report_shows_the_gpu_activity(live, tmp_path):
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", str(live.path),
                           "--html", str(out)], env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fig = figures_of(live)
    with Browser() as browser:
        browser.open(out)
        assert browser.evaluate("document.body.dataset.ready") == "1"
        assert browser.problems() == []
        assert browser.requests() == [out.resolve().as_uri()]
        kind = browser.evaluate("document.querySelector('#verdict .kind').textContent")
        assert kind == ("GPU-bound" if live.name == "b512" else "host-bound")
        text = browser.evaluate("document.querySelector('#gpu-activity').textContent")
        assert f"Busy {figures_pct(fig.busy_share)}" in text and "CUPTI kernel activity" in text
        links = browser.evaluate("Array.from(document.querySelectorAll("
                                 "'#gpu-activity table.gpulinks tbody tr'))"
                                 ".map(r => r.cells[0].textContent)")
        assert links == [x["name"] for x in fig.links[:len(links)]] and len(links) > 5
        kernels = browser.evaluate("document.querySelectorAll("
                                   "'#gpu-activity table.gpukernels tbody tr').length")
        assert kernels == len(fig.top_kernels)
        segments = browser.evaluate("Array.from(document.querySelectorAll("
                                    "'#gpu-activity rect.seg')).map(r => r.dataset.tip)")
        assert segments[0].startswith("busy: ")
        assert [t.split(":")[0] for t in segments[1:]] == [
            IDLE_LABELS[k] for k, v in fig.idle_ms.items() if v > 0]
        data = json.loads(browser.evaluate("document.getElementById('report-data')"
                                           ".textContent"))
        assert data["gpu_activity_busy_share"] == round(fig.busy_share, 4)


# -- bounds ---------------------------------------------------------------------------------------

def test_over_the_record_limit_the_trace_keeps_whole_iterations_not_the_evaluation(tmp_path):
    """A record limit of 2,000 ranges keeps 500 GPU operations; an evaluation after training
    launches 1,030 more.  The trace drops what ran outside the iterations first, then the
    oldest iterations, whole: every ProfilerStep it keeps holds every kernel launched in
    its iteration, the summary says what was left out, and HolisticTraceAnalysis's
    temporal and idle-time breakdowns run on the trace as written."""
    pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (it comes with the test extra: "
               "pip install -e '.[test]')")
    rec = with_evaluation("b16", repeats=10)
    run = replay_live("b16", tmp_path, record_limit=2000, recording=rec, pace_s=0.02)
    fig = figures_of(run)
    assert fig.ops["kernel"] + fig.ops["memcpy"] == len(rec.batch.ops)  # the figures: all
    data = json.loads(run.path.read_text())
    events = data["traceEvents"]
    ops = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert 0 < len(ops) <= 500
    # the kernels each step holds (launched inside it) against those its iteration launched
    start = data["otherData"]["chainer_autoprof"]["clock"]["perf_counter_ns_at_start"]
    launch_of = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    api = rec.batch.api
    recorded_launch = dict(zip(api.correlation.tolist(), (
        run.session.analysis.attributor.clock.to_agent(api.start) - start).tolist()))
    kernels = rec.batch.ops.correlation[rec.batch.ops.kind == KERNEL].tolist()
    in_trace = {e["args"]["correlation"] for e in ops if e["cat"] == "kernel"}
    steps = [e for e in events if e.get("cat") == "user_annotation"]
    numbers = [int(e["name"].split("#")[1]) for e in steps]
    assert numbers == list(range(15 - len(steps), 15)) and len(steps) >= 3  # the newest
    for step in steps:
        t0, t1 = step["ts"] * 1000, (step["ts"] + step["dur"]) * 1000
        launched = {c for c in kernels if t0 <= recorded_launch[c] <= t1}
        held = {c for c in in_trace if t0 <= launch_of[c] * 1000 <= t1}
        assert len(launched) > 50 and held == launched, step["name"]
    evaluation = set(rec.batch.ops.correlation[-1030:].tolist())
    assert not evaluation & {e["args"]["correlation"] for e in ops}
    keeper = run.outcome.analysis.keeper
    assert keeper.dropped == len(rec.batch.ops) - len(ops)
    note = (f"the trace keeps {len(steps)} whole iterations' GPU operations (record limit); "
            f"left out: {15 - len(steps)} iterations' (")
    assert any(line.startswith(note) for line in run.stats.gpu_activity.notes)
    assert f"note: {note}" in format_summary(run.stats)
    # HolisticTraceAnalysis on the trace as written, as a user calls it
    hta = hta_as_written(run.path, tmp_path / "hta")
    assert hta["steps"] == numbers[:-1]  # the last step left out by default


def test_with_a_capture_window_the_trace_keeps_the_operations_of_iterations_only(tmp_path):
    """With a window, only the operations launched in an iteration are kept (the figures
    count all), and HolisticTraceAnalysis's breakdowns run on that trace."""
    run = replay_live("b16", tmp_path, window=True, pace_s=0.02)
    kept = run.outcome.analysis.records()
    assert len(kept) and (kept.attr.iteration >= 0).all()
    every = len(run.recording.batch.ops)
    outside = every - len(kept)
    assert outside > 0  # the model's arrays copied to the GPU before training
    assert run.outcome.analysis.keeper.dropped == 0
    assert sum(run.outcome.figures.ops.values()) == every
    if importlib.util.find_spec("hta") is not None:
        assert hta_as_written(run.path, tmp_path / "hta")["steps"]
