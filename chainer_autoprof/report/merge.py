"""``python -m chainer_autoprof merge rank*.json -o job.json``: one timeline for a whole job.

Every input is a trace written by the recorder (one per rank, and per child
process).  The output is one Chrome trace-event file (Perfetto UI,
chrome://tracing) with one process track per input, named ``rank N`` (children
``rank N child``) and sorted by rank, and a summary across ranks printed on
stdout and kept in ``otherData.chainer_autoprof.summary``: per-rank iteration
time, time spent in communication, and the slowest rank (the straggler) with
how long the others wait for it.

Clock alignment (``--align``, default ``auto``), per input:

1. ``clock``: the input ran on the same host as the reference rank (the
   lowest rank): ``perf_counter`` is the host's monotonic clock, shared by
   every process there: exact.
2. ``collective``: another host, both traces hold a clock reference (the end of
   the first synchronizing collective, which completes on every rank at the
   same instant up to the collective's latency): the two references are made
   to coincide.
3. ``wall``: otherwise, the wall clock (``time.time_ns`` at the agent's start),
   as good as the hosts' clock synchronization (NTP: about a millisecond).

``--align collective`` and ``--align wall`` force a method for every input
that allows it.  Traces keep their own times; only the offsets change.

Hung and killed jobs: the inputs may be the ranks' partial traces
(``TRACE.partial``, the trace so far a rank left when it was killed or that a
stall report or ``dump`` wrote).  Each holds where its training thread was at
that moment; those positions, or a finished trace's last stall report, are
printed side by side and the odd one out is named (:mod:`.stall`): the rank
that is somewhere else while the others wait in the collective.

Per-rank statistics need no alignment: the first ``warmup`` iterations of each
rank (the recorder's setting, or ``--warmup``) are left out; communication is
the time in ``comm:*`` ranges inside the counted iterations; compute is the
rest of the iteration.  Every figure per iteration is a mean over the counted
iterations, so that the columns add up (iteration = communication + compute;
medians of parts do not sum to the median of the whole when iterations are
uneven).  In a data-parallel job every rank waits in the gradient all-reduce
for the slowest one, so the rank with the most compute per iteration is the
straggler and the others' extra communication time is how long it holds them
back.  A rank's wait in one iteration is its communication time beyond the
fastest rank's in the same (k-th counted) iteration; the longest one is always
said, and the ranks are called balanced only when the waits are under
:data:`BALANCED_SHARE` of the iteration time on average and in every iteration.
"""

from __future__ import annotations

import argparse
import os
import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence, cast

from ..analysis import record
from ..analysis.record import (
    By,
    MalformedError,
    MergeSummary,
    RankRow,
    Snapshot,
    Straggler,
)
from ..analysis.stall import odd_one_out, position
from ..analysis.stats import median
from ..common import names
from ..common.one_line import write
from ..common.outputs import atomic_text
from ..common.paths import check_output
from . import command_parser, trace_events
from .stall import describe_odd, side_by_side
from .trace_events import PROCESS_LABELS, PROCESS_NAME, PROCESS_SORT_INDEX, RANGES
from .tracefile import TraceError, open_trace

ALIGN_METHODS = ("auto", "clock", "collective", "wall")
#: Below this share of the others' iteration time spent waiting, the ranks count as balanced.
BALANCED_SHARE = 0.05


class MergeError(Exception):
    """A problem with the inputs: one line for the user, exit status 2."""


@dataclass
class Input:
    """One trace file to merge."""

    path: str
    meta: dict[str, Any]
    pid: int | None
    rank: int | None
    host: str
    child: bool
    start_perf: int
    start_unix: int
    reference: dict[str, Any] | None
    stats: RankStats | None = None
    offset_ns: int = 0        # own perf clock -> the merged timeline's clock
    method: str = ""
    new_pid: int = 0
    label: str = ""

    @property
    def sort_key(self) -> tuple[int, bool, int, str]:
        return (self.rank if self.rank is not None else 1 << 30, self.child, self.pid or 0,
                self.path)


