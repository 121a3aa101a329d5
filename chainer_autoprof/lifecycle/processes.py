"""Which processes profile: child processes and MPI ranks, and what a trace says of each.

* **Children.**  The first process where the agent starts records its pid in
  ``_CHAINER_PROF_ROOT_PID``; an interpreter started later with that variable
  in its environment (a spawn or forkserver child, a subprocess) is a child.
  ``CHAINER_PROF_CHILDREN=0`` keeps the agent off there, and the agent
  switches itself off in a forked child at the fork.  A forked child that
  profiles gets clean state and writes its trace when a ``multiprocessing``
  worker ends (those end with ``os._exit``, which skips ``atexit``).
* **Ranks.**  The rank itself comes from :mod:`..common.rank`;
  ``CHAINER_PROF_RANKS`` picks the ranks that profile.  The rank is shown in
  NVTX as a process-wide ``rank N`` start/end range in the agent's domain
  (range names stay the same on every rank) and in the trace metadata and
  file name (``%r``).

* **exec.**  A program that replaces itself (``os.exec*``: restart-on-failure
  wrappers) would lose the image's profile (no ``atexit`` runs) and leave its
  trace so far behind.  :func:`hook_exec` runs the agent's end just before
  the exec: each image prints its own summary, and writes its own trace, the
  earlier ones beside the path asked for with ``.execN`` added (``t.exec1.json``:
  the first image), the last one at the path itself; the image's number
  travels to the next in ``_CHAINER_PROF_EXEC_IMAGE`` (``PID:N``, this pid only).

Nothing here adds communication: a rank that is not profiled, or that runs
without the agent, can never be kept waiting by one that is.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..common import log, rank
from ..common.paths import trace_file
from ..common.settings import BY_NAME, INTERNAL_PREFIX, to_environ_value
from ..common.shared_paths import differs_per_rank, per_rank_template

if TYPE_CHECKING:
    from ..common.settings import Config

#: The pid of the first process where the agent started (children see it).
ROOT_PID_VAR = INTERNAL_PREFIX + "ROOT_PID"

RANK_RANGE_COLOR = 0xFF808080

_rank_range: tuple[Any, int] | None = None  # (NVTX domain, range id)
_lock = threading.Lock()
_exported: dict[str, str | None] = {}  # variables admit() set: name -> previous value
_per_rank = False  # the trace path is shared by the ranks: .rank%r added (rank_known)
_launcher_said = False  # the launcher's variables gave the rank at the start (settings checked)
#: This image's number among the images of this process (os.exec*), for the next one.
EXEC_VAR = INTERNAL_PREFIX + "EXEC_IMAGE"
_exec_suffix: int | None = None  # this image is being replaced: its trace gets .execN
_exec_originals: dict[str, Callable[..., Any]] = {}


# -- who profiles ------------------------------------------------------------------
def profiles_rank(cfg: Config, number: int | None) -> bool:
    """Whether rank ``number`` is one of the ranks ``cfg.ranks`` selects (all when unset)."""
    return cfg.ranks is None or number is None or number in cfg.ranks


def is_child(environ: Mapping[str, str] | None = None, pid: int | None = None) -> bool:
    """Whether an agent started in a parent of this process (not in this one)."""
    env = os.environ if environ is None else environ
    root = env.get(ROOT_PID_VAR, "").strip()
    return bool(root) and root != str(os.getpid() if pid is None else pid)


def admit(cfg: Config) -> bool:
    """Called before the agent is built: may this process profile?

    ``False`` for a child with ``children`` off and for a rank that
    ``ranks`` leaves out.  A process that profiles and has no root marks
    itself as the root, so that its children know they are children.
    """
    global _launcher_said
    if is_child() and not cfg.children:
        return False
    _launcher_said = rank.from_environ() is not None
    info = rank.current()
    if not profiles_rank(cfg, None if info is None else info.rank):
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
    global _per_rank
    _per_rank = False
    for name, previous in _exported.items():
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
    _exported.clear()


def export_settings(cfg: Config) -> None:
    """Put the settings given to ``install()`` into the environment, for children.

    A spawn or forkserver child is a fresh interpreter: it starts the agent
    from ``CHAINER_PROF_*`` variables (the ``.pth`` line), so settings given
    as arguments rather than variables reach it only this way.
    """
    _set_environ(BY_NAME["enable"].env, "1")
    for name in cfg.explicit:
        setting = BY_NAME[name]
        text = to_environ_value(setting, getattr(cfg, name))
        try:
            setting.parse(text)
        except ValueError:
            continue  # no environment form (e.g. an unset sync level)
        _set_environ(setting.env, text)


# -- forked children -----------------------------------------------------------------
def rank_known(cfg: Config, number: int, size: int | None) -> None:
    """A communicator told the rank after the start, no launcher having said it.

    Too late to refuse a trace path the ranks would share (the launcher's
    variables make the settings refuse it before the program runs): each rank
    writes its own file then, ``.rankN`` added, and says so in one line.
    """
    global _per_rank
    template = cfg.trace
    if not template or _per_rank or _launcher_said or size is None or size < 2 or is_child():
        return
    writers = size if cfg.ranks is None else sum(1 for r in cfg.ranks if 0 <= r < size)
    if writers < 2 or differs_per_rank(template, number):
        return
    _per_rank = True
    log.warning(f"CHAINER_PROF_TRACE={template!r} names one file for the {writers} ranks of "
                "this job (the rank came from the ChainerMN communicator, after the start): "
                f"rank {number} writes {per_rank_template(template).replace('%r', str(number))}"
                " instead (put %r in the path to choose the names)")


def after_fork() -> None:
    """In a forked child: the parent's ``rank N`` range is not ours to end."""
    global _rank_range
    _rank_range = None


