"""THE run record: ``otherData.chainer_autoprof`` of a trace, declared once.

Like the settings table (:mod:`..common.settings`), one declaration drives
everything that touches the record:

* the writers build it through :func:`build` (the final trace at exit and the
  live statistics, :mod:`..lifecycle.finish`; the trace so far's metadata;
  ``merge``): a key not declared for that writer, or a required one missing,
  is a bug (:class:`~.shapes.RecordError`), which every test that writes a
  trace catches;
* the readers check it with :func:`check` (``report``, ``report --html``,
  ``merge``): every declared field present is checked against its kind, a
  null one counts as absent, a defaulted one is then taken with its default;
* :class:`~.stats.RunStats` takes its record fields through :func:`stats_fields`
  (live in the recorder, and from a saved trace), and a saved ``run_stats`` is
  checked with :func:`check_run_stats` (its fields: :class:`RunStats`' own);
* the documentation's tables (``docs/trace_format.md``, from :func:`markdown`).

A field names who writes it (:class:`~.shapes.By`): the final trace at exit,
the trace so far (and what its reader adds), a merged trace, or the live
statistics only.  Fields are never removed: older traces hold what they hold
(the GPU traces under ``tests/data/gpu`` read with this declaration).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Mapping, TypedDict

from ..common.settings import SETTINGS
from .facts import FACTS
from .shapes import (
    ANY,
    BOOL,
    INT,
    NEEDED,
    NON_NEGATIVE,
    NUMBER,
    OBJECT,
    SERIES,
    SIGNED,
    TEXT,
    By,
    Field,
    Int,
    Kind,
    ListOf,
    MalformedError,
    MapOf,
    Number,
    RecordError,
    Section,
    Triple,
    Window,
    by_text,
)
from .stats import LinkStat, RunStats

__all__ = ["RECORD", "RUN_STATS", "WHERE", "By", "MalformedError", "RecordError", "add", "build",
           "check", "check_run_stats", "from_stats", "markdown", "stats_fields", "value"]

#: Where the record sits in a trace file (error lines name fields from here).
WHERE = "otherData.chainer_autoprof"

#: Writers of the run's own facts: the final trace and the trace so far.
RUN = By.EXIT | By.SO_FAR
#: The same, and the trace so far's reader (which rewrites or adds them).
RUN_READ = By.EXIT | By.SO_FAR | By.READ

# -- sections ------------------------------------------------------------------------------------
#: Settings newer than the oldest traces read with this declaration (tests/data/gpu): written
#: always, but not required of a trace.
_NEWER_SETTINGS = frozenset({"gpu_activity"})

SETTINGS_SECTION = Section(
    [Field(s.name, Window() if s.name == "iterations" else ANY, s.doc,
           required=s.name not in _NEWER_SETTINGS) for s in SETTINGS]
    + [Field("effective_sync_level", ANY, "the sync level in effect (SYNC and SYNC_LEVEL)")],
    doc="every setting as the run used it (common/settings.py)")

CLOCK = Section([
    Field("perf_counter_ns_at_start", INT, "time.perf_counter_ns() when the agent started",
          "ns", by=RUN_READ),
    Field("unix_time_ns_at_start", INT, "time.time_ns() at the same moment", "ns",
          by=RUN_READ),
    Field("duration_ns", INT, "from the start to the end of the run (the trace so far: to "
          "its last write)", "ns", by=By.EXIT | By.READ),
    Field("method", TEXT, "merge: the alignment asked for (--align)", by=By.MERGE),
    Field("zero_perf_counter_ns", SIGNED, "merge: the merged timeline's zero on the "
          "reference clock", "ns", by=By.MERGE),
], doc="clock readings")

DEVICE = Section([
    Field("id", INT, "CUDA device number"),
    Field("name", TEXT, "its name (where the program imported CuPy)", required=False),
], doc="one GPU in use")

IMPLEMENTATION = Section([
    Field("name", TEXT, "native or python"),
    Field("reason", TEXT, "why the Python one runs (empty for the native one)"),
], doc="the hot path's implementation (runtime/hotpath)")

CLOCK_REFERENCE = Section([
    Field("method", TEXT, "how it was taken (first-collective)"),
    Field("op", TEXT, "the collective"),
    Field("perf_counter_ns", INT, "time.perf_counter_ns() at its end", "ns", default=NEEDED),
    Field("unix_time_ns", INT, "time.time_ns() at its end", "ns"),
], doc="the end of the first synchronizing collective (common/rank.py)")

PROCESS = Section([
    Field("mpi_rank", INT, "MPI rank (null outside an MPI job)"),
    Field("world_size", INT, "ranks in the job"),
    Field("rank_source", TEXT, "where the rank came from (a launcher's variable, ChainerMN)"),
    Field("child", BOOL, "whether an agent started in a parent process"),
    Field("parent_pid", INT, "the parent's pid"),
    Field("clock_reference", CLOCK_REFERENCE, "merge's clock reference", required=False),
], doc="the process's place in the job (lifecycle/processes.py)")

OPEN_RANGE = Section([
    Field("name", TEXT, "range name"),
    Field("category", TEXT, "range category"),
    Field("open_s", NON_NEGATIVE, "how long it has been open", "s"),
], doc="a range still open", open=True)

THREAD = Section([
    Field("tid", INT, "native thread id"),
    Field("name", TEXT, "thread name"),
    Field("main", BOOL, "the main thread"),
    Field("open", ListOf(OPEN_RANGE), "its open ranges, outermost first"),
    Field("stack", ListOf(OBJECT), "its innermost frames not the agent's", required=False),
], doc="one thread", open=True)

SNAPSHOT = Section([
    Field("reason", TEXT, "why it was taken (stall, dump, partial write)"),
    Field("pid", INT, "process id"),
    Field("host", TEXT, "host name"),
    Field("rank", INT, "MPI rank"),
    Field("world_size", INT, "ranks in the job"),
    Field("parent_pid", INT, "the parent's pid"),
    Field("unix_ns", INT, "when (wall clock)", "ns"),
    Field("perf_ns", INT, "when (perf counter)", "ns"),
    Field("iteration", INT, "the iteration begun last (from 0)"),
    Field("in_iteration", BOOL, "whether the loop thread is inside it"),
    Field("since_iteration_s", NON_NEGATIVE, "since the last iteration began", "s"),
    Field("since_progress_s", NON_NEGATIVE, "since the last progress (a new iteration or any "
          "instrumented call)", "s"),
    Field("threshold_s", NON_NEGATIVE, "the stall threshold", "s"),
    Field("threshold_rule", TEXT, "how the threshold was set (a number, or what auto learned)"),
    Field("threads", ListOf(THREAD), "every thread with where it is"),
    Field("notes", ListOf(ANY), "one line each (the input queue's state, ...)"),
], doc="where the process was (lifecycle/where.py)", open=True)

PARTIAL_STATE = Section([
    Field("perf_ns", INT, "when the trace so far was last written (perf counter)", "ns"),
    Field("unix_ns", INT, "the same, wall clock", "ns"),
    Field("where", SNAPSHOT, "where every thread was then"),
    Field("stalls", ListOf(SNAPSHOT), "the stall reports so far"),
    Field("dropped", INT, "ranges dropped by the record limit before they were written"),
    Field("path", TEXT, "the partial file read"),
], doc="the trace so far's last state (report/partial.py)")

INPUT = Section([
    Field("path", TEXT, "the input file"),
    Field("label", TEXT, "its process track's label"),
    Field("pid", INT, "its pid"),
    Field("merged_pid", INT, "its process track in the merged file"),
    Field("rank", INT, "its MPI rank"),
    Field("host", TEXT, "its host"),
    Field("child", BOOL, "a child process"),
    Field("meta", OBJECT, "its own run record"),
], doc="one merged input")

RANK_ROW = Section([
    Field("label", TEXT, "process track label"),
    Field("rank", INT, "MPI rank"),
    Field("host", TEXT, "host"),
    Field("pid", INT, "pid"),
    Field("child", BOOL, "a child process"),
    Field("iterations", INT, "counted iterations"),
    Field("iteration_ms_median", NON_NEGATIVE, "median iteration", "ms"),
    Field("iteration_ms_mean", NON_NEGATIVE, "mean iteration", "ms"),
    Field("comm_ms_per_iteration", NUMBER, "mean time in comm:* ranges per counted iteration",
          "ms"),
    Field("comm_share", NUMBER, "its share of the mean iteration"),
    Field("compute_ms_per_iteration", NUMBER, "the rest of the iteration (mean: "
          "iteration_ms_mean = comm_ms_per_iteration + compute_ms_per_iteration)", "ms"),
    Field("comm_outside_iterations_ms", NUMBER, "communication outside iterations", "ms"),
    Field("comm_ms_max", NUMBER, "the most time in comm:* ranges in one counted iteration",
          "ms", required=False),
    Field("wait_ms_max", NUMBER, "the longest wait for the other ranks in one counted "
          "iteration (communication beyond the fastest rank's)", "ms", required=False),
], doc="one process's iterations (report/merge.py)")

STRAGGLER = Section([
    Field("rank", INT, "the slowest rank"),
    Field("label", TEXT, "its label"),
    Field("compute_ms_per_iteration", NUMBER, "its compute per iteration", "ms"),
    Field("others_compute_ms_per_iteration", NUMBER, "the others' (mean)", "ms"),
    Field("extra_compute_ms_per_iteration", NUMBER, "the difference", "ms"),
    Field("held_back_ms_per_iteration", NUMBER, "how long the others wait for it (mean)", "ms"),
    Field("held_back_share", NUMBER, "that wait's share of their iteration"),
    Field("balanced", BOOL, "whether every rank's waits are under BALANCED_SHARE of the "
          "iteration, on average and in every iteration"),
    Field("longest_wait_ms", NUMBER, "the longest wait of a rank for the others in one "
          "counted iteration", "ms", required=False),
    Field("longest_wait_rank", INT, "the rank that waited", required=False),
    Field("longest_wait_iteration", INT, "in which counted iteration (from 0)",
          required=False),
], doc="the rank the others wait for")

MERGE_WHERE = Section([
    Field("positions", ListOf(SNAPSHOT), "each rank's last position"),
    Field("odd_one_out", ListOf(INT), "the ranks somewhere else"),
    Field("odd_one_out_text", TEXT, "that, in words"),
], doc="where each rank was")

ALIGNMENT = Section([
    Field("path", TEXT, "the input file"),
    Field("label", TEXT, "its label"),
    Field("method", TEXT, "reference, clock, collective or wall"),
    Field("offset_ns", SIGNED, "its clock's offset to the merged timeline", "ns"),
], doc="one input's clock alignment")

MERGE_SUMMARY = Section([
    Field("ranks", ListOf(RANK_ROW), "per process"),
    Field("straggler", STRAGGLER, "the slowest rank (null with fewer than two ranks)"),
    Field("where", MERGE_WHERE, "where the ranks were (hung and killed jobs)"),
    Field("alignment", ListOf(ALIGNMENT), "how each input's clock was aligned"),
], doc="the summary across ranks (report/merge.py)")

# -- GPU activity (analysis/gpu_figures.py: GpuActivityRecord, key for key) ----------------------
GPU_LINK = Section([
    Field("name", TEXT, "the link (its key in the summary's link table)"),
    Field("fwd_ms", NON_NEGATIVE, "kernel time launched in its forward range", "ms"),
    Field("fwd_kernels", INT, "kernels launched there"),
    Field("bwd_ms", NON_NEGATIVE, "kernel time launched in its backward range", "ms"),
    Field("bwd_kernels", INT, "kernels launched there"),
    Field("copy_ms", NON_NEGATIVE, "copy and memset time launched in either", "ms"),
], doc="one link's GPU time over the counted iterations")

GPU_PHASE = Section([
    Field("kernel_ms", NON_NEGATIVE, "kernel time launched in the phase", "ms"),
    Field("kernels", INT, "kernels launched there"),
    Field("copy_ms", NON_NEGATIVE, "copy and memset time launched there", "ms"),
], doc="one phase's GPU time over the counted iterations (by launch)")

GPU_KERNEL = Section([
    Field("name", TEXT, "the kernel"),
    Field("link", TEXT, "the link that launched it (null: none)", nullable=True),
    Field("backward", BOOL, "launched in that link's backward range"),
    Field("ms", NON_NEGATIVE, "its time over the counted iterations", "ms"),
    Field("calls", INT, "its launches there"),
], doc="one of the kernels with the most time, with the link that launched it")

GPU_TIMELINE = Section([
    Field("device", INT, "CUDA device number"),
    Field("windows", INT, "counted iteration windows on its timeline"),
    Field("span_ms", NON_NEGATIVE, "their time", "ms"),
    Field("busy_ms", NON_NEGATIVE, "a kernel running", "ms"),
    Field("idle_ms", MapOf(NON_NEGATIVE, key="cause"), "idle time by cause", "ms"),
], doc="one GPU's timeline over the counted iterations")

GPU_ACTIVITY = Section([
    Field("iterations", INT, "counted iteration windows on the GPU's timeline"),
    Field("warmup_skip", INT, "warm-up iterations left out"),
    Field("span_ms", NON_NEGATIVE, "the counted windows' time", "ms"),
    Field("busy_ms", NON_NEGATIVE, "a kernel running (the union over streams)", "ms"),
    Field("busy_share", Number(0, 1), "busy over span (null: no window)", nullable=True),
    Field("active_share", Number(0, 1), "kernels or copies running over span",
          nullable=True),
    Field("idle_ms", MapOf(NON_NEGATIVE, key="cause"), "idle time by cause: host (launched "
          "late), copies (only copies ran), between iterations, other", "ms"),
    Field("iteration_ms", SERIES, "per counted iteration: span, busy and each idle cause "
          "(a sample beyond 65,536)", "ms"),
    Field("sample_stride", Int(1), "the lists hold every N-th counted iteration"),
    Field("devices", ListOf(GPU_TIMELINE), "per GPU"),
    Field("phases", MapOf(GPU_PHASE, key="phase"), "per phase (and other)"),
    Field("links", ListOf(GPU_LINK), "per link, the most GPU time first"),
    Field("top_kernels", ListOf(GPU_KERNEL), "the kernels with the most time"),
    Field("warmup_kernel_ms", NON_NEGATIVE, "kernel time launched in warm-up iterations", "ms"),
    Field("outside_kernel_ms", NON_NEGATIVE, "kernel time launched outside iterations", "ms"),
    Field("ops", MapOf(INT, key="kind"), "operations recorded: kernel, memcpy, memset"),
    Field("statuses", MapOf(MapOf(NUMBER, key="figure"), key="status"), "operations and their "
          "time (ms) by attribution status: attributed, no launch record, unknown thread, "
          "ranges dropped, ranges still open"),
    Field("late_ops", INT, "operations that arrived behind the placed timeline (left off it)"),
    Field("clock", MapOf(NUMBER, key="figure"), "CUPTI's clock on the agent's: pairs, "
          "drift_ppm, residual_ns, read_ns, bound_ns"),
    Field("source", TEXT, "how the figures were obtained (the verdict names it)"),
    Field("collector", MapOf(INT, key="count"), "what the collection saw: buffers, records, "
          "dropped records, incomplete operations, callback errors, operations and ranges "
          "its queues dropped"),
    Field("notes", ListOf(TEXT), "what is missing from the figures, one line each"),
], doc="GPU activity from CUPTI, each operation tied to the range that launched it "
       "(analysis/gpu_figures.py)")

# -- the saved statistics (RunStats, field for field) --------------------------------------------
#: The record fields that feed RunStats: one declaration for the record and for ``run_stats``.
_STATS_FIELDS = [
    Field("dropped_ranges", INT, "ranges the record limit dropped from the trace",
          by=By.EXIT | By.READ, default=0, stats="dropped_ranges"),
    Field("batch_size", INT, "the training batch's length (null: unknown)", by=RUN,
          stats="batch_size", nullable=True),
    Field("samples", INT, "samples the counted iterations trained on, as the iterator "
          "handed them out (else as the converter was handed them): every batch of a step, "
          "each as long as it was", by=By.EXIT, default=0, stats="samples",
          required=False),  # (newer than the oldest traces read: tests/data/gpu)
    Field("sampled_iterations", INT, "the counted iterations whose samples were counted",
          by=By.EXIT, default=0, stats="sampled_iterations", required=False),
    Field("sync_level", Int(0, 3), "the GPU synchronization level in effect", by=RUN,
          default=0, stats="sync_level"),
    Field("sync_calls", INT, "GPU synchronizations the agent made", by=RUN, default=0,
          stats="sync_calls"),
    Field("overhead_ms", NON_NEGATIVE, "the agent's own time, estimated", "ms", by=By.EXIT,
          default=0.0, stats="overhead_ms"),
    Field("overhead_method", TEXT, "how that estimate was made (one line)", by=By.EXIT,
          default="", stats="overhead_method"),
    Field("gpu_phase_ms", SERIES, "per counted iteration, the iteration and its phases timed "
          "with CUDA events", "ms", by=By.EXIT, stats="gpu_phase_ms", nullable=True),
    Field("gpu_activity", GPU_ACTIVITY, "GPU time per link, phase and iteration from CUPTI "
          "activity (CHAINER_PROF_GPU_ACTIVITY=1; null: not recorded)", by=By.EXIT,
          stats="gpu_activity", nullable=True, required=False),
]
_BY_STATS = {f.stats: f for f in _STATS_FIELDS}

LINK = Section(
    [Field(f.name, {"name": TEXT, "calls": INT, "bwd_calls": INT}.get(f.name, NUMBER),
           f"LinkStat.{f.name}", "ms" if f.name.endswith("_ms") else "", default=NEEDED)
     for f in dataclasses.fields(LinkStat)],
    doc="one link's figures (analysis/stats.py LinkStat)", keep_only=True)

SLOW = Section([
    Field("iteration", INT, "its number", default=NEEDED),
    Field("ms", NON_NEGATIVE, "its time", "ms", default=NEEDED),
    Field("gc_ms", NON_NEGATIVE, "collections inside it", "ms"),
    Field("phases", MapOf(NUMBER, key="phase"), "its phases", "ms"),
    Field("gc", ListOf(Triple("gc", INT)), "its collections: [generation, ms, phase]"),
    Field("ranges", ListOf(Triple("ranges", TEXT)), "its longest named ranges: [name, ms, "
          "phase]"),
], doc="one of the slowest iterations (analysis/outliers.py)")

#: RunStats' own fields: (kind, doc, unit, whether a saved copy must hold it).
_RUN_STATS_OWN: dict[str, tuple[Kind, str, str, bool]] = {
    "iterations": (INT, "counted iterations", "", True),
    "warmup": (INT, "warm-up iterations left out", "", True),
    "iteration_ms": (ListOf(NON_NEGATIVE), "per counted iteration (a sample)", "ms", True),
    "phase_ms": (SERIES, "per phase, per counted iteration (the same sample)", "ms", True),
    "outside_ms": (MapOf(NUMBER, key="kind"), "time outside iterations by kind", "ms", True),
    "wall_ms": (NON_NEGATIVE, "the run's wall time", "ms", True),
    "links": (ListOf(LINK), "per link", "", True),
    "meta": (OBJECT, "the run record (empty when saved)", "", False),
    "iteration_total_ms": (NON_NEGATIVE, "exact total of the counted iterations", "ms", False),
    "phase_total_ms": (MapOf(NUMBER, key="phase"), "exact per-phase totals", "ms", False),
    "sample_stride": (Int(1), "the lists hold every N-th counted iteration", "", False),
    "ranges": (INT, "ranges recorded", "", False),
    "has_phases": (BOOL, "whether phase ranges were recorded", "", False),
    "other_thread_iterations": (INT, "iterations run by other threads", "", False),
    "gc_ms": (ListOf(NON_NEGATIVE), "collection time per counted iteration", "ms", False),
    "gc_total_ms": (NON_NEGATIVE, "collection time inside counted iterations", "ms", False),
    "slowest": (ListOf(SLOW), "the slowest counted iterations", "", False),
    "wait_phase_ms": (SERIES, "the agent's GPU waits per phase (and the rest), per counted "
                      "iteration (the same sample)", "ms", False),
    "wait_phase_total_ms": (MapOf(NON_NEGATIVE, key="phase"), "exact per-phase totals of the "
                            "agent's GPU waits", "ms", False),
    "waits_recorded": (BOOL, "whether the agent's GPU waits were recorded as ranges (else "
                       "they are estimated from sync_ms)", "", False),
    "comm_ms": (ListOf(NON_NEGATIVE), "communication (comm:* ranges) per counted iteration "
                "(the same sample)", "ms", False),
    "comm_total_ms": (MapOf(NON_NEGATIVE, key="operation"), "communication inside the "
                      "counted iterations, per operation", "ms", False),
}
#: Of the record's fields, those a saved copy must hold.
_RUN_STATS_NEEDED = ("sync_level", "sync_calls", "overhead_ms")


def _run_stats_field(f: dataclasses.Field) -> Field:  # type: ignore[type-arg]
    """The declaration of RunStats' field ``f`` (a record field's own where it feeds one)."""
    shared = _BY_STATS.get(f.name)
    if shared is not None:
        return Field(f.name, shared.kind, shared.doc, shared.unit,
                     default=NEEDED if f.name in _RUN_STATS_NEEDED else shared.default,
                     nullable=shared.nullable, stats=f.name)
    kind, doc, unit, needed = _RUN_STATS_OWN[f.name]  # a RunStats field declared nowhere: fails
    if needed:
        default = NEEDED
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = {} if f.default is dataclasses.MISSING else f.default  # meta
    return Field(f.name, kind, doc, unit, default=default, nullable=f.name == "phase_total_ms",
                 stats=f.name)


RUN_STATS = Section([_run_stats_field(f) for f in dataclasses.fields(RunStats)],
                    doc="a saved RunStats (analysis/stats.py)", null_is_absent=False)

# -- the record ------------------------------------------------------------------------------
#: Every field of the run record, in the order the final trace holds them.
RECORD = Section([
    Field("version", TEXT, "chainer_autoprof's version", by=RUN),
    Field("pid", INT, "the process id (its events' pid)", by=RUN),
    Field("host", TEXT, "host name", by=RUN),
    Field("rank", INT, "MPI rank (0 outside an MPI job)", by=RUN),
    Field("command", TEXT, "the command line", by=RUN),
    Field("settings", SETTINGS_SECTION, "every setting as the run used it", by=RUN),
    Field("env", MapOf(TEXT, key="variable"), "the settings given explicitly, as their "
          "CHAINER_PROF_* values", by=RUN),
    Field("versions", MapOf(TEXT, key="module"), "Python's and the imported modules' "
          "versions", by=RUN),
    Field("devices", ListOf(DEVICE), "the GPUs in use", by=RUN),
    Field("merged", BOOL, "a merged trace", by=By.MERGE),
    Field("inputs", ListOf(INPUT), "the merged traces", by=By.MERGE),
    Field("clock", CLOCK, "clock readings", by=RUN_READ | By.MERGE),
    Field("warmup_skip", INT, "iterations the statistics leave out at the start", by=RUN,
          default=0),
    Field("granularity", TEXT, "the finest ranges emitted", by=RUN),
    Field("implementation", IMPLEMENTATION, "the hot path's implementation", by=RUN),
    Field("sync_ms", NON_NEGATIVE, "time in the agent's GPU synchronizations (null: not "
          "recorded)", "ms", by=RUN),
    Field("facts", FACTS, "run-time facts the advice reads", by=RUN),
    Field("process", PROCESS, "the process's place in the job", by=RUN),
    Field("stalls", ListOf(SNAPSHOT), "the stall reports of the run", by=By.EXIT,
          required=False),
    _BY_STATS["dropped_ranges"],
    Field("main_tid", INT, "the main thread's native id (its track comes first)", by=RUN),
    Field("process_name", TEXT, "the process track's name (the final trace holds it as its "
          "process_name event)", by=By.SO_FAR),
    *(_BY_STATS[name] for name in ("batch_size", "samples", "sampled_iterations",
                                   "sync_level", "sync_calls", "overhead_ms",
                                   "overhead_method", "gpu_phase_ms", "gpu_activity")),
    Field("ranges", INT, "ranges recorded in the run (kept or dropped)", by=By.EXIT,
          default=0),
    Field("run_stats", RUN_STATS, "the whole run's statistics, saved when the record limit "
          "dropped ranges (the events then cover the newest only)", by=By.EXIT | By.READ,
          required=False, lazy=True),
    Field("partial", PARTIAL_STATE, "a trace so far read back: its last state", by=By.READ),
    Field("trace_path", TEXT, "where the final trace went (the summary's trace line)",
          by=By.LIVE, required=False),
    Field("summary", MERGE_SUMMARY, "the summary across ranks", by=By.MERGE),
], doc="the run record")


# -- writing -------------------------------------------------------------------------------------
def build(by: By, values: Mapping[str, Any], complete: bool = True) -> dict[str, Any]:
    """The record writer ``by`` writes, from ``values``, in declared order.

    :class:`RecordError` (a bug) for a key not declared for ``by`` (nested
    sections too), or, when ``complete``, a field ``by`` must write missing.
    """
    return RECORD.build(values, by, "the run record", complete)


def add(record: dict[str, Any], by: By, **values: Any) -> dict[str, Any]:
    """``record`` with ``values`` set, each a field ``by`` writes (:class:`RecordError` if
    not); their content is the reader's to check (a file read back may be damaged)."""
    for key in values:
        f = RECORD.by_name.get(key)
        if f is None or f.by is None or not f.by & by:
            raise RecordError(f"the run record's {key} is not written by {by_text(by)}")
    record.update(values)
    return record