@dataclass
class RankStats:
    """One process's iterations, from its own ranges (no alignment needed)."""

    label: str
    rank: int | None
    host: str
    pid: int | None
    child: bool
    iterations: int
    iteration_ms: list[float] = field(default_factory=list)
    comm_ms: list[float] = field(default_factory=list)
    comm_outside_ms: float = 0.0
    #: per counted iteration: communication beyond the fastest rank's (:func:`note_waits`)
    wait_ms: list[float] = field(default_factory=list)

    @property
    def compute_ms(self) -> list[float]:
        return [it - c for it, c in zip(self.iteration_ms, self.comm_ms)]

    def as_dict(self) -> RankRow:
        iteration, comm = _mean(self.iteration_ms), _mean(self.comm_ms)
        return {
            "label": self.label, "rank": self.rank, "host": self.host, "pid": self.pid,
            "child": self.child, "iterations": self.iterations,
            "iteration_ms_median": median(self.iteration_ms),
            "iteration_ms_mean": iteration,
            "comm_ms_per_iteration": comm,
            "comm_share": _share(comm, iteration),
            "compute_ms_per_iteration": iteration - comm,
            "comm_outside_iterations_ms": self.comm_outside_ms,
            "comm_ms_max": max(self.comm_ms, default=0.0),
            "wait_ms_max": max(self.wait_ms, default=0.0),
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


# -- reading ------------------------------------------------------------------------
def _read_json(path: str) -> dict[str, Any]:
    try:
        return open_trace(path)
    except TraceError as exc:
        raise MergeError(str(exc)) from None


def load_input(path: str, warmup: int | None = None) -> Input:
    """Read one trace file: what merging needs of its metadata, and its statistics.

    The events are not kept (they are read again when the merged file is
    written), so merging many large traces needs the memory of one.
    """
    data = _read_json(path)
    other = data.get("otherData")
    meta = other.get("chainer_autoprof") if isinstance(other, dict) else None
    if not isinstance(meta, dict):
        raise MergeError(f"{path} was not written by chainer_autoprof (no otherData."
                         "chainer_autoprof metadata)")
    if meta.get("merged"):
        raise MergeError(f"{path} is already a merged trace; merge the per-rank traces")
    try:
        meta = record.check(meta)
    except MalformedError as exc:
        raise MergeError(f"{path}: {exc}") from None
    clock = meta.get("clock") or {}
    process = meta.get("process") or {}
    try:
        start_perf = int(clock["perf_counter_ns_at_start"])
        start_unix = int(clock["unix_time_ns_at_start"])
    except (KeyError, TypeError, ValueError):
        raise MergeError(f"{path} has no clock readings (otherData.chainer_autoprof.clock)") \
            from None
    rank = process.get("mpi_rank", meta.get("rank"))
    reference = process.get("clock_reference")
    inp = Input(path=path, meta=meta, pid=meta.get("pid"),
                rank=int(rank) if isinstance(rank, int) else None,
                host=str(meta.get("host", "")), child=bool(process.get("child", False)),
                start_perf=start_perf, start_unix=start_unix,
                reference=reference if isinstance(reference, dict) else None)
    inp.stats = rank_stats(inp, data["traceEvents"], warmup)
    return inp


# -- clock alignment -------------------------------------------------------------------
def align(inputs: list[Input], method: str = "auto") -> None:
    """Set every input's ``offset_ns`` and ``method`` (see the module docstring)."""
    anchor = next((i for i in inputs if not i.child and i.reference is not None), None) \
        or next((i for i in inputs if not i.child), None) or inputs[0]
    anchor.offset_ns, anchor.method = 0, "reference"
    anchor_wall = anchor.start_unix - anchor.start_perf
    ref_op = anchor.reference.get("op") if anchor.reference else None
    aligned = [anchor]
    pending = [i for i in inputs if i is not anchor]

    def by_collective(i: Input) -> bool:
        if anchor.reference is None or i.reference is None or i.reference.get("op") != ref_op:
            return False
        i.offset_ns = int(anchor.reference["perf_counter_ns"]) - int(i.reference["perf_counter_ns"])
        i.method = "collective"
        return True

    def by_clock(i: Input) -> bool:
        for other in aligned:
            if other.host and other.host == i.host:
                i.offset_ns, i.method = other.offset_ns, "clock"
                return True
        return False

    def by_wall(i: Input) -> None:
        i.offset_ns = (i.start_unix - i.start_perf) - anchor_wall
        i.method = "wall"

    if method == "wall":
        for i in pending:
            by_wall(i)
        return
    rest = []
    for i in pending:
        if method == "collective":
            done = by_collective(i) or (i.child and by_clock(i))
        else:  # auto, clock
            done = by_clock(i) or (method == "auto" and by_collective(i))
        if done:
            aligned.append(i)
        else:
            rest.append(i)
    for i in rest:  # e.g. a child on a host aligned through one of its ranks
        if not by_clock(i):
            by_wall(i)


# -- statistics ------------------------------------------------------------------------
def rank_stats(inp: Input, events: list[object], warmup: int | None) -> RankStats:
    """Per-iteration time and communication time of one input, from its ranges."""
    # by thread id (looked up with None where no thread iterated)
    iterations: dict[int | None, list[tuple[int, int]]] = {}
    comm: dict[int | None, list[tuple[int, int]]] = {}
    for n, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if trace_events.kind_of(ev) is not RANGES:
            continue
        try:
            r = RANGES.decode(ev, f"event {n}")
        except MalformedError as exc:
            raise MergeError(f"{inp.path}: {exc}") from None
        if r.category != names.ITERATION and r.category != names.COMM:
            continue
        table = iterations if r.category == names.ITERATION else comm
        table.setdefault(r.tid, []).append((r.t0, r.t1))
    loop_tid = max(iterations, key=lambda tid: len(iterations[tid]), default=None)
    iters = sorted(iterations.get(loop_tid, []))
    skip = int(record.value(inp.meta, "warmup_skip")) if warmup is None else warmup
    if len(iters) <= skip:
        skip = 0
    starts = [t0 for t0, _ in iters]
    comm_in = [0] * len(iters)
    outside = 0
    for t0, t1 in comm.get(loop_tid, []):
        k = bisect_right(starts, t0) - 1
        if k >= 0 and t1 <= iters[k][1]:
            comm_in[k] += t1 - t0
        else:
            outside += t1 - t0
    for tid, rows in comm.items():
        if tid != loop_tid:
            outside += sum(t1 - t0 for t0, t1 in rows)
    counted = range(skip, len(iters))
    return RankStats(
        label=inp.path, rank=inp.rank, host=inp.host, pid=inp.pid, child=inp.child,
        iterations=len(counted),
        iteration_ms=[(iters[k][1] - iters[k][0]) / 1e6 for k in counted],
        comm_ms=[comm_in[k] / 1e6 for k in counted],
        comm_outside_ms=outside / 1e6)


def _ranks(stats: list[RankStats]) -> list[RankStats]:
    """The ranks of the job (children and processes without a rank left out)."""
    return [s for s in stats if not s.child and s.iterations and s.rank is not None]


def note_waits(stats: list[RankStats]) -> None:
    """Each rank's wait per counted iteration: its communication time beyond the fastest
    rank's in the same (k-th counted) iteration, what it spent waiting for the others."""
    ranks = _ranks(stats)
    if len(ranks) < 2:
        return
    n = min(len(s.comm_ms) for s in ranks)
    fastest = [min(s.comm_ms[k] for s in ranks) for k in range(n)]
    for s in ranks:
        s.wait_ms = [s.comm_ms[k] - fastest[k] for k in range(n)]


def straggler(stats: list[RankStats]) -> Straggler | None:
    """The rank the others wait for, and for how long (``None`` with fewer than two ranks).

    Means per counted iteration throughout (a rank slow in some iterations only holds the
    others back by its total, which a median of the iterations leaves out)."""
    ranks = _ranks(stats)
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=lambda s: _mean(s.compute_ms))
    others = [s for s in ranks if s is not slow]
    slow_compute = _mean(slow.compute_ms)
    others_compute = _mean([_mean(s.compute_ms) for s in others])
    slow_comm = _mean(slow.comm_ms)
    held_back = _mean([max(0.0, _mean(s.comm_ms) - slow_comm) for s in others])
    others_iter = _mean([_mean(s.iteration_ms) for s in others])
    longest, who, when = 0.0, None, -1
    for s in ranks:
        for k, wait in enumerate(s.wait_ms):
            if wait > longest:
                longest, who, when = wait, s.rank, k
    iteration = median([median(s.iteration_ms) for s in ranks])
    waits = [_mean(s.wait_ms) for s in ranks]
    balanced = (_share(held_back, others_iter) < BALANCED_SHARE
                and _share(max(waits), iteration) < BALANCED_SHARE
                and _share(longest, iteration) < BALANCED_SHARE)
    return {
        "rank": slow.rank, "label": slow.label,
        "compute_ms_per_iteration": slow_compute,
        "others_compute_ms_per_iteration": others_compute,
        "extra_compute_ms_per_iteration": slow_compute - others_compute,
        "held_back_ms_per_iteration": held_back,
        "held_back_share": _share(held_back, others_iter),
        "balanced": balanced,
        "longest_wait_ms": longest, "longest_wait_rank": who, "longest_wait_iteration": when,
    }


