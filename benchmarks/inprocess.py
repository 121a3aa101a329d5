"""Per-Link-call cost in one process: configurations switched on and off, interleaved.

    python benchmarks/inprocess.py                       # Linear(4, 4) Link calls
    python benchmarks/inprocess.py --trivial --rounds 80 agent:phase agent:link floor

Resolves a few hundred nanoseconds, which separate processes cannot (their
memory layouts differ by more): each round applies every configuration in a
shuffled order (``chainer_autoprof.install()`` ... ``uninstall()``, a hook
entered and left, ``Link.__call__`` wrapped and restored), times two steps of
``LINK_CALLS + 1`` Link calls, and keeps the minimum.  A tool for work on the
hot path; ``overhead.py`` is the benchmark.  Configurations: ``agent:G`` with G
a granularity, ``agent:G+recorder``, ``fhook``, ``timerhook``, ``floor``
(bare wrapt on ``Link.__call__``), ``floor-nvtx`` (the same with one NVTX pair).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "tests")]

DEFAULT = ("agent:iteration", "agent:phase", "agent:link", "agent:function",
           "agent:link+recorder", "fhook", "timerhook", "floor", "floor-nvtx")


def _nvtx_tool() -> None:
    """Attach the test NVTX tool (read by NVTX at its first call, so before any)."""
    if "NVTX_INJECTION64_PATH" not in os.environ:
        from nvtx_tool import build_injection_library

        os.environ["NVTX_INJECTION64_PATH"] = str(build_injection_library())
    os.environ.pop("NVTX_RECORD_FILE", None)


def _switch(name: str) -> Callable[[], None]:
    """Apply configuration ``name``; returns what undoes it."""
    import chainer
    import configs

    import chainer_autoprof

    if name.startswith("agent:"):
        granularity, _, extra = name[6:].partition("+")
        chainer_autoprof.install(granularity=granularity, summary=extra == "recorder",
                                 advice=False, log="error")
        return chainer_autoprof.uninstall
    if name in ("fhook", "timerhook"):
        hook = configs._function_hook() if name == "fhook" else configs._timer_hook()
        hook.__enter__()
        return lambda: hook.__exit__(None, None, None)
    if name in ("floor", "floor-nvtx"):
        import nvtx
        import wrapt
        from nvtx._lib import pop_range, push_range

        domain = nvtx.get_domain(configs.DOMAIN)
        handle, attr = domain.handle, domain.get_event_attributes(message="link")

        def passthrough(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)

        def with_pair(wrapped, instance, args, kwargs):
            push_range(attr, handle)
            try:
                return wrapped(*args, **kwargs)
            finally:
                pop_range(handle)

        link_cls = chainer.link.Link
        original = link_cls.__dict__["__call__"]
        wrapt.wrap_function_wrapper(link_cls, "__call__",
                                    passthrough if name == "floor" else with_pair)
        return lambda: setattr(link_cls, "__call__", original)
    raise SystemExit(f"unknown configuration {name!r}")


def _trivial_step() -> Callable[[], Any]:
    import chainer
    import numpy as np
    import workloads

    class Trivial(chainer.Link):
        def forward(self, x):
            return x

    class Repeat(chainer.Chain):
        def __init__(self) -> None:
            super().__init__()
            with self.init_scope():
                self.inner = Trivial()

        def forward(self, x):
            for _ in range(workloads.LINK_CALLS):
                self.inner(x)
            return x

    model, x = Repeat(), chainer.Variable(np.ones((1, 1), np.float32))
    return lambda: model(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", default=list(DEFAULT))
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--trivial", action="store_true",
                        help="a Link whose forward returns its input, not a Linear(4, 4)")
    args = parser.parse_args(argv)
    _nvtx_tool()
    import workloads

    step = _trivial_step() if args.trivial else workloads.build("link", None)
    calls = workloads.unit("link")
    names = ["none", *args.configs]
    best = dict.fromkeys(names, float("inf"))
    for _ in range(args.rounds):
        random.shuffle(names)
        for name in names:
            undo = _switch(name) if name != "none" else (lambda: None)
            try:
                step()  # the first call after a switch builds what the configuration caches
                for _ in range(2):
                    t0 = perf_counter_ns()
                    step()
                    best[name] = min(best[name], (perf_counter_ns() - t0) / calls)
            finally:
                undo()
    base = best["none"]
    what = "trivial Link" if args.trivial else "Linear(4, 4)"
    print(f"| Configuration | ns per {what} call | added |\n|---|--:|--:|")
    for name in ["none", *args.configs]:
        print(f"| {name} | {best[name]:.0f} | {best[name] - base:+.0f} |")


if __name__ == "__main__":
    main()
