"""THE figures read at each iteration's end (:mod:`.per_iteration`): a new one is its own
module declaring an :class:`~.per_iteration.IterationFigure`, and one line here.

The recorder reads these, the run record holds their samples, the findings judge them
and the advice takes theirs, the summary, ``report`` and the HTML report show them, the
trace draws each as a counter track: all by going through this tuple.
"""

from __future__ import annotations

from .memory import MEMORY
from .per_iteration import IterationFigure

FIGURES: tuple[IterationFigure, ...] = (MEMORY,)
