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
import time
from typing import Iterable

import pytest
from support import run_with_agent
from test_hotpath import IMPLEMENTATIONS, _impl, native_module  # noqa: F401 (a fixture)

from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.lifecycle.finish import report_run
from chainer_autoprof.report.summary import format_summary
from chainer_autoprof.report.tracefile import read_trace
from chainer_autoprof.runtime.device import CountingBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder

WAIT_S = 0.002
ITERATIONS = 8
WARMUP = 2


class WaitingBackend(CountingBackend):
    """The device-sync stand-in: a GPU still busy for ``WAIT_S`` at every synchronization."""

    def synchronize(self, devices: Iterable[int]) -> None:
        super().synchronize(devices)
        if tuple(devices):
            time.sleep(WAIT_S)


def run(tmp_path, level: int, impl_name: str, native_module, gpu: bool = True,  # noqa: F811
        iterations: int = ITERATIONS):
    impl = _impl(impl_name, native_module)
    tracer = Tracer(names.LINK_LEVEL, SyncPolicy(level, WaitingBackend()), implementation=impl)
    trace = tmp_path / f"sync{level}.json"
    cfg = Config({"summary": False, "trace": str(trace), "warmup": WARMUP,
                  "sync_level": level})
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)
    if gpu:
        tracer.sync.add_devices([0])  # the patches saw the model's arrays on GPU 0
    ts = tracer.state()
    link = tracer.info("predictor/l1 (Linear) @gpu0", names.LINK)
    for _ in range(iterations):
        for phase in names.PHASES:
            tracer.begin_phase(ts, phase)
            if phase == names.FORWARD:
                tracer.end(tracer.begin(link, ts), ts)
            tracer.end_phase(ts)
        tracer.end_iteration(ts)
    tracer.close()
    stats = report_run(recorder, tracer, cfg, hits=1, trace_path=lambda: str(trace))
    assert stats is not None
    return stats, trace, recorder


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


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_each_wait_lands_where_it_happened(tmp_path, impl_name, native_module):  # noqa: F811
    counted = ITERATIONS - WARMUP
    at_least = WAIT_S * 1e3 * counted * 0.95
    # sync 1: the wait at each iteration's end lies in the iteration, between phases
    stats, trace, _ = run(tmp_path, 1, impl_name, native_module)
    assert stats.waits_recorded and stats.iterations == counted
    assert waits_per_iteration(trace) == {**dict.fromkeys(names.PHASES, 0), "iteration": 1}
    assert stats.wait_phase_total_ms["other"] >= at_least
    assert all(stats.wait_phase_total_ms[k] == 0 for k in names.PHASES)
    # ... and the one at each iteration's start lies between iterations (the first one, before
    # the first iteration, in the start-up)
    assert stats.outside_ms["wait for GPU"] >= (ITERATIONS - 1) * WAIT_S * 1e3 * 0.95
    # sync 2: one wait inside each phase (its end), and one between phases at each phase's
    # start and at the iteration's end
    stats, trace, _ = run(tmp_path, 2, impl_name, native_module)
    assert waits_per_iteration(trace) == {**dict.fromkeys(names.PHASES, 1), "iteration": 5}
    for phase in names.PHASES:
        assert stats.wait_phase_total_ms[phase] >= at_least, phase
    assert stats.wait_phase_total_ms["other"] >= 5 * at_least
    # sync 3: the link's start and end add two waits inside forward
    stats, trace, _ = run(tmp_path, 3, impl_name, native_module)
    assert waits_per_iteration(trace)["forward"] == 3
    assert stats.wait_phase_total_ms["forward"] >= 3 * at_least
    # the phases still hold their waits; the series has one row per counted iteration
    assert stats.phase_total("forward") >= stats.wait_phase_total_ms["forward"]
    assert len(stats.wait_phase_ms["forward"]) == counted


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_the_trace_gives_the_same_waits(tmp_path, impl_name, native_module):  # noqa: F811
    stats, trace, _ = run(tmp_path, 2, impl_name, native_module)
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


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_the_summary_and_the_verdict_leave_the_waits_out(tmp_path, impl_name,
                                                         native_module):  # noqa: F811
    stats, _, _ = run(tmp_path, 1, impl_name, native_module)
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


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_no_waits_recorded_without_a_gpu_or_at_sync_0(tmp_path, impl_name,
                                                      native_module):  # noqa: F811
    stats, trace, recorder = run(tmp_path, 2, impl_name, native_module, gpu=False)
    assert not stats.waits_recorded
    assert not [i for i in recorder.infos if i[1] == names.GPU_WAIT]  # no name registered
    events = json.loads(trace.read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == names.GPU_WAIT]
    stats, _, recorder = run(tmp_path, 0, impl_name, native_module)
    assert recorder.tracer.sync.on_wait is None and not stats.waits_recorded


def test_waits_never_reach_nvtx(tmp_path):
    """A real subprocess with the NVTX recorder, at sync level 2, a GPU pretended for the
    recorder (its test switch): the waits are in the trace, not in the NVTX stream."""
    trace = tmp_path / "t.json"
    source = """
import numpy as np, chainer, chainer.links as L
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
x = np.ones((4, 3), np.float32); t = np.zeros(4, np.int32)
for _ in range(6):
    opt.update(model, x, t)
"""
    res = run_with_agent(tmp_path, source, {"CHAINER_PROF_SYNC_LEVEL": "2",
                                            "CHAINER_PROF_TRACE": str(trace)},
                         env={"CHAINER_AUTOPROF_TEST_EVENTS": "1"})
    assert res.returncode == 0, res.stderr
    pushed = {ev.text for ev in res.events if ev.event == "push"}
    assert "forward" in pushed and not any("wait for GPU" in t for t in pushed)
    assert "wait for GPU (forward)" in trace.read_text()
    assert res.tree()  # balanced (tree raises on an unbalanced stream)
