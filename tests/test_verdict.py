"""The bottleneck verdict on scripted runs whose bottleneck is known, and the replay experiment.

Each run is a real Chainer training (tests/verdict_workloads.py) under the
agent, in a subprocess, with the summary on stderr and a trace written; the
verdict is checked both in the live summary and on the statistics read back
from the trace.
"""

from __future__ import annotations

import json
import re

import pytest
from verdict_workloads import run_workload

from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.analysis.stats import RunStats
from chainer_autoprof.common import figures
from chainer_autoprof.report.summary import format_verdict

_RUNS: dict[str, object] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lazily run each named workload once per module."""
    base = tmp_path_factory.mktemp("verdict")

    def get(name: str, *args: str, env: dict[str, str] | None = None):
        if name not in _RUNS:
            _RUNS[name] = run_workload(base / name, *args, env=env)
        return _RUNS[name]

    return get


INPUT_BOUND = ("mlp", "--delay", "0.002", "--iterations", "20")


def summary_verdict(stderr: str) -> str:
    match = re.search(r"^Verdict: ([a-z-]+)", stderr, re.M)
    assert match, f"no verdict in the summary:\n{stderr}"
    return match.group(1)


def test_slow_dataset_is_input_bound(runs):
    w = runs("input", *INPUT_BOUND)
    verdict = vd.decide(w.stats)
    assert verdict.kind == "input-bound"
    assert summary_verdict(w.stderr) == "input-bound"
    share = w.stats.phase_share("data")
    assert share >= vd.INPUT_SHARE
    text = format_verdict(verdict)
    # the claim prints its numbers: the share, the threshold, the iterator and the suggestion
    assert f"{100 * share:.1f}%" in text
    assert f"threshold {100 * vd.INPUT_SHARE:.1f}%" in text
    assert "SerialIterator" in text and "MultiprocessIterator" in text
    assert "CHAINER_PROF_REPLAY_BATCH=1" in text


def test_slow_extension_is_extension_bound(runs):
    w = runs("extension", "mlp", "--slow-extension", "0.02", "--iterations", "20")
    verdict = vd.decide(w.stats)
    assert verdict.kind == "extension-bound"
    assert summary_verdict(w.stderr) == "extension-bound"
    assert verdict.figures["extension_share"] >= vd.EXTENSION_SHARE
    text = format_verdict(verdict)
    assert "extension:SlowReport" in text  # the extension is named, with its time
    ext_ms = w.stats.outside_ms["extension:SlowReport"]
    assert ext_ms >= 20 * 20 * 0.9  # 20 calls of at least 20 ms (sleep)
    assert figures.ms(ext_ms) in text


def test_large_layers_are_compute_bound(runs):
    w = runs("compute", "big", "--batch", "128", "--iterations", "15")
    verdict = vd.decide(w.stats)
    assert verdict.kind == "compute-bound", format_verdict(verdict)
    assert summary_verdict(w.stderr) == "compute-bound"
    assert verdict.figures["compute_share"] >= vd.COMPUTE_SHARE
    text = format_verdict(verdict)
    for phase in ("forward", "backward", "update"):  # each phase with its figures
        ms = w.stats.phase_total(phase) / w.stats.iterations
        assert f"{phase} {figures.ms(ms)} ({figures.pct(w.stats.phase_share(phase))})" in text


def test_compute_bound_names_the_top_links(runs):
    w = runs("compute_links", "big", "--batch", "128", "--iterations", "15",
             env={"CHAINER_PROF_GRANULARITY": "link"})
    verdict = vd.decide(w.stats)
    assert verdict.kind == "compute-bound"
    text = format_verdict(verdict)
    top = vd.top_links(w.stats)[0]
    assert top.name in text and "top links" in text
    # the largest layer (256 -> 1024 or 1024 -> 10 over a batch of 128) is one of the Linears
    assert "Linear" in top.name


def test_many_small_layers_are_host_bound(runs):
    w = runs("host", "deep", "--batch", "2", "--iterations", "15")
    verdict = vd.decide(w.stats)
    assert verdict.kind == "host-bound", format_verdict(verdict)
    calls = vd.functions_per_iteration(w.stats)
    assert calls is not None and calls >= vd.HOST_MIN_FUNCTIONS
    assert f"{calls} function calls per iteration" in format_verdict(verdict)


def test_costly_synchronization_is_the_agents_overhead(runs):
    """Sync level 3 at function granularity: every range waits in the device layer.

    The counting stand-in appends a line to its log file at each
    synchronization, so the waits cost real time, as GPU synchronizations do.
    They are the agent's, never the run's bottleneck: the verdict is about the
    model's own work (host-bound for these many small layers, or compute-bound
    when the stand-in's file writes, which count as the calls' CPU time in
    iteration 1, make a call look costly), and the waits are a note about the
    agent's overhead, left out of the figures.
    """
    w = runs("sync", "deep", "--batch", "2", "--iterations", "10",
             env={"CHAINER_PROF_SYNC_LEVEL": "3", "CHAINER_PROF_GRANULARITY": "function"})
    meta = w.stats.meta
    assert meta["sync_ms"] > 0 and w.stats.sync_calls > 0
    verdict = vd.decide(w.stats)
    text = format_verdict(verdict)
    assert verdict.kind in ("host-bound", "compute-bound"), text
    assert "synchronization-bound" not in text and "synchronization-bound" not in w.stderr
    assert verdict.figures["wait_share"] > 0.05  # the log writes cost real time
    assert "the agent's overhead, not the run's bottleneck" in text
    assert "sync level 3" in text
    # the host's figures leave the waits out: a call's time is the host's own
    with_waits = sum(w.stats.phase_total(k) for k in ("forward", "backward", "update"))
    us = vd.us_per_function(w.stats, verdict.figures)
    calls = vd.functions_per_iteration(w.stats)
    assert us is not None and calls
    assert us * calls / 1000 < with_waits / w.stats.iterations


def test_sync_level_one_is_never_the_bottleneck(runs):
    w = runs("sync1", "deep", "--batch", "2", "--iterations", "10",
             env={"CHAINER_PROF_SYNC_LEVEL": "1"})
    assert w.stats.sync_calls > 0
    assert vd.decide(w.stats).kind == "host-bound"


def test_advice_off_silences_verdict_and_advice(runs):
    w = runs("input_quiet", *INPUT_BOUND, env={"CHAINER_PROF_ADVICE": "0"})
    assert "Verdict:" not in w.stderr and "Advice" not in w.stderr
    assert "iteration time" in w.stderr  # the summary itself is still printed


def test_replay_makes_data_nearly_free_and_compares(runs):
    normal = runs("input", *INPUT_BOUND)
    replay = runs("input_replay", *INPUT_BOUND, env={"CHAINER_PROF_REPLAY_BATCH": "1"})
    assert vd.is_replay(replay.stats) and not vd.is_replay(normal.stats)
    facts = vd.facts_of(replay.stats)["replay"]
    assert facts["iterator"] == "SerialIterator"
    assert facts["iterator_mode"] == "epoch state advanced without loading"
    # the dataset sleeps 2 ms per example: the replayed data phase reads none
    assert replay.stats.phase_median("data") < normal.stats.phase_median("data") / 5
    assert vd.decide(replay.stats).kind != "input-bound"
    assert "this is a replay run" in replay.stderr

    pair = vd.pick_replay(replay.stats, normal.stats)
    assert pair is not None and pair[0] is normal.stats
    verdict = vd.decide(normal.stats, replay.stats)
    text = format_verdict(verdict)
    n_med, r_med = normal.stats.median(), replay.stats.median()
    assert "if data were free (replay run)" in text
    assert f"({figures.factor(n_med / r_med)} faster)" in text


def test_replay_keeps_epoch_triggers(runs):
    """An epoch-based stop trigger ends the replayed run after as many iterations."""
    args = ("mlp", "--epochs", "2", "--examples", "100", "--batch", "16")
    normal = runs("epochs", *args)
    replay = runs("epochs_replay", *args, env={"CHAINER_PROF_REPLAY_BATCH": "1"})
    expected = "iterations 13 epoch 2"  # ceil(200 / 16) iterations reach epoch 2
    assert expected in normal.run.stdout
    assert expected in replay.run.stdout
    assert replay.stats.iterations + replay.stats.warmup == 13
    assert vd.facts_of(replay.stats)["replay"]["replayed"] >= 2 * 12


def test_replay_through_the_iterators_own_next(runs):
    """A MultithreadIterator is advanced by the replay too; training still stops by epoch."""
    args = ("mlp", "--epochs", "1", "--examples", "64", "--iterator", "thread")
    replay = runs("thread_replay", *args, env={"CHAINER_PROF_REPLAY_BATCH": "1"})
    assert "iterations 4 epoch 1" in replay.run.stdout
    assert vd.facts_of(replay.stats)["replay"]["iterator"] == "MultithreadIterator"


def test_verdict_without_iterations():
    stats = RunStats(iterations=0, warmup=2, iteration_ms=[], phase_ms={}, outside_ms={},
                     wall_ms=10.0, links=[], batch_size=None, sync_level=0, sync_calls=0,
                     overhead_ms=0.0, gpu_phase_ms=None, meta={})
    verdict = vd.decide(stats)
    assert verdict.kind == "unknown"
    assert "2 iteration(s) seen, all in the warm-up" in format_verdict(verdict)


def test_thresholds_are_documented():
    """Every threshold constant appears, with its value, in docs/verdict.md."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "verdict.md").read_text()
    for name in ("INPUT_SHARE", "EXTENSION_SHARE", "COMPUTE_SHARE",
                 "HOST_US_PER_FUNCTION", "HOST_CHECKS_PER_FUNCTION", "HOST_MIN_FUNCTIONS",
                 "GPU_WAIT_SHARE", "GPU_BOUND_SHARE", "BEHIND_MARGIN", "BEHIND_MIN_MS",
                 "WAIT_BEHIND_SHARE", "WAIT_PER_SYNC_MS", "MIN_GPU_SAMPLES", "MIN_ITERATIONS",
                 "ADVICE_MIN_SHARE", "TRANSFER_ITERATION_SHARE", "BLAS_SLOW_GFLOPS",
                 "BLAS_MIN_COMPUTE_SHARE", "WARMUP_SLOW_FACTOR", "WARMUP_MIN_SHARE",
                 "WARMUP_MIN_MS", "OVERHEAD_NOTE_SHARE", "COMM_SHARE"):
        value = getattr(vd, name)
        rows = [line for line in doc.splitlines() if line.startswith(f"| `{name}`")]
        assert len(rows) == 1, name
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert f"| {shown} " in rows[0], (name, shown, rows[0])


def test_verdict_figures_are_json(runs):
    w = runs("input", *INPUT_BOUND)
    json.dumps(vd.decide(w.stats).figures)
