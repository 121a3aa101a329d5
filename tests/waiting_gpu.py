"""The agent's own waits for the GPU, in-process: the device-sync stand-in waits a fixed time.

Without a GPU, :class:`WaitingBackend` (the CountingBackend stand-in) sleeps ``WAIT_S`` at each
synchronization when the model's arrays are said to be on a GPU; :func:`run_waiting` traces
a few iterations through the real tracer and recorder and reports them as a run does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

from chainer_autoprof.analysis.stats import RunStats
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.lifecycle.finish import report_run
from chainer_autoprof.runtime import hotpath
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


def run_waiting(tmp_path: Path, level: int, impl: hotpath.Implementation, gpu: bool = True,
                iterations: int = ITERATIONS) -> tuple[RunStats, Path, Recorder]:
    """``iterations`` of one link's phases traced in-process at sync ``level`` on hot path
    ``impl``, a GPU said to hold the model (``gpu``); the run's figures, trace and recorder."""
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
