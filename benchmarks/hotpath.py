"""The hot path's targets: a 50-layer training step, the agent beside hand-written hooks.

    python benchmarks/hotpath.py                  # instructions and wall clock, ~25 minutes
    python benchmarks/hotpath.py --instructions   # callgrind only
    python benchmarks/hotpath.py --wallclock      # in-process wall clock only, ~3 minutes
    python benchmarks/hotpath.py --package DIR    # measure the chainer_autoprof of another checkout

Workload (``workloads.build_train50``): 50 ``Linear(16, 16)`` + ReLU, batch 1,
one training step written out by hand (forward, ``F.sum`` loss, cleargrads,
backward, SGD update): 51 Link calls.  Configurations: the agent at phase,
link and function granularity and with the recorder on top of link
granularity, in each implementation of the hot path (native and pure Python);
a hand-written ``chainer.LinkHook`` pushing one cached NVTX range per Link
call; a ``chainer.FunctionHook`` pushing NVTX around each function's forward
and backward; ``chainer.link_hooks.TimerHook``.  NVTX calls reach the test
injection library, which records nothing (``NVTX_RECORD_FILE`` unset).

Two measures, each as figures added per Link call over the uninstrumented step:

* instructions under ``valgrind --tool=callgrind``, which do not move between
  runs: each configuration in a process of its own, run for ``n`` and
  ``n + k`` steps so that start-up cancels out (``PYTHONHASHSEED=0``);
* wall clock in ONE process: every round switches each configuration on
  (``install`` ... ``uninstall``, a hook entered and left) in a shuffled
  order and times two steps; the minimum over rounds is kept.

Each target is printed as met / not met.  ``BEFORE`` holds the figures of the
code before the native hot path (measured with ``--package`` on that commit),
for the last target: the pure-Python path no slower than before.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The untouched code's figures, per Link call (commit a1f5e71, this machine, same method).
BEFORE = {
    "instructions": {},
    "wallclock_ns": {},
}

AGENT_GRANULARITIES = ("phase", "link", "function", "link+recorder")
PEERS = ("linkhook", "fhook", "timerhook")
PEER_LABELS = {
    "linkhook": "hand-written NVTX LinkHook",
    "fhook": "hand-written NVTX FunctionHook",
    "timerhook": "chainer TimerHook",
}
#: (config run, steps, extra steps) for the instruction counts
STEPS, EXTRA = 1, 4


# -- configurations -------------------------------------------------------------

def _has_native_setting() -> bool:
    from chainer_autoprof.common import settings

    return "native" in settings.BY_NAME


def config_names(package_native: bool) -> list[str]:
    """Every configuration measured, baseline first."""
    names = ["none"]
    for granularity in AGENT_GRANULARITIES:
        if package_native:
            names += [f"agent:{granularity}:native", f"agent:{granularity}:python"]
        else:
            names.append(f"agent:{granularity}")
    return names + list(PEERS)


def label(name: str) -> str:
    if name == "none":
        return "uninstrumented"
    if name.startswith("agent:"):
        parts = name.split(":")
        impl = f" ({parts[2]})" if len(parts) > 2 else ""
        return f"agent: {parts[1].replace('+', ' + ')}{impl}"
    return PEER_LABELS[name]


def switch(name: str) -> Callable[[], None]:
    """Apply configuration ``name`` (Chainer already imported); returns what undoes it."""
    import configs

    import chainer_autoprof

    if name == "none":
        return lambda: None
    if name.startswith("agent:"):
        parts = name.split(":")
        granularity, _, extra = parts[1].partition("+")
        settings: dict[str, Any] = dict(granularity=granularity, summary=extra == "recorder",
                                        advice=False, log="error")
        if len(parts) > 2:
            settings["native"] = parts[2] == "native"
        agent = chainer_autoprof.install(**settings)
        used = getattr(agent, "implementation", None)
        if len(parts) > 2 and used != parts[2]:
            chainer_autoprof.uninstall()
            raise SystemExit(f"{name}: the {used} implementation ran "
                             f"({getattr(agent, 'implementation_reason', '')})")
        return chainer_autoprof.uninstall
    hook = {"linkhook": configs._link_hook, "fhook": configs._function_hook,
            "timerhook": configs._timer_hook}[name]()
    hook.__enter__()
    return lambda: hook.__exit__(None, None, None)


def flush_recorder() -> None:
    """Aggregate the recorder's buffered ranges (its cost counts, per range)."""
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    if agent is not None and agent.recorder is not None:
        agent.recorder.flush_all()


