"""Memory at each iteration's end, and the leak every Chainer user writes once.

A real hand-written loop that sums its losses as Variables (``sum_loss += loss``: every
iteration's graph stays alive) gets the leak reported with its growth per iteration, the
iteration it started and the advice naming the usual causes; its fixed twin (``sum_loss +=
float(loss.array)``) does not, at every granularity and on both hot paths.  The figures
reach the summary, the trace (its record and a counter track under the process),
``report`` and the HTML report.  CuPy's pools are read through the stand-in ``cupy`` the
GPU tests use (no GPU here), which reports a pool that caches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import clean_env, program, run_python, twin_env, twins, write_script

from chainer_autoprof.analysis import memory
from chainer_autoprof.analysis.per_iteration import Samples
from chainer_autoprof.common import figures, names
from chainer_autoprof.report.tracefile import read_trace

LOOP = program("memory_sum_loss")
POOL_CUPY = program("memory_cupy_pool")
#: The causes the advice names.
CAUSES = ("float(loss.array)", "loss.array", "unchain_backward()", "chainer.no_backprop_mode()")
ITERATIONS, WARMUP = 40, 3


def train(tmp, variant: str, granularity: str, *more: str, env: dict[str, str] | None = None):
    """One run of the loop (``leak`` or ``fixed``) with its summary and its trace."""
    script = write_script(tmp, "train.py", LOOP)
    trace = tmp / f"{variant}.json"
    run = run_python(tmp, ["-m", "chainer_autoprof", "--summary", "1", "--granularity",
                           granularity, "--trace", str(trace), str(script), variant, *more],
                     env=env, nvtx=False)
    assert run.returncode == 0, run.stderr
    return run, trace


@pytest.fixture(scope="module", params=[(t, g) for t in twins() for g in names.GRANULARITY_LEVEL],
                ids=lambda p: f"{p[0]}-{p[1]}")
def pair(request, tmp_path_factory):
    """The leaking loop and its fixed twin, on one hot path at one granularity."""
    twin, granularity = request.param
    tmp = tmp_path_factory.mktemp(f"memory-{twin}-{granularity}")
    return (train(tmp, "leak", granularity, env=twin_env(twin)),
            train(tmp, "fixed", granularity, env=twin_env(twin)))


@pytest.mark.hotpath  # on each hot path (the pair fixture)
def test_the_leak_gets_its_growth_its_start_and_the_advice(pair):
    (run, trace), _fixed = pair
    stats = read_trace(str(trace)).stats()
    grown = memory.leak(stats.per_iteration.get("memory"))
    assert grown is not None and grown.column == memory.RSS
    # each iteration keeps its activations: 2 x 256 x 512 float32 at least (1 MiB)
    assert grown.per_iteration >= 1 << 20
    assert grown.start_iteration <= WARMUP + 3
    err = run.stderr
    assert "[memory_leak]" in err
    assert f"since iteration {grown.start_iteration}" in err
    for cause in CAUSES:
        assert cause in err, cause
    assert "steadily: a leak" in err


@pytest.mark.hotpath  # on each hot path (the pair fixture)
def test_the_fixed_twin_gets_no_leak(pair):
    _leak, (run, trace) = pair
    stats = read_trace(str(trace)).stats()
    mem = stats.per_iteration.get("memory")
    assert mem is not None and memory.leak(mem) is None
    assert "[memory_leak]" not in run.stderr and "a leak" not in run.stderr
    assert "memory          at iteration ends: resident median" in run.stderr


@pytest.mark.hotpath  # on each hot path (the pair fixture)
def test_the_figures_and_the_counter_track_are_in_the_trace(pair):
    (run, trace), _fixed = pair
    data = json.loads(trace.read_text())
    mem = data["otherData"]["chainer_autoprof"]["per_iteration"]["memory"]
    counted = ITERATIONS - WARMUP
    assert mem["iteration"] == list(range(WARMUP, ITERATIONS))
    rss = mem["values"]["rss"]
    assert len(rss) == counted and mem["peak"]["rss"] == max(rss)
    assert mem["peak_iteration"]["rss"] == mem["iteration"][rss.index(max(rss))]
    pid = data["otherData"]["chainer_autoprof"]["pid"]
    counters = [e for e in data["traceEvents"] if e.get("ph") == "C"]
    assert len(counters) == counted
    assert {(e["name"], e["pid"]) for e in counters} == {("memory", pid)}
    assert [e["args"]["resident"] for e in counters] == [round(b / (1 << 20), 3) for b in rss]
    # each counter at its iteration's end: inside the iteration's range, at its end
    ends = sorted(e["ts"] + e["dur"] for e in data["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == names.ITERATION)
    assert [e["ts"] for e in counters] == pytest.approx(ends[WARMUP:], abs=0.002)
    median = sorted(rss)[len(rss) // 2]
    assert f"resident median {figures.size(median)}, peak {figures.size(max(rss))} " \
        f"(iteration {mem['peak_iteration']['rss']})" in run.stderr


def _report(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", *args],
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.hotpath  # on each hot path (the pair fixture)
def test_report_and_the_html_report_say_it_too(pair, tmp_path):
    (run, trace), (_fixed_run, fixed_trace) = pair
    text = _report(str(trace)).stdout
    memory_line = next(line for line in run.stderr.splitlines()
                       if line.startswith("  memory "))
    assert memory_line in text
    assert "[memory_leak]" in text and "unchain_backward()" in text
    assert "[memory_leak]" not in _report(str(fixed_trace)).stdout
    out = tmp_path / "report.html"
    _report(str(trace), "--html", str(out))
    page = out.read_text(encoding="utf-8")
    assert "<dt>memory</dt>" in page and "steadily: a leak" in page
    assert "memory_leak" in page and "chainer.no_backprop_mode()" in page


@pytest.mark.hotpath  # on each hot path (the pair fixture)
def test_a_trace_of_the_version_that_held_memory_apart_reads_the_same(pair, tmp_path):
    """Before memory became one of the figures read at each iteration's end, the record
    held it as ``memory`` (``bytes``, ``peak_bytes``): such a trace reports the same."""
    (_run, trace), _fixed = pair
    data = json.loads(trace.read_text())
    rec = data["otherData"]["chainer_autoprof"]
    mem = rec.pop("per_iteration")["memory"]
    rec["memory"] = {"bytes" if k == "values" else "peak_bytes" if k == "peak" else k: v
                     for k, v in mem.items()}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    before, now = _report(str(old)).stdout, _report(str(trace)).stdout
    assert "resident median" in now and "[memory_leak]" in now
    assert before.splitlines()[1:] == now.splitlines()[1:]  # (the first names the file)


def test_a_pool_that_fills_then_holds_is_caching_not_a_leak(tmp_path):
    """CuPy's pool read at each iteration's end (the stand-in ``cupy`` reports one that fills
    in the first iterations, then holds)."""
    folder = tmp_path / "stand_in" / "cupy"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(POOL_CUPY)
    env = {"PYTHONPATH": clean_env()["PYTHONPATH"] + ":" + str(tmp_path / "stand_in")}
    run, trace = train(tmp_path, "fixed", "phase", "pool", env=env)
    stats = read_trace(str(trace)).stats()
    mem = stats.per_iteration.get("memory")
    assert mem is not None
    assert set(mem.values["pool used"]) == {48 << 20}
    assert mem.peak["pool held"] == 4 * (32 << 20)
    assert mem.peak_iteration["pool held"] == WARMUP  # it filled in the 4th (from 0)
    cache = memory.caching(mem)
    assert cache is not None and cache.held_bytes == 4 * (32 << 20)
    assert cache.until_iteration == WARMUP
    assert memory.leak(mem) is None
    assert "CuPy pool in use median 48.0 MiB" in run.stderr
    assert "(caching, not a leak)" in run.stderr and "[memory_leak]" not in run.stderr


def test_growth_that_starts_late_is_dated_and_a_cache_is_not_a_leak():
    """The leak's start is where the growth begins, not the first counted iteration; a
    figure that grew and then held is no leak."""
    flat, step = 200 << 20, 3 << 20
    rss = [flat] * 20 + [flat + k * step for k in range(40)]
    late = Samples(iteration=list(range(3, 63)), values={memory.RSS: rss})
    grown = memory.leak(late)
    assert grown is not None and 22 <= grown.start_iteration <= 24
    assert grown.per_iteration == pytest.approx(step, rel=0.05)
    held = [flat + min(k, 10) * step for k in range(60)]
    assert memory.leak(Samples(iteration=list(range(3, 63)),
                                     values={memory.RSS: held})) is None
