"""One process: threads training at once keep NVTX and the trace correct; several GPUs."""

from __future__ import annotations

import json

import pytest
from nvtx_tool import ranges_by_thread
from support import program, run_with_agent
from traces import check_nesting, trace_threads

THREADS_SCRIPT = program("threads_two_trainers")


def test_two_threads_running_links_at_once(tmp_path):
    run = run_with_agent(tmp_path, THREADS_SCRIPT,
                         {"CHAINER_PROF_GRANULARITY": "link",
                          "CHAINER_PROF_TRACE": str(tmp_path / "trace.json"),
                          "CHAINER_PROF_WARMUP": "0"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"

    # NVTX: every push has its pop on its own thread (ranges_by_thread asserts it).
    by_thread = ranges_by_thread(run.events, "chainer")
    trees = [[f"{'  ' * depth}{text}" for depth, text, _color in ranges]
             for ranges in by_thread.values()]
    assert len(trees) == 3  # alone, trainer-0, trainer-1 (the main thread trains nothing)
    reference = next(t for t in trees if t)  # threads start in order: "alone" is first
    assert reference.count("iteration") == 5
    assert any(line.strip() == "l1 (Linear)" or line.strip().endswith("/l1 (Linear)")
               for line in reference), reference
    for tree in trees:
        assert tree == reference  # concurrently, the same ranges as alone

    # The trace: one track per thread, each with its own well-nested ranges.
    threads = trace_threads(tmp_path / "trace.json")
    assert {"alone", "trainer-0", "trainer-1"} <= set(threads)
    for name in ("alone", "trainer-0", "trainer-1"):
        rows = threads[name]
        assert [r[0] for r in rows].count("iteration") == 5
        check_nesting(rows)
        assert [r[0] for r in rows] == [r[0] for r in threads["alone"]]

    # The two trainers really ran at the same time.
    def span(rows):
        its = [r for r in rows if r[0] == "iteration"]
        return its[0][1], its[-1][2]

    a0, a1 = span(threads["trainer-0"])
    b0, b1 = span(threads["trainer-1"])
    assert a0 < b1 and b0 < a1


# -- several GPUs in one process (GPU-marked) ------------------------------------------

def _gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, or no CUDA device
        return 0


needs_two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="needs CuPy and two CUDA GPUs")

MODEL_PARALLEL_SCRIPT = program("threads_model_parallel")

PARALLEL_UPDATER_SCRIPT = program("threads_parallel_updater")


def _gpu_run(tmp_path, source):
    trace = tmp_path / "trace.json"
    run = run_with_agent(tmp_path, source,
                         {"CHAINER_PROF_GRANULARITY": "link", "CHAINER_PROF_SYNC": "1",
                          "CHAINER_PROF_TRACE": str(trace), "CHAINER_PROF_WARMUP": "0"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"
    data = json.loads(trace.read_text())
    names = [ev["name"] for ev in data["traceEvents"] if ev["ph"] == "X"]
    devices = [d["id"] for d in data["otherData"]["chainer_autoprof"]["devices"]]
    return run, names, devices


@pytest.mark.gpu
@needs_two_gpus
def test_model_parallel_links_on_two_gpus(tmp_path):
    run, names, devices = _gpu_run(tmp_path, MODEL_PARALLEL_SCRIPT)
    assert names.count("iteration") == 3
    assert "l1 (Linear) @gpu0" in names and "l2 (Linear) @gpu1" in names
    assert devices == [0, 1]
    assert "sync 0,1" in run.sync_log()  # each synchronization covers both devices


@pytest.mark.gpu
@needs_two_gpus
def test_parallel_updater_on_two_gpus(tmp_path):
    run, names, devices = _gpu_run(tmp_path, PARALLEL_UPDATER_SCRIPT)
    assert names.count("iteration") == 3
    assert any(n.endswith("@gpu0") for n in names) and any(n.endswith("@gpu1") for n in names)
    assert devices == [0, 1]
    assert "sync 0,1" in run.sync_log()
