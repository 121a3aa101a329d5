"""The hot path's targets: a 50-layer training step, the agent beside hand-written hooks.

    python benchmarks/hotpath.py                  # instructions and wall clock, ~13 minutes
    python benchmarks/hotpath.py --instructions   # callgrind only
    python benchmarks/hotpath.py --wallclock      # in-process wall clock only, ~3 minutes
    python benchmarks/hotpath.py --package DIR    # measure the chainer_autoprof of another checkout

Workload (``workloads.build_train50``): 50 ``Linear(16, 16)`` + ReLU, batch 1,
one training step written out by hand (forward, ``F.sum`` loss, cleargrads,
backward, SGD update): 51 Link calls.  Configurations: the agent at phase,
link and function granularity, with the recorder on top of link granularity,
and with the recorder and the GPU phase timer at link and function
granularity (the counting backend's host event timer, started by the
recorder as on a GPU), in each implementation of the hot path (native and
pure Python);
a hand-written ``chainer.LinkHook`` pushing one cached NVTX range per Link
call; a ``chainer.FunctionHook`` pushing NVTX around each function's forward
and backward; ``chainer.link_hooks.TimerHook``.  NVTX calls reach the test
injection library, which records nothing (``NVTX_RECORD_FILE`` unset).

Two measures, each as figures added per Link call over the uninstrumented step:

* instructions under ``valgrind --tool=callgrind``: in one process, every
  round switches each configuration on (``install`` ... ``uninstall``, a hook
  entered and left) in a shuffled order, runs one uncounted step and counts
  ``STEPS`` (client requests from ``callgrind_control.c`` through ctypes: a
  dump per segment); the mean over rounds and over ``PROCESSES`` processes.
  Why not one process per configuration: an interpreter's instructions per
  step move by up to 0.4% (several thousand per Link call here) with its
  memory layout, because CPython's method cache is indexed by the addresses
  of attribute names and by type version tags, which every install changes;
  interleaved rounds give each configuration the same spread of states.
  The table shows the mean's standard error;
* wall clock in ONE process, the same rounds: two steps timed, the minimum
  over rounds kept.

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
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: Instructions: processes (each with its own memory layout), interleaved rounds in each, and
#: the steps counted per configuration and round (after one uncounted step).
PROCESSES, ROUNDS, STEPS = 2, 10, 2
#: Wall clock: interleaved rounds in one process.
WALL_ROUNDS = 100
#: The recorder's aggregation is counted on a buffer holding at least this many ranges
#: (it aggregates every 4096).
AGGREGATED = 3500
#: The GPU phase timer's own work is per iteration and phase (about 70,000 instructions an
#: iteration with the counting backend's timer, ``gpu_timer.py``): spread over the step's 51
#: Link calls, at most this many per Link call (instructions); nothing per link range.
GPU_TIMER_TARGET = 1500
#: Memory layouts of the processes (lengths of a padding variable).
LAYOUTS = (0, 33, 101, 211)
LAYOUT_VARIABLE = "CHAINER_AUTOPROF_BENCH_LAYOUT"
CONTROL = HERE / "callgrind_control.c"

#: The untouched code's figures, per Link call (commit a1f5e71, this machine, same method).
BEFORE = {
    "instructions": {"phase": 8005, "link": 39967, "function": 143712, "link+recorder": 46743},
    "wallclock_ns": {"phase": 1892, "link": 8886, "function": 23393, "link+recorder": 11847},
}

AGENT_GRANULARITIES = ("phase", "link", "function", "link+recorder", "link+recorder+gpu",
                       "function+recorder+gpu")
#: The GPU phase timer without a GPU: the counting backend's host event timer, which the
#: recorder starts at the first iteration's end (what every GPU run does), as in the tests.
GPU_TIMER_ENV = {"CHAINER_AUTOPROF_TEST_EVENTS": "1", "CHAINER_AUTOPROF_TEST_DEVICE": "counting"}
PEERS = ("linkhook", "fhook", "timerhook")
PEER_LABELS = {
    "linkhook": "hand-written NVTX LinkHook",
    "fhook": "hand-written NVTX FunctionHook",
    "timerhook": "chainer TimerHook",
}

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
        granularity, *extras = parts[1].split("+")
        settings: dict[str, Any] = {"granularity": granularity,
                                    "summary": "recorder" in extras, "advice": False,
                                    "log": "error"}
        if len(parts) > 2:
            settings["native"] = parts[2] == "native"
        saved = {key: os.environ.get(key) for key in GPU_TIMER_ENV}
        if "gpu" in extras:  # read when the agent is made (the backend, the recorder)
            os.environ.update(GPU_TIMER_ENV)
        try:
            agent = chainer_autoprof.install(**settings)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
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


def check_gpu_timer(name: str) -> None:
    """After a configuration's first step: the GPU phase timer runs where it is asked for."""
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    wanted = name.startswith("agent:") and "+gpu" in name
    running = agent is not None and agent.recorder is not None and agent.recorder.gpu is not None
    if wanted != running:
        raise SystemExit(f"{name}: the GPU phase timer {'did not start' if wanted else 'ran'}")


