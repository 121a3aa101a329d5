"""Garbage collection as ranges, slow iterations and their cause, the input queue's statistics.

Real Chainer training in subprocesses, with the NVTX injection library
recording what a profiler would see.
"""

from __future__ import annotations

import json

from nvtx_tool import ranges_by_thread
from support import program, run_with_agent

from chainer_autoprof.analysis.outliers import slow_iterations
from chainer_autoprof.report.tracefile import stats_from_trace

#: Every EVERY-th forward builds a large reference cycle and drops it; a big
#: set of long-lived objects makes each full collection expensive.
CYCLES = program("gc_cycles")


def test_reference_cycles_give_gc_ranges_and_an_outlier_line_naming_gc(tmp_path):
    run = run_with_agent(tmp_path, CYCLES, {"CHAINER_PROF_SUMMARY": "1",
                                            "CHAINER_PROF_TRACE": "run.json"},
                         script_args=("10", "50000", "200000", "40"), check=True)
    assert run.stdout == "done\n"
    err = run.stderr
    # the summary: the slowest iterations, each a cycle-building one, named by gc
    slow = err.split("slowest iterations (")[1].split("\n  ")[0]
    lines = [line.strip() for line in err.split("slowest iterations (")[1].splitlines()[1:]
             if line.startswith("    iteration ")]
    assert lines, err
    assert "2x the median or more" in slow
    first = lines[0]
    number = int(first.split()[1].rstrip(":"))
    assert (number + 1) % 10 == 0, first  # iterations 9, 19, ... build the cycles
    assert "x the median):" in first and "gc gen" in first and "in forward" in first
    assert "garbage collection  " in err and "objects freed" in err
    # the verdict says so, and the advice gives the fix
    assert "Verdict: gc-bound: garbage collection takes" in err
    assert "slow iterations: " in err and "garbage collection explains" in err
    assert "[gc] garbage collection slows training iterations" in err
    assert "gc.freeze()" in err

    # The trace: gc ranges on the training thread, inside forward, with what they freed.
    data = json.loads((tmp_path / "run.json").read_text())
    events = [e for e in data["traceEvents"] if e["ph"] == "X"]
    gcs = [e for e in events if e["cat"] == "gc"]
    assert gcs and all(e["name"].startswith("gc gen ") for e in gcs)
    assert any(e["args"].get("collected", 0) > 1000 for e in gcs)
    forwards = [e for e in events if e["name"] == "forward"]
    inside = [g for g in gcs if any(f["ts"] <= g["ts"] and g["ts"] + g["dur"] <= f["ts"] + f["dur"]
                                    + 1e-3 for f in forwards)]
    assert len(inside) >= len(gcs) // 2
    assert all(g["args"]["depth"] >= 1 for g in gcs)
    facts = data["otherData"]["chainer_autoprof"]["facts"]["gc"]
    assert sum(facts["collections"]) >= len(gcs)

    # report of the trace says the same
    slowest = slow_iterations(stats_from_trace(str(tmp_path / "run.json")))
    assert slowest and slowest[0].cause == "gc" and slowest[0].iteration == number

    # NVTX: gc ranges in the agent's domain, nested in the training's ranges, balanced
    ranges = ranges_by_thread(run.events, "chainer", keep_gc=True)
    texts = [(depth, text) for rows in ranges.values() for depth, text, _c in rows]
    assert any(text.startswith("gc gen ") and depth >= 2 for depth, text in texts)


#: Collections at almost every allocation: many start inside the agent's own begin/end.
EVERYWHERE = program("gc_everywhere")


def test_collections_inside_the_agents_code_keep_streams_and_trace_consistent(tmp_path):
    run = run_with_agent(tmp_path, EVERYWHERE, {"CHAINER_PROF_SUMMARY": "1",
                                                "CHAINER_PROF_GRANULARITY": "function",
                                                "CHAINER_PROF_TRACE": "run.json"}, check=True)
    ranges = ranges_by_thread(run.events, "chainer", keep_gc=True)  # raises when unbalanced
    texts = [text for rows in ranges.values() for _d, text, _c in rows]
    assert texts.count("iteration") == 12
    assert sum(t.startswith("gc gen ") for t in texts) > 50
    data = json.loads((tmp_path / "run.json").read_text())
    facts = data["otherData"]["chainer_autoprof"]["facts"]["gc"]
    assert facts["unranged"] > 0  # some collections started in the agent's code: no range
    # the recorded ranges nest: each one inside the range one level up that encloses it
    events = sorted((e for e in data["traceEvents"] if e["ph"] == "X"),
                    key=lambda e: (e["tid"], e["ts"], e["args"]["depth"]))
    open_by_depth: dict[int, dict] = {}
    for e in events:
        depth = e["args"]["depth"]
        if depth:
            parent = open_by_depth[depth - 1]
            assert parent["ts"] <= e["ts"] + 1e-3
            assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + 1e-3, (e, parent)
        open_by_depth[depth] = e
    assert sum(e["name"] == "iteration" for e in events) == 12
    assert "iterations      9 counted" in run.stderr


def test_gc_ranges_off(tmp_path):
    run = run_with_agent(tmp_path, CYCLES, {"CHAINER_PROF_GC": "0"},
                         script_args=("5", "20000", "1000", "12"), check=True)
    texts = [text for rows in ranges_by_thread(run.events, "chainer", keep_gc=True).values()
             for _d, text, _c in rows]
    assert texts.count("iteration") == 12
    assert not any(t.startswith("gc ") for t in texts)


#: A slow data set behind a MultiprocessIterator (or a fast one behind a
#: MultithreadIterator with a slow model).
QUEUE = program("gc_queue")


def test_an_empty_input_queue_is_named_in_the_input_bound_verdict(tmp_path):
    run = run_with_agent(tmp_path, QUEUE, {"CHAINER_PROF_SUMMARY": "1",
                                           "CHAINER_PROF_TRACE": "run.json"},
                         script_args=("process", "15", "0"), check=True)
    err = run.stderr
    line = next(line for line in err.splitlines() if "input queue (MultiprocessIterator" in line)
    empty = float(line.split("empty at ")[1].split("%")[0])
    assert empty >= 50, line
    assert "Verdict: input-bound" in err
    assert "input queue ran dry: MultiprocessIterator had no batch ready at" in err
    facts = json.loads((tmp_path / "run.json").read_text())["otherData"]["chainer_autoprof"][
        "facts"]["input_queue"]["MultiprocessIterator"]
    assert facts["capacity"] == 1
    assert facts["fetches"] == 29  # every training fetch but the first
    assert sum(facts["ready"]) == 29


def test_a_full_input_queue_is_not_dry(tmp_path):
    run = run_with_agent(tmp_path, QUEUE, {"CHAINER_PROF_SUMMARY": "1"},
                         script_args=("thread", "0", "20"), check=True)
    err = run.stderr
    line = next(line for line in err.splitlines() if "input queue (MultithreadIterator" in line)
    empty = float(line.split("empty at ")[1].split("%")[0])
    assert empty < 50, line
    assert "input queue ran dry" not in err
