"""Trace path templates: Nsight's substitutions, and whether a path can be written.

``%p`` pid, ``%h`` host name, ``%q{VAR}`` environment variable (as Nsight
Systems), plus ``%r`` MPI rank (:mod:`.rank`) and ``%%`` a percent sign.

What the agent writes (a trace, a merged trace, an HTML report) only ever
replaces a regular file: a symlink is written through to its target where the
kernel lets this process follow it, and a directory, a device, a FIFO, a
socket or a path on a kernel interface (``/proc``, ``/sys``) is refused with
one line (:func:`.outputs.output_target`), both when the settings are checked and again
when the file is written.  So is a path that names a directory (``dir/``), one
with white space at either end or a control character, and one whose
directory the kernel cannot reach as written (``missing/../x.json``): paths
are never normalized here, the kernel reads them as given.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Mapping

from . import rank
from .outputs import file_kind, output_target

_SUBST = re.compile(r"%(?:q\{([^}]*)\}|(.))")


def expand_path(template: str, pid: int | None = None,
                environ: Mapping[str, str] | None = None, *, rank_number: int | None = None,
                host: str | None = None) -> str:
    """Apply ``%p %h %r %q{VAR} %%`` to ``template`` (unknown ``%x`` kept as is).

    ``pid``, ``rank_number`` and ``host`` stand for this process's where given.
    """
    env = os.environ if environ is None else environ

    def sub(match: re.Match[str]) -> str:
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


def check_directory(directory: str) -> None:
    """``ValueError`` (one line) unless ``directory`` is, as the kernel reads it, a directory
    this process may create files in."""
    directory = directory or os.curdir
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise ValueError(f"directory {directory} does not exist"
                         + _first_missing(directory)) from None
    except OSError as exc:
        raise ValueError(f"directory {directory}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        raise ValueError(f"{directory} is {file_kind(mode)}, not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"directory {directory} is not writable")


def _first_missing(directory: str) -> str:
    """`` (NAME does not exist)`` for the first part of ``directory`` that is not there."""
    parts = directory.split(os.sep)
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end]) or os.sep
        if prefix != directory and not os.path.exists(prefix):
            return f" ({prefix} does not exist)"
    return ""


def check_output(path: str) -> str:
    """Raise ``ValueError`` (one line) if an output (a trace, a merged trace, an HTML report)
    could not be written at ``path``; else return :func:`output_target`'s name for it."""
    target = output_target(path)
    check_directory(os.path.dirname(path))
    if os.path.islink(path):  # written through: replaced where the link leads
        check_directory(os.path.dirname(target))
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{path} (-> {target}) is not writable")
    elif os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{path} is not writable")
    else:
        _check_replaceable(path)
    return target


def _check_replaceable(path: str) -> None:
    """``ValueError`` where ``path`` is another user's file in a sticky directory (``/tmp``):
    the kernel would refuse the rename that replaces it, at the end of the run."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(path) or os.curdir)
    except OSError:
        return
    euid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if parent.st_mode & stat.S_ISVTX and euid not in (0, st.st_uid, parent.st_uid):
        raise ValueError(f"{path} belongs to another user (uid {st.st_uid}) in a sticky "
                         "directory: it cannot be replaced")


def check_writable(template: str) -> None:
    """Raise ``ValueError`` (one line) if the trace could not be written there."""
    path = expand_path(template)
    if not path.strip():
        raise ValueError(f"{template} expands to an empty path")
    check_output(path)
