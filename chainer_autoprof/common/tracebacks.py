"""Tracebacks without the agent's frames.

The native hot path puts no Python frame of ours between the user's frames.
The pure-Python one keeps one per wrapped call; where an uncaught exception is
printed (the launcher's report, and the ``sys.excepthook`` the agent puts in
front of the program's with that implementation) those frames are left out,
so that the traceback reads as under plain ``python``.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Callable, Optional, Type

#: The package's directory: a frame whose code lives here is the agent's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_own(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs the agent's code (not a script that happens to live here)."""
    filename = frame.f_code.co_filename
    return (os.path.isabs(filename) and filename.startswith(PACKAGE_DIR + os.sep)
            and frame.f_globals.get("__name__") != "__main__")


def without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` with every entry of the agent's frames taken out of the chain."""
    while tb is not None and is_own(tb.tb_frame):
        tb = tb.tb_next
    entry = tb
    while entry is not None:
        following = entry.tb_next
        while following is not None and is_own(following.tb_frame):
            following = following.tb_next
        entry.tb_next = following
        entry = following
    return tb


def drop_own_frames(exc: BaseException) -> None:
    """Take the agent's frames out of ``exc``'s traceback and of those it was raised from."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = without_own_frames(current.__traceback__)
        todo += [current.__cause__, current.__context__]


#: An exception hook (``sys.excepthook``'s signature).
ExceptHook = Callable[[Type[BaseException], BaseException, Optional[types.TracebackType]], object]

_previous: ExceptHook | None = None


def _excepthook(kind: type[BaseException], value: BaseException,
                tb: types.TracebackType | None) -> None:
    try:
        if value is not None:
            value.__traceback__ = tb
            drop_own_frames(value)
            tb = value.__traceback__
    except Exception:  # noqa: BLE001
        pass  # printed as it was
    (_previous or sys.__excepthook__)(kind, value, tb)


def install_excepthook() -> None:
    """Print uncaught exceptions without the agent's frames (in front of the current hook)."""
    global _previous
    if sys.excepthook is _excepthook:
        return
    _previous = sys.excepthook
    sys.excepthook = _excepthook


def uninstall_excepthook() -> None:
    """Give the previous hook back (unless someone replaced ours since)."""
    global _previous
    if sys.excepthook is _excepthook:
        sys.excepthook = _previous or sys.__excepthook__
    _previous = None
