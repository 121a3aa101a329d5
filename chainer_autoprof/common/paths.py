"""Trace path templates: Nsight's substitutions, and whether a path can be written.

``%p`` pid, ``%h`` host name, ``%q{VAR}`` environment variable (as Nsight
Systems), plus ``%r`` MPI rank (:mod:`.rank`) and ``%%`` a percent sign.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from . import rank

_SUBST = re.compile(r"%(?:q\{([^}]*)\}|(.))")


def expand_path(template: str, pid: int | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """Apply ``%p %h %r %q{VAR} %%`` to ``template`` (unknown ``%x`` kept as is)."""
    env = os.environ if environ is None else environ

    def sub(match: re.Match) -> str:
        var, code = match.group(1), match.group(2)
        if var is not None:
            return env.get(var, "")
        if code == "p":
            return str(os.getpid() if pid is None else pid)
        if code == "h":
            import socket  # only for %h: not on the start-up path otherwise

            return socket.gethostname()
        if code == "r":
            return str(rank.number(environ))
        if code == "%":
            return "%"
        return match.group(0)

    return os.path.expanduser(_SUBST.sub(sub, template))


def check_writable(template: str) -> None:
    """Raise ``ValueError`` (one line) if the trace could not be written there."""
    path = expand_path(template)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory")
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"directory {directory} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{path} is not writable")
