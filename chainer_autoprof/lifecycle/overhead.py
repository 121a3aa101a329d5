"""The agent's own time, estimated at exit: calibrated costs times what was counted.

At exit the cost of one recorded range (tracer begin/end plus the recorder)
and of one instrumented call that emits nothing (the wrapper) are measured
on a scratch tracer; the estimate is ``ranges x range cost + wrapper calls x
wrapper cost + the aggregation time actually measured + the run-time checks' time
measured on the program's thread``.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from ..common import names
from ..common.settings import Config
from ..runtime import hotpath
from ..runtime.device import NullBackend
from ..runtime.events import Tracer
from ..runtime.policies import SyncPolicy
from ..sinks.recorder import Recorder

if TYPE_CHECKING:
    from ..common.typedefs import Args, Kwargs

_calibration: dict[str, tuple[float, float]] = {}


def estimate(recorder: Recorder, granularity_level: int, hits: int,
             implementation: hotpath.Implementation | None = None) -> tuple[float, str]:
    """(milliseconds, method) of the agent's own time; ``hits``: instrumented calls made."""
    impl = implementation if implementation is not None else hotpath.PYTHON
    try:
        range_ns, call_ns = calibrate(granularity_level, impl)
    except Exception as exc:  # not measured: said in the summary  # noqa: BLE001
        return 0.0, f"{impl.describe()} hot path; not measured ({type(exc).__name__}: {exc})"
    ranges = recorder.agg.ranges
    quiet_calls = max(0, hits - ranges)
    total_ns = ranges * range_ns + quiet_calls * call_ns + recorder.flush_ns + recorder.own_ns \
        + recorder.figures_ns
    checks = f" + {recorder.own_ns / 1e6:.1f} ms run-time checks" if recorder.own_ns else ""
    if recorder.figures_ns:
        checks += f" + {recorder.figures_ns / 1e6:.1f} ms figures read at iteration ends"
    method = (f"{impl.describe()} hot path; "
              f"calibrated at exit: {ranges:,} ranges x {range_ns / 1000:.2f} us"
              f" + {quiet_calls:,} other instrumented calls x {call_ns / 1000:.2f} us"
              f" + {recorder.flush_ns / 1e6:.1f} ms aggregation{checks}")
    return total_ns / 1e6, method


def calibrate(granularity_level: int, implementation: hotpath.Implementation | None = None,
              pairs: int = 4000) -> tuple[float, float]:
    """(ns per recorded range, ns per instrumented call emitting nothing), measured once.

    A scratch tracer with a scratch recorder (no NVTX, no sync), on the hot
    path's implementation in use, times ``pairs`` begin/end pairs; a wrapper
    of that implementation, shaped like the patches', times the cost of a
    call that emits nothing, against the bare call.
    """
    impl = implementation if implementation is not None else hotpath.PYTHON
    known = _calibration.get(impl.name)
    if known is not None:
        return known
    tracer = Tracer(granularity_level, SyncPolicy(0, NullBackend()), implementation=impl)
    cfg = Config({"summary": False, "trace": None})
    tracer.add_sink(Recorder(cfg, tracer, chunk_ranges=pairs + 1))
    # iteration-level names: emitted at every granularity
    outer = tracer.info("calibration", names.ITERATION)
    info = tracer.info("calibration range", names.ITERATION)
    ts = tracer.state()
    begin, end = tracer.begin, tracer.end
    begin(outer, ts)
    best_range = float("inf")
    for _ in range(3):
        t0 = perf_counter_ns()
        for _ in range(pairs):
            tok = begin(info, ts)
            end(tok, ts)
        best_range = min(best_range, (perf_counter_ns() - t0) / pairs)
        ts.record = None
    end(outer, ts)

    state = tracer.state

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        if state().quiet:
            return None
        return None

    def fail(exc: BaseException) -> None:
        pass

    def bare(x: Any) -> Any:
        return x

    wrapped = impl.around(bare, impl.switch(), enter, None, fail)
    best_call = float("inf")
    for _ in range(3):
        t0 = perf_counter_ns()
        for i in range(pairs):
            wrapped(i)
        t1 = perf_counter_ns()
        for i in range(pairs):
            bare(i)
        t2 = perf_counter_ns()
        best_call = min(best_call, max(0.0, ((t1 - t0) - (t2 - t1)) / pairs))
    result = _calibration[impl.name] = (best_range, best_call)
    tracer.forget_thread()  # this thread's scratch state goes with the scratch tracer
    return result
