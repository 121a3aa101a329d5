"""What a change would buy: the what-if model over the run's timeline.

Checked against real counterfactual runs: the batch-512 CNN recorded on one H100 at sync
levels 0, 1, 2 and 3 (tests/data/gpu/traces, same workload, machine and hour): replaying the
sync-1/2/3 traces without the agent's synchronization must land near what the sync-0 trace
measured.  The model is built from how a Chainer step runs, never fitted to these numbers;
its unchanged replay must give each recording's measured median.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, clean_env

from chainer_autoprof.analysis import advice, whatif
from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.analysis.stats import PHASE_KEYS, RunStats
from chainer_autoprof.common import figures, log
from chainer_autoprof.report.summary import format_summary, format_verdict
from chainer_autoprof.report.tracefile import read_trace

DATA = REPO / "tests" / "data" / "gpu"
TRACES = sorted((DATA / "traces").glob("*.json"))
#: Every recorded GPU trace the tests hold: the six runs and the two beside CUPTI records.
RECORDED = TRACES + sorted((DATA / "cupti").glob("*/agent_trace.json"))
SYNC0 = DATA / "traces" / "gpu_bound_b512_sync0_phase.json"
SYNCED = [DATA / "traces" / f"gpu_bound_b512_sync{n}" for n in (1, 2, 3)]
LINE = re.compile(r"^what-if (?P<lever>.+): (?P<now>\S+ \S+) -> (?P<predicted>\S+ \S+) per "
                  r"iteration \((?P<low>\S+ \S+) to (?P<high>\S+ \S+)\)$")


def stats_of(path: Path) -> RunStats:
    return read_trace(str(path)).stats()


def model_of(stats: RunStats) -> whatif.WhatIf:
    wf = whatif.model(stats)
    assert wf is not None
    return wf


def synced(stem: Path) -> Path:
    (path,) = stem.parent.glob(stem.name + "_*.json")
    return path


def test_every_recorded_trace_is_here():
    assert len(TRACES) == 6 and len(RECORDED) == 8


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_unchanged_replay_gives_the_measured_median(path: Path):
    stats = stats_of(path)
    wf = model_of(stats)
    assert wf.measured_ms == stats.median()
    assert abs(wf.replay_ms - stats.median()) <= 0.05 * stats.median(), wf.replay_text()
    assert abs(wf.replay_error) <= 0.05
    assert figures.ms(wf.replay_ms) in wf.replay_text()


@pytest.mark.parametrize("stem", SYNCED, ids=lambda p: p.name)
def test_sync_level_0_predicted_from_the_synchronized_runs(stem: Path):
    """The sync-0 run measured 31.0 ms per iteration; each synchronized run of the same
    workload predicts it within 10%, and its band holds it."""
    measured = stats_of(SYNC0).median()
    assert figures.ms(measured) == "31.0 ms"
    stats = stats_of(synced(stem))
    assert stats.sync_level >= 1 and stats.median() > 1.15 * measured
    p = model_of(stats).get(whatif.SYNC0)
    assert p is not None, whatif.lines(whatif.model(stats))
    assert abs(p.predicted_ms - measured) <= 0.10 * measured, p.text()
    assert p.low_ms <= measured <= p.high_ms, p.text()
    assert p.now_ms == stats.median()


def test_each_line_reads_as_the_issue_asks_through_the_figure_formatter():
    for path in TRACES:
        wf = model_of(stats_of(path))
        assert wf.predictions
        for p in wf.predictions:
            m = LINE.match(p.text())
            assert m, p.text()
            assert m["now"] == figures.ms(p.now_ms)
            assert m["predicted"] == figures.ms(p.predicted_ms)
            assert (m["low"], m["high"]) == (figures.ms(p.low_ms), figures.ms(p.high_ms))
            assert p.low_ms <= p.predicted_ms <= p.high_ms


def test_levers_where_they_matter():
    by_name = {p.stem: model_of(stats_of(p)) for p in TRACES}
    # the agent's synchronization is a lever only where there is one
    assert by_name["gpu_bound_b512_sync0_phase"].get(whatif.SYNC0) is None
    assert by_name["gpu_bound_b512_sync2_phase"].get(whatif.SYNC0) is not None
    for wf in by_name.values():
        assert wf.get(whatif.HOST_2X) is not None and wf.get(whatif.GPU_2X) is not None
    # data loading at batch 16 is a twentieth of a step: not a visible share
    assert by_name["host_bound_b16_sync0_phase"].get(whatif.INPUT_FREE) is None
    # per-link GPU time (sync level 3): the top link named
    link = [p for p in by_name["gpu_bound_b512_sync3_link"].predictions
            if p.lever.endswith("GPU time halved")]
    assert [p.lever for p in link] == ["predictor/conv2 (Convolution2D) @gpu0 GPU time halved"]
    assert link[0].gain_ms > 0


def test_who_pays_off_on_the_real_runs():
    """Batch 512 is GPU-bound: a GPU twice as fast nearly halves the step, a faster host buys
    nothing at sync 0; batch 16 is host-bound: the other way round."""
    gpu_bound = model_of(stats_of(SYNC0))
    gpu2, host2 = gpu_bound.get(whatif.GPU_2X), gpu_bound.get(whatif.HOST_2X)
    assert gpu2 is not None and host2 is not None
    assert gpu2.predicted_ms < 0.6 * gpu2.now_ms and host2.gain_ms < 0.02 * host2.now_ms
    host_bound = model_of(stats_of(DATA / "traces" / "host_bound_b16_sync0_phase.json"))
    gpu2, host2 = host_bound.get(whatif.GPU_2X), host_bound.get(whatif.HOST_2X)
    assert gpu2 is not None and host2 is not None
    assert host2.predicted_ms < 0.6 * host2.now_ms and gpu2.gain_ms < 0.02 * gpu2.now_ms
    # at batch 16 the GPU's time per phase is open (it keeps up): the band says so
    assert host2.high_ms >= 0.95 * host2.now_ms


def test_a_short_run_whose_host_ran_ahead_starts_from_where_it_would_settle():
    """Twelve counted iterations at sync 0 whose host never blocked: the measured median is
    the host's pace (13.6 ms), the GPU's is 31.9 ms; the levers start from the latter."""
    stats = stats_of(DATA / "cupti" / "b512" / "agent_trace.json")
    wf = model_of(stats)
    assert wf.timeline.ran_ahead
    assert wf.now_ms > 2 * stats.median()
    assert "ran ahead of the GPU" in wf.replay_text()
    gpu2 = wf.get(whatif.GPU_2X)
    assert gpu2 is not None and gpu2.now_ms == wf.now_ms and gpu2.predicted_ms < 0.6 * wf.now_ms


# -- run records built here: the model's rules ------------------------------------------------

FACTS = {"params": {"count": 4, "size": 1000, "dtypes": {"float32": 4}, "gpu": 4},
         "functions_per_iteration": 40, "cuda": {"available": True, "cudnn_enabled": True},
         "config": {"type_check": True, "autotune": True, "use_cudnn": "auto"}}


def record(sync_level: int, host: dict[str, float], gpu: dict[str, float] | None = None,
           sync_ms: float | None = None, n: int = 20, jitter: float = 0.0,
           facts: dict | None = None, waits: dict[str, float] | None = None) -> RunStats:
    """``n`` iterations of these host phase times (ms, the agent's waits included), CUDA
    event spans, the run's total wait or the waits recorded per phase; ``jitter`` spreads
    the iterations (each phase scaled by 1 +- jitter)."""
    scales = [1.0 + jitter * ((i % 5) - 2) / 2.0 for i in range(n)]
    phase_ms = {k: [host.get(k, 0.0) * s for s in scales] for k in PHASE_KEYS}
    iteration_ms = [sum(phase_ms[k][i] for k in PHASE_KEYS) for i in range(n)]
    meta = {"facts": copy.deepcopy(FACTS if facts is None else facts),
            "devices": [{"id": 0, "name": "GPU"}], "versions": {"cupy": "13.6.0"}}
    if sync_ms is not None:
        meta["sync_ms"] = sync_ms
    return RunStats(
        iterations=n, warmup=0, iteration_ms=iteration_ms, phase_ms=phase_ms, outside_ms={},
        wall_ms=sum(iteration_ms) + 100.0, links=[], batch_size=32, sync_level=sync_level,
        sync_calls=2 * n if sync_level else 0, overhead_ms=1.0,
        gpu_phase_ms={k: [v] * n for k, v in gpu.items()} if gpu else None, meta=meta,
        iteration_total_ms=sum(iteration_ms),
        phase_total_ms={k: sum(v) for k, v in phase_ms.items()},
        wait_phase_ms={k: [(waits or {}).get(k, 0.0)] * n for k in PHASE_KEYS} if waits else {},
        wait_phase_total_ms={k: (waits or {}).get(k, 0.0) * n for k in PHASE_KEYS}
        if waits else {}, waits_recorded=bool(waits))


#: A slow input pipeline at sync level 2 in front of a GPU that needs 20 ms per step: data
#: loading 57 of 93 ms on the host; the agent waited 25 ms per iteration at the joins.
SLOW_INPUT = dict(host={"data": 57.0, "forward": 15.0, "backward": 18.0, "update": 1.0,
                        "other": 2.0},
                  gpu={"iteration": 93.0, "data": 57.0, "forward": 15.0, "backward": 18.0,
                       "update": 1.0})


def test_the_band_follows_the_spread_of_the_iterations():
    host = {"data": 1.0, "forward": 4.0, "backward": 5.0, "update": 0.5, "other": 0.5}
    steady = model_of(record(0, host, dict(host, iteration=11.0)))
    jittery = model_of(record(0, host, dict(host, iteration=11.0), jitter=0.1))
    assert steady.spread == 0.0 < jittery.spread
    a, b = steady.get(whatif.HOST_2X), jittery.get(whatif.HOST_2X)
    assert a is not None and b is not None
    assert (b.high_ms - b.low_ms) > (a.high_ms - a.low_ms)


def test_recorded_waits_at_sync_2_bound_the_gpus_time():
    """Waits recorded where they happened (this version's traces): at sync level 2 the GPU
    was busy at least while the host waited at a phase's end and at most the whole phase;
    without the joins the step takes about the GPU's time, the host's own being shorter."""
    host = {"data": 2.0, "forward": 10.0, "backward": 20.0, "update": 1.0, "other": 0.5}
    waits = {"forward": 7.0, "backward": 15.0, "update": 0.5}
    wf = model_of(record(2, host, waits=waits))
    assert abs(wf.replay_error) < 0.05
    assert wf.timeline.host["forward"] == pytest.approx(3.0)
    assert wf.timeline.gpu_low["backward"] == pytest.approx(15.0)
    assert wf.timeline.gpu_high["backward"] == pytest.approx(20.0)
    p = wf.get(whatif.SYNC0)
    assert p is not None
    assert 22.5 + 0.5 <= p.predicted_ms <= 31.0 < wf.measured_ms  # the GPU's time, bounded
    assert p.low_ms <= 22.5 + 0.5 and p.high_ms >= 31.0


def test_input_free_at_sync_2_keeps_the_gpus_time():
    stats = record(2, **SLOW_INPUT, sync_ms=25.0 * 20)
    p = model_of(stats).get(whatif.INPUT_FREE)
    assert p is not None
    # free data leaves the host's 36 ms of own work, joined with the GPU's at every phase
    assert 30.0 < p.predicted_ms < 45.0, p.text()


def test_input_free_at_sync_0_leaves_the_gpus_pace():
    """At sync 0 the next batch loads while the GPU still runs: with a slow input pipeline
    (57 ms of loading, the GPU idle meanwhile: the data phase's span equals it) in front of
    31 ms of GPU work, free data leaves the GPU's 31 ms, not the host's 11 ms."""
    host = {"data": 57.0, "forward": 5.0, "backward": 5.0, "update": 0.5, "other": 0.5}
    spans = {"iteration": 68.0, "data": 57.0, "forward": 11.0, "backward": 20.0,
             "update": 0.2}
    stats = record(0, host, spans)
    wf = model_of(stats)
    assert abs(wf.replay_error) < 0.05
    assert not wf.timeline.ran_ahead and vd.decide(stats).kind == "input-bound"
    p = wf.get(whatif.INPUT_FREE)
    assert p is not None
    assert 30.0 <= p.predicted_ms <= 33.0 and p.low_ms <= 31.0 <= p.high_ms, p.text()


def test_input_bound_at_every_sync_level():
    """A data phase over the threshold is input-bound at sync 0 to 3, whatever the GPU
    evidence says (at sync 2 it used to be "not enough evidence")."""
    for level in (0, 1, 2, 3):
        waited = 25.0 * 20 if level else None
        verdict = vd.decide(record(level, **SLOW_INPUT, sync_ms=waited))
        assert verdict.kind == "input-bound", (level, format_verdict(verdict))
        assert any(line.startswith("what-if input free:") for line in verdict.evidence)


def test_host_and_gpu_both_saturated_names_both_and_which_pays_off_first():
    host = {"data": 0.5, "forward": 12.0, "backward": 16.0, "update": 1.0, "other": 0.8}
    stats = record(0, host, dict(host, iteration=30.3))
    stats.meta["gpu_activity"] = {"busy_share": 0.95, "source": "CUPTI kernel activity"}
    verdict = vd.decide(stats)
    text = format_verdict(verdict)
    assert verdict.kind == "host- and GPU-bound", text
    assert "the GPU is busy 95.0%" in verdict.title and "the host's own work takes" in text
    assert re.search(r"; the (host|GPU) pays off first$", verdict.title)
    assert any(LINE.match(line) and "host 2x faster" in line for line in verdict.evidence)
    assert any(LINE.match(line) and "GPU 2x faster" in line for line in verdict.evidence)
    # the summary's closing line says the same: both, not "the GPU sets the pace"
    stats.ranges = 20 * 6  # (the synthetic record's ranges, as a recorded run has them)
    closing = format_summary(stats).rsplit("=> ", 1)[-1]
    assert closing.startswith("the host and the GPU both set the pace"), closing
    assert re.search(r"the (host|GPU) pays off first\.", " ".join(closing.split())), closing
    # the same GPU behind a host with time to spare (half the step waiting at sync 1) stays
    # GPU-bound
    light = {"data": 0.5, "forward": 6.0, "backward": 8.0, "update": 0.5, "other": 15.3}
    stats = record(1, light, sync_ms=15.0 * 20)
    stats.meta["gpu_activity"] = {"busy_share": 0.95}
    assert vd.decide(stats).kind == "GPU-bound"


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_the_recordings_keep_their_verdicts(path: Path):
    kind = vd.decide(stats_of(path)).kind
    assert kind == ("GPU-bound" if path.stem.startswith("gpu_bound") else "host-bound")


def test_advice_costs_show_their_lever_ordered_by_gain():
    facts = dict(FACTS, iterator="SerialIterator", type_check_us=2.0, function_cpu_us=20.0)
    stats = record(1, **SLOW_INPUT, sync_ms=25.0 * 20, facts=facts)
    findings = advice.check(stats)
    keys = [f.key for f in findings]
    assert keys[:2] == ["serial_iterator", "type_check"], keys
    for f in findings[:2]:
        assert LINE.match(f.cost.split("; ")[-1]), f.cost
    assert "what-if input free:" in findings[0].cost
    assert "what-if type checks off:" in findings[1].cost


def test_the_summary_prints_the_levers_after_the_verdict():
    text = format_summary(stats_of(synced(SYNCED[0])))
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("What-if"))
    assert head > next(i for i, line in enumerate(lines) if line.startswith("Verdict:"))
    assert LINE.match(lines[head + 1].strip())
    assert lines[head + 1].strip().startswith("what-if sync level 0: 36.8 ms -> ")


def test_the_summarys_debug_output_says_how_close_the_replay_came(capsys):
    stats = stats_of(synced(SYNCED[0]))
    wf = model_of(stats)
    log.set_level("debug")
    try:
        format_summary(stats)
    finally:
        log.set_level("warning")
    said = capsys.readouterr().err
    assert (f"what-if model: the timeline replayed unchanged gives {figures.ms(wf.replay_ms)} "
            f"per iteration against the measured median {figures.ms(stats.median())} "
            f"({'+' if wf.replay_error >= 0 else ''}{figures.pct(wf.replay_error)})" in said), said


def test_report_on_a_trace_of_an_earlier_version():
    """The recordings were written by an earlier version of the agent; ``report`` plays the
    levers from what they hold."""
    path = synced(SYNCED[1])
    out = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", str(path)],
                         capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    levers = [line.strip() for line in out.stdout.splitlines()
              if line.strip().startswith("what-if ")]
    wf = model_of(stats_of(path))
    assert levers == [p.text() for p in wf.predictions]