def last_position(inp: Input) -> dict[str, Any] | None:
    """Where ``inp``'s training thread last was: a partial trace's last state, else its last
    stall report (``None`` for a run that ended normally without a stall)."""
    partial = inp.meta.get("partial")
    if isinstance(partial, dict) and isinstance(partial.get("where"), dict):
        where: dict[str, Any] = partial["where"]
        return where
    stalls = inp.meta.get("stalls") or (partial or {}).get("stalls") or []
    return stalls[-1] if stalls and isinstance(stalls[-1], dict) else None


# -- writing ---------------------------------------------------------------------------
def _labels(inputs: list[Input]) -> None:
    inputs.sort(key=lambda i: i.sort_key)
    for n, inp in enumerate(inputs):
        inp.new_pid = n + 1
        if inp.rank is None:
            inp.label = f"child pid {inp.pid}" if inp.child else f"pid {inp.pid}"
        else:
            inp.label = f"rank {inp.rank} child pid {inp.pid}" if inp.child else f"rank {inp.rank}"


def merged_events(inputs: list[Input], zero_ns: int) -> Iterator[Mapping[str, object]]:
    """Every input's events on the merged timeline, one process track per input."""
    for inp in inputs:
        shift_us = (inp.start_perf + inp.offset_ns - zero_ns) / 1000.0
        pid = inp.new_pid
        detail = f"{inp.host}, pid {inp.pid}" if "pid" not in inp.label else inp.host
        yield PROCESS_NAME.event(pid, 0, f"{inp.label} ({detail})")
        yield PROCESS_SORT_INDEX.event(pid, 0, pid)
        if inp.rank is not None:
            yield PROCESS_LABELS.event(pid, 0, f"rank {inp.rank}")
        own = (PROCESS_NAME, PROCESS_SORT_INDEX, PROCESS_LABELS)  # the merged file's own
        for n, ev in enumerate(_read_json(inp.path)["traceEvents"]):
            if not isinstance(ev, dict):
                continue
            if trace_events.kind_of(ev) in own and not trace_events.is_gpu_pid(ev.get("pid")):
                continue  # (a GPU's track keeps its name, moved with its process)
            try:
                yield trace_events.move(ev, n, pid, shift_us)
            except MalformedError as exc:
                raise MergeError(f"{inp.path}: {exc}") from None


