"""The verdict on a GPU: GPU-bound or host-bound, right at every sync level.

Two kinds of evidence pin the rules:

* the real GPU recordings (tests/data/gpu/traces: one H100, a small CNN at batch 512, which
  CUPTI shows 87% busy, and at batch 16, 22% busy), replayed through ``report`` exactly as a
  saved trace is: every ``gpu_bound_*`` trace is GPU-bound and every ``host_bound_*`` one
  host-bound, with the figures behind the claim;
* run records built here with the GPU figures of each sync level (CUDA event spans, the
  agent's waits recorded or only their total, an exact activity record), GPU- and
  host-bound, and the cases where the evidence is not enough.

The verdict and the advice name no "synchronization-bound" anywhere: the agent's own waits
are its overhead, a note with their cost.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from support import REPO, clean_env

from chainer_autoprof.analysis import advice
from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.analysis.stats import PHASE_KEYS, LinkStat, RunStats
from chainer_autoprof.common import figures
from chainer_autoprof.report.summary import format_summary, format_verdict, verdict_section
from chainer_autoprof.report.tracefile import read_trace

TRACES = REPO / "tests" / "data" / "gpu" / "traces"
GPU_BOUND = sorted(TRACES.glob("gpu_bound_*.json"))
HOST_BOUND = sorted(TRACES.glob("host_bound_*.json"))
#: An exponent in a printed figure: ``5.68e+03``, ``1e-05``, ``2E+06``.
EXPONENT = re.compile(r"\d(\.\d+)?[eE][+-]?\d")


def stats_of(path: Path) -> RunStats:
    return read_trace(str(path)).stats()


def test_the_recordings_are_here():
    assert len(GPU_BOUND) == 4 and len(HOST_BOUND) == 2


# -- the real recordings -----------------------------------------------------------------------

@pytest.mark.parametrize("path", GPU_BOUND, ids=lambda p: p.stem)
def test_batch_512_is_gpu_bound_at_every_sync_level(path: Path):
    stats = stats_of(path)
    verdict = vd.decide(stats)
    text = format_verdict(verdict)
    assert verdict.kind == "GPU-bound", text
    gpu = verdict.gpu
    assert gpu is not None and gpu.limit == "gpu"
    assert gpu.busy_share is not None and gpu.busy_share >= vd.GPU_BOUND_SHARE
    # the claim prints its figure and how it was obtained
    assert f"at least {figures.pct(gpu.busy_share)} of each iteration" in verdict.title
    assert gpu.busy_method in text
    # the phase with the most GPU time, by its CUDA event time
    assert re.search(r"most GPU time: backward, \S+ ms per iteration", text)
    assert verdict.figures["gpu_busy_share"] == gpu.busy_share
    if stats.sync_level >= 1:
        # the waits are the agent's: its overhead, with their cost, never the bottleneck
        overhead = [n for n in verdict.notes if n.startswith("the agent's own synchron")]
        assert overhead and "not the run's bottleneck" in overhead[0]
        assert "the overlap it takes away" in overhead[0]
        assert gpu.sync_cost_ms is not None and 0 < gpu.sync_cost_ms < stats.median()


def test_sync_0_reads_the_cuda_event_spans():
    """At sync level 0 the GPU runs behind the host: forward and backward's CUDA event spans
    exceed their host (launch) times, and the data phase's host time overlapped earlier GPU
    work (its span is the copy alone), so it is not input time."""
    stats = stats_of(TRACES / "gpu_bound_b512_sync0_phase.json")
    verdict = vd.decide(stats)
    gpu = verdict.gpu
    assert gpu is not None
    assert [p.phase for p in gpu.behind] == ["forward", "backward"]
    forward = gpu.phase("forward")
    assert forward is not None and forward.gpu_ms is not None
    assert forward.gpu_ms > forward.host_ms * 1.5  # 10.9 ms on the GPU, 6.33 on the host
    assert gpu.busy_share > 0.95  # (10.9 + 20.3) / 31.5
    text = format_verdict(verdict)
    assert f"forward {figures.ms(forward.gpu_ms)} on the GPU against " \
           f"{figures.ms(forward.host_ms)} on the host" in text
    assert "data: " in text and "costs nothing here" in text
    assert verdict.figures["data_own_share"] < 0.01 < verdict.figures["data_share"]


def test_sync_1_wait_at_the_iteration_end_is_its_own_row():
    """At sync level 1 the agent's wait lands in the rest of the iteration: estimated for this
    trace (it predates the recorded waits), shown as its own row, not as "rest of iteration"."""
    stats = stats_of(TRACES / "gpu_bound_b512_sync1_phase.json")
    text = format_summary(stats)
    row = re.search(r"^\s+waiting for the GPU \(agent's sync\)\s+~(\S+ \S+)\s+~(\S+)%", text,
                    re.M)
    assert row, text
    share = float(row.group(2)) / 100
    assert 0.5 < share < stats.phase_share("other")  # about 56% of the 58% "other"
    rest = re.search(r"^\s+rest of iteration\s+~(\S+ \S+)\s+~(\S+)%", text, re.M)
    assert rest and float(rest.group(2)) < 5
    assert "~ estimated" in text
    verdict = vd.decide(stats)
    assert verdict.gpu is not None and verdict.gpu.wait_source == "estimated"
    assert "the host waited" in format_verdict(verdict)


def test_sync_3_names_the_link_with_the_most_gpu_time():
    stats = stats_of(TRACES / "gpu_bound_b512_sync3_link.json")
    verdict = vd.decide(stats)
    links, how = vd.gpu_links(stats)
    assert links[0][0].startswith("predictor/conv2 (Convolution2D)")
    assert "sync level 3" in how
    text = format_verdict(verdict)
    assert "links with the most GPU time per iteration" in text
    assert "look into predictor/conv2 (Convolution2D) @gpu0's kernels first" in text


def test_link_times_below_sync_3_are_not_called_gpu_time():
    stats = stats_of(TRACES / "gpu_bound_b512_sync3_link.json")
    stats.sync_level = 1
    assert vd.gpu_links(stats) == ([], "")


@pytest.mark.parametrize("path", HOST_BOUND, ids=lambda p: p.stem)
def test_batch_16_is_host_bound(path: Path):
    stats = stats_of(path)
    verdict = vd.decide(stats)
    text = format_verdict(verdict)
    assert verdict.kind == "host-bound", text
    gpu = verdict.gpu
    assert gpu is not None and gpu.limit == "host" and gpu.behind == []
    assert "the GPU waits for the host" in verdict.title
    assert "GPU-limited time: 0.0% of the iteration" in text
    calls = vd.functions_per_iteration(stats)
    assert f"{calls} function calls per iteration" in text
    assert any("a larger batch (now 16)" in s for s in verdict.suggestions)
    assert not any("cuDNN" in s or "mixed precision" in s for s in verdict.suggestions)


@pytest.mark.parametrize("path", GPU_BOUND + HOST_BOUND, ids=lambda p: p.stem)
def test_report_of_each_recording(path: Path):
    """``python -m chainer_autoprof report TRACE`` says it, in the summary's words."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", str(path)],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    expected = "GPU-bound" if path.name.startswith("gpu_bound") else "host-bound"
    assert re.search(rf"^Verdict: {expected}: ", out, re.M), out
    assert "synchronization-bound" not in out
    assert "GPU time (CUDA events" in out  # the GPU line keeps its event times
    assert not EXPONENT.search(out), EXPONENT.search(out)


