"""Which processes profile, and who each one is: child processes and MPI ranks.

* **Children.**  The first process where the agent starts records its pid in
  ``_CHAINER_PROF_ROOT_PID``; an interpreter started later with that variable
  in its environment (a spawn or forkserver child, a subprocess) is a child.
  ``CHAINER_PROF_CHILDREN=0`` keeps the agent off there, and switches it off
  in a forked child at the fork.  A forked child that profiles gets clean state
  and writes its trace when a ``multiprocessing`` worker ends (those end with
  ``os._exit``, which skips ``atexit``).
* **Ranks.**  The MPI rank comes from the launcher's environment (Open MPI,
  MPICH/PMI, PMIx, MVAPICH, Slurm) or, when none says, from the first ChainerMN
  communicator created; ``CHAINER_PROF_RANKS`` picks the ranks that profile.
  The rank is shown in NVTX as a process-wide ``rank N`` start/end range in
  the agent's domain (range names stay the same on every rank) and in the
  trace metadata and file name (``%r``).
* **Clock reference.**  The end of the first synchronizing collective
  (all-reduce, all-gather, all-to-all) a rank takes part in is, within the
  collective's latency, the same instant on every rank: like a barrier.  Its
  clock readings let ``merge`` put all ranks on one timeline.

Nothing here adds communication: a rank that is not profiled, or that runs
without the agent, can never be kept waiting by one that is.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .settings import INTERNAL_PREFIX

#: The pid of the first process where the agent started (children see it).
ROOT_PID_VAR = INTERNAL_PREFIX + "ROOT_PID"

#: Launchers' rank variables: (rank variable, size variable, launcher), checked in order.
LAUNCHER_VARS: tuple[tuple[str, str | None, str], ...] = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPICH/PMI"),
    ("PMIX_RANK", None, "PMIx"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MVAPICH"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
)

#: ChainerMN communicator operations after which every rank has arrived.
SYNCHRONIZING = frozenset({"multi_node_mean_grad", "allreduce_grad", "allreduce",
                           "allreduce_obj", "allgather", "alltoall"})

RANK_RANGE_COLOR = 0xFF808080


@dataclass(frozen=True)
class RankInfo:
    """This process's place in an MPI job."""

    rank: int
    size: int | None
    source: str  # the launcher, or "communicator"


_rank: RankInfo | None = None
_clock_ref: dict[str, Any] | None = None
_rank_range: tuple[Any, int] | None = None  # (NVTX domain, range id)
_lock = threading.Lock()
_exported: dict[str, str | None] = {}  # variables admit() set: name -> previous value


# -- ranks -----------------------------------------------------------------------
def rank_from_environ(environ: Mapping[str, str] | None = None) -> RankInfo | None:
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


def current_rank() -> int | None:
    """This process's MPI rank, or ``None`` outside an MPI job."""
    info = _rank
    return None if info is None else info.rank


def profiles_rank(cfg: Any, rank: int | None) -> bool:
    """Whether ``rank`` is one of the ranks ``cfg.ranks`` selects (all when unset)."""
    return cfg.ranks is None or rank is None or rank in cfg.ranks


# -- children --------------------------------------------------------------------
def is_child(environ: Mapping[str, str] | None = None, pid: int | None = None) -> bool:
    """Whether an agent started in a parent of this process (not in this one)."""
    env = os.environ if environ is None else environ
    root = env.get(ROOT_PID_VAR, "").strip()
    return bool(root) and root != str(os.getpid() if pid is None else pid)


# -- the agent's start and forks ---------------------------------------------------
def admit(cfg: Any) -> bool:
    """Called before the agent is built: may this process profile?

    ``False`` for a child with ``children`` off and for a rank that
    ``ranks`` leaves out.  A process that profiles and has no root marks
    itself as the root, so that its children know they are children.
    """
    global _rank
    if is_child() and not cfg.children:
        return False
    info = rank_from_environ()
    if info is not None:
        _rank = info
    if not profiles_rank(cfg, current_rank()):
        return False
    if not os.environ.get(ROOT_PID_VAR):
        _set_environ(ROOT_PID_VAR, str(os.getpid()))
        if cfg.children:
            export_settings(cfg)
    return True


def _set_environ(name: str, value: str) -> None:
    _exported.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def restore_environ() -> None:
    """Undo what :func:`admit` put into the environment (the agent is uninstalled)."""
    for name, previous in _exported.items():
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
    _exported.clear()


def export_settings(cfg: Any) -> None:
    """Put the settings given to ``install()`` into the environment, for children.

    A spawn or forkserver child is a fresh interpreter: it starts the agent
    from ``CHAINER_PROF_*`` variables (the ``.pth`` line), so settings given
    as arguments rather than variables reach it only this way.
    """
    from .settings import BY_NAME, to_environ_value

    _set_environ(BY_NAME["enable"].env, "1")
    for name in cfg.explicit:
        setting = BY_NAME[name]
        text = to_environ_value(setting, getattr(cfg, name))
        try:
            setting.parse(text)
        except ValueError:
            continue  # no environment form (e.g. an unset sync level)
        _set_environ(setting.env, text)