def merge(paths: Sequence[str], output: str, method: str = "auto",
          warmup: int | None = None) -> MergeSummary:
    """Merge ``paths`` into ``output``; returns the summary written with it."""
    inputs = [load_input(p, warmup) for p in paths]
    _labels(inputs)
    align(inputs, method)
    zero_ns = min(i.start_perf + i.offset_ns for i in inputs)
    stats = [i.stats for i in inputs if i.stats is not None]
    for i in inputs:
        if i.stats is not None:
            i.stats.label = i.label
    note_waits(stats)
    snaps = [snap for snap in (last_position(i) for i in inputs if not i.child) if snap]
    found = odd_one_out([position(snap) for snap in snaps]) if len(snaps) > 1 else None
    summary: MergeSummary = {
        "ranks": [s.as_dict() for s in stats],
        "straggler": straggler(stats),
        "where": {"positions": cast("list[Snapshot]", snaps),
                  "odd_one_out": [p.rank for p in found.odd] if found else [],
                  "odd_one_out_text": describe_odd(found) if found else ""},
        "alignment": [{"path": i.path, "label": i.label, "method": i.method,
                       "offset_ns": i.offset_ns} for i in inputs],
    }
    other = record.build(By.MERGE, {
        "merged": True,
        "inputs": [{"path": i.path, "label": i.label, "pid": i.pid, "merged_pid": i.new_pid,
                    "rank": i.rank, "host": i.host, "child": i.child, "meta": i.meta}
                   for i in inputs],
        "clock": {"method": method, "zero_perf_counter_ns": zero_ns},
        "summary": summary,
    })
    events = merged_events(inputs, zero_ns)
    try:
        check_output(output)  # a regular file only (a symlink: where the kernel follows it)
    except ValueError as exc:
        raise MergeError(f"cannot write {output}: {exc}") from None
    try:
        with atomic_text(output) as out:
            trace_events.write_container(out, other, _texts(events, inputs))
    except ValueError as exc:
        raise MergeError(f"cannot write {exc}") from None
    except OSError as exc:
        raise MergeError(f"cannot write {output}: {exc.strerror or exc}") from None
    return summary


def _texts(events: Iterator[Mapping[str, object]], inputs: list[Input]) -> Iterator[str]:
    """Each merged event as strict JSON text (NaN and Infinity are not numbers there)."""
    for ev in events:
        try:
            yield trace_events.dumps(ev)
        except ValueError:
            raise MergeError(f"an event of {_source(inputs, ev)} holds NaN or "
                             "Infinity") from None


