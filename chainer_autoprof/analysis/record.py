"""THE run record: ``otherData.chainer_autoprof`` of a trace, declared once.

Each shape is declared once, as the typed class that carries it: :class:`RunRecord`
and its parts here, :class:`~.stats.RunStats` (its fields marked with a writer are
record fields too), the facts (:mod:`.facts`), the GPU figures
(:mod:`.gpu_record`) and the clock reference (:mod:`..common.rank`, where it is
taken).  A field's kind comes from its type, the rest (doc, unit, who writes it,
default) from its :class:`~.shapes.F`; :func:`~.shapes.section_of`
derives the run-time :class:`~.shapes.Section` that drives everything that touches
the record:

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
import json
from typing import Any, Dict, List, Mapping, Optional, TypedDict

from ..common.rank import ClockReference
from ..common.settings import SETTINGS
from .facts import Facts
from .gpu_record import GpuActivity, KernelGpuDict, LinkGpuDict, PhaseGpuDict, TimelineDict
from .shapes import (
    ANY,
    NEEDED,
    NON_NEGATIVE,
    SIGNED,
    Annotated,
    By,
    F,
    Field,
    Kind,
    ListOf,
    MalformedError,
    MapOf,
    Ms,
    Ns,
    RecordError,
    Section,
    Window,
    by_text,
    section_of,
    shape,
)
from .stats import LinkStat, RunStats, SlowestEntry

__all__ = ["RECORD", "RUN_STATS", "WHERE", "By", "MalformedError", "RecordError", "RunRecord",
           "add", "build", "check", "check_run_stats", "from_stats", "markdown", "stats_fields",
           "value"]

#: Where the record sits in a trace file (error lines name fields from here).
WHERE = "otherData.chainer_autoprof"

#: Writers of the run's own facts: the final trace and the trace so far.
RUN = By.EXIT | By.SO_FAR
#: The same, and the trace so far's reader (which rewrites or adds them).
RUN_READ = By.EXIT | By.SO_FAR | By.READ
S = Annotated[float, F(unit="s", kind=NON_NEGATIVE)]

# -- fields several sections hold, each declared once ---------------------------------------------
#: A process's place: its host, pid and MPI rank, its job's size, its parent.
Host = Annotated[str, F("host name")]
Pid = Annotated[int, F("process id")]
Rank = Annotated[int, F("MPI rank")]
WorldSize = Annotated[int, F("ranks in the job")]
ParentPid = Annotated[int, F("the parent's pid")]
Child = Annotated[bool, F("a child process")]
#: A merged input: its file, and its process track's label in the merged trace.
InputFile = Annotated[str, F("the input file")]
TrackLabel = Annotated[str, F("its process track's label")]

# -- sections ------------------------------------------------------------------------------------
#: Settings newer than the oldest traces read with this declaration (tests/data/gpu): written
#: always, but not required of a trace.
_NEWER_SETTINGS = frozenset({"gpu_activity"})

#: The settings' section comes from their own table (common/settings.py).
SETTINGS_SECTION = Section(
    [Field(s.name, Window() if s.name == "iterations" else ANY, s.doc,
           required=s.name not in _NEWER_SETTINGS) for s in SETTINGS]
    + [Field("effective_sync_level", ANY, "the sync level in effect (SYNC and SYNC_LEVEL)")],
    doc="every setting as the run used it (common/settings.py)")


class Clock(TypedDict, total=False):
    """Clock readings."""

    perf_counter_ns_at_start: Annotated[int, F("time.perf_counter_ns() when the agent started",
                                               "ns", by=RUN_READ)]
    unix_time_ns_at_start: Annotated[int, F("time.time_ns() at the same moment", "ns",
                                            by=RUN_READ)]
    duration_ns: Annotated[int, F("from the start to the end of the run (the trace so far: to "
                                  "its last write)", "ns", by=By.EXIT | By.READ)]
    method: Annotated[str, F("merge: the alignment asked for (--align)", by=By.MERGE)]
    zero_perf_counter_ns: Annotated[int, F("merge: the merged timeline's zero on the "
                                           "reference clock", "ns", SIGNED, by=By.MERGE)]


class Device(TypedDict, total=False):
    """One GPU in use."""

    id: Annotated[int, F("CUDA device number")]
    name: Annotated[str, F("its name (where the program imported CuPy)", required=False)]


class Implementation(TypedDict, total=False):
    """The hot path's implementation (runtime/hotpath)."""

    name: Annotated[str, F("native or python")]
    reason: Annotated[str, F("why the Python one runs (empty for the native one)")]


