"""Child processes: forked, spawned and forkserver children profile on their own, or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nvtx_tool import ranges_by_thread
from support import CHILD_STEPS, PARENT_STEPS, REPO, program, run_python, run_with_agent

CHILDREN_SCRIPT = program("children_fork_spawn_forkserver")


def _site_shim(tmp: Path) -> str:
    """A directory for PYTHONPATH whose sitecustomize processes the project's ``.pth`` file.

    Fresh interpreters (spawn, forkserver) then start exactly as with the
    package installed: the ``.pth`` line activates the agent from the environment.
    """
    shim = tmp / "site_shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(REPO)!r})\n")
    return f"{shim}:{REPO}"


def _traces(tmp: Path) -> dict[str, dict]:
    """{"parent" | "child": metadata + iteration count + range names} of the trace files."""
    out: dict[str, dict] = {}
    for path in sorted(tmp.glob("trace*.json")):
        data = json.loads(path.read_text())
        meta = data["otherData"]["chainer_autoprof"]
        names = [ev["name"] for ev in data["traceEvents"] if ev["ph"] == "X"]
        role = "child" if meta["process"]["child"] else "parent"
        assert role not in out, f"two {role} traces: {sorted(tmp.glob('trace*.json'))}"
        out[role] = {"meta": meta, "names": names, "path": path,
                     "iterations": names.count("iteration")}
    return out


def _nvtx_iterations(run) -> dict[int, int]:
    """{pid: iterations pushed} over the processes' NVTX records (asserting balance)."""
    counts: dict[int, int] = {}
    for (pid, _tid), ranges in ranges_by_thread(run.events, "chainer").items():
        counts[pid] = counts.get(pid, 0) + sum(1 for _d, text, _c in ranges
                                               if text == "iteration")
    return counts


@pytest.mark.parametrize("method", ["os.fork", "fork", "spawn", "forkserver"])
def test_child_process_profiles_on_its_own(tmp_path, method):
    # Without %p in the path a child writes beside the parent's file, never over it.
    template = "trace.json" if method == "os.fork" else "trace.%p.json"
    run = run_with_agent(tmp_path, CHILDREN_SCRIPT,
                         {"CHAINER_PROF_TRACE": str(tmp_path / template),
                          "CHAINER_PROF_GRANULARITY": "link", "CHAINER_PROF_WARMUP": "0"},
                         script_args=(method,), env={"PYTHONPATH": _site_shim(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"
    child_pid = int((tmp_path / "child0.done").read_text())

    traces = _traces(tmp_path)
    assert set(traces) == {"parent", "child"}
    parent, child = traces["parent"], traces["child"]
    assert parent["iterations"] == PARENT_STEPS
    assert child["iterations"] == CHILD_STEPS
    assert child["meta"]["pid"] == child_pid
    assert child["path"].name == f"trace.{child_pid}.json"
    if method == "os.fork":
        assert parent["path"].name == "trace.json"
        assert "around fork" in parent["names"]
        assert "around fork" not in child["names"]  # no inherited open range
    if method != "forkserver":  # a forkserver child's parent is the fork server
        assert child["meta"]["process"]["parent_pid"] == parent["meta"]["pid"]
    # The settings reached the child: link ranges, and its own settings say so.
    assert child["meta"]["settings"]["granularity"] == "link"
    assert "predictor (Linear)" in child["names"]

    # NVTX: both processes' ranges arrive, balanced, each with its own iterations.
    iterations = _nvtx_iterations(run)
    assert iterations[child_pid] == CHILD_STEPS
    assert iterations[parent["meta"]["pid"]] == PARENT_STEPS
    assert set(iterations) == {child_pid, parent["meta"]["pid"]}


def test_children_off(tmp_path):
    run = run_with_agent(tmp_path, CHILDREN_SCRIPT,
                         {"CHAINER_PROF_TRACE": str(tmp_path / "trace.%p.json"),
                          "CHAINER_PROF_CHILDREN": "0", "CHAINER_PROF_WARMUP": "0"},
                         script_args=("os.fork", "fork", "spawn"),
                         env={"PYTHONPATH": _site_shim(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"
    child_pids = {int((tmp_path / f"child{n}.done").read_text()) for n in range(3)}

    traces = _traces(tmp_path)
    assert set(traces) == {"parent"}
    assert traces["parent"]["iterations"] == PARENT_STEPS
    iterations = _nvtx_iterations(run)
    assert set(iterations) == {traces["parent"]["meta"]["pid"]}
    # The children trained, and made no NVTX range at all.
    pushes = {ev.pid for ev in run.events if ev.event == "push"}
    assert not pushes & child_pids


MULTIPROCESS_ITERATOR_SCRIPT = program("children_multiprocess_iterator")


def test_multiprocess_iterator(tmp_path):
    plain = run_with_agent(tmp_path, MULTIPROCESS_ITERATOR_SCRIPT, {"CHAINER_PROF_ENABLE": "0"},
                           nvtx=False)
    assert plain.returncode == 0, plain.stderr
    run = run_with_agent(tmp_path, MULTIPROCESS_ITERATOR_SCRIPT,
                         {"CHAINER_PROF_TRACE": str(tmp_path / "trace.%p.json"),
                          "CHAINER_PROF_WARMUP": "0"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == plain.stdout  # the same training result

    traces = _traces(tmp_path)
    assert set(traces) == {"parent"}  # the workers trained nothing: no file of theirs
    names = traces["parent"]["names"]
    assert traces["parent"]["iterations"] == 12
    assert names.count("data") >= 12
    # Every process's NVTX ranges balanced; the iterations are the parent's alone.
    iterations = _nvtx_iterations(run)
    assert iterations == {traces["parent"]["meta"]["pid"]: 12}


INSTALL_SCRIPT = program("children_install_then_spawn")


def test_settings_given_to_install_reach_spawned_children(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(INSTALL_SCRIPT)
    run = run_python(tmp_path, [str(script), str(tmp_path / "trace.%p.json")],
                     env={"PYTHONPATH": _site_shim(tmp_path)}, nvtx=False)
    assert run.returncode == 0, run.stderr
    traces = _traces(tmp_path)
    assert set(traces) == {"child"}  # the parent uninstalled before its exit: no trace
    assert traces["child"]["iterations"] == CHILD_STEPS
    assert traces["child"]["meta"]["settings"]["granularity"] == "link"
    assert "predictor (Linear)" in traces["child"]["names"]
    # While installed, the settings were in the environment; uninstalling took them back.
    exported, left = run.stdout.strip().split("] [")
    for name in ("CHAINER_PROF_ENABLE", "CHAINER_PROF_GRANULARITY", "CHAINER_PROF_TRACE",
                 "_CHAINER_PROF_ROOT_PID"):
        assert repr(name) in exported
    assert left == "]"