def recorded_ranges() -> int:
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    if agent is None or agent.recorder is None:
        return 0
    agent.recorder.flush_all()
    return int(agent.recorder.agg.ranges)


# -- the child process of an instruction count ---------------------------------------

def child(name: str, steps: int) -> None:
    """Run ``steps`` training steps under configuration ``name`` (after one untimed step)."""
    import chainer  # noqa: F401  (imported before the agent: it instruments at once)
    import workloads

    switch(name)
    step = workloads.build_train50()
    step()
    before = recorded_ranges()
    for _ in range(steps):
        step()
    flush_recorder()
    print(f"ranges {(recorded_ranges() - before) / steps if steps else 0}")


def count(name: str, steps: int, env: dict[str, str]) -> tuple[int, float]:
    """(instructions, recorded ranges per step) of one child run under callgrind."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, str(Path(__file__).resolve()), "--child", name, str(steps)],
        env=env, capture_output=True, text=True)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    ranges = re.search(r"^ranges (\S+)$", proc.stdout, re.M)
    if proc.returncode != 0 or found is None or ranges is None:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return int(found.group(1)), float(ranges.group(1))


def instructions(names: list[str], env: dict[str, str], jobs: int) -> dict[str, dict[str, float]]:
    """Per configuration: instructions per step and recorded ranges per step."""
    runs = [(name, steps) for name in names for steps in (STEPS, STEPS + EXTRA)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = dict(zip(runs, pool.map(lambda r: count(r[0], r[1], env), runs)))
    out = {}
    for name in names:
        (short, _), (long, ranges) = results[(name, STEPS)], results[(name, STEPS + EXTRA)]
        out[name] = {"per_step": (long - short) / EXTRA, "ranges": ranges}
        print(f"  measured {label(name)}: {out[name]['per_step']:,.0f} instructions a step",
              file=sys.stderr, flush=True)
    return out


# -- in-process wall clock ------------------------------------------------------------

def wallclock(names: list[str], rounds: int, seed: int) -> dict[str, dict[str, float]]:
    """Per configuration: the best time of a step (ns) over interleaved rounds."""
    import chainer  # noqa: F401
    import workloads

    step = workloads.build_train50()
    order = list(names)
    rng = random.Random(seed)
    best = dict.fromkeys(names, float("inf"))
    ranges: dict[str, float] = {}
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            undo = switch(name)
            try:
                step()  # the first step after a switch builds what the configuration caches
                before = recorded_ranges()
                for _ in range(2):
                    t0 = perf_counter_ns()
                    step()
                    flush_recorder()
                    best[name] = min(best[name], perf_counter_ns() - t0)
                ranges[name] = (recorded_ranges() - before) / 2
            finally:
                undo()
    return {name: {"per_step": best[name], "ranges": ranges.get(name, 0.0)} for name in names}


# -- the report -----------------------------------------------------------------------

def added(figures: dict[str, dict[str, float]], name: str, calls: int) -> float | None:
    if name not in figures or "none" not in figures:
        return None
    return (figures[name]["per_step"] - figures["none"]["per_step"]) / calls


def table(figures: dict[str, dict[str, float]], unit: str, calls: int) -> str:
    base = figures["none"]["per_step"]
    rows = [f"| Configuration | {unit} a step | added per Link call | ranges a step |",
            "|---|--:|--:|--:|"]
    for name, fig in figures.items():
        extra = added(figures, name, calls)
        cell = "(baseline)" if name == "none" else f"{extra:+,.0f}"
        shown = f"{fig['per_step']:,.0f}" if unit == "instructions" else \
            f"{fig['per_step'] / 1e6:.3f} ms"
        rows.append(f"| {label(name)} | {shown} | {cell} | {fig['ranges']:g} |")
    del base
    return "\n".join(rows)


def targets(figures: dict[str, dict[str, float]], unit: str, calls: int,
            before: dict[str, float]) -> list[str]:
    """Each target as a line: met / not met, with the figures."""
    lines = []

    def verdict(ok: bool | None, text: str, detail: str) -> None:
        state = "not measured" if ok is None else ("met" if ok else "not met")
        lines.append(f"- [{state}] {text}: {detail}")

    def impl(granularity: str) -> str:
        name = f"agent:{granularity}:native"
        return name if name in figures else f"agent:{granularity}"

    word = "instructions" if unit == "instructions" else "ns"
    for granularity, peer in (("link", "linkhook"), ("function", "fhook")):
        ours, theirs = added(figures, impl(granularity), calls), added(figures, peer, calls)
        ok = None if ours is None or theirs is None else ours <= theirs / 2
        detail = "-" if ok is None else \
            f"{ours:+,.0f} vs {theirs:+,.0f} {word} per Link call ({ours / theirs:.2f}x)"
        verdict(ok, f"{granularity.capitalize()} granularity <= half of the "
                f"{PEER_LABELS[peer]}", detail)
    if unit == "instructions":
        ours = added(figures, impl("phase"), calls)
        verdict(None if ours is None else ours <= 2000,
                "Phase granularity <= 2,000 instructions per Link call",
                "-" if ours is None else f"{ours:+,.0f}")
        link, rec = impl("link"), impl("link+recorder")
        if link in figures and rec in figures and figures[rec]["ranges"]:
            per_range = (figures[rec]["per_step"] - figures[link]["per_step"]) \
                / figures[rec]["ranges"]
            verdict(per_range <= 1000, "Recorder on top of link granularity <= 1,000 "
                    "instructions per range",
                    f"{per_range:+,.0f} ({figures[rec]['ranges']:g} ranges a step)")
        else:
            verdict(None, "Recorder on top of link granularity <= 1,000 instructions per range",
                    "-")
    worse = []
    compared = 0
    for granularity in AGENT_GRANULARITIES:
        now = added(figures, f"agent:{granularity}:python", calls)
        then = before.get(granularity)
        if now is None or then is None:
            continue
        compared += 1
        if now > then * 1.02 + (50 if unit == "instructions" else 20):
            worse.append(f"{granularity} {now:+,.0f} vs {then:+,.0f}")
    detail = "; ".join(worse) if worse else ", ".join(
        f"{g} {added(figures, f'agent:{g}:python', calls):+,.0f} vs {before[g]:+,.0f}"
        for g in AGENT_GRANULARITIES if g in before and f"agent:{g}:python" in figures)
    verdict(None if not compared else not worse,
            f"Pure-Python path no slower than before (per Link call, {word})", detail or "-")
    return lines


def nvtx_env() -> dict[str, str]:
    sys.path.insert(0, str(REPO / "tests"))
    from nvtx_tool import build_injection_library

    return {"NVTX_INJECTION64_PATH": str(build_injection_library())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instructions", action="store_true", help="callgrind counts only")
    parser.add_argument("--wallclock", action="store_true", help="in-process wall clock only")
    parser.add_argument("--rounds", type=int, default=60, help="wall-clock rounds")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind runs at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--package", type=Path, default=REPO,
                        help="directory holding the chainer_autoprof to measure")
    parser.add_argument("--configs", help="comma-separated subset (the baseline is always in)")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(HERE), str(args.package.resolve())]
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    both = not (args.instructions or args.wallclock)
    names = config_names(_has_native_setting())
    if args.configs:
        wanted = set(args.configs.split(","))
        names = ["none", *[n for n in names if n in wanted and n != "none"]]
    calls = 51
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               **nvtx_env())
    env.pop("NVTX_RECORD_FILE", None)  # NVTX calls reach a tool that records nothing
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(args.package.resolve()), os.environ.get("PYTHONPATH")]))
    print(f"chainer_autoprof from {args.package.resolve()}; {calls} Link calls a step\n")
    if args.instructions or both:
        if shutil.which("valgrind") is None:
            print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
            return 2
        figures = instructions(names, env, args.jobs)
        print("Instructions (callgrind):\n")
        print(table(figures, "instructions", calls) + "\n")
        print("\n".join(targets(figures, "instructions", calls, BEFORE["instructions"])) + "\n",
              flush=True)
    if args.wallclock or both:
        os.environ.update({k: v for k, v in env.items() if k.startswith("NVTX_")})
        os.environ.pop("NVTX_RECORD_FILE", None)
        figures = wallclock(names, args.rounds, args.seed)
        print(f"Wall clock in one process (best of {args.rounds} interleaved rounds):\n")
        print(table(figures, "time", calls) + "\n")
        print("\n".join(targets(figures, "ns", calls, BEFORE["wallclock_ns"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
