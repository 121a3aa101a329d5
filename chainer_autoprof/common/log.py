"""The agent's messages: one line each, on stderr, never on stdout."""

from __future__ import annotations

import os
import sys

from .one_line import write

#: Test-only: an error of the agent's own that the reporting code contains (a check of the
#: advice or the verdict that raises, a summary section) is raised instead, so a test fails.
ENV_TEST_STRICT = "CHAINER_AUTOPROF_TEST_STRICT"

_LEVELS = {"error": 0, "warning": 1, "info": 2, "debug": 3}
_level = 1
_said: set[str] = set()


def set_level(name: str) -> None:
    global _level
    _level = _LEVELS[name]


def enabled(name: str) -> bool:
    return _LEVELS[name] <= _level


def _emit(level: str, msg: str, once: bool) -> None:
    if _LEVELS[level] > _level:
        return
    if once:
        if msg in _said:
            return
        _said.add(msg)
    try:
        write(sys.stderr, f"chainer_autoprof: {msg}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the program  # noqa: BLE001
        pass


def error(msg: str, once: bool = True) -> None:
    _emit("error", msg, once)


def warning(msg: str, once: bool = True) -> None:
    _emit("warning", msg, once)


def info(msg: str) -> None:
    _emit("info", msg, False)


def debug(msg: str) -> None:
    _emit("debug", msg, False)


def contained(what: str, exc: BaseException) -> str:
    """A bug of ours, caught so that the program and its report go on: the one line to show
    in place of ``what``.  Under the tests (``CHAINER_AUTOPROF_TEST_STRICT=1``) it is raised
    again instead, so that it fails them rather than vanish; call it in an ``except`` block."""
    if os.environ.get(ENV_TEST_STRICT) == "1":
        raise exc
    return f"{what} left out ({type(exc).__name__}: {exc})"