def test_cudnn_advice_names_cupy_13_for_cupy_14():
    stats = stats_of(TRACES / "gpu_bound_b512_sync0_phase.json")
    assert stats.meta["versions"]["cupy"].startswith("14.")
    found = {f.key: f for f in advice.check(stats)}
    assert "CuPy 14 removed cuDNN support" in found["cudnn"].seen
    assert "cupy-cuda12x<14" in found["cudnn"].fix and "CuPy 13" in found["cudnn"].fix
    older = copy.deepcopy(stats)
    older.meta["versions"]["cupy"] = "13.6.0"
    found = {f.key: f for f in advice.check(older)}
    assert "CuPy 14" not in found["cudnn"].seen
    assert "<14" not in found["cudnn"].fix and "install cuDNN for this CuPy" in found["cudnn"].fix
    # the verdict names the missing cuDNN and points at the advice, which says how once
    for run in (stats, older):
        said = [s for s in vd.decide(run).suggestions if "cuDNN" in s]
        assert said and all("see the cudnn advice" in s for s in said)
        assert not any("CuPy 13" in s or "install" in s for s in said)


def test_cudnn_advice_cost_at_sync_3_is_the_convolutions_gpu_share():
    stats = stats_of(TRACES / "gpu_bound_b512_sync3_link.json")
    found = {f.key: f for f in advice.check(stats)}
    assert "the convolution links hold" in found["cudnn"].cost


