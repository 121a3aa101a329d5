"""Scripted training runs for the verdict, advice and HTML report tests.

:data:`SCRIPT` is a real Chainer training script (Trainer, StandardUpdater,
CPU) whose bottleneck is chosen on its command line; :func:`run_workload`
runs it in a subprocess under the agent, with the summary on and a trace
written, and returns the run with the trace's :class:`RunStats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from support import Run, program, run_with_agent

from chainer_autoprof.analysis.stats import RunStats
from chainer_autoprof.report.tracefile import read_trace

SCRIPT = program("verdict_workload")


@dataclass
class Workload:
    """A finished workload run: the process, its trace and the trace's statistics."""

    run: Run
    trace_path: Path
    stats: RunStats

    @property
    def stderr(self) -> str:
        return self.run.stderr


def run_workload(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Workload:
    """Run :data:`SCRIPT` with ``args`` under the agent (summary on, trace written)."""
    tmp.mkdir(parents=True, exist_ok=True)
    trace = tmp / "trace.json"
    settings = {"CHAINER_PROF_SUMMARY": "1", "CHAINER_PROF_TRACE": str(trace)}
    settings.update(env or {})
    run = run_with_agent(tmp, SCRIPT, settings, script_args=args, nvtx=False, timeout=120)
    if run.returncode != 0:
        raise AssertionError(f"workload {args} failed ({run.returncode}):\n{run.stderr}")
    return Workload(run, trace, read_trace(str(trace)).stats())