def started(agent: Any) -> None:
    """Called once the agent runs: tag NVTX with the rank when it is known."""
    if _rank is not None:
        _tag_nvtx(agent, _rank.rank)


def after_fork_in_child(agent: Any) -> None:
    """In a forked child (tracer already reset): switch off, or arrange the trace at exit."""
    global _rank_range
    _rank_range = None  # the parent's range: not ours to end
    from . import agent as agent_module

    if agent_module.current() is not agent:
        return  # an agent uninstalled before the fork
    if not agent.cfg.children:
        switch_off(agent)
        return
    _finish_multiprocessing_workers(agent)


def switch_off(agent: Any) -> None:
    """Stop ``agent`` in this process: no more ranges, no output at exit."""
    tracer = agent.tracer
    tracer.sinks = []
    tracer._begin_fns = ()
    tracer._end_fns = ()
    from . import agent as agent_module

    agent.uninstall()
    if agent_module._agent is agent:
        agent_module._agent = None


def _finish_multiprocessing_workers(agent: Any) -> None:
    """A ``multiprocessing`` child ends with ``os._exit``: close the agent in its finalizers.

    The after-fork callback runs inside ``Process._bootstrap`` after the
    finalizer registry of the child was cleared, so the finalizer sticks.
    """
    import sys

    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    try:
        util.register_after_fork(agent, _register_exit_finalizer)
    except Exception:
        pass


def _register_exit_finalizer(agent: Any) -> None:
    import multiprocessing.util as util

    util.Finalize(agent, agent.at_exit, exitpriority=-100)


# -- rank from a communicator ------------------------------------------------------
def note_rank(rank: int, size: int | None, source: str = "communicator") -> bool:
    """A ChainerMN communicator told this process its world rank.

    Returns ``False`` when the agent was switched off because ``ranks`` leaves
    this rank out.
    """
    global _rank
    from . import agent as agent_module

    current = agent_module.current()
    if _rank is None or _rank.rank != rank:
        _rank = RankInfo(rank, size, source)
        if current is not None:
            _tag_nvtx(current, rank)
    elif _rank.size is None and size is not None:
        _rank = RankInfo(rank, size, _rank.source)
    if current is not None and not profiles_rank(current.cfg, rank):
        switch_off(current)
        return False
    return True


def _tag_nvtx(agent: Any, rank: int) -> None:
    """A process-wide NVTX range ``rank N``: every rank's ranges keep their names."""
    global _rank_range
    sink = getattr(agent, "nvtx", None)
    if sink is None:
        return
    try:
        with _lock:
            if _rank_range is not None:
                domain, range_id = _rank_range
                domain.end_range(range_id)
            domain = sink.domain
            range_id = domain.start_range(message=f"rank {rank}", color=RANK_RANGE_COLOR)
            first = _rank_range is None
            _rank_range = (domain, range_id)
        if first:
            import atexit

            atexit.register(_end_rank_range)
    except Exception as exc:
        from . import log

        log.warning(f"could not tag NVTX with the rank ({type(exc).__name__}: {exc})")


def _end_rank_range() -> None:
    global _rank_range
    with _lock:
        if _rank_range is not None:
            domain, range_id = _rank_range
            _rank_range = None
            try:
                domain.end_range(range_id)
            except Exception:
                pass


# -- clock reference -----------------------------------------------------------------
def clock_reference() -> dict[str, Any] | None:
    """The clock readings at the end of the first synchronizing collective, if any."""
    return _clock_ref


def note_collective_end(op: str, perf_ns: int) -> None:
    """Record ``op``'s end as the clock reference (the first one only)."""
    global _clock_ref
    if _clock_ref is None:
        _clock_ref = {"method": "first-collective", "op": op,
                      "perf_counter_ns": perf_ns, "unix_time_ns": time.time_ns()}


def metadata() -> dict[str, Any]:
    """What a trace records about this process's place in the job (``otherData...process``)."""
    info = _rank
    meta: dict[str, Any] = {
        "mpi_rank": None if info is None else info.rank,
        "world_size": None if info is None else info.size,
        "rank_source": None if info is None else info.source,
        "child": is_child(),
        "parent_pid": os.getppid(),
    }
    if _clock_ref is not None:
        meta["clock_reference"] = dict(_clock_ref)
    return meta


def child_trace_template(template: str) -> str:
    """The trace path template for this process: a child without ``%p`` gets ``.%p`` added.

    Parent and children would otherwise write the same file, the last one
    to end overwriting the others.
    """
    if "%p" in template or not is_child():
        return template
    stem, ext = os.path.splitext(template)
    return f"{stem}.%p{ext}"

