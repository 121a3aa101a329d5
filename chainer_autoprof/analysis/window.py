"""The capture window as the run met it: a window the run never reached, and how far it got.

With ``CHAINER_PROF_ITERATIONS=START:STOP`` nothing is recorded before
iteration START begins; a run that ends sooner records nothing at all, and
its summary must say why (not "no training ran").  How far it got is the
tracer's count of iterations begun, kept in the run's facts
(``facts["iterations"]``), so a saved trace says it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stats import RunStats


@dataclass(frozen=True)
class Unreached:
    """A capture window ``start:stop`` the run ended before: it began ``ran`` iterations."""

    start: int
    stop: int
    ran: int

    def setting(self) -> str:
        return f"CHAINER_PROF_ITERATIONS={self.start}:{self.stop}"

    def progress(self) -> str:
        """``the run ended after 20 iterations (0-19)``."""
        if not self.ran:
            return "the run began no training iteration"
        if self.ran == 1:
            return "the run ended after 1 iteration (0)"
        return f"the run ended after {self.ran} iterations (0-{self.ran - 1})"


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def unreached(stats: RunStats) -> Unreached | None:
    """The capture window of ``stats``'s run, when the run ended before it began; else None."""
    meta = getattr(stats, "meta", None) or {}
    settings = meta.get("settings")
    window = settings.get("iterations") if isinstance(settings, dict) else None
    if not isinstance(window, (list, tuple)) or len(window) != 2:
        return None
    start, stop = _integer(window[0]), _integer(window[1])
    facts = meta.get("facts")
    ran = _integer(facts.get("iterations", 0)) if isinstance(facts, dict) else None
    if start is None or stop is None or ran is None or ran > start:
        return None
    if stats.iterations or stats.warmup:
        return None  # something of it was recorded
    return Unreached(start, stop, ran)
