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
from typing import Any, Sequence

from ..common import figures

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


@dataclass
class LinkStat:
    """One link (by its path in the model) over the counted iterations."""

    name: str
    calls: int
    incl_ms: float
    self_ms: float
    bwd_calls: int
    bwd_ms: float

    @property
    def total_ms(self) -> float:
        """Forward inclusive plus attributed backward time."""
        return self.incl_ms + self.bwd_ms


@dataclass
class RunStats:
    """Everything the summary prints, from a live run or a saved trace."""

    iterations: int
    warmup: int
    iteration_ms: list[float]
    phase_ms: dict[str, list[float]]
    outside_ms: dict[str, float]
    wall_ms: float
    links: list[LinkStat]
    batch_size: int | None
    sync_level: int
    sync_calls: int
    overhead_ms: float
    gpu_phase_ms: dict[str, list[float]] | None
    meta: dict[str, Any]
    #: Exact total of the counted iterations (the lists may be a sample).
    iteration_total_ms: float = 0.0
    #: Exact per-phase totals over the counted iterations.
    phase_total_ms: dict[str, float] = field(default_factory=dict)
    #: The lists hold every ``sample_stride``-th counted iteration.
    sample_stride: int = 1
    #: Ranges recorded, and ranges dropped from the trace by the record limit.
    ranges: int = 0
    dropped_ranges: int = 0
    #: Whether phase ranges were recorded (granularity phase or finer).
    has_phases: bool = True
    #: How the overhead figure was obtained (one line).
    overhead_method: str = ""
    #: Iterations run by threads other than the loop thread (not in these figures).
    other_thread_iterations: int = 0
    #: Collection time per counted iteration (same sample as ``iteration_ms``), and in all.
    gc_ms: list[float] = field(default_factory=list)
    gc_total_ms: float = 0.0
    #: The slowest counted iterations with what ran inside them (:mod:`.outliers`).
    slowest: list[dict[str, Any]] = field(default_factory=list)
    #: The agent's own waits for the GPU inside the counted iterations, per phase key (the
    #: phase they lay in, ``other`` between phases): per counted iteration (same sample as
    #: ``iteration_ms``) and in all.  The phases and ``other`` include them.
    wait_phase_ms: dict[str, list[float]] = field(default_factory=dict)
    wait_phase_total_ms: dict[str, float] = field(default_factory=dict)
    #: Whether the waits were recorded (a run before they were, or one without a GPU: no).
    waits_recorded: bool = False
    #: Samples the counted iterations trained on (counted at the iterator, else the
    #: converter: every batch of a step, each as long as it was), and the counted iterations
    #: whose samples were counted (0: unknown; the batch size then stands in).
    samples: int = 0
    sampled_iterations: int = 0
    #: Communication (ChainerMN's ``comm:*`` ranges) inside the counted iterations: per
    #: counted iteration (same sample as ``iteration_ms``), and in all per operation.  The
    #: phases holding it (the update, for the gradient all-reduce) include it.
    comm_ms: list[float] = field(default_factory=list)
    comm_total_ms: dict[str, float] = field(default_factory=dict)
    #: GPU activity from CUPTI (:class:`~.gpu_figures.GpuActivityRecord`: GPU time per link,
    #: phase and iteration, busy share, top kernels), when recorded.
    gpu_activity: dict[str, Any] | None = None

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


