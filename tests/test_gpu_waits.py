"""The agent's own waits for the GPU, recorded where they happen.

At sync level 1 and above the agent waits for the GPU at range boundaries.  Each wait is
recorded as a ``gpu_wait`` row named after the place it lies in (a phase, or the iteration
between phases), in both hot paths, so the summary can show the waits as their own row and
the verdict leave them out of the host's figures.  They are never NVTX ranges (the CUDA API
row of Nsight shows the synchronize call; the program's NVTX ranges stay its own).

Without a GPU the stand-in for the device-sync call (CountingBackend) waits a fixed time
when the model's arrays are said to be on a GPU.
"""

from __future__ import annotations

import json

import pytest
from support import program, run_with_agent
from waiting_gpu import ITERATIONS, WAIT_S, WARMUP, run_waiting

from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.common import names
from chainer_autoprof.report.summary import format_summary
from chainer_autoprof.report.tracefile import read_trace


def waits_per_iteration(trace) -> dict[str, float]:
    """Wait rows per counted iteration, by place, counted in the trace (not timed: the stand-in
    sleeps at least ``WAIT_S``, more on a loaded machine)."""
    events = json.loads(trace.read_text())["traceEvents"]
    counts: dict[str, float] = {}
    for e in events:
        if e.get("cat") == names.GPU_WAIT:
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    return {place: counts.get(names.gpu_wait_text(place), 0) / ITERATIONS
            for place in names.WAIT_PLACES}


def test_each_wait_lands_where_it_happened(tmp_path, implementation):
    counted = ITERATIONS - WARMUP
    at_least = WAIT_S * 1e3 * counted * 0.95
    # sync 1: the wait at each iteration's end lies in the iteration, between phases
    stats, trace, _ = run_waiting(tmp_path, 1, implementation)
    assert stats.waits_recorded and stats.iterations == counted
    assert waits_per_iteration(trace) == {**dict.fromkeys(names.PHASES, 0), "iteration": 1}
    assert stats.wait_phase_total_ms["other"] >= at_least
    assert all(stats.wait_phase_total_ms[k] == 0 for k in names.PHASES)
    # ... and the one at each iteration's start lies between iterations (the first one, before
    # the first iteration, in the start-up)
    assert stats.outside_ms["wait for GPU"] >= (ITERATIONS - 1) * WAIT_S * 1e3 * 0.95
    # sync 2: one wait inside each phase (its end), and one between phases at each phase's
    # start and at the iteration's end
    stats, trace, _ = run_waiting(tmp_path, 2, implementation)
    assert waits_per_iteration(trace) == {**dict.fromkeys(names.PHASES, 1), "iteration": 5}
    for phase in names.PHASES:
        assert stats.wait_phase_total_ms[phase] >= at_least, phase
    assert stats.wait_phase_total_ms["other"] >= 5 * at_least
    # sync 3: the link's start and end add two waits inside forward
    stats, trace, _ = run_waiting(tmp_path, 3, implementation)
    assert waits_per_iteration(trace)["forward"] == 3
    assert stats.wait_phase_total_ms["forward"] >= 3 * at_least
    # the phases still hold their waits; the series has one row per counted iteration
    assert stats.phase_total("forward") >= stats.wait_phase_total_ms["forward"]
    assert len(stats.wait_phase_ms["forward"]) == counted


def test_the_trace_gives_the_same_waits(tmp_path, implementation):
    stats, trace, _ = run_waiting(tmp_path, 2, implementation)
    again = read_trace(str(trace)).stats()
    assert again.waits_recorded
    for key, total in stats.wait_phase_total_ms.items():
        assert again.wait_phase_total_ms[key] == pytest.approx(total, abs=1e-6), key
    events = json.loads(trace.read_text())["traceEvents"]
    waits = [e for e in events if e.get("cat") == names.GPU_WAIT]
    assert {e["name"] for e in waits} >= {names.gpu_wait_text(p) for p in names.WAIT_PLACES}
    # nested where they happened: a phase's wait one level below the phase
    phase_depth = {e["name"]: e["args"]["depth"] for e in events if e.get("cat") == "forward"}
    inside = [e for e in waits if e["name"] == names.gpu_wait_text("forward")]
    assert {e["args"]["depth"] for e in inside} == {phase_depth["forward"] + 1}


def test_the_summary_and_the_verdict_leave_the_waits_out(tmp_path, implementation):
    stats, _, _ = run_waiting(tmp_path, 1, implementation)
    stats.meta["devices"] = [{"id": 0}]
    text = format_summary(stats)
    row = next(line for line in text.splitlines()
               if line.strip().startswith("waiting for the GPU (agent's sync)"))
    assert "~" not in row  # recorded, not estimated
    verdict = vd.decide(stats)
    assert verdict.figures["wait_ms"] == pytest.approx(sum(stats.wait_phase_total_ms.values()))
    own = verdict.figures["other_own_ms_per_iteration"]
    assert own < stats.phase_total("other") / stats.iterations - 0.9 * WAIT_S * 1e3
    assert any("the agent's overhead, not the run's bottleneck" in n for n in verdict.notes)


def test_no_waits_recorded_without_a_gpu_or_at_sync_0(tmp_path, implementation):
    stats, trace, recorder = run_waiting(tmp_path, 2, implementation, gpu=False)
    assert not stats.waits_recorded
    assert not [i for i in recorder.infos if i[1] == names.GPU_WAIT]  # no name registered
    events = json.loads(trace.read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == names.GPU_WAIT]
    stats, _, recorder = run_waiting(tmp_path, 0, implementation)
    assert recorder.tracer.sync.on_wait is None and not stats.waits_recorded


def test_waits_never_reach_nvtx(tmp_path, twin):
    """A real subprocess with the NVTX recorder, at sync level 2, a GPU pretended for the
    recorder (its test switch): the waits are in the trace, not in the NVTX stream."""
    trace = tmp_path / "t.json"
    source = program("gpu_waits_six_updates")
    res = run_with_agent(tmp_path, source, {"CHAINER_PROF_SYNC_LEVEL": "2",
                                            "CHAINER_PROF_TRACE": str(trace)},
                         env={"CHAINER_AUTOPROF_TEST_EVENTS": "1"})
    assert res.returncode == 0, res.stderr
    pushed = {ev.text for ev in res.events if ev.event == "push"}
    assert "forward" in pushed and not any("wait for GPU" in t for t in pushed)
    assert "wait for GPU (forward)" in trace.read_text()
    assert res.tree()  # balanced (tree raises on an unbalanced stream)
