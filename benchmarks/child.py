"""One benchmark process: apply one configuration, time the workloads, print JSON.

Run by ``overhead.py``, never by hand (the configuration must be applied
before Chainer is imported, and agent settings are per process)::

    python benchmarks/child.py serve CONFIG --warmup 3     # then "mlp 1" lines on stdin
    python benchmarks/child.py visibility CONFIG --steps 4
    python benchmarks/child.py floor
    python benchmarks/child.py memory --limit 5000

Its only output on stdout is JSON, one object a line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

WORKLOADS = ("mlp", "deep", "link")


def _apply(name: str) -> tuple[Any, dict[str, Any]]:
    """Apply configuration ``name`` before Chainer is imported."""
    from configs import BY_NAME

    cfg = BY_NAME[name]
    info: dict[str, Any] = {}
    if cfg.agent is not None:
        import chainer_autoprof

        agent = chainer_autoprof.install(**cfg.agent)
        info["nvtx_sink"] = agent is not None and agent.nvtx is not None
        info["recorder"] = agent is not None and agent.recorder is not None
    if cfg.setup is not None:
        cfg.setup()
    return cfg, info


def _wrapped_targets() -> list[str]:
    """Chainer functions the agent would wrap that are not plain functions (should be none)."""
    import types

    from chainer import _backprop_utils, function_node, link, optimizer, variable
    from chainer.dataset import convert, iterator
    from chainer.training import extension, updater

    targets = [(link.Link, "__call__"), (optimizer.Optimizer, "update"),
               (optimizer.GradientMethod, "update"), (function_node.FunctionNode, "apply"),
               (variable.Variable, "backward"), (function_node, "grad"),
               (_backprop_utils, "backprop_step"), (convert, "_call_converter"),
               (convert.Converter, "__call__"), (iterator.Iterator, "__next__"),
               (updater.Updater, "update"), (extension.Extension, "__call__")]
    todo = [link.Link]
    while todo:  # every Link subclass that defines its own __call__
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "__call__" in cls.__dict__ and cls is not link.Link:
            targets.append((cls, "__call__"))
    bad = []
    for owner, attr in targets:
        obj = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if type(obj) is not types.FunctionType or hasattr(obj, "__wrapped__"):
            bad.append(f"{getattr(owner, '__name__', owner)}.{attr}")
    for base in (link.Link, optimizer.Optimizer, extension.Extension, updater.Updater,
                 iterator.Iterator, convert.Converter):
        hook = base.__dict__.get("__init_subclass__")
        if hook is not None and getattr(getattr(hook, "__func__", hook), "_chainer_autoprof", 0):
            bad.append(f"{base.__name__}.__init_subclass__")
    return bad


def cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    """Build the workloads, then time steps on request: one ``WORKLOAD N`` line per request.

    Each request is answered with one JSON line of step times (ns); ``quit``
    ends the process.  The parent interleaves the steps of every configuration
    this way, so that the compared processes see the same machine state.
    """
    import contextlib

    cfg, info = _apply(args.config)
    import workloads

    if args.config == "not-activated":
        info["wrapped"] = _wrapped_targets()
        info["agent_loaded"] = "chainer_autoprof.agent" in sys.modules
    steps = {name: workloads.build(name, cfg.optimizer) for name in WORKLOADS}
    hook = cfg.hook() if cfg.hook is not None else None
    per_step = hook is not None and getattr(hook, "per_step", False)
    if hook is not None and not per_step:
        hook.__enter__()
    around = hook if per_step else contextlib.nullcontext()
    for step in steps.values():
        with around:
            workloads.timed(step, args.warmup)
    _send({"config": cfg.name, "ready": True, "info": info})
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        name, n = words[0], int(words[1])
        with around:
            samples = workloads.timed(steps[name], n)
        _send({"samples": samples, "unit": workloads.unit(name)})
    if hook is not None and not per_step:
        hook.__exit__(None, None, None)
    return {"config": cfg.name, "done": True}


def _send(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def cmd_visibility(args: argparse.Namespace) -> dict[str, Any]:
    """Run MLP steps between two NVTX marks; the parent counts the ranges between them."""
    cfg, info = _apply(args.config)
    import nvtx
    import workloads

    step = workloads.build("mlp", cfg.optimizer)
    hook = cfg.hook() if cfg.hook is not None else None
    step()  # first step: lazy initialisation outside the counted ones
    if hook is not None:
        hook.__enter__()
    nvtx.mark("steps-begin", domain="benchmark")
    for _ in range(args.steps):
        step()
    nvtx.mark("steps-end", domain="benchmark")
    if hook is not None:
        hook.__exit__(None, None, None)
    return {"config": cfg.name, "steps": args.steps, "info": info}


def cmd_floor(args: argparse.Namespace) -> dict[str, Any]:
    """Costs of the building blocks, in-process: an NVTX push+pop pair, a wrapt wrapper."""
    import statistics
    from time import perf_counter_ns

    import nvtx
    import wrapt
    from nvtx._lib import pop_range, push_range

    domain = nvtx.get_domain("benchmark")
    handle = domain.handle
    attr = domain.get_event_attributes(message="pair")
    n = args.n

    def loop_pair() -> float:
        t0 = perf_counter_ns()
        for _ in range(n):
            push_range(attr, handle)
            pop_range(handle)
        return (perf_counter_ns() - t0) / n

    def loop_empty() -> float:
        t0 = perf_counter_ns()
        for _ in range(n):
            pass
        return (perf_counter_ns() - t0) / n

    class Plain:
        def __call__(self, x):
            return x

    class Wrapped:
        def __call__(self, x):
            return x

    def passthrough(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(Wrapped, "__call__", passthrough)

    def loop_call(obj: Any) -> float:
        t0 = perf_counter_ns()
        for _ in range(n):
            obj(1)
        return (perf_counter_ns() - t0) / n

    plain, wrapped = Plain(), Wrapped()
    pair, empty, p_call, w_call = [], [], [], []
    for _ in range(args.repeat):
        empty.append(loop_empty())
        pair.append(loop_pair())
        p_call.append(loop_call(plain))
        w_call.append(loop_call(wrapped))
    med = statistics.median
    return {"config": "floor", "nvtx_pair_ns": med(pair) - med(empty),
            "wrapt_ns": med(w_call) - med(p_call), "plain_call_ns": med(p_call) - med(empty)}


#: Equal windows of ``record_limit`` ranges measured past the limit (memory/growth).
WINDOWS = 3


def cmd_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Recorder memory per range kept for the trace, and whether it stops at ``record_limit``.

    The trace keeps the newest ``record_limit`` ranges, so memory must grow
    by a fixed amount per range up to the limit, then stay flat.  Ranges
    buffered per thread are aggregated first (``flush_all``), so each figure
    is what stays in memory.  Growth past the limit is the smallest of
    :data:`WINDOWS` equal windows: what grows with the ranges grows in each.
    """
    import gc
    import shutil
    import tempfile
    import tracemalloc

    import chainer_autoprof

    trace = Path(tempfile.mkdtemp(prefix="autoprof-bench-")) / "trace.json"
    agent = chainer_autoprof.install(granularity="link", summary=False, advice=False,
                                     log="error", record_limit=args.limit, trace=str(trace))
    import workloads

    if agent is None or agent.recorder is None:
        return {"config": "memory", "recorder": False}
    recorder = agent.recorder
    step = workloads.build("link", None)
    per_call = workloads.LINK_CALLS + 2  # link ranges + the forward phase

    def run(ranges: int) -> tuple[int, int]:
        calls = max(1, ranges // per_call)
        for _ in range(calls):
            step()
        recorder.flush_all()
        gc.collect()
        return tracemalloc.get_traced_memory()[0], calls * per_call

    for _ in range(3):
        step()
    # The trace so far's first write (on the monitor thread, every flush_interval) loads its
    # writer once: done here, so that a one-time step is not taken for growth wherever the
    # timer puts it.  Later writes run as they come.
    agent.monitor.flush()
    tracemalloc.start()
    m0, _ = run(args.limit // 5)          # the aggregates' first allocations
    m1, n1 = run(args.limit // 2)         # up to about 0.7 x limit kept
    m2, _ = run(3 * args.limit)           # far past the limit: the newest `limit` kept
    # past the limit, equal windows: growth shows in every one, a one-time step (a
    # background write's buffers, a dict resized) in one only
    past = [m2]
    for _ in range(WINDOWS):
        m, n3 = run(args.limit)
        past.append(m)
    tracemalloc.stop()
    m3 = min(b - a for a, b in zip(past, past[1:])) + m2
    flush0 = recorder.flush_ns  # the recorder's own time aggregating buffered ranges
    _, aggregated = run(args.limit)
    aggregation_ns = (recorder.flush_ns - flush0) / aggregated
    agent.uninstall()  # no trace is written: the run ends here
    shutil.rmtree(trace.parent, ignore_errors=True)
    return {"config": "memory", "recorder": True, "limit": args.limit,
            "bytes_per_range": (m1 - m0) / n1, "m": [m0, m1, *past],
            "growth_past_limit_per_range": (m3 - m2) / n3,
            "aggregation_ns_per_range": aggregation_ns}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("config")
    p.add_argument("--warmup", type=int, default=3)
    p = sub.add_parser("visibility")
    p.add_argument("config")
    p.add_argument("--steps", type=int, default=4)
    p = sub.add_parser("floor")
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=5)
    p = sub.add_parser("memory")
    p.add_argument("--limit", type=int, default=5000)
    args = parser.parse_args(argv)
    result = {"serve": cmd_serve, "visibility": cmd_visibility, "floor": cmd_floor,
              "memory": cmd_memory}[args.cmd](args)
    _send(result)


if __name__ == "__main__":
    main()
