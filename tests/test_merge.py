"""``python -m chainer_autoprof merge``: several processes' traces on one timeline.

Runs without MPI: a parent and its forked child make two traces.  The MPI
case (ranks, collective reference, straggler) is in ``test_mpi.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import CHILD_STEPS, PARENT_STEPS, clean_env, program, run_with_agent


def merge(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chainer_autoprof", "merge", *args],
                          env=clean_env(), cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def parent_and_child(tmp_path_factory):
    """Trace files of a parent that forked a child which trained first."""
    tmp = tmp_path_factory.mktemp("merge")
    run = run_with_agent(tmp, program("children_fork_spawn_forkserver"),
                         {"CHAINER_PROF_TRACE": str(tmp / "trace.%p.json"),
                          "CHAINER_PROF_WARMUP": "0"},
                         script_args=("fork",), nvtx=False)
    assert run.returncode == 0, run.stderr
    traces = sorted(tmp.glob("trace.*.json"))
    assert len(traces) == 2
    child_pid = int((tmp / "child0.done").read_text())
    return tmp, traces, child_pid


def _tracks(data: dict) -> dict[int, str]:
    return {ev["pid"]: ev["args"]["name"] for ev in data["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "process_name"}


def _iterations(data: dict, pid: int) -> list[tuple[float, float]]:
    return sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in data["traceEvents"]
                  if ev["ph"] == "X" and ev["pid"] == pid and ev["name"] == "iteration")


def test_merge_parent_and_child(parent_and_child):
    tmp, traces, child_pid = parent_and_child
    result = merge(tmp, *map(str, traces), "-o", "all.json")
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp / "all.json").read_text())
    tracks = _tracks(data)
    assert len(tracks) == 2
    child_track = next(pid for pid, name in tracks.items() if f"child pid {child_pid}" in name)
    parent_track = next(pid for pid in tracks if pid != child_track)
    child_its, parent_its = _iterations(data, child_track), _iterations(data, parent_track)
    assert (len(child_its), len(parent_its)) == (CHILD_STEPS, PARENT_STEPS)
    # One clock: the child trained (and ended) before the parent's first iteration.
    assert child_its[-1][1] < parent_its[0][0]
    summary = data["otherData"]["chainer_autoprof"]["summary"]
    assert {a["method"] for a in summary["alignment"]} == {"reference", "clock"}
    assert summary["straggler"] is None  # no MPI ranks, nobody waits for anybody
    assert "straggler" not in result.stdout
    assert f"child pid {child_pid}" in result.stdout


def test_wall_clock_alignment_agrees_on_one_host(parent_and_child):
    tmp, traces, _child_pid = parent_and_child
    result = merge(tmp, *map(str, traces), "-o", "wall.json", "--align", "wall", "-q")
    assert result.returncode == 0, result.stderr
    alignment = json.loads((tmp / "wall.json").read_text())["otherData"]["chainer_autoprof"][
        "summary"]["alignment"]
    assert [a["method"] for a in alignment] == ["reference", "wall"]
    assert abs(alignment[1]["offset_ns"]) < 50_000_000


def test_merge_refuses_bad_inputs(parent_and_child, tmp_path):
    _tmp, traces, _child_pid = parent_and_child
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    (tmp_path / "broken.json").write_text("{")
    cases = [
        (["other.json"], "not written by chainer_autoprof"),
        (["broken.json"], "not valid JSON"),
        (["missing.json"], "cannot read missing.json"),
    ]
    for inputs, message in cases:
        result = merge(tmp_path, str(traces[0]), *inputs, "-o", "out.json")
        assert result.returncode == 2
        assert result.stderr.startswith("merge: ") and message in result.stderr
        assert result.stderr.count("\n") == 1
        assert not (tmp_path / "out.json").exists()
    result = merge(tmp_path, str(traces[0]), str(traces[1]), "-o", str(traces[1]))
    assert result.returncode == 2 and "is one of the inputs" in result.stderr
    # A merged file is not merged again.
    assert merge(tmp_path, *map(str, traces), "-o", "job.json", "-q").returncode == 0
    result = merge(tmp_path, "job.json", str(traces[0]), "-o", "again.json")
    assert result.returncode == 2 and "already a merged trace" in result.stderr