def test_two_traces_at_two_sync_levels_show_the_sync_cost():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report",
                           str(TRACES / "gpu_bound_b512_sync0_phase.json"),
                           str(TRACES / "gpu_bound_b512_sync2_phase.json")],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the note as one sentence (a long line is wrapped for the terminal)
    line = " ".join(proc.stdout.split("the agent's synchronization", 1)[1].split("\n\n")[0]
                    .split())
    s0 = stats_of(TRACES / "gpu_bound_b512_sync0_phase.json").median()
    s2 = stats_of(TRACES / "gpu_bound_b512_sync2_phase.json").median()
    assert f"level 2 costs {figures.ms(s2 - s0)} per iteration more" in line
    assert "the agent's overhead, not the run's" in line


# -- run records built here ----------------------------------------------------------------------

GPU_FACTS = {"params": {"count": 4, "size": 1000, "dtypes": {"float32": 4}, "gpu": 4},
             "functions_per_iteration": 40, "batch_size": 32,
             "cuda": {"available": True, "cudnn_enabled": True},
             "config": {"type_check": True, "autotune": True, "use_cudnn": "auto"}}


def record(sync_level: int, host: dict[str, float], gpu: dict[str, float] | None = None,
           waits: dict[str, float] | None = None, sync_ms: float | None = None,
           n: int = 20, warmup: int = 3, facts: dict | None = None,
           outside: dict[str, float] | None = None, links: list[LinkStat] | None = None,
           **extra) -> RunStats:
    """A run of ``n`` identical iterations: host phase times (ms, ``other`` included), CUDA
    event spans (ms, ``iteration`` included), the agent's waits recorded per phase key, or
    only the run's total wait (``sync_ms``)."""
    iteration = sum(host.values())
    waits = waits or {}
    meta = {"facts": copy.deepcopy(facts if facts is not None else GPU_FACTS),
            "devices": [{"id": 0, "name": "GPU"}], "versions": {"cupy": "13.6.0"}}
    if sync_ms is not None:
        meta["sync_ms"] = sync_ms
    return RunStats(
        iterations=n, warmup=warmup, iteration_ms=[iteration] * n,
        phase_ms={k: [host.get(k, 0.0)] * n for k in PHASE_KEYS},
        outside_ms=dict(outside or {}), wall_ms=iteration * (n + warmup) + 100.0,
        links=list(links or []),
        batch_size=32, sync_level=sync_level, sync_calls=2 * n if sync_level else 0,
        overhead_ms=1.0, gpu_phase_ms={k: [v] * n for k, v in gpu.items()} if gpu else None,
        meta=meta, iteration_total_ms=iteration * n,
        phase_total_ms={k: host.get(k, 0.0) * n for k in PHASE_KEYS},
        wait_phase_ms={k: [waits.get(k, 0.0)] * n for k in PHASE_KEYS} if waits else {},
        wait_phase_total_ms={k: waits.get(k, 0.0) * n for k in PHASE_KEYS} if waits else {},
        waits_recorded=bool(waits), **extra)


#: A GPU that takes 30 ms per iteration behind a host that launches forward and backward in
#: 19 ms: the host spends the rest in the data phase, while the GPU runs the last iteration's
#: work (the data phase's span is the copy alone).
GPU_LIMITED_SYNC0 = dict(host={"data": 10.0, "forward": 5.0, "backward": 14.0, "update": 0.5,
                               "other": 0.5},
                         gpu={"iteration": 30.0, "data": 0.2, "forward": 10.0, "backward": 19.5,
                              "update": 0.3})
#: The same host, a GPU that keeps up (its spans follow the host's times).
HOST_LIMITED_SYNC0 = dict(host={"data": 1.0, "forward": 5.0, "backward": 6.0, "update": 1.0,
                                "other": 0.2},
                          gpu={"iteration": 13.2, "data": 1.0, "forward": 5.0, "backward": 6.0,
                               "update": 1.0})


