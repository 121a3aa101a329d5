"""The summary's text as its reader takes it: settings named as they were given, lines that fit.

Two passes over a finished text, applied where it is written (the summary at
exit, ``report``, the HTML page):

* :func:`hint_form`: a run started by the launcher (``python -m
  chainer_autoprof ... train.py``) is told its settings as launcher flags
  (``--granularity link``), a run activated from the environment as variables
  (``CHAINER_PROF_GRANULARITY=link``): what the user would type next.
* :func:`wrap_long_lines`: a line longer than :data:`LONG` characters (a
  verdict's evidence, an advice's fix) is wrapped at :data:`WIDTH`, its
  continuation indented under its text; tables and the title (the command,
  kept whole so it can be pasted) are shorter or left as they are.
"""

from __future__ import annotations

import re
import sys
import textwrap
from typing import Mapping

from .settings import BY_NAME, PREFIX

#: Lines longer than this (about what a terminal shows of a line) are wrapped ...
LONG = 200
#: ... to this width.
WIDTH = 100

_HINT = re.compile(re.escape(PREFIX) + r"([A-Z0-9_]+)(?:=([^\s,;)'\"]+))?")
#: The start of a list item (``-> ``, ``note: ``) or of a labelled line (``agent overhead  ``),
#: continued under its text.
_MARKER = re.compile(r"^\s*(?:[-=]>\s|[-*]\s|[a-z]+:\s+|[a-zA-Z][\w ]{0,30}?\s{2,}(?=\S))?")
_LAUNCHER = re.compile(r"(^|[\s/])(-m chainer_autoprof|chainer-autoprof)(\s|$)")


def launched(meta: Mapping[str, object]) -> bool:
    """Whether the run of ``meta`` was started by the launcher (its command says so)."""
    return bool(_LAUNCHER.search(str(meta.get("command", ""))))


def launched_here() -> bool:
    """Whether the launcher started this interpreter (its settings came as flags)."""
    argv = getattr(sys, "orig_argv", None) or sys.argv
    return launched({"command": " ".join(str(a) for a in argv)})


def hint_form(text: str, launcher: bool) -> str:
    """``text`` with every ``CHAINER_PROF_NAME=VALUE`` as the launcher's ``--name VALUE``,
    every bare ``CHAINER_PROF_NAME`` as ``--name`` (``launcher``), or unchanged."""
    if not launcher:
        return text

    def flag(match: re.Match[str]) -> str:
        setting = BY_NAME.get(match.group(1).lower())
        if setting is None:
            return match.group(0)
        value = match.group(2)
        if value is None:
            return setting.flag
        tail = value[len(value.rstrip(".:")):]  # a sentence's full stop or colon stays
        value = value[:len(value) - len(tail)]
        return f"{setting.flag} {value}{tail}" if value else match.group(0)

    return _HINT.sub(flag, text)


def wrap_long_lines(text: str, long: int = LONG, width: int = WIDTH) -> str:
    """``text`` with each line over ``long`` characters but the first wrapped at ``width``."""
    lines = text.split("\n")
    out = lines[:1]
    for line in lines[1:]:
        if len(line) <= long:
            out.append(line)
            continue
        marker = _MARKER.match(line)
        indent = " " * (len(marker.group(0)) if marker else 0)
        out += textwrap.wrap(line, width=max(width, len(indent) + 40),
                             subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False, drop_whitespace=True) or [line]
    return "\n".join(out)


def readable(text: str, meta: Mapping[str, object]) -> str:
    """A summary's text as it is shown: hints in the form of the run's start, lines that fit."""
    return wrap_long_lines(hint_form(text, launched(meta)))
