"""Several processes' whereabouts side by side: which rank is the odd one out.

In a data-parallel job a rank that stops (a dead data loader, a deadlock,
a slow file system) holds every other rank in the next collective, so the
others all wait in the same communication while the odd rank is somewhere
else -- or one rank went into a collective that the others, stuck
elsewhere, never reach.  :func:`odd_one_out` takes each process's position
-- where its training thread is, from a stall report, a dump or a partial
trace -- and names the rank(s) whose position differs from the others':

1. one position is shared by more ranks than any other (and by two or
   more): the ranks elsewhere are the odd ones;
2. else (e.g. two ranks in two places), some ranks wait in a communication
   range (``comm:*``) and others do not: those others are the odd ones, the
   ranks that the waiting ones wait for;
3. else, some ranks are in an earlier iteration than the rest: those lag.

Works on plain snapshot dictionaries (:mod:`..lifecycle.where` makes them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..common import names

#: Categories that say where a training thread is (finer ranges are detail).
_COARSE = (names.ITERATION, *names.PHASES, names.COMM, names.EXTENSION, names.INFERENCE,
           names.USER)


@dataclass
class Position:
    """Where one process's training thread is."""

    rank: int | None
    pid: int | None
    host: str
    iteration: int | None
    in_iteration: bool
    #: the open ranges, outermost first: (name, category, seconds open or None)
    ranges: list[tuple[str, str, float | None]] = field(default_factory=list)
    thread: str = ""

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    @property
    def coarse(self) -> tuple[str, ...]:
        """The open ranges that say where it is (no links, functions or collections)."""
        return tuple(name for name, category, _s in self.ranges if category in _COARSE)

    @property
    def innermost(self) -> tuple[str, str, float | None] | None:
        coarse = [r for r in self.ranges if r[1] in _COARSE]
        return coarse[-1] if coarse else None

    @property
    def in_comm(self) -> bool:
        inner = self.innermost
        return inner is not None and inner[1] == names.COMM


def position(snap: Mapping[str, Any]) -> Position:
    """The position of the training thread (the loop thread) in snapshot ``snap``."""
    threads = snap.get("threads") or []
    loop = next((t for t in threads if t.get("loop")), None) or \
        next((t for t in threads if t.get("main")), None) or {}
    ranges = [(str(r.get("name", "")), str(r.get("category", "")), r.get("open_s"))
              for r in loop.get("open") or ()]
    return Position(snap.get("rank"), snap.get("pid"), str(snap.get("host", "")),
                    snap.get("iteration"), bool(snap.get("in_iteration")), ranges,
                    str(loop.get("name", "")))


@dataclass
class OddOneOut:
    """The rank(s) whose position differs, and where the others are."""

    odd: list[Position]
    others: list[Position]
    #: comm (the others wait in a communication), behind (earlier iteration), majority
    rule: str

    @property
    def others_in(self) -> str:
        """Where the other ranks are (their shared innermost range)."""
        inner = Counter(p.innermost[0] for p in self.others if p.innermost)
        return inner.most_common(1)[0][0] if inner else "no range"


def odd_one_out(positions: Sequence[Position]) -> OddOneOut | None:
    """The odd rank(s) among ``positions`` (``None`` when all are in the same place or < 2)."""
    ranks = [p for p in positions if p is not None]
    if len(ranks) < 2:
        return None
    counts = Counter(p.coarse for p in ranks)
    if len(counts) == 1:
        return None  # all in the same place
    (common, n), (_second, m) = counts.most_common(2)
    if n >= 2 and n > m:
        return OddOneOut([p for p in ranks if p.coarse != common],
                         [p for p in ranks if p.coarse == common], "majority")
    waiting = [p for p in ranks if p.in_comm]
    if waiting and len(waiting) < len(ranks):
        return OddOneOut([p for p in ranks if not p.in_comm], waiting, "comm")
    iterations = [p.iteration for p in ranks if p.iteration is not None]
    if len(iterations) == len(ranks) and len(set(iterations)) > 1:
        low = min(iterations)
        behind = [p for p in ranks if p.iteration == low]
        return OddOneOut(behind, [p for p in ranks if p.iteration != low], "behind")
    return None