def test_sync_0_gpu_behind_the_host_is_gpu_bound():
    verdict = vd.decide(record(0, **GPU_LIMITED_SYNC0))
    assert verdict.kind == "GPU-bound"
    assert verdict.gpu is not None
    assert verdict.gpu.busy_share == pytest.approx((10.0 + 19.5) / 30.0)


def test_sync_0_gpu_keeping_up_is_host_bound():
    verdict = vd.decide(record(0, **HOST_LIMITED_SYNC0))
    assert verdict.kind == "host-bound"
    assert verdict.gpu is not None and verdict.gpu.busy_share == 0.0


def test_sync_0_a_span_just_over_the_host_time_is_not_gpu_limited():
    """Within :data:`BEHIND_MARGIN` (a kernel's tail after the last launch) the GPU keeps up."""
    case = copy.deepcopy(HOST_LIMITED_SYNC0)
    case["gpu"]["backward"] = 6.0 * (1 + vd.BEHIND_MARGIN) - 0.01
    assert vd.decide(record(0, **case)).kind == "host-bound"
    case["gpu"]["backward"] = 6.0 * (1 + vd.BEHIND_MARGIN) + 0.01
    gpu = vd.decide(record(0, **case)).gpu
    assert gpu is not None and [p.phase for p in gpu.behind] == ["backward"]


def test_sync_0_without_cuda_events_is_not_enough_evidence():
    verdict = vd.decide(record(0, host=GPU_LIMITED_SYNC0["host"]))
    assert verdict.kind == "unknown"
    assert verdict.title.startswith("not enough evidence to tell GPU-bound from host-bound")
    assert any("CHAINER_PROF_SYNC_LEVEL=1" in s for s in verdict.suggestions)


def test_too_few_event_samples_are_not_enough_evidence():
    stats = record(0, **GPU_LIMITED_SYNC0)
    stats.gpu_phase_ms = {k: v[:vd.MIN_GPU_SAMPLES - 1] for k, v in stats.gpu_phase_ms.items()}
    assert vd.decide(stats).kind == "unknown"


def test_too_few_iterations_are_not_enough_evidence():
    verdict = vd.decide(record(0, n=vd.MIN_ITERATIONS - 1, **GPU_LIMITED_SYNC0))
    assert verdict.kind == "unknown" and "not enough evidence" in verdict.title
    assert f"only {vd.MIN_ITERATIONS - 1} counted iteration(s)" in verdict.title
    cpu = record(0, n=vd.MIN_ITERATIONS - 1, **HOST_LIMITED_SYNC0)  # a CPU run alike
    cpu.meta["devices"] = []
    cpu.meta["facts"]["params"]["gpu"] = 0
    assert vd.decide(cpu).kind == "unknown"
    cpu.iterations = vd.MIN_ITERATIONS
    assert vd.decide(cpu).kind != "unknown"


def test_sync_1_events_and_the_recorded_wait():
    host = {"data": 4.0, "forward": 4.5, "backward": 4.5, "update": 0.6, "other": 22.5}
    gpu = {"iteration": 36.1, "data": 4.0, "forward": 11.5, "backward": 20.3, "update": 0.2}
    verdict = vd.decide(record(1, host, gpu, waits={"other": 22.0}))
    assert verdict.kind == "GPU-bound"
    ev = verdict.gpu
    assert ev is not None and ev.wait_source == "recorded"
    assert ev.wait_ms == pytest.approx(22.0)
    # without the waits the host's own time is 14.1 ms; the GPU-limited phases take 31.8 ms
    assert ev.sync_cost_ms == pytest.approx(36.1 - 31.8)
    assert not ev.sync_cost_bound
    # the host's figures leave the waits out
    assert verdict.figures["other_own_ms_per_iteration"] == pytest.approx(0.5)
    text = format_summary(record(1, host, gpu, waits={"other": 22.0}))
    assert re.search(r"^\s+waiting for the GPU \(agent's sync\)\s+440 ms\s+60\.9%\s+\S+\s+22\.0 ms",
                     text, re.M), text
    assert re.search(r"^\s+rest of iteration\s+10\.0 ms\s+1\.4%", text, re.M)


@pytest.mark.parametrize(("share", "kind"), [(0.6, "GPU-bound"), (0.05, "host-bound"),
                                              (0.3, "unknown")])