class Process(TypedDict, total=False):
    """The process's place in the job (lifecycle/processes.py)."""

    mpi_rank: Annotated[int, F("MPI rank (null outside an MPI job)")]
    world_size: WorldSize
    rank_source: Annotated[str, F("where the rank came from (a launcher's variable, ChainerMN)")]
    child: Annotated[bool, F("whether an agent started in a parent process")]
    parent_pid: ParentPid
    clock_reference: Annotated[ClockReference, F("merge's clock reference", required=False)]


@shape(open=True)
class OpenRange(TypedDict, total=False):
    """A range still open."""

    name: Annotated[str, F("range name")]
    category: Annotated[str, F("range category")]
    open_s: Annotated[S, F("how long it has been open")]


@shape(open=True)
class Thread(TypedDict, total=False):
    """One thread."""

    tid: Annotated[int, F("native thread id")]
    name: Annotated[str, F("thread name")]
    main: Annotated[bool, F("the main thread")]
    open: Annotated[List[OpenRange], F("its open ranges, outermost first")]
    stack: Annotated[List[Dict[str, Any]], F("its innermost frames not the agent's",
                                             required=False)]


@shape(open=True)
class Snapshot(TypedDict, total=False):
    """Where the process was (lifecycle/where.py)."""

    reason: Annotated[str, F("why it was taken (stall, dump, partial write)")]
    pid: Pid
    host: Host
    rank: Rank
    world_size: WorldSize
    parent_pid: ParentPid
    unix_ns: Annotated[Ns, F("when (wall clock)")]
    perf_ns: Annotated[Ns, F("when (perf counter)")]
    iteration: Annotated[int, F("the iteration begun last (from 0)")]
    in_iteration: Annotated[bool, F("whether the loop thread is inside it")]
    since_iteration_s: Annotated[S, F("since the last iteration began")]
    since_progress_s: Annotated[S, F("since the last progress (a new iteration or any "
                                     "instrumented call)")]
    threshold_s: Annotated[S, F("the stall threshold")]
    threshold_rule: Annotated[str, F("how the threshold was set (a number, or what auto "
                                     "learned)")]
    threads: Annotated[List[Thread], F("every thread with where it is")]
    notes: Annotated[List[Any], F("one line each (the input queue's state, ...)")]


class PartialState(TypedDict, total=False):
    """The trace so far's last state (report/partial.py)."""

    perf_ns: Annotated[Ns, F("when the trace so far was last written (perf counter)")]
    unix_ns: Annotated[Ns, F("the same, wall clock")]
    where: Annotated[Snapshot, F("where every thread was then")]
    stalls: Annotated[List[Snapshot], F("the stall reports so far")]
    dropped: Annotated[int, F("ranges dropped by the record limit before they were written")]
    path: Annotated[str, F("the partial file read")]


class MergedInput(TypedDict, total=False):
    """One merged input."""

    path: InputFile
    label: TrackLabel
    pid: Pid
    merged_pid: Annotated[int, F("its process track in the merged file")]
    rank: Rank
    host: Host
    child: Child
    meta: Annotated[Dict[str, Any], F("its own run record")]


class RankRow(TypedDict, total=False):
    """One process's iterations (report/merge.py)."""

    label: TrackLabel
    rank: Annotated[Optional[int], F("MPI rank")]
    host: Host
    pid: Annotated[Optional[int], F("process id")]
    child: Child
    iterations: Annotated[int, F("counted iterations")]
    iteration_ms_median: Annotated[Ms, F("median iteration")]
    iteration_ms_mean: Annotated[Ms, F("mean iteration")]
    comm_ms_per_iteration: Annotated[float, F("mean time in comm:* ranges per counted "
                                              "iteration", "ms")]
    comm_share: Annotated[float, F("its share of the mean iteration")]
    compute_ms_per_iteration: Annotated[float, F(
        "the rest of the iteration (mean: iteration_ms_mean = comm_ms_per_iteration + "
        "compute_ms_per_iteration)", "ms")]
    comm_outside_iterations_ms: Annotated[float, F("communication outside iterations", "ms")]
    comm_ms_max: Annotated[float, F("the most time in comm:* ranges in one counted iteration",
                                    "ms", required=False)]
    wait_ms_max: Annotated[float, F("the longest wait for the other ranks in one counted "
                                    "iteration (communication beyond the fastest rank's)", "ms",
                                    required=False)]