def flush_recorder() -> None:
    """Aggregate the recorder's buffered ranges (its cost counts, per range)."""
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    if agent is not None and agent.recorder is not None:
        agent.recorder.flush_all()


def pending_ranges() -> int:
    """Ranges the recorder holds, not yet aggregated."""
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    if agent is None or agent.recorder is None:
        return 0
    if not hasattr(agent.recorder, "pending_blocks"):  # the code before the native hot path
        return sum(len(ts.record or ()) for ts in list(agent.tracer.states.values()))
    return sum(len(block) for _, block in agent.recorder.pending_blocks())


def recorded_ranges() -> int:
    import chainer_autoprof.agent as agent_module

    agent = agent_module.current()
    if agent is None or agent.recorder is None:
        return 0
    agent.recorder.flush_all()
    return int(agent.recorder.agg.ranges)


# -- instruction counts: interleaved rounds in processes under callgrind ---------------

def build_control() -> Path:
    """The callgrind client-request helper, compiled into ``benchmarks/_build`` when stale."""
    out = HERE / "_build" / "callgrind_control.so"
    if out.exists() and out.stat().st_mtime >= CONTROL.stat().st_mtime:
        return out
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    proc = subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-O2", "-o",
                           str(tmp), str(CONTROL)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"could not build {CONTROL.name} (valgrind's headers: the valgrind "
                         f"package): {proc.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)
    return out


def child(names: list[str], rounds: int, steps: int, seed: int) -> None:
    """Count ``steps`` steps of each configuration per round; one callgrind dump per segment.

    Prints the segments' labels in order, and the recorded ranges per step.
    """
    import ctypes

    import chainer  # noqa: F401  (imported before the agent: it instruments at once)
    import workloads

    control = ctypes.CDLL(str(build_control()))
    step = workloads.build_train50()
    rng = random.Random(seed)
    order = list(names)
    ranges: dict[str, float] = {}
    for number in range(rounds + 1):  # round 0: every configuration once, uncounted
        rng.shuffle(order)
        for name in order:
            undo = switch(name)
            try:
                step()
                check_gpu_timer(name)
                flush_recorder()
                before = recorded_ranges()
                if number:
                    control.start()
                for _ in range(steps):
                    step()
                if number:
                    control.dump(name.encode())
                    control.stop()
                    print(f"segment {name}", flush=True)
                ranges[name] = (recorded_ranges() - before) / steps
            finally:
                undo()
    for name, value in ranges.items():
        print(f"ranges {name} {value}")
    for name in names:  # the recorder's aggregation, per range, of a buffer nearly full
        if name.startswith("agent:") and "recorder" in name:
            undo = switch(name)
            try:
                step()
                flush_recorder()
                while pending_ranges() + 2 * ranges[name] < AGGREGATED:
                    step()
                count = pending_ranges()
                control.start()
                flush_recorder()
                control.dump(f"aggregate:{name}".encode())
                control.stop()
                print(f"segment aggregate:{name}", flush=True)
                print(f"aggregated {name} {count}")
            finally:
                undo()


def _dumps(out: Path) -> list[int]:
    """The instruction total of each dump of a callgrind run, in order."""
    totals = []
    for path in sorted(out.parent.glob(out.name + ".*"), key=lambda p: int(p.suffix[1:])):
        found = re.search(r"^(?:summary|totals):\s*(\d+)", path.read_text(), re.M)
        totals.append(int(found.group(1)) if found else 0)
    return totals


