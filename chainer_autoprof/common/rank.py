"""This process's place in an MPI job: its rank, and the instant all ranks shared.

One source of truth for the rank: the launcher's environment (Open MPI,
MPICH/PMI, PMIx, MVAPICH, Slurm, checked in that order) or, where no launcher
says, the first ChainerMN communicator created (:func:`note`).  Rank
selection (``CHAINER_PROF_RANKS``), the NVTX ``rank N`` range, ``%r`` in trace
paths and the trace metadata all read :func:`current`.

The clock reference is the end of the first synchronizing collective a rank
takes part in: within the collective's latency the same instant on every
rank, so ``merge`` can put all ranks on one timeline.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, TypedDict

if sys.version_info >= (3, 11):
    from typing import Annotated, Required
else:  # Chainer's own dependency
    from typing_extensions import Annotated, Required

#: Launchers' rank variables: (rank variable, size variable, launcher), checked in order.
LAUNCHER_VARS: tuple[tuple[str, str | None, str], ...] = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPICH/PMI"),
    ("PMIX_RANK", None, "PMIx"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MVAPICH"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
)

COMMUNICATOR = "communicator"


@dataclass(frozen=True)
class RankInfo:
    """This process's place in an MPI job."""

    rank: int
    size: int | None
    source: str  # the launcher, or "communicator"


_noted: RankInfo | None = None  # learned from a communicator


class ClockReference(TypedDict, total=False):
    """The end of the first synchronizing collective (common/rank.py).

    The run record's ``process.clock_reference`` (analysis/record.py holds it as it is
    declared here, the docs beside each type its documentation): how ``merge`` lines the
    ranks' clocks up.  Written whole (:func:`note_collective_end`); a reader of a saved
    record counts on ``perf_counter_ns`` only (the record's check refuses a reference
    without it), any other key may be missing.
    """

    method: Annotated[str, "how it was taken (first-collective)"]
    op: Annotated[str, "the collective"]
    perf_counter_ns: Required[Annotated[int, "time.perf_counter_ns() at its end", "ns"]]
    unix_time_ns: Annotated[int, "time.time_ns() at its end", "ns"]


_clock_ref: ClockReference | None = None
_lock = threading.Lock()


def from_environ(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The rank the launcher gave this process, if a known launcher did."""
    env = os.environ if environ is None else environ
    for rank_var, size_var, launcher in LAUNCHER_VARS:
        raw = env.get(rank_var, "").strip()
        if not raw:
            continue
        try:
            rank = int(raw)
        except ValueError:
            continue
        size: int | None = None
        if size_var is not None:
            try:
                size = int(env.get(size_var, "").strip())
            except ValueError:
                size = None
        return RankInfo(rank, size, launcher)
    return None


def current(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The rank a communicator told, else the launcher's (``None`` outside an MPI job).

    With ``environ`` given, that environment stands for the launcher's.
    """
    noted = _noted
    return noted if noted is not None else from_environ(environ)


def number(environ: Mapping[str, str] | None = None) -> int:
    """The rank as a number, 0 outside an MPI job (``%r`` in paths)."""
    info = current(environ)
    return 0 if info is None else info.rank


def note(rank: int, size: int | None) -> bool:
    """A ChainerMN communicator told this process its world rank; ``True`` if that is news."""
    global _noted
    with _lock:
        known = current()
        if known is not None and known.rank == rank:
            if known.size is None and size is not None:
                _noted = RankInfo(rank, size, known.source)
            return False
        _noted = RankInfo(rank, size, COMMUNICATOR)
        return True


def forget() -> None:
    """Forget what communicators said (tests; an uninstalled agent)."""
    global _noted, _clock_ref
    _noted = None
    _clock_ref = None


def clock_reference() -> ClockReference | None:
    """The clock readings at the end of the first synchronizing collective, if any."""
    return _clock_ref


def note_collective_end(op: str, perf_ns: int) -> None:
    """Record ``op``'s end as the clock reference (the first one only)."""
    global _clock_ref
    if _clock_ref is None:
        _clock_ref = {"method": "first-collective", "op": op,
                      "perf_counter_ns": perf_ns, "unix_time_ns": time.time_ns()}