def test_sync_1_without_events_decides_on_the_wait_share(share: float, kind: str):
    """Only the waits: at least half the iteration is GPU-bound, under a tenth host-bound,
    in between not enough evidence (the GPU was busy at least that long, no more is known)."""
    host = {"data": 2.0, "forward": 3.0, "backward": 3.0, "update": 1.0}
    rest = sum(host.values())
    wait = share * rest / (1 - share)
    host["other"] = wait + 0.1
    n, warmup = 20, 3
    stats = record(1, host, sync_ms=wait * (n + warmup), n=n, warmup=warmup)
    verdict = vd.decide(stats)
    assert verdict.kind == kind, format_verdict(verdict)
    assert verdict.gpu is not None
    assert verdict.gpu.wait_source == "estimated"
    assert verdict.gpu.busy_share == pytest.approx(wait * n / stats.iteration_total_ms)


def test_many_short_waits_are_kernel_tails_not_a_backlog():
    """Sync level 3 without the waits recorded: 15% of the iteration spent waiting, but in
    hundreds of synchronize calls of 20 us each: the GPU had nothing queued at any boundary."""
    host = {"data": 0.5, "forward": 4.0, "backward": 5.0, "update": 0.7, "other": 0.3}
    n, warmup = 20, 3
    wait = 0.15 * sum(host.values())
    stats = record(3, host, sync_ms=wait * (n + warmup), n=n, warmup=warmup)
    stats.sync_calls = round(wait * (n + warmup) / 0.02)  # 20 us per call
    verdict = vd.decide(stats)
    assert verdict.kind == "host-bound", format_verdict(verdict)
    assert verdict.gpu is not None and "no backlog" in verdict.gpu.busy_method
    stats.sync_calls = round(wait * (n + warmup) / 0.5)  # 0.5 ms per call: a backlog
    assert vd.decide(stats).kind == "unknown"


def test_sync_2_recorded_waits_tell_the_phases_apart():
    """At sync level 2 the spans equal the host times; the wait at a phase's end tells it."""
    host = {"data": 3.8, "forward": 11.2, "backward": 21.3, "update": 0.6, "other": 0.4}
    gpu = {"iteration": 37.3, "data": 3.8, "forward": 11.2, "backward": 21.3, "update": 0.6}
    waits = {"data": 0.05, "forward": 6.7, "backward": 16.8, "update": 0.05, "other": 0.1}
    verdict = vd.decide(record(2, host, gpu, waits=waits))
    assert verdict.kind == "GPU-bound"
    ev = verdict.gpu
    assert ev is not None and [p.phase for p in ev.behind] == ["forward", "backward"]
    assert ev.busy_share == pytest.approx((11.2 + 21.3) / 37.3)
    host_bound = {"data": 0.4, "forward": 3.4, "backward": 4.0, "update": 0.6, "other": 0.2}
    small = {k: 0.02 for k in PHASE_KEYS}
    gpu_small = {"iteration": 8.6, **{k: host_bound[k] for k in ("data", "forward", "backward",
                                                                 "update")}}
    verdict = vd.decide(record(2, host_bound, gpu_small, waits=small))
    assert verdict.kind == "host-bound"


def test_sync_3_waits_under_half_the_phase_are_not_gpu_limited():
    """Sync level 3: hundreds of synchronize calls each cost microseconds; waits under
    :data:`WAIT_BEHIND_SHARE` of a phase's own time do not make it GPU-limited."""
    host = {"data": 0.5, "forward": 4.0, "backward": 5.0, "update": 0.7, "other": 0.2}
    waits = {"forward": 0.4 * 3.6, "backward": 0.3 * 4.7}
    verdict = vd.decide(record(3, host, waits=waits))
    assert verdict.kind == "host-bound", format_verdict(verdict)


@pytest.mark.parametrize(("share", "kind"), [(0.65, "GPU-bound"), (0.04, "host-bound")])
def test_sync_3_old_traces_decide_on_the_total_wait(share: float, kind: str):
    host = {"data": 4.0, "forward": 14.0, "backward": 22.5, "update": 0.7, "other": 0.3}
    n, warmup = 20, 3
    total = share * sum(host.values()) * n
    verdict = vd.decide(record(3, host, sync_ms=total * (n + warmup) / n, n=n, warmup=warmup))
    assert verdict.kind == kind
    assert verdict.gpu is not None and verdict.gpu.wait_source == "estimated"
    assert verdict.figures["wait_share"] == pytest.approx(share)