def from_stats(stats: RunStats) -> dict[str, object]:
    """The final trace's fields that are RunStats' figures."""
    return {f.name: getattr(stats, f.stats) for f in _STATS_FIELDS if f.stats}


# -- reading -------------------------------------------------------------------------------------
def check(meta: object) -> dict[str, Any]:
    """The record of a trace read back, checked (:class:`MalformedError`, one line).

    Returns a copy: each null field that has a default removed (readers take
    the default), everything else as the file holds it, undeclared keys too.
    ``run_stats`` is checked where it is used (:func:`check_run_stats`).
    """
    return RECORD.check(meta, WHERE)


def check_run_stats(data: object) -> dict[str, Any]:
    """A saved RunStats, checked, ready for :meth:`RunStats.from_dict`: each link reduced to
    the fields a ``LinkStat`` has, an absent field given its default."""
    out = RUN_STATS.check(data, f"{WHERE}.run_stats")
    for f in RUN_STATS.fields:
        if f.name not in out:
            out[f.name] = copy.copy(f.default)
    return out


def value(meta: Mapping[str, Any], dotted: str) -> Any:
    """The field ``dotted`` (``clock.duration_ns``) of a checked record, or its default."""
    section: Section = RECORD
    current: Any = meta
    f = None
    for name in dotted.split("."):
        f = section.by_name[name]  # KeyError: not declared (a bug)
        current = current.get(name) if isinstance(current, Mapping) else None
        if isinstance(f.kind, Section):
            section = f.kind
    assert f is not None
    return f.default if current is None and f.default is not NEEDED else current


