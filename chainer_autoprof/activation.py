"""Start-up activation: what the ``chainer_autoprof.pth`` line runs.

The installed ``chainer_autoprof.pth`` holds one line that scans
``os.environ`` for a ``CHAINER_PROF_*`` name and, only when there is one,
calls :func:`activate`.  An interpreter without such a variable imports
nothing of ours.  :func:`activate` starts the agent from the environment
(:func:`chainer_autoprof.agent.activate_from_env`): bad settings leave it off
with one line on stderr, and the program runs.

:func:`activate` is idempotent: in some virtual environments the site
directory, and so the ``.pth`` line, is processed twice at start-up.
"""

from __future__ import annotations

import os
import sys

__all__ = ["activate", "launcher_process"]

_done = False

#: Names the launcher runs under: ``python -m chainer_autoprof`` and the console script.
LAUNCHER_MODULE = "chainer_autoprof"
LAUNCHER_SCRIPTS = ("chainer-autoprof", "chainer-autoprof.exe", "chainer-autoprof-script.py")


def launcher_process() -> bool:
    """Whether this interpreter is starting the launcher (which installs the agent itself).

    The launcher validates its flags and the environment before the user's
    script starts, so start-up activation leaves the work to it.  Detected from
    the console script's name, or ``-m chainer_autoprof`` in ``sys.orig_argv``
    (Python 3.10 and newer; older ones fall back to the launcher re-installing).
    """
    argv = getattr(sys, "argv", None) or [""]
    if os.path.basename(argv[0]) in LAUNCHER_SCRIPTS:
        return True
    if argv[0] != "-m":
        return False
    orig: list[str] = getattr(sys, "orig_argv", None) or []
    for i, arg in enumerate(orig[1:], 1):
        if arg == "-m":
            return i + 1 < len(orig) and orig[i + 1] == LAUNCHER_MODULE
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:] == LAUNCHER_MODULE
    return False


def _switched_off() -> bool:
    from .common.settings import BY_NAME  # only where a CHAINER_PROF_* variable is set

    raw = os.environ.get(BY_NAME["enable"].env)
    if raw is None:
        return False
    try:
        return not BY_NAME["enable"].parse(raw)
    except ValueError:
        return False  # reported by activate_from_env's validation


def activate() -> None:
    """Start the agent from ``CHAINER_PROF_*`` variables; never raises, never writes stdout."""
    global _done
    if _done:
        return
    _done = True
    try:
        if _switched_off() or launcher_process():
            return
        from .agent import activate_from_env  # likewise: the .pth line imports this module

        activate_from_env()
    except Exception as exc:  # interpreter start-up must never fail because of us  # noqa: BLE001
        try:
            from .common.one_line import write

            write(sys.stderr, f"chainer_autoprof: start-up activation failed "
                  f"({type(exc).__name__}: {exc}); the agent stays off\n")
        except Exception:  # stderr itself failed: nowhere to say it  # noqa: BLE001
            pass