class Straggler(TypedDict, total=False):
    """The rank the others wait for."""

    rank: Annotated[Optional[int], F("the slowest rank")]
    label: Annotated[str, F("its label")]
    compute_ms_per_iteration: Annotated[float, F("its compute per iteration", "ms")]
    others_compute_ms_per_iteration: Annotated[float, F("the others' (mean)", "ms")]
    extra_compute_ms_per_iteration: Annotated[float, F("the difference", "ms")]
    held_back_ms_per_iteration: Annotated[float, F("how long the others wait for it (mean)",
                                                   "ms")]
    held_back_share: Annotated[float, F("that wait's share of their iteration")]
    balanced: Annotated[bool, F("whether every rank's waits are under BALANCED_SHARE of the "
                                "iteration, on average and in every iteration")]
    longest_wait_ms: Annotated[float, F("the longest wait of a rank for the others in one "
                                        "counted iteration", "ms", required=False)]
    longest_wait_rank: Annotated[Optional[int], F("the rank that waited", required=False)]
    longest_wait_iteration: Annotated[int, F("in which counted iteration (from 0)",
                                             required=False)]


class MergeWhere(TypedDict, total=False):
    """Where each rank was."""

    positions: Annotated[List[Snapshot], F("each rank's last position")]
    odd_one_out: Annotated[List[Optional[int]], F("the ranks somewhere else")]
    odd_one_out_text: Annotated[str, F("that, in words")]


class Alignment(TypedDict, total=False):
    """One input's clock alignment."""

    path: InputFile
    label: TrackLabel
    method: Annotated[str, F("reference, clock, collective or wall")]
    offset_ns: Annotated[int, F("its clock's offset to the merged timeline", "ns", SIGNED)]


class MergeSummary(TypedDict, total=False):
    """The summary across ranks (report/merge.py)."""

    ranks: Annotated[List[RankRow], F("per process")]
    straggler: Annotated[Optional[Straggler], F("the slowest rank (null with fewer than two "
                                                "ranks)")]
    where: Annotated[MergeWhere, F("where the ranks were (hung and killed jobs)")]
    alignment: Annotated[List[Alignment], F("how each input's clock was aligned")]


# -- the saved statistics: RunStats' own declaration -----------------------------------------------
RUN_STATS = section_of(RunStats)
LINK = section_of(LinkStat)
SLOW = section_of(SlowestEntry)
#: The record fields that feed RunStats (declared there, with a writer).
_STATS_FIELDS: list[Field] = []


# -- the record ------------------------------------------------------------------------------
#: Where the record holds a field declared by RunStats (its type repeated here, checked to be
#: the same); RunStats' fields with a writer placed nowhere here come at the record's end.
STATS = F(stats=True)


