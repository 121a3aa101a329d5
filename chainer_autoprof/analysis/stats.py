"""Run statistics: what the summary, the report and the verdict read.

:class:`RunStats` holds everything a summary says of a run, whether it was
aggregated live by the recorder or read back from a saved trace (both go
through :class:`~.aggregate.Aggregator`, so the two agree).  Also here: the
layout of a recorded range's depth field and the names of the time outside
iterations, which the recorder, the aggregation and the trace files share.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TypedDict

from ..common import figures
from .gpu_record import GpuActivity
from .iteration_figures import FIGURES
from .per_iteration import Samples
from .shapes import INT, NEEDED, TEXT, Annotated, By, F, Int, ListOf, Ms, Triple, shape

#: Keys of :attr:`RunStats.phase_ms`: the four phases and the rest of the iteration.
PHASE_KEYS = ("data", "forward", "backward", "update", "other")
#: Per-iteration values kept before the lists are thinned to a uniform sample.
MAX_KEPT_ITERATIONS = 1 << 16
#: A recorded depth field: the depth in the low bits; an iteration range also
#: carries its iteration number + 1 above them.
DEPTH_BITS = 16
DEPTH_MASK = (1 << DEPTH_BITS) - 1

STARTUP = "startup"
WARMUP = "warm-up"
IDLE = "idle"
SHUTDOWN = "shutdown"
BEFORE_WINDOW = "before window"
#: A run read from its partial trace: the time after its last complete iteration.
UNFINISHED = "unfinished"
AFTER_WINDOW = "after window"
#: The agent's own work on the program's thread outside iterations (its run-time checks):
#: its overhead, neither the program's idle time nor the loop's.
AGENT_OWN = "agent"


def median(values: Sequence[float]) -> float:
    """Median (0.0 for no values)."""
    return percentile(values, 50.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@shape(keep_only=True, defaults=True)
@dataclass
class LinkStat:
    """One link (by its path in the model) over the counted iterations."""

    name: Annotated[str, F("its path in the model and its class (the summary's key)")]
    calls: Annotated[int, F("forward calls")]
    incl_ms: Annotated[float, F("forward time, the links it calls included", "ms")]
    self_ms: Annotated[float, F("forward time, the links it calls excluded", "ms")]
    bwd_calls: Annotated[int, F("backward passes through it")]
    bwd_ms: Annotated[float, F("backward time attributed to it", "ms")]

    @property
    def total_ms(self) -> float:
        """Forward inclusive plus attributed backward time."""
        return self.incl_ms + self.bwd_ms


#: ``[what, ms, phase]`` rows of a slow iteration.
_GC_ROW = Triple("gc", INT)
_RANGE_ROW = Triple("ranges", TEXT)


class SlowestEntry(TypedDict, total=False):
    """One of the slowest iterations (analysis/outliers.py)."""

    iteration: Annotated[int, F("its number", default=NEEDED)]
    ms: Annotated[Ms, F("its time", default=NEEDED)]
    gc_ms: Annotated[Ms, F("collections inside it")]
    phases: Annotated[Dict[str, float], F("its phases", "ms", key="phase")]
    gc: Annotated[List[Any], F("its collections: [generation, ms, phase]", kind=ListOf(_GC_ROW))]
    ranges: Annotated[List[Any], F("its longest named ranges: [name, ms, phase]",
                                   kind=ListOf(_RANGE_ROW))]


#: Writers of a record field that is RunStats': the final trace, and the trace so far too.
_RUN = By.EXIT | By.SO_FAR


@shape(null_is_absent=False, defaults=True, stats=True)
@dataclass
class RunStats:
    """A saved RunStats (analysis/stats.py): everything the summary prints, from a live run
    or a saved trace.

    Its fields are declared once, here: the saved copy's (the run record's ``run_stats``),
    and, for a field with a writer (``F(by=...)``), the run record's field of that name
    (:class:`~.record.RunRecord` places it; a new one comes at the record's end), whose
    reader's default in the record ``F(default=...)`` gives where it is not the class's.
    """

    iterations: Annotated[int, F("counted iterations")]
    warmup: Annotated[int, F("warm-up iterations left out")]
    iteration_ms: Annotated[List[Ms], F("per counted iteration (a sample)", "ms")]
    phase_ms: Annotated[Dict[str, List[float]], F(
        "per phase, per counted iteration (the same sample)", "ms", key="key")]
    outside_ms: Annotated[Dict[str, float], F("time outside iterations by kind", "ms",
                                              key="kind")]
    wall_ms: Annotated[Ms, F("the run's wall time")]
    links: Annotated[List[LinkStat], F("per link")]
    sync_level: Annotated[int, F("the GPU synchronization level in effect", kind=Int(0, 3),
                                 by=_RUN, default=0)]
    sync_calls: Annotated[int, F("GPU synchronizations the agent made", by=_RUN,
                                   default=0)]
    overhead_ms: Annotated[Ms, F("the agent's own time, estimated", by=By.EXIT,
                                 default=0.0)]
    batch_size: Annotated[Optional[int], F("the training batch's length (null: unknown)",
                                            by=_RUN)] = None
    gpu_phase_ms: Annotated[Optional[Dict[str, List[float]]], F(
        "per counted iteration, the iteration and its phases timed with CUDA events", "ms",
        key="key", by=By.EXIT)] = None
    meta: Annotated[Dict[str, Any], F("the run record (empty when saved)")] = \
        field(default_factory=dict)
    #: Exact total of the counted iterations (the lists may be a sample).
    iteration_total_ms: Annotated[Ms, F("exact total of the counted iterations")] = 0.0
    #: Exact per-phase totals over the counted iterations.
    phase_total_ms: Annotated[Dict[str, float], F("exact per-phase totals", "ms", key="phase",
                                                  nullable=True)] = field(default_factory=dict)
    #: The lists hold every ``sample_stride``-th counted iteration.
    sample_stride: Annotated[int, F("the lists hold every N-th counted iteration",
                                    kind=Int(1))] = 1
    #: Ranges recorded, and ranges dropped from the trace by the record limit.
    ranges: Annotated[int, F("ranges recorded")] = 0
    dropped_ranges: Annotated[int, F("ranges the record limit dropped from the trace",
                                     by=By.EXIT | By.READ)] = 0
    #: Whether phase ranges were recorded (granularity phase or finer).
    has_phases: Annotated[bool, F("whether phase ranges were recorded")] = True
    #: How the overhead figure was obtained (one line).
    overhead_method: Annotated[str, F("how that estimate was made (one line)",
                                      by=By.EXIT)] = ""
    #: Iterations run by threads other than the loop thread (not in these figures).
    other_thread_iterations: Annotated[int, F("iterations run by other threads")] = 0
    #: Collection time per counted iteration (same sample as ``iteration_ms``), and in all.
    gc_ms: Annotated[List[Ms], F("collection time per counted iteration", "ms")] = \
        field(default_factory=list)
    gc_total_ms: Annotated[Ms, F("collection time inside counted iterations")] = 0.0
    #: The slowest counted iterations with what ran inside them (:mod:`.outliers`).
    slowest: Annotated[List[SlowestEntry], F("the slowest counted iterations")] = \
        field(default_factory=list)
    #: The agent's own waits for the GPU inside the counted iterations, per phase key (the
    #: phase they lay in, ``other`` between phases): per counted iteration (same sample as
    #: ``iteration_ms``) and in all.  The phases and ``other`` include them.
    wait_phase_ms: Annotated[Dict[str, List[float]], F(
        "the agent's GPU waits per phase (and the rest), per counted iteration (the same "
        "sample)", "ms", key="key")] = field(default_factory=dict)
    wait_phase_total_ms: Annotated[Dict[str, Ms], F(
        "exact per-phase totals of the agent's GPU waits", "ms", key="phase")] = \
        field(default_factory=dict)
    #: Whether the waits were recorded (a run before they were, or one without a GPU: no).
    waits_recorded: Annotated[bool, F(
        "whether the agent's GPU waits were recorded as ranges (else they are estimated from "
        "sync_ms)")] = False
    #: Samples the counted iterations trained on (counted at the iterator, else the
    #: converter: every batch of a step, each as long as it was), and the counted iterations
    #: whose samples were counted (0: unknown; the batch size then stands in).
    samples: Annotated[int, F(
        "samples the counted iterations trained on, as the iterator handed them out (else as "
        "the converter was handed them): every batch of a step, each as long as it was",
        by=By.EXIT, required=False)] = 0  # (newer than the oldest traces read: tests/data/gpu)
    sampled_iterations: Annotated[int, F(
        "the counted iterations whose samples were counted", by=By.EXIT, required=False)] = 0
    #: Communication (ChainerMN's ``comm:*`` ranges) inside the counted iterations: per
    #: counted iteration (same sample as ``iteration_ms``), and in all per operation.  The
    #: phases holding it (the update, for the gradient all-reduce) include it.
    comm_ms: Annotated[List[Ms], F(
        "communication (comm:* ranges) per counted iteration (the same sample)", "ms")] = \
        field(default_factory=list)
    comm_total_ms: Annotated[Dict[str, Ms], F(
        "communication inside the counted iterations, per operation", "ms",
        key="operation")] = field(default_factory=dict)
    #: GPU activity from CUPTI (GPU time per link, phase and iteration, busy share, top
    #: kernels), when recorded.
    gpu_activity: Annotated[Optional[GpuActivity], F(
        "GPU time per link, phase and iteration from CUPTI activity "
        "(CHAINER_PROF_GPU_ACTIVITY=1; null: not recorded)", by=By.EXIT,
        required=False)] = None
    #: The figures read at each counted iteration's end (:mod:`.iteration_figures`), by name.
    per_iteration: Annotated[Dict[str, Samples], F(
        "figures read at each counted iteration's end, by name: " + "; ".join(
            f"`{fig.name}`, {fig.doc}" for fig in FIGURES), by=By.EXIT, required=False,
        key="figure")] = field(default_factory=dict)

    # -- iterations --------------------------------------------------------
    def median(self) -> float:
        """Median iteration time (ms)."""
        return median(self.iteration_ms)

    def p95(self) -> float:
        """95th percentile of iteration time (ms)."""
        return percentile(self.iteration_ms, 95.0)

    def mean(self) -> float:
        """Mean iteration time (ms), exact."""
        return self.iteration_total_ms / self.iterations if self.iterations else 0.0

    def iterations_per_second(self) -> float:
        """Counted iterations per second of iteration time."""
        return 1000.0 / self.mean() if self.iterations and self.mean() > 0 else 0.0

    def samples_per_iteration(self) -> float | None:
        """Samples a counted iteration trained on, on average: what the iterator handed out
        (every batch of a step, each as long as it was); else the batch size; else ``None``."""
        if self.sampled_iterations:
            return self.samples / self.sampled_iterations
        return float(self.batch_size) if self.batch_size else None

    def samples_per_second(self) -> float | None:
        """Samples per second of iteration time, when the samples or the batch size are
        known."""
        per_iteration = self.samples_per_iteration()
        if per_iteration is None:
            return None
        if self.sampled_iterations == self.iterations and self.iteration_total_ms > 0:
            return self.samples * 1000.0 / self.iteration_total_ms  # exact
        return self.iterations_per_second() * per_iteration

    def samples_text(self) -> str:
        """What the samples per second are made of, for people: ``batch 32``, ``64.0 samples
        per iteration on average, batch 16`` (four batches a step), ``25.0 ...`` (a partial
        last batch)."""
        per_iteration = self.samples_per_iteration()
        if per_iteration is None:
            return ""
        if not self.sampled_iterations:
            return f"batch {self.batch_size}"
        if per_iteration == self.batch_size:
            return f"batch {self.batch_size}"
        batch = f", batch {self.batch_size}" if self.batch_size else ""
        return f"{figures.fixed(per_iteration)} samples per iteration on average{batch}"

    # -- phases --------------------------------------------------------------
    def phase_total(self, phase: str) -> float:
        """Exact total of ``phase`` over the counted iterations (ms)."""
        return self.phase_total_ms.get(phase, 0.0)

    def phase_share(self, phase: str) -> float:
        """Share (0-1) of the counted iteration time spent in ``phase``."""
        total = self.iteration_total_ms
        return self.phase_total(phase) / total if total > 0 else 0.0

    def phase_median(self, phase: str) -> float:
        """Median time per iteration in ``phase`` (ms)."""
        return median(self.phase_ms.get(phase, []))

    def dominant_phase(self) -> str | None:
        """The phase key with the largest total (``None`` without iterations)."""
        if not self.iterations:
            return None
        keys = PHASE_KEYS if self.has_phases else ("other",)
        return max(keys, key=self.phase_total)

    # -- outside iterations --------------------------------------------------
    def wall_share(self, ms: float) -> float:
        """Share (0-1) of the wall time."""
        return ms / self.wall_ms if self.wall_ms > 0 else 0.0

    # -- serialization -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunStats:
        data = dict(data)
        data["links"] = [LinkStat(**link) for link in data.get("links", [])]
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