def test_an_exact_busy_share_takes_precedence():
    stats = record(0, **HOST_LIMITED_SYNC0)
    stats.meta["gpu_activity"] = {"busy_share": 0.87, "source": "CUPTI kernel activity"}
    verdict = vd.decide(stats)
    assert verdict.kind == "GPU-bound"
    assert verdict.gpu is not None and verdict.gpu.busy_exact
    assert "the GPU is busy 87.0% of each iteration" in verdict.title
    assert "measured: CUPTI kernel activity" in format_verdict(verdict)
    stats = record(0, **GPU_LIMITED_SYNC0)
    stats.meta["gpu_activity"] = {"busy_share": 0.22}
    assert vd.decide(stats).kind == "host-bound"
    stats.meta["gpu_activity"] = {"busy_share": "a lot"}  # not well formed: ignored
    assert vd.decide(stats).kind == "GPU-bound"


def test_exact_link_times_name_the_link():
    stats = record(0, **GPU_LIMITED_SYNC0)
    stats.meta["gpu_activity"] = {"busy_share": 0.9, "link_ms": {"predictor/conv2": 5.9,
                                                                 "predictor/conv3": 2.9}}
    text = format_verdict(vd.decide(stats))
    assert "predictor/conv2 5.90 ms" in text and "measured" in text


def test_input_bound_on_a_gpu_only_when_the_gpu_waits_for_the_data():
    host = {"data": 8.0, "forward": 3.0, "backward": 3.0, "update": 0.5, "other": 0.5}
    waiting = {"iteration": 15.0, "data": 8.0, "forward": 3.0, "backward": 3.0, "update": 0.5}
    verdict = vd.decide(record(0, host, waiting))
    assert verdict.kind == "input-bound"
    # the same host times, but the data phase's GPU span is the copy alone: the GPU was
    # still running earlier work while the host loaded the batch
    busy = {"iteration": 15.0, "data": 0.1, "forward": 3.0, "backward": 3.0, "update": 0.5}
    assert vd.decide(record(0, host, busy)).kind != "input-bound"


def test_extension_bound_on_a_gpu():
    stats = record(0, outside={"extension:Evaluator": 2000.0}, **GPU_LIMITED_SYNC0)
    verdict = vd.decide(stats)
    assert verdict.kind == "extension-bound"
    assert any(a.startswith("GPU-bound") for a in verdict.also)


def test_suggestions_only_where_the_run_shows_them():
    no_cudnn = dict(GPU_FACTS, cuda={"available": True, "cudnn_enabled": False},
                    conv_links={"count": 2, "gpu": 2})
    verdict = vd.decide(record(0, facts=no_cudnn, **GPU_LIMITED_SYNC0))
    assert any("without cuDNN" in s for s in verdict.suggestions)
    autotune_off = dict(GPU_FACTS, conv_links={"count": 2, "gpu": 2},
                        config={"type_check": True, "autotune": False, "use_cudnn": "auto"})
    verdict = vd.decide(record(0, facts=autotune_off, **GPU_LIMITED_SYNC0))
    assert any("autotune" in s for s in verdict.suggestions)
    assert not any("without cuDNN" in s for s in verdict.suggestions)
    half = dict(GPU_FACTS, params=dict(GPU_FACTS["params"], dtypes={"float16": 4}))
    verdict = vd.decide(record(0, facts=half, **GPU_LIMITED_SYNC0))
    assert not any("mixed precision" in s for s in verdict.suggestions)  # already float16
    verdict = vd.decide(record(0, **GPU_LIMITED_SYNC0))
    assert not any("cuDNN" in s or "autotune" in s for s in verdict.suggestions)


def test_a_cpu_run_keeps_the_cpu_verdict():
    """No GPU seen: the GPU evidence is not asked, the CPU rules stand."""
    stats = record(0, **HOST_LIMITED_SYNC0)
    stats.meta["devices"] = []
    stats.meta["facts"]["params"]["gpu"] = 0
    stats.meta["facts"]["functions_per_iteration"] = 40
    verdict = vd.decide(stats)
    assert verdict.gpu is None
    assert verdict.kind == "compute-bound"  # 12 ms over 40 calls: 300 us each


