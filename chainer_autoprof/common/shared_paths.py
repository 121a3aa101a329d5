"""Several processes, one trace path: the ranks of an MPI job that would write the same file.

Each process writes its own trace (and its trace so far, ``TRACE.partial``).
Where the ranks of one job are given a path that does not tell them apart
(``--trace run.json``, ``run-%h.json`` with two ranks on a host,
``run-%q{VAR}.json`` with ``VAR`` the same everywhere), they would append to
one partial file and replace each other's trace: one would be lost.
:func:`shared_trace` says so before the program runs, from the launcher's
environment, so that the settings are refused (launcher: exit status 2;
environment only: the agent stays off, with one line).

A path tells the ranks apart when it changes with the rank (``%r``, a rank
variable such as ``%q{OMPI_COMM_WORLD_RANK}``) or the process (``%p``), or
with the host (``%h``) where each host runs one rank, or with the host and
a rank on the host (``%q{OMPI_COMM_WORLD_LOCAL_RANK}``) together.  Child
processes write beside their parent's file with ``.PID`` added, so they are
apart by construction.  A rank learned later from a ChainerMN communicator
(no known launcher) comes too late to refuse: then each rank writes its own
file, ``.rankN`` added (:func:`per_rank_template`), and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .paths import expand_path

#: Per launcher (as :data:`.rank.LAUNCHER_VARS`): (rank, job size, ranks on this host).
_JOB_VARS: tuple[tuple[str, str | None, str | None, str], ...] = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "MPICH/PMI"),
    ("PMIX_RANK", None, None, "PMIx"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE", "MVAPICH"),
    # a job step's own size: a batch script has SLURM_PROCID and SLURM_NTASKS too
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "Slurm"),
)
#: Variables that differ between the ranks of a job.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
              "SLURM_PROCID", "PMI_ID")
#: Variables that differ between the ranks on one host only.
_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK", "MPI_LOCALRANKID",
               "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMIX_LOCAL_RANK",
               "SLURM_TASK_PID")
#: Variables that name the host.
_HOST_VARS = ("HOSTNAME", "HOST", "SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR")


@dataclass(frozen=True)
class Job:
    """This process's MPI job as its launcher describes it."""

    launcher: str
    rank: int
    size: int | None
    on_host: int | None  # ranks on this host (the most on any host, for Slurm)


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _most_per_host(text: str | None) -> int | None:
    """Slurm's tasks per node (``2(x3),1``): the most on one host."""
    counts = []
    for part in (text or "").split(","):
        count = _int(part.split("(")[0])
        if count is None:
            return None
        counts.append(count)
    return max(counts) if counts else None


def job(environ: Mapping[str, str]) -> Job | None:
    """The job the launcher's variables in ``environ`` describe (``None``: no known launcher)."""
    for rank_var, size_var, local_var, launcher in _JOB_VARS:
        number = _int(environ.get(rank_var))
        if number is None:
            continue
        size = _int(environ.get(size_var)) if size_var else None
        local = environ.get(local_var) if local_var else None
        on_host = _most_per_host(local) if launcher == "Slurm" else _int(local)
        return Job(launcher, number, size, on_host)
    return None


def _changed(environ: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    env = dict(environ)
    for name in names:
        if name in env:
            env[name] = env[name] + "~other"
    return env


def shared_trace(template: str, environ: Mapping[str, str], ranks: frozenset[int] | None,
                 pid: int | None = None) -> str | None:
    """Why the ranks of this MPI job would write one trace file (``None``: each its own).

    ``ranks``: the ranks that profile (``CHAINER_PROF_RANKS``; ``None``: all).
    The answer is what a path must be instead, for the settings' one line.
    """
    info = job(environ)
    if info is None or info.size is None or info.size < 2:
        return None
    writers = info.size if ranks is None else sum(1 for r in ranks if 0 <= r < info.size)
    if writers < 2:
        return None
    pid = os.getpid() if pid is None else pid

    def expand(env: Mapping[str, str], pid_: int = pid, rank_: int = info.rank,
               host: str = "this-host") -> str:
        return expand_path(template, pid_, env, rank_number=rank_, host=host)

    here = expand(environ)
    if expand(_changed(environ, _RANK_VARS), pid + 1, info.rank + 1) != here:
        return None  # %r, %p or a rank variable: every rank its own
    per_host_rank = expand(_changed(environ, _LOCAL_VARS)) != here
    per_host = expand(_changed(environ, _HOST_VARS), host="another-host") != here
    if per_host and (per_host_rank or info.on_host == 1):
        return None  # the host, and a rank on the host or one rank per host
    if per_host_rank and info.on_host == info.size:
        return None  # every rank on this host, each with its own local rank
    path = expand_path(template, pid, environ, rank_number=info.rank)
    if per_host:
        who = f"the ranks on one host ({info.on_host or 'several'} here)"
    elif per_host_rank:
        who = (f"ranks with the same rank on their host, on different hosts ({info.size} "
               f"ranks, {info.on_host or 'fewer'} here)")
    else:
        who = f"the {writers} ranks of this {info.launcher} job" + \
            (" that profile (CHAINER_PROF_RANKS)" if writers < info.size else "")
    stem, ext = os.path.splitext(template)
    return (f"a path that differs per MPI rank: {who} would all write {path} and lose each "
            f"other's trace; put %r (the rank) in it, e.g. {stem}.%r{ext}")


def differs_per_rank(template: str, rank: int, pid: int | None = None) -> bool:
    """Whether ``template`` names another file for another rank (``%r``) or process (``%p``)."""
    pid = os.getpid() if pid is None else pid
    return expand_path(template, pid, rank_number=rank) != \
        expand_path(template, pid + 1, rank_number=rank + 1)


def per_rank_template(template: str) -> str:
    """``template`` with ``.rank%r`` before its extension (``run.json`` -> ``run.rank%r.json``)."""
    stem, ext = os.path.splitext(template)
    return f"{stem}.rank%r{ext}"
