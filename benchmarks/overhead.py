"""Overhead of chainer_autoprof next to the alternatives: one command, one table.

    python benchmarks/overhead.py            # full run, about 4 minutes
    python benchmarks/overhead.py --quick    # about a minute and a half
    python benchmarks/overhead.py --smoke    # checks that it runs; figures meaningless

Each configuration (``configs.py``) lives in fresh processes of its own
(agent settings are per process; two or three of them, taking turns round by
round, so that no one process's memory layout decides a figure); all are
started at once and wait.  A round asks every one of them, in a shuffled order, for one step of a
workload (``workloads.py``; after an untimed step, since a process that
waited has cold caches), with an uninstrumented step after every
``BASELINE_EVERY`` of them; each step is compared with the uninstrumented
steps just before and after it, so that both see the same machine (a shared
machine's speed changes by tens of percent from one second to the next).
Figures are medians over rounds.

NVTX calls go to the test injection library (``tests/nvtx_tool.py``) with
``NVTX_RECORD_FILE`` unset: real calls into an NVTX tool that records
nothing.  BLAS runs single-threaded.  Prints a Markdown table, the floor
figures, and each target as met / not met.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO / "tests"))

from configs import CONFIGS, Config  # noqa: E402
from pth_check import measure_pth  # noqa: E402

CHILD = HERE / "child.py"
AGENT_CONFIGS = ("agent-iteration", "agent-phase", "agent-link", "agent-function",
                 "agent-recorder", "agent-sync3")
WORKLOADS = ("mlp", "deep", "link")


@dataclass(frozen=True)
class Mode:
    cycles: int             # rounds: every configuration runs one step of each workload
    replicas: int           # processes per configuration, taking turns round by round
    warmup: int
    visibility_steps: int   # MLP steps recorded to count ranges (0: not counted)
    floor_n: int
    memory_limit: int
    pth_runs: int


MODES = {
    "full": Mode(120, 3, 3, 4, 200_000, 20_000, 21),
    "quick": Mode(20, 2, 2, 2, 50_000, 4000, 5),
    "smoke": Mode(2, 1, 1, 0, 2000, 1000, 2),  # no range counting: seconds matter
}
#: a baseline step after every this many configuration steps
BASELINE_EVERY = 3


# -- running processes ---------------------------------------------------------

def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment: no agent or NVTX variables, the NVTX test tool attached."""
    from nvtx_tool import build_injection_library

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINER_PROF_", "_CHAINER_PROF_", "NVTX_", "CHAINER_AUTOPROF_"))}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env["NVTX_INJECTION64_PATH"] = str(build_injection_library())
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    env.update(extra or {})
    return env


def run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a one-shot child command; its last stdout line is the JSON result."""
    proc = subprocess.run([sys.executable, str(CHILD), *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(REPO), check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"no JSON on stdout: {proc.stdout[-400:]!r}"}


class Server:
    """A configuration's process, timing steps on request (``child.py serve``)."""

    def __init__(self, cfg: Config, env: dict[str, str], warmup: int, tmp: Path,
                 replica: int = 0) -> None:
        self.cfg = cfg
        self.errfile = tmp / f"{cfg.name}.{replica}.stderr"
        with open(self.errfile, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), "serve", cfg.name, "--warmup", str(warmup)],
                env=env, cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, bufsize=1)
        self.info: dict[str, Any] = {}
        self.error: str | None = None

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"exit {self.proc.returncode}: "
                               f"{self.errfile.read_text().strip()[-800:]}")
        return json.loads(line)

    def wait_ready(self) -> None:
        try:
            self.info = self._read().get("info", {})
        except Exception as exc:  # a child that failed to start: its error is reported  # noqa: BLE001
            self.error = str(exc)

    def step(self, workload: str) -> float:
        """A timed step of ``workload``: ns per unit (per Link call for ``link``).

        Two steps run; the first only warms the caches that the other
        processes used meanwhile (a training loop runs warm).
        """
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{workload} 2\n")
        reply = self._read()
        return reply["samples"][-1] / reply["unit"]

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except Exception:  # a child that will not stop: killed  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()


