"""The agent's messages: one line each, on stderr, never on stdout."""

from __future__ import annotations

import sys

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
        sys.stderr.write(f"chainer_autoprof: {msg}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the program
        pass


def error(msg: str, once: bool = True) -> None:
    _emit("error", msg, once)


def warning(msg: str, once: bool = True) -> None:
    _emit("warning", msg, once)


def info(msg: str) -> None:
    _emit("info", msg, False)


def debug(msg: str) -> None:
    _emit("debug", msg, False)