def close_at_worker_exit(owner: object, close: Callable[[], None]) -> None:
    """A ``multiprocessing`` child ends with ``os._exit``: run ``close`` in its finalizers.

    ``owner`` is the object the finalizer belongs to (``multiprocessing``
    holds it weakly).  Called from an after-fork callback, which runs inside
    ``Process._bootstrap`` after the finalizer registry of the child was
    cleared, so the finalizer sticks.
    """
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    try:
        util.register_after_fork(owner, functools.partial(_register_exit_finalizer, close))
    except Exception:  # an optional hook: without it the worker's trace is not closed early  # noqa: BLE001
        pass


def _register_exit_finalizer(close: Callable[[], None], owner: object) -> None:
    util = sys.modules["multiprocessing.util"]  # the fork came from multiprocessing
    util.Finalize(owner, close, exitpriority=-100)


# -- the rank in NVTX ----------------------------------------------------------------------
def tag_rank(nvtx: Any, number: int) -> None:
    """A process-wide NVTX range ``rank N`` (every rank's ranges keep their names)."""
    global _rank_range
    if nvtx is None:
        return
    try:
        with _lock:
            if _rank_range is not None:
                domain, range_id = _rank_range
                domain.end_range(range_id)
            domain = nvtx.domain
            range_id = domain.start_range(message=f"rank {number}", color=RANK_RANGE_COLOR)
            first = _rank_range is None
            _rank_range = (domain, range_id)
        if first:
            atexit.register(_end_rank_range)
    except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
        log.warning(f"could not tag NVTX with the rank ({type(exc).__name__}: {exc})")


def _end_rank_range() -> None:
    global _rank_range
    with _lock:
        if _rank_range is not None:
            domain, range_id = _rank_range
            _rank_range = None
            try:
                domain.end_range(range_id)
            except Exception:  # ending the rank's NVTX range at exit: best effort  # noqa: BLE001
                pass


# -- what a trace says of this process ---------------------------------------------------------
def metadata() -> dict[str, object]:
    """This process's place in the job (``otherData.chainer_autoprof.process``)."""
    info = rank.current()
    meta: dict[str, object] = {
        "mpi_rank": None if info is None else info.rank,
        "world_size": None if info is None else info.size,
        "rank_source": None if info is None else info.source,
        "child": is_child(),
        "parent_pid": os.getppid(),
    }
    reference = rank.clock_reference()
    if reference is not None:
        meta["clock_reference"] = dict(reference)
    return meta


def trace_path(template: str, start_dir: str | None) -> str:
    """THE file this process's trace goes to now (the final trace; the trace so far beside it).

    ``template`` (``CHAINER_PROF_TRACE``) expanded now (``%p %h %r %q{VAR}``: the
    pid after a fork, the rank once known), a child's without ``%p`` given
    ``.%p`` (:func:`child_trace_template`), a relative one taken from
    ``start_dir``, the directory the run started in and the path was checked
    in (the program may have changed it).  The agent binds the template and
    the directory once and hands this down; nothing else composes the path.
    """
    return trace_file(child_trace_template(template), start_dir)


def child_trace_template(template: str) -> str:
    """The trace path template for this process: a child without ``%p`` gets ``.%p`` added.

    Parent and children would otherwise write the same file, the last one
    to end overwriting the others.  Where the ranks of a job share the path
    (:func:`rank_known`), ``.rank%r`` is added first.
    """
    if _per_rank:
        template = per_rank_template(template)
    if _exec_suffix is not None:  # an earlier image of an exec'ing process: beside the last's
        stem, ext = os.path.splitext(template)
        template = f"{stem}.exec{_exec_suffix}{ext}"
    if "%p" in template or not is_child():
        return template
    stem, ext = os.path.splitext(template)
    return f"{stem}.%p{ext}"


# -- os.exec*: each image's profile -------------------------------------------------------------
def exec_image() -> int:
    """This image's number among the images of this process (1: the first)."""
    pid, _, number = os.environ.get(EXEC_VAR, "").partition(":")
    if pid != str(os.getpid()) or not number.isdigit():
        return 1  # none, or another process's (inherited by a subprocess)
    return max(1, int(number))


def hook_exec(before: Callable[[], None]) -> None:
    """``before()`` runs just before ``os.execv``/``os.execve`` replace this image (the
    other ``os.exec*`` functions call these two)."""
    for name in ("execv", "execve"):
        original = getattr(os, name, None)
        if original is None or name in _exec_originals:
            continue
        _exec_originals[name] = original
        setattr(os, name, functools.partial(_exec, before, original))


def unhook_exec() -> None:
    """``os.execv``/``os.execve`` as they were (where still ours)."""
    for name, original in list(_exec_originals.items()):
        if isinstance(getattr(os, name, None), functools.partial):
            setattr(os, name, original)
        del _exec_originals[name]


def _exec(before: Callable[[], None], original: Callable[..., Any], path: Any, args: Any,
          *env: Any) -> Any:
    """The agent's end for this image, then the exec (the next image numbered after it)."""
    global _exec_suffix
    number = exec_image()
    _exec_suffix = number
    try:
        before()
    except Exception as exc:  # our error: one line, the exec goes on  # noqa: BLE001
        log.error(f"no profile of this image before exec ({type(exc).__name__}: {exc})")
    finally:
        _exec_suffix = None
    following = f"{os.getpid()}:{number + 1}"
    os.environ[EXEC_VAR] = following
    if env and env[0] is not None:
        env = (dict(env[0], **{EXEC_VAR: following}), *env[1:])
    return original(path, args, *env)