def _progress(started: float, what: str) -> None:
    sys.stderr.write(f"{what} ({time.monotonic() - started:.0f} s)\n")


def run_cycles(servers: dict[str, list[Server]], cycles: int, rng: random.Random,
               progress: bool) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Interleave one step of every configuration per workload and cycle.

    Each configuration's step is paired with the uninstrumented steps just
    before and after it (a baseline step runs after every ``BASELINE_EVERY``
    configuration steps): ``(time, baseline time)`` per unit.  Successive
    rounds take turns among a configuration's processes (replicas), so that
    no process's memory layout decides a figure.
    """
    pairs: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {w: [] for w in WORKLOADS} for name in servers}
    failed: set[str] = set()
    started = time.monotonic()
    for cycle in range(cycles):
        pick = {name: group[cycle % len(group)] for name, group in servers.items()}
        base = pick["uninstrumented"]
        for w in WORKLOADS:
            order = [s for name, s in pick.items()
                     if name != "uninstrumented" and name not in failed]
            rng.shuffle(order)
            before = base.step(w)
            pending: list[tuple[str, float]] = []
            for i, server in enumerate(order):
                try:
                    pending.append((server.cfg.name, server.step(w)))
                except Exception as exc:  # one configuration failing: the others go on  # noqa: BLE001
                    server.error = server.error or str(exc)
                    failed.add(server.cfg.name)
                if (i + 1) % BASELINE_EVERY == 0 or i == len(order) - 1:
                    after = base.step(w)
                    pairs["uninstrumented"][w].append((before, (before + after) / 2))
                    for name, t in pending:
                        pairs[name][w].append((t, (before + after) / 2))
                    pending, before = [], after
        if progress and (cycle + 1) % max(1, cycles // 4) == 0:
            _progress(started, f"round {cycle + 1}/{cycles}")
    return pairs


def count_ranges(record: Path, steps: int) -> float | None:
    """NVTX ranges pushed per step between the child's two marks."""
    from nvtx_tool import read_events

    events = read_events(record)
    inside, pushes, seen_end = False, 0, False
    for ev in events:
        if ev.event == "mark" and ev.domain == "benchmark":
            if ev.text == "steps-begin":
                inside = True
            elif ev.text == "steps-end":
                inside, seen_end = False, True
        elif inside and ev.event in ("push", "start"):
            pushes += 1
    return pushes / steps if seen_end else None


def visibility(configs: tuple[Config, ...], mode: Mode, tmp: Path) -> dict[str, Any]:
    """NVTX ranges per MLP step for each configuration (recorded, not timed)."""
    def one(cfg: Config) -> tuple[str, Any]:
        record = tmp / f"vis-{cfg.name}.tsv"
        env = child_env({"NVTX_RECORD_FILE": str(record)})
        out = run_child(["visibility", cfg.name, "--steps", str(mode.visibility_steps)], env)
        if "error" in out:
            return cfg.name, out
        return cfg.name, count_ranges(record, mode.visibility_steps)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, configs))


# -- statistics ------------------------------------------------------------------

