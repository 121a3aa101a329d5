"""Findings first: everything the analysis says of a run, computed once.

At exit (:mod:`..lifecycle.finish`) and in ``report`` (:mod:`..report.compare`),
:func:`find` computes one :class:`Findings` from a run's statistics -- the run-time
facts, the GPU evidence, the slow iterations, the figures read at each iteration's
end, the verdict and the advice -- and the summary, ``report`` and the HTML report render it: they
format what is here and never call back into the analysis while they do.

A part that fails (a bug of ours, or facts of a shape it does not expect) is left
out with one line (:func:`..common.log.contained`: under the tests it raises),
the rest stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..common import log
from . import communication
from .advice import check
from .finding import Finding
from .gpu_evidence import GpuEvidence, Waits, busy_text, gather, on_gpu, waits
from .gpu_record import GpuActivity
from .iteration_figures import FIGURES
from .outliers import SlowIteration, Stutter, slow_iterations, stutter
from .per_iteration import Judged, judge
from .verdict import Verdict, decide, facts_of
from .whatif import WhatIf
from .window import Unreached, unreached

if TYPE_CHECKING:
    from ..common.typedefs import Facts
    from .stats import RunStats


@dataclass
class Findings:
    """One run's findings: the renderers' only input (its statistics included)."""

    stats: RunStats
    #: The run-time facts (``{}`` without).
    facts: Facts
    #: Whether the model ran on a GPU.
    on_gpu: bool
    #: The agent's waits for the GPU (none below sync level 1).
    waits: Waits
    #: On a GPU with counted iterations: the GPU evidence.
    gpu: GpuEvidence | None = None
    #: The slowest counted iterations, explained, and their share of the time.
    slow: list[SlowIteration] = field(default_factory=list)
    stutter: Stutter | None = None
    #: A capture window the run never reached.
    window: Unreached | None = None
    #: The figures read at each iteration's end, judged (memory's leak, a pool that caches).
    figures: list[Judged] = field(default_factory=list)
    #: Communication (ChainerMN's ``comm:*``) inside the counted iterations: its time, and
    #: the closing sentence when it sets the pace.
    comm_ms: float = 0.0
    comm_sentence: str | None = None
    #: The what-if model of the run's step (with the verdict: ``None`` when not asked for,
    #: or when the trace holds too little for it).
    whatif: WhatIf | None = None
    #: The verdict and the advice (``None``/empty: not asked for, or none could be made).
    verdict: Verdict | None = None
    advice: list[Finding] = field(default_factory=list)
    #: One line per part that failed (shown where that part would be).
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def busy(self) -> str | None:
        """The GPU's busy share in words, from the GPU evidence (else the verdict's)."""
        evidence = self.gpu or (self.verdict.gpu if self.verdict is not None else None)
        if evidence is None or evidence.busy_share is None:
            return None
        return busy_text(evidence)

    @property
    def activity(self) -> GpuActivity | None:
        """The GPU activity's figures (CUPTI), when it has counted iterations."""
        fig = self.stats.gpu_activity
        return fig if fig is not None and fig.iterations else None


def find(stats: RunStats, replay: RunStats | None = None, *, advice: bool = True) -> Findings:
    """Everything the analysis says of ``stats`` (``replay``: its replay run, which lets the
    verdict tell data loading's cost; ``advice``: the verdict and the advice too)."""
    gpu_used = on_gpu(stats)
    out = Findings(stats, facts_of(stats), gpu_used,
                   waits(stats) if stats.sync_level >= 1 else Waits())
    if stats.iterations and gpu_used:
        try:
            out.gpu = gather(stats)
        except Exception as exc:  # our bug: the rest stands  # noqa: BLE001
            out.errors["gpu"] = log.contained("the GPU evidence", exc)
    out.slow = slow_iterations(stats)
    out.stutter = stutter(stats) if out.slow else None
    out.window = unreached(stats)
    out.figures = judge(FIGURES, stats.per_iteration)
    out.comm_ms, out.comm_sentence = communication.comm_ms(stats), communication.sentence(stats)
    if advice:
        try:
            out.verdict = decide(stats, replay)
            out.advice = check(stats, out.verdict)
            out.whatif = out.verdict.whatif  # the verdict's: computed once
            if out.whatif is not None:
                log.debug(out.whatif.replay_text())
        except Exception as exc:  # our bug or damaged facts: the rest stands  # noqa: BLE001
            # (the summary's section of that name shows the line)
            out.errors["verdict"] = log.contained("verdict_section", exc)
    return out