# -- no exponent in any printed figure -----------------------------------------------------------

def extreme_records() -> list[RunStats]:
    """Runs whose figures span microseconds to hours, at every sync level."""
    out = []
    for scale in (1e-6, 1e-3, 1.0, 1e3, 1e5):
        for level in (0, 1, 2, 3):
            host = {k: v * scale for k, v in GPU_LIMITED_SYNC0["host"].items()}
            gpu = {k: v * scale for k, v in GPU_LIMITED_SYNC0["gpu"].items()}
            waits = {"other": 0.4 * scale, "forward": 3 * scale} if level else None
            stats = record(level, host, gpu, waits=waits, sync_ms=0.5 * scale * 23,
                           outside={"warm-up": 5000.0 * scale, "extension:X": 1e-4 * scale},
                           links=[LinkStat("predictor/l1 (Linear)", 20, 1e-5 * scale,
                                           1e-6 * scale, 20, 1e7 * scale)])
            stats.meta["facts"].update(
                type_check_us=1e-3 * scale, function_cpu_us=5e4 * scale,
                blas={"name": None, "optimized": None, "gflops": 1e-5},
                gc={"collections": [123456, 2, 1], "ms": [1e6 * scale, 0, 0],
                    "collected": [10**7, 0, 0]})
            out.append(stats)
    return out


def test_no_exponent_in_any_printed_figure():
    texts = [format_summary(stats) for stats in extreme_records()]
    texts += [format_summary(stats_of(p)) for p in GPU_BOUND + HOST_BOUND]
    texts += [verdict_section(stats) for stats in extreme_records()]
    for text in texts:
        found = EXPONENT.search(text)
        assert not found, text[max(0, found.start() - 200):found.end() + 50]


@pytest.mark.parametrize("x", [0, 1e-9, 3.2e-5, 0.0004, 0.999, 9.9996, 123.45, 999.7, 5680.0,
                               86_400_000.0, 1e15, -2.5e-7, float("nan"), float("inf")])
def test_the_formatter_never_writes_an_exponent(x: float):
    for text in (figures.ms(x), figures.us(x), figures.num(x), figures.pct(x),
                 figures.factor(x), figures.count(x), figures.fixed(x)):
        assert not EXPONENT.search(text) and "e+" not in text and "e-" not in text, text


def test_the_formatter_reads_as_the_issue_asks():
    assert figures.ms(5680.0) == "5.68 s"
    assert figures.ms(999.7) == "1.00 s"  # not "1000 ms"
    assert figures.ms(0.134) == "0.134 ms" and figures.ms(20.27) == "20.3 ms"
    assert figures.pct(0.862) == "86.2%"
    assert figures.num(0.0000123) == "0.0000123" and figures.num(12345.6) == "12,346"
    assert figures.ms(float("nan")) == "?"


# -- errors of our own are visible ---------------------------------------------------------------

def test_a_raising_check_fails_the_tests_and_is_one_line_for_a_user(monkeypatch, capsys):
    def broken(stats, verdict, facts):
        raise KeyError("no such fact")

    stats = stats_of(TRACES / "host_bound_b16_sync0_phase.json")
    monkeypatch.setattr(advice, "CHECKS", (broken, *advice.CHECKS))
    with pytest.raises(KeyError):  # under the tests: raised, not swallowed
        advice.check(stats)
    monkeypatch.delenv("CHAINER_AUTOPROF_TEST_STRICT")
    found = advice.check(stats)  # a user's run: the other checks still speak
    assert "cudnn" in [f.key for f in found]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "advice check broken left out (KeyError" in err


def test_a_raising_verdict_fails_the_tests(monkeypatch):
    stats = stats_of(TRACES / "host_bound_b16_sync0_phase.json")

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(vd, "gather", broken)
    with pytest.raises(ZeroDivisionError):
        format_summary(stats)
    monkeypatch.delenv("CHAINER_AUTOPROF_TEST_STRICT")
    text = format_summary(stats)
    assert "verdict_section left out (ZeroDivisionError: a bug)" in text


def test_no_synchronization_bound_anywhere():
    for path in [*(REPO / "chainer_autoprof").rglob("*.py"), REPO / "README.md",
                 *(REPO / "docs").glob("*.md")]:
        assert "synchronization-bound" not in path.read_text(encoding="utf-8"), path