def count(names: list[str], env: dict[str, str], layout: int, package: Path, seed: int,
          rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One process under callgrind: per configuration, instructions per step of each round."""
    env = dict(env, **{LAYOUT_VARIABLE: "x" * layout})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, str(Path(__file__).resolve()), "--package", str(package),
             "--seed", str(seed), "--rounds", str(rounds), "--configs", ",".join(names),
             "--child"],
            env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind run: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        totals = _dumps(out)
    labels = re.findall(r"^segment (\S+)$", proc.stdout, re.M)
    if len(labels) != len(totals):
        raise RuntimeError(f"{len(labels)} segments but {len(totals)} callgrind dumps")
    per_step: dict[str, list[float]] = {name: [] for name in names}
    aggregated = {m[0]: int(m[1]) for m in re.findall(r"^aggregated (\S+) (\S+)$", proc.stdout,
                                                       re.M)}
    for name, total in zip(labels, totals):
        if name.startswith("aggregate:"):  # per range aggregated
            per_step.setdefault(name, []).append(total / aggregated[name.split(":", 1)[1]])
        else:
            per_step[name].append(total / STEPS)
    ranges = {m[0]: float(m[1]) for m in re.findall(r"^ranges (\S+) (\S+)$", proc.stdout, re.M)}
    return per_step, ranges


def instructions(names: list[str], env: dict[str, str], processes: int, rounds: int,
                 package: Path, seed: int) -> dict[str, dict[str, float]]:
    """Per configuration: mean instructions per step, its standard error, ranges per step."""
    build_control()
    layouts = [LAYOUTS[i % len(LAYOUTS)] for i in range(processes)]
    with ThreadPoolExecutor(max_workers=processes) as pool:
        runs = list(pool.map(lambda i: count(names, env, layouts[i], package, seed + i, rounds),
                             range(processes)))
    out = {}
    for name in names:
        values = [v for per_step, _ in runs for v in per_step[name]]
        aggregate = [v for per_step, _ in runs for v in per_step.get(f"aggregate:{name}", [])]
        mean = statistics.fmean(values)
        error = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        out[name] = {"per_step": mean, "error": error, "ranges": runs[0][1].get(name, 0.0),
                     "aggregate": statistics.fmean(aggregate) if aggregate else 0.0}
        print(f"  {label(name)}: {mean:,.0f} a step; rounds: "
              + ", ".join(f"{v / 1e6:.3f}M" for v in values), file=sys.stderr, flush=True)
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
                check_gpu_timer(name)
                flush_recorder()
                before = recorded_ranges()
                for _ in range(2):
                    t0 = perf_counter_ns()
                    step()
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
    rows = [f"| Configuration | {unit} a step | added per Link call | ranges a step |",
            "|---|--:|--:|--:|"]
    for name, fig in figures.items():
        extra = added(figures, name, calls)
        cell = "(baseline)" if name == "none" else f"{extra:+,.0f}"
        if unit == "instructions":
            shown = f"{fig['per_step']:,.0f} ± {fig['error']:,.0f}"
        else:
            shown = f"{fig['per_step'] / 1e6:.3f} ms"
        rows.append(f"| {label(name)} | {shown} | {cell} | {fig['ranges']:g} |")
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
            append = (figures[rec]["per_step"] - figures[link]["per_step"]) \
                / figures[rec]["ranges"]
            aggregate = figures[rec].get("aggregate", 0.0)
            per_range = append + aggregate
            verdict(per_range <= 1000, "Recorder on top of link granularity <= 1,000 "
                    "instructions per range",
                    f"{per_range:+,.0f} ({append:+,.0f} recording, {aggregate:,.0f} aggregating "
                    f"a nearly full buffer; {figures[rec]['ranges']:g} ranges a step)")
        else:
            verdict(None, "Recorder on top of link granularity <= 1,000 instructions per range",
                    "-")
        gpu = impl("link+recorder+gpu")
        if rec in figures and gpu in figures:
            extra = added(figures, gpu, calls) - added(figures, rec, calls)
            per_range = extra * calls / figures[gpu]["ranges"] if figures[gpu]["ranges"] else 0.0
            verdict(extra <= GPU_TIMER_TARGET, "GPU phase timer on top of link + recorder <= "
                    f"{GPU_TIMER_TARGET:,} instructions per Link call (its own work per "
                    "iteration; it is called for the iteration and the phases only)",
                    f"{extra:+,.0f} ({per_range:+,.0f} per range)")
        else:
            verdict(None, "GPU phase timer on top of link + recorder <= "
                    f"{GPU_TIMER_TARGET:,} instructions per Link call", "-")
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
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="interleaved rounds of the instruction counts, per process")
    parser.add_argument("--wall-rounds", type=int, default=WALL_ROUNDS,
                        help="interleaved rounds of the wall clock")
    parser.add_argument("--processes", type=int, default=PROCESSES,
                        help="callgrind processes (run at once), each with its own layout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--package", type=Path, default=REPO,
                        help="directory holding the chainer_autoprof to measure")
    parser.add_argument("--configs", help="comma-separated subset (the baseline is always in)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(HERE), str(args.package.resolve())]
    if args.child:
        import chainer_autoprof

        assert Path(chainer_autoprof.__file__).parent.parent == args.package.resolve(), \
            chainer_autoprof.__file__
        child(args.configs.split(","), args.rounds, STEPS, args.seed)
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
        figures = instructions(names, env, args.processes, args.rounds, args.package.resolve(),
                               args.seed)
        print("Instructions (callgrind):\n")
        print(table(figures, "instructions", calls) + "\n")
        print("\n".join(targets(figures, "instructions", calls, BEFORE["instructions"])) + "\n",
              flush=True)
    if args.wallclock or both:
        os.environ.update({k: v for k, v in env.items() if k.startswith("NVTX_")})
        os.environ.pop("NVTX_RECORD_FILE", None)
        figures = wallclock(names, args.wall_rounds, args.seed)
        print(f"Wall clock in one process (best of {args.wall_rounds} interleaved rounds):\n")
        print(table(figures, "time", calls) + "\n")
        print("\n".join(targets(figures, "ns", calls, BEFORE["wallclock_ns"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
