"""Text from outside (a path, a script name, a command line) shown on one line,
and every text the agent writes for people made safe to show.

A file name may hold a newline, a tab or an escape sequence; printed as is,
it breaks the summary's header line or a one-line message, or moves the
terminal's cursor.  :func:`one_line` escapes those characters as Python
does in a string's ``repr`` (``\\n``, ``\\t``, ``\\x1b``); :func:`command_line`
quotes a command as a POSIX shell would read it back (``$'a\\nb.py'`` for a
name with a newline), so the text can be pasted into a shell.

Names come from the program and from traces read back (link and class names,
script and thread names, kernel names, paths): a name holding ``ESC ] 0 ;
... BEL`` would retitle the user's terminal, ``ESC [ 2 J`` clear it.  Every
text that leaves the agent for a terminal or a page -- the summary, ``report``,
``merge``, ``dump``, the stall reports, the agent's one-line messages, the
HTML page -- goes through :func:`printable` where it is written
(:func:`write`): its lines kept, every other control character escaped.
"""

from __future__ import annotations

import shlex
from typing import Iterable, TextIO

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


#: Control characters (C0, DEL, C1) and the Unicode line and paragraph separators.
_TABLE = {code: _escape(chr(code))
          for code in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}


#: The same but for the newline (a text of several lines keeps them), and with the
#: bidirectional overrides and isolates, which reorder what a terminal or a page shows.
_LINES_KEPT = {**{code: text for code, text in _TABLE.items() if code != 0x0A},
               **{code: f"\\u{code:04x}" for code in [*range(0x202A, 0x202F),
                                                     *range(0x2066, 0x206A)]}}


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character that :func:`one_line` escapes."""
    return any(ord(c) in _TABLE for c in text)


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\t``, ``\\x1b``)."""
    return text.translate(_TABLE)


def printable(text: str) -> str:
    """``text`` with every control character but the newline escaped (``\\x1b``,
    ``\\r``, ``\\x9b``): what may reach a terminal or a page."""
    return text.translate(_LINES_KEPT)


def write(stream: TextIO, text: str) -> None:
    """Write ``text`` to ``stream`` (a terminal, a pipe, a file people read) as
    :func:`printable` makes it: the output boundary of every text the agent shows."""
    stream.write(printable(text))


def quote(arg: str) -> str:
    """One argument as a POSIX shell reads it back: ``shlex.quote``, or ``$'...'`` with
    escapes where it holds a control character."""
    if not has_control(arg):
        return shlex.quote(arg)
    body = arg.replace("\\", "\\\\").replace("'", "\\'").translate(_TABLE)
    return f"$'{body}'"


def command_line(argv: Iterable[str]) -> str:
    """A command on one line, each argument quoted as a shell reads it back."""
    return " ".join(quote(str(arg)) for arg in argv)
