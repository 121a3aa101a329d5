"""Trace path templates: Nsight's substitutions, and whether a path can be written.

``%p`` pid, ``%h`` host name, ``%q{VAR}`` environment variable (as Nsight
Systems), plus ``%r`` MPI rank (:mod:`.rank`) and ``%%`` a percent sign.

What the agent writes (a trace, a merged trace, an HTML report) only ever
replaces a regular file: a symlink is written through to its target, and a
directory, a device, a FIFO, a socket or a path on a kernel interface (``/proc``,
``/sys``) is refused with one line (:func:`output_target`), both when the
settings are checked and again when the file is written.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Mapping

from . import rank

_SUBST = re.compile(r"%(?:q\{([^}]*)\}|(.))")


def expand_path(template: str, pid: int | None = None,
                environ: Mapping[str, str] | None = None, *, rank_number: int | None = None,
                host: str | None = None) -> str:
    """Apply ``%p %h %r %q{VAR} %%`` to ``template`` (unknown ``%x`` kept as is).

    ``pid``, ``rank_number`` and ``host`` stand for this process's where given.
    """
    env = os.environ if environ is None else environ

    def sub(match: re.Match) -> str:
        var, code = match.group(1), match.group(2)
        if var is not None:
            return env.get(var, "")
        if code == "p":
            return str(os.getpid() if pid is None else pid)
        if code == "h":
            if host is not None:
                return host
            import socket  # only for %h: not on the start-up path otherwise

            return socket.gethostname()
        if code == "r":
            return str(rank.number(environ) if rank_number is None else rank_number)
        if code == "%":
            return "%"
        return match.group(0)

    return os.path.expanduser(_SUBST.sub(sub, template))


def variables(template: str) -> list[str]:
    """The environment variables ``template`` names with ``%q{VAR}``, in order."""
    return list(dict.fromkeys(m.group(1) for m in _SUBST.finditer(template)
                              if m.group(1) is not None))


def trace_file(template: str, start_dir: str | None = None) -> str:
    """The file ``template`` names for this process; a relative one is taken from
    ``start_dir`` (the directory the run started in and the path was checked in)."""
    path = expand_path(template)
    if start_dir is not None and not os.path.isabs(path):
        path = os.path.join(start_dir, path)
    return path


#: Kernel interfaces: files there are not storage, and creating one fails at exit.
KERNEL_TREES = ("/proc", "/sys")


def output_target(path: str) -> str:
    """The regular file that writing ``path`` replaces: ``path``, or a symlink's final target.

    Raises ``ValueError`` (one line) for what must never be replaced: an empty
    path, a directory, a device, a FIFO, a socket, anything under ``/proc`` or
    ``/sys``.  A path that does not exist yet is fine here (its directory is
    checked by :func:`check_writable`).
    """
    if not path.strip():
        raise ValueError("the path is empty")
    target = os.path.realpath(path)
    shown = path if target == os.path.abspath(path) else f"{path} (-> {target})"
    for tree in KERNEL_TREES:
        if target == tree or target.startswith(tree + os.sep):
            raise ValueError(f"{shown} is under {tree}, a kernel interface, not a file system")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ValueError(f"{shown}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return target
    raise ValueError(f"{shown} is {_kind(mode)}, not a regular file")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "something else"


def check_writable(template: str) -> None:
    """Raise ``ValueError`` (one line) if the trace could not be written there."""
    path = expand_path(template)
    if not path.strip():
        raise ValueError(f"{template} expands to an empty path")
    path = output_target(path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"directory {directory} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{path} is not writable")