def _source(inputs: list[Input], ev: Mapping[str, object]) -> str:
    """The input file a merged event came from."""
    return next((i.path for i in inputs if i.new_pid == ev.get("pid")), "an input")


def format_summary(summary: MergeSummary, output: str) -> str:
    """The merged summary as text."""
    rows = summary["ranks"]
    methods = sorted({a["method"] for a in summary["alignment"]} - {"reference"})
    lines = [f"merged {len(rows)} trace(s) into {output} (clocks: "
             f"{', '.join(methods) if methods else 'one process'})", ""]
    header = (f"  {'process':<28} {'iters':>6} {'iter ms':>9} {'comm ms':>9} {'comm':>5} "
              f"{'compute ms':>10} {'longest wait ms':>15}")
    lines.append(header)
    for r in rows:
        # shown as they add up: compute = iteration - communication, each as printed
        iteration, comm = round(r["iteration_ms_mean"], 2), round(r["comm_ms_per_iteration"], 2)
        lines.append(f"  {r['label']:<28} {r['iterations']:>6} {iteration:>9.2f} {comm:>9.2f} "
                     f"{r['comm_share']:>5.0%} {iteration - comm:>10.2f} "
                     f"{r.get('wait_ms_max', 0.0):>15.2f}")
    lines += ["  (means per counted iteration, iter ms = comm ms + compute ms; iter: the "
              "iteration's time;",
              "   comm: in comm:* ranges, waiting for the other ranks included; compute: the "
              "rest (data,",
              "   forward, backward, the update's own work); longest wait: the most one "
              "iteration spent",
              "   in comm beyond the fastest rank's)"]
    slow = summary.get("straggler")
    if slow is not None:
        lines += ["", f"slowest rank (straggler): {slow['rank']}: "
                      f"{slow['compute_ms_per_iteration']:.2f} ms of compute per iteration, "
                      f"{slow['extra_compute_ms_per_iteration']:+.2f} ms against the others; "
                      f"the others wait {slow['held_back_ms_per_iteration']:.2f} ms per "
                      f"iteration for it ({slow['held_back_share']:.0%} of their iteration "
                      "time)"]
        longest = (f"the longest wait: {slow['longest_wait_ms']:.2f} ms, rank "
                   f"{slow['longest_wait_rank']} in counted iteration "
                   f"{slow['longest_wait_iteration']}") \
            if slow.get("longest_wait_rank") is not None else "no rank waited for another"
        if slow["balanced"]:
            lines.append(f"  the ranks are balanced (waits under {BALANCED_SHARE:.0%} of the "
                         f"iteration time on average and in every iteration; {longest})")
        else:
            lines.append(f"  {longest}")
    where = summary.get("where") or {}
    if where.get("positions"):
        lines += ["", side_by_side(where["positions"],
                                   "where each rank was (the last state each trace holds)")]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "merge",
        "Merge the traces of the ranks (and child processes) of one job into one "
        "Perfetto timeline, and summarize iteration and communication time per "
        "rank.")
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (rank*.json)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH",
                        help="the merged trace file to write")
    parser.add_argument("--align", choices=ALIGN_METHODS, default="auto",
                        help="clock alignment: auto (shared host clock, else the collective "
                             "reference, else wall clock), or force collective or wall")
    parser.add_argument("--warmup", type=int, default=None, metavar="N",
                        help="iterations left out at the start of each rank (default: the "
                             "recorder's setting)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``merge`` subcommand; returns the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.warmup is not None and args.warmup < 0:
        write(sys.stderr, "merge: --warmup must be >= 0\n")
        return 2
    real = [os.path.realpath(p) for p in args.traces]
    twice = next((p for p, r in zip(args.traces, real) if real.count(r) > 1), None)
    if twice is not None:
        write(sys.stderr, f"merge: {twice} is given twice\n")
        return 2
    streams = [p for p in args.traces if os.path.exists(p) and not os.path.isfile(p)]
    if streams:
        write(sys.stderr, f"merge: {streams[0]} is not a regular file (each input is read "
                          "twice: give files)\n")
        return 2
    if os.path.realpath(args.output) in set(real):
        write(sys.stderr, f"merge: the output {args.output} is one of the inputs\n")
        return 2
    try:
        summary = merge(args.traces, args.output, args.align, args.warmup)
    except MergeError as exc:
        write(sys.stderr, f"merge: {exc}\n")
        return 2
    if not args.quiet:
        write(sys.stdout, format_summary(summary, args.output) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