def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free 95% confidence interval of the median (order statistics)."""
    n = len(values)
    if n < 6:
        return None
    ordered = sorted(values)
    half = 0.98 * n ** 0.5
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half + 1))
    return ordered[lo], ordered[hi]


def summarize(pairs: dict[str, dict[str, list[tuple[float, float]]]],
              servers: dict[str, list[Server]]) -> dict[str, dict[str, Any]]:
    """Per configuration and workload: median time, paired ratio and added time."""
    out: dict[str, dict[str, Any]] = {}
    for name, group in servers.items():
        errors = [s.error for s in group if s.error]
        wrapped = sorted({w for s in group for w in s.info.get("wrapped", [])})
        row: dict[str, Any] = {"error": errors[0] if errors else None, "info": group[0].info,
                               "wrapped": wrapped}
        for w in WORKLOADS:
            got = pairs.get(name, {}).get(w, [])
            ratios = [t / b for t, b in got]
            row[w] = {"ns": median([t for t, _ in got]), "ratio": median(ratios),
                      "ratio_ci": median_ci(ratios), "n": len(got),
                      "added_ns": median([t - b for t, b in got])}
        out[name] = row
    return out


# -- output ------------------------------------------------------------------------

def machine() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                  check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    versions = []
    for dist in ("chainer", "numpy", "nvtx", "wrapt"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} -")
    return [f"CPU: {cpu}, {os.cpu_count()} logical CPUs; {platform.platform()}",
            f"Python {sys.version.split()[0]} ({platform.python_implementation()}, "
            f"{' '.join(sys.version.split()[1:])})",
            ", ".join(versions)]


def _fmt_time(ns: float | None, unit: str) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:.2f} ms" if unit == "ms" else f"{ns / 1e3:.1f} µs"


def _cell(stats: dict[str, Any], base: dict[str, Any] | None, unit: str) -> str:
    """The baseline's median time x this configuration's paired ratio, and the ratio."""
    if stats["ratio"] is None or base is None or base["ns"] is None:
        return "-"
    return f"{_fmt_time(base['ns'] * stats['ratio'], unit)} ({stats['ratio']:.3f}x)"


def table(configs: tuple[Config, ...], summary: dict[str, Any], vis: dict[str, Any]) -> str:
    rows = ["| Configuration | Shows | NVTX ranges / MLP step | MLP step | deep-50 step "
            "| Link call | added / Link call |",
            "|---|---|--:|--:|--:|--:|--:|"]
    for cfg in configs:
        row = summary.get(cfg.name)
        if row is None:
            continue
        if row["error"]:
            rows.append(f"| {cfg.label} | {cfg.visibility} | error | error | error | error "
                        f"| {row['error'].splitlines()[-1][:60]} |")
            continue
        count = vis.get(cfg.name)
        ranges = f"{count:.0f}" if isinstance(count, (int, float)) else "-"
        added = row["link"]["added_ns"]
        added_txt = "-" if added is None else f"{added / 1e3:+.2f} µs"
        base = summary.get("uninstrumented") or {}
        cells = [_cell(row[w], base.get(w), unit)
                 for w, unit in (("mlp", "ms"), ("deep", "ms"), ("link", "us"))]
        rows.append(f"| {cfg.label} | {cfg.visibility} | {ranges} | " + " | ".join(cells)
                    + f" | {added_txt} |")
    return "\n".join(rows)


def targets(summary: dict[str, Any], floor: dict[str, Any], memory: dict[str, Any],
            pth: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """(target, met or None when not measurable, figures)."""
    got: list[tuple[str, bool | None, str]] = []

    def stat(name: str, w: str, key: str) -> float | None:
        row = summary.get(name)
        return None if row is None or row["error"] else row[w][key]

    na = summary.get("not-activated")
    if na is not None and not na["error"]:
        wrapped = na["wrapped"]
        got.append(("Not activated: no Chainer function wrapped", not wrapped,
                    "all identical" if not wrapped else "wrapped: " + ", ".join(wrapped)))
    if pth.get("found"):
        ms = pth["median_ns"] / 1e6
        got.append(("Not activated: .pth start-up check < 1 ms", ms < 1.0,
                    f"{ms:.3f} ms median over fresh interpreters ({pth['where']})"))
    else:
        got.append(("Not activated: .pth start-up check < 1 ms", None, pth.get("where", "")))
    r = stat("agent-phase", "mlp", "ratio")
    ci = stat("agent-phase", "mlp", "ratio_ci")
    ci_text = f" (95% CI {(ci[0] - 1) * 100:+.2f}% to {(ci[1] - 1) * 100:+.2f}%)" if ci else ""
    got.append(("Phase granularity <= 1% slower on the MLP", None if r is None else r <= 1.01,
                "-" if r is None else f"{(r - 1) * 100:+.2f}%{ci_text}"))
    added = stat("agent-link", "link", "added_ns")
    pair = floor.get("nvtx_pair_ns")
    got.append(("Link granularity <= 1.5 µs added per Link call",
                None if added is None else added <= 1500,
                "-" if added is None else f"{added / 1e3:.2f} µs"))
    got.append(("Link granularity <= 2x a bare NVTX push+pop",
                None if added is None or pair is None else added <= 2 * pair,
                "-" if added is None or pair is None
                else f"{added:.0f} ns vs 2 x {pair:.0f} ns (a bare wrapt wrapper alone: "
                     f"{floor.get('wrapt_ns', 0):.0f} ns)"))
    pairs = [(w, stat("agent-function", w, "ratio"), stat("fhook", w, "ratio"))
             for w in WORKLOADS]
    if all(a is not None and b is not None for _, a, b in pairs):
        got.append(("Function granularity cheaper than Chainer's function hook",
                    all(a < b for _, a, b in pairs),
                    "agent vs hook: " + ", ".join(f"{w} {a:.3f}x vs {b:.3f}x"
                                                  for w, a, b in pairs)))
    else:
        got.append(("Function granularity cheaper than Chainer's function hook", None, "-"))
    rec = summary.get("agent-recorder")
    has_recorder = bool(rec and rec["info"].get("recorder"))
    rec_added, link_added = stat("agent-recorder", "link", "added_ns"), added
    if has_recorder and rec_added is not None and link_added is not None:
        extra = rec_added - link_added
        got.append(("Recorder < 1 µs per range", extra < 1000,
                    f"{extra:.0f} ns per Link range (link + recorder vs link, each against "
                    "the uninstrumented steps beside it)"))
    else:
        got.append(("Recorder < 1 µs per range", None, "no recorder sink in this build"))
    if memory.get("recorder"):
        bpr = memory["bytes_per_range"]
        growth = memory["growth_past_limit_per_range"]
        got.append(("Recorder < 100 bytes per range", bpr < 100, f"{bpr:.1f} B per range"))
        got.append(("Recorder memory bounded (record_limit)", growth < 0.05 * max(bpr, 1.0),
                    f"{growth:.2f} B per range past the limit of {memory['limit']}"))
    else:
        why = memory.get("error", "no recorder sink in this build")
        got.append(("Recorder < 100 bytes per range", None, why))
        got.append(("Recorder memory bounded (record_limit)", None, why))
    worst = []
    for name in AGENT_CONFIGS:
        for w in WORKLOADS:
            a, b = stat(name, w, "ratio"), stat("nvtx-auto", w, "ratio")
            if a is not None and b is not None:
                worst.append((a / b, name, w, a, b))
    if worst:
        top = max(worst)
        got.append(("Every agent configuration cheaper than python -m nvtx", top[0] < 1,
                    f"closest: {top[1]} on {top[2]}, {top[3]:.3f}x the uninstrumented time "
                    f"vs {top[4]:.3f}x"))
    return got


# -- main ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true",
                       help="fewer rounds (about a minute and a half)")
    speed.add_argument("--smoke", action="store_true",
                       help="two tiny rounds, ranges not counted: checks that it runs")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument("--configs", help="comma-separated subset of configurations")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed")
    args = parser.parse_args(argv)
    mode = MODES["quick" if args.quick else "smoke" if args.smoke else "full"]
    cycles = args.rounds or mode.cycles
    configs = CONFIGS
    if args.configs:
        wanted = {"uninstrumented", *args.configs.split(",")}
        unknown = wanted - {c.name for c in CONFIGS}
        if unknown:
            parser.error(f"unknown configurations: {', '.join(sorted(unknown))}")
        configs = tuple(c for c in CONFIGS if c.name in wanted)

    started = time.monotonic()
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="autoprof-bench-") as tmp_name:
        tmp = Path(tmp_name)
        vis = visibility(configs, mode, tmp) if mode.visibility_steps else {}
        _progress(started, "ranges counted")
        servers = {cfg.name: [Server(cfg, env, mode.warmup, tmp, i)
                              for i in range(mode.replicas)] for cfg in configs}
        everyone = [s for group in servers.values() for s in group]
        try:
            for server in everyone:
                server.wait_ready()
            _progress(started, "processes ready")
            live = {n: g for n, g in servers.items() if all(s.error is None for s in g)}
            pairs = run_cycles(live, cycles, random.Random(args.seed), progress=True) \
                if "uninstrumented" in live else {}
        finally:
            for server in everyone:
                server.close()
    floor = run_child(["floor", "--n", str(mode.floor_n)], env)
    memory = run_child(["memory", "--limit", str(mode.memory_limit)], env)
    pth = measure_pth(env, mode.pth_runs)
    _progress(started, "floor, memory and start-up measured")
    summary = summarize(pairs, servers)

    print("## Overhead: chainer_autoprof and the alternatives (CPU)\n")
    for line in machine():
        print(f"- {line}")
    print(f"- {cycles} rounds; {mode.replicas} processes per configuration taking turns, all "
          "alive at once; each round "
          "runs one step of every configuration per workload (after an untimed one that warms "
          "the caches), in a shuffled order, with an uninstrumented step after every "
          f"{BASELINE_EVERY}: a ratio compares a step with the uninstrumented steps just before "
          "and after it; medians over rounds")
    print("- NVTX calls go to the test injection library (tests/nvtx_tool.py) with "
          "NVTX_RECORD_FILE unset: real NVTX calls into a tool that records nothing; no GPU")
    print("- BLAS single-threaded; 'Link call' = one call of a Linear(4, 4) on a batch of 1 "
          "inside a Chain, in training mode\n")
    print(table(configs, summary, vis))
    base = summary.get("uninstrumented")
    if base is not None and base["error"] is None:
        cis = [(w, base[w]["ratio_ci"]) for w in WORKLOADS]
        print("\nNoise: an uninstrumented step against its neighbours, 95% CI of the median "
              "ratio: " + ", ".join(f"{w} {lo:.3f}-{hi:.3f}" for w, ci in cis if ci
                                    for lo, hi in [ci]))
    print("\nFloor, in-process, per call:")
    for key, text in (("nvtx_pair_ns", "bare NVTX push+pop pair from Python"),
                      ("wrapt_ns", "bare wrapt wrapper on a __call__ (added)")):
        value = floor.get(key)
        print(f"- {text}: " + ("-" if value is None else f"{value:.0f} ns"))
    if memory.get("recorder"):
        print(f"- recorder memory: {memory['bytes_per_range']:.1f} B per range kept, "
              f"{memory['growth_past_limit_per_range']:.2f} B per range past record_limit; "
              f"its aggregation of buffered ranges: "
              f"{memory['aggregation_ns_per_range']:.0f} ns per range")
    print("\nTargets:")
    for text, met, figures in targets(summary, floor, memory, pth):
        verdict = "met" if met else "not met" if met is not None else "not measured"
        print(f"- [{verdict}] {text}: {figures}")
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"pairs": pairs, "floor": floor, "memory": memory,
                                         "pth": pth, "visibility": vis}, indent=1))
    failed = {name: row["error"] for name, row in summary.items() if row["error"]}
    for key, result in (("floor", floor), ("memory", memory)):
        if "error" in result:
            failed[key] = result["error"]
    for name, err in failed.items():
        sys.stderr.write(f"failed: {name}: {err}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