class StatsFields(TypedDict):
    """The RunStats fields the run record feeds."""

    dropped_ranges: int
    batch_size: int | None
    samples: int
    sampled_iterations: int
    sync_level: int
    sync_calls: int
    overhead_ms: float
    overhead_method: str
    gpu_phase_ms: dict[str, list[float]] | None
    gpu_activity: dict[str, Any] | None


def stats_fields(values: Mapping[str, Any]) -> StatsFields:
    """RunStats' record fields from ``values`` (a checked record, or the live run's figures):
    each converted to RunStats' type, absent or null ones with their defaults."""
    out: dict[str, Any] = {}
    for f in _STATS_FIELDS:
        item = values.get(f.name)
        out[f.stats or f.name] = f.default if item is None else f.kind.convert(item)
    return out  # type: ignore[return-value]


# -- documentation -------------------------------------------------------------------------------
def markdown() -> str:
    """The record's tables for ``docs/trace_format.md``: the record, then each section."""
    out: list[str] = []
    seen: set[int] = set()

    def table(title: str, section: Section, by: By | None) -> None:
        rows = [f"#### {title}", "", section.doc[:1].upper() + section.doc[1:] + ".", "",
                "| Field | Type | Unit | Written by | Always | Default | RunStats | Meaning |",
                "|---|---|---|---|---|---|---|---|"]
        nested: list[tuple[str, Section, By | None]] = []
        for f in section.fields:
            writers = f.by if f.by is not None else by
            default = "" if f.default is None else "needed" if f.default is NEEDED \
                else f"`{json.dumps(f.default)}`"
            rows.append(f"| `{f.name}` | {_type_text(f.kind)} | {f.unit} | "
                        f"{by_text(writers) if writers else ''} | "
                        f"{'yes' if f.required else 'no'} | {default} | "
                        f"{f'`{f.stats}`' if f.stats else ''} | {f.doc} |")
            inner = _section_of(f.kind)
            if inner is not None and id(inner) not in seen:
                seen.add(id(inner))
                nested.append((f"{title}.{f.name}" if title != "record" else f.name, inner,
                               writers))
        out.extend([*rows, ""])
        for name, inner, writers in nested:
            table(name, inner, writers)

    table("record", RECORD, None)
    return "\n".join(out).rstrip() + "\n"


def _section_of(kind: Kind) -> Section | None:
    while isinstance(kind, (ListOf, MapOf)):
        kind = kind.item
    return kind if isinstance(kind, Section) else None


def _type_text(kind: Kind) -> str:
    if isinstance(kind, Section):
        return "object (below)"
    if isinstance(kind, ListOf) and isinstance(kind.item, Section):
        return "list of objects (below)"
    if isinstance(kind, MapOf) and isinstance(kind.item, Section):
        return kind.doc.replace(kind.item.doc, "object (below)")
    return kind.doc