class RunRecord(TypedDict, total=False):
    """The run record."""

    version: Annotated[str, F("chainer_autoprof's version", by=RUN)]
    pid: Annotated[int, F("the process id (its events' pid)", by=RUN)]
    host: Annotated[str, F("host name", by=RUN)]
    rank: Annotated[int, F("MPI rank (0 outside an MPI job)", by=RUN)]
    command: Annotated[str, F("the command line", by=RUN)]
    settings: Annotated[Dict[str, Any], F("every setting as the run used it", kind=SETTINGS_SECTION,
                                          by=RUN)]
    env: Annotated[Dict[str, str], F("the settings given explicitly, as their CHAINER_PROF_* "
                                     "values", by=RUN, key="variable")]
    versions: Annotated[Dict[str, str], F("Python's and the imported modules' versions", by=RUN,
                                          key="module")]
    devices: Annotated[List[Device], F("the GPUs in use", by=RUN)]
    merged: Annotated[bool, F("a merged trace", by=By.MERGE)]
    inputs: Annotated[List[MergedInput], F("the merged traces", by=By.MERGE)]
    clock: Annotated[Clock, F("clock readings", by=RUN_READ | By.MERGE)]
    warmup_skip: Annotated[int, F("iterations the statistics leave out at the start", by=RUN,
                                  default=0)]
    granularity: Annotated[str, F("the finest ranges emitted", by=RUN)]
    implementation: Annotated[Implementation, F("the hot path's implementation", by=RUN)]
    sync_ms: Annotated[Ms, F("time in the agent's GPU synchronizations (null: not recorded)",
                             by=RUN)]
    facts: Annotated[Facts, F("run-time facts the advice reads", by=RUN)]
    process: Annotated[Process, F("the process's place in the job", by=RUN)]
    stalls: Annotated[List[Snapshot], F("the stall reports of the run", by=By.EXIT,
                                        required=False)]
    dropped_ranges: Annotated[int, STATS]
    main_tid: Annotated[int, F("the main thread's native id (its track comes first)", by=RUN)]
    process_name: Annotated[str, F("the process track's name (the final trace holds it as its "
                                   "process_name event)", by=By.SO_FAR)]
    batch_size: Annotated[Optional[int], STATS]
    samples: Annotated[int, STATS]
    sampled_iterations: Annotated[int, STATS]
    sync_level: Annotated[int, STATS]
    sync_calls: Annotated[int, STATS]
    overhead_ms: Annotated[float, STATS]
    overhead_method: Annotated[str, STATS]
    gpu_phase_ms: Annotated[Optional[Dict[str, List[float]]], STATS]
    gpu_activity: Annotated[Optional[GpuActivity], STATS]
    ranges: Annotated[int, F("ranges recorded in the run (kept or dropped)", by=By.EXIT,
                             default=0)]
    run_stats: Annotated[Dict[str, Any], F("the whole run's statistics, saved when the record "
                                           "limit dropped ranges (the events then cover the "
                                           "newest only)", kind=RUN_STATS, by=By.EXIT | By.READ,
                                           required=False, lazy=True)]
    partial: Annotated[PartialState, F("a trace so far read back: its last state", by=By.READ)]
    trace_path: Annotated[str, F("where the final trace went (the summary's trace line)",
                                 by=By.LIVE, required=False)]
    summary: Annotated[MergeSummary, F("the summary across ranks", by=By.MERGE)]


#: Every field of the run record, in the order the final trace holds them.
RECORD = section_of(RunRecord, stats=RUN_STATS)
_STATS_FIELDS.extend(f for f in RECORD.fields if f.stats)
GPU_ACTIVITY = section_of(GpuActivity)
GPU_LINK, GPU_PHASE = section_of(LinkGpuDict), section_of(PhaseGpuDict)
GPU_KERNEL, GPU_TIMELINE = section_of(KernelGpuDict), section_of(TimelineDict)


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
    return RECORD.check(_upgraded(meta), WHERE)


def check_run_stats(data: object) -> dict[str, Any]:
    """A saved RunStats, checked, ready for :meth:`RunStats.from_dict`: each link reduced to
    the fields a ``LinkStat`` has, an absent field given its default, a section declared by a
    dataclass (the GPU figures; each of a map's) an object of it."""
    out = RUN_STATS.check(_upgraded(data), f"{WHERE}.run_stats")
    for f in RUN_STATS.fields:
        if f.name not in out:
            out[f.name] = copy.copy(f.default)
        elif isinstance(f.kind, (Section, MapOf)) and out[f.name] is not None:
            # an object of its declaring class (a map: each of its values)
            out[f.name] = f.kind.convert(out[f.name])
    return out


def _upgraded(data: object) -> object:
    """A record or saved ``run_stats`` of the version that held memory as ``memory``
    (``bytes``, ``peak_bytes``), with it where the figures read at each iteration's end are
    now (``per_iteration.memory``: ``values``, ``peak``)."""
    if not isinstance(data, dict) or "per_iteration" in data \
            or not isinstance(data.get("memory"), dict):
        return data
    old = data["memory"]
    renamed = {"bytes": "values", "peak_bytes": "peak"}
    out = {k: v for k, v in data.items() if k != "memory"}
    out["per_iteration"] = {"memory": {renamed.get(k, k): v for k, v in old.items()}}
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


def stats_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """RunStats' record fields from ``values`` (a checked record, or the live run's figures):
    each converted to RunStats' type, absent or null ones with their defaults."""
    out: dict[str, Any] = {}
    for f in _STATS_FIELDS:
        item = values.get(f.name)
        out[f.stats or f.name] = f.default if item is None else f.kind.convert(item)
    return out


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
