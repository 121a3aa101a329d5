"""How every file the agent writes reaches the disk: whole or not at all, or appended to.

* :func:`atomic_text` / :func:`atomic_bytes`: the final trace, a merged trace, the HTML report and a
  rewrite of the trace so far.  A temporary file beside the target (same file
  system, so the rename is atomic), written, flushed to the disk, given the
  mode the umask allows, renamed over the target: a crash never leaves half a
  file, and a failure leaves the old one and no temporary.  Only a regular
  file is replaced; a symlink is written through to its target
  (:func:`.paths.output_target`).
* :func:`replaced_by`: the same rename for a file another program writes (the
  compiler of the native hot path).
* The append-only file of the trace so far: :func:`create_appendable`,
  :func:`reopen_appendable`, :func:`append`, :func:`rename`, :func:`remove`.

Each decision (where a temporary goes and how it is created, how the partial
file is created, the mode a file gets) is made once, here.  Only the standard
library at import: the native build loads this file by path, before the
package is importable.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from contextlib import contextmanager
from typing import IO, Any, BinaryIO, ContextManager, Iterator, TextIO, cast

#: Prefix and suffix of the temporary files (dot files: hidden while they exist).
TEMP_PREFIX = ".chainer_autoprof."
TEMP_SUFFIX = ".tmp"


def umask() -> int:
    """The process's umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets: what ``open(path, "w")`` would give it."""
    return 0o666 & ~umask()


@contextmanager
def atomic_file(path: str, binary: bool = False) -> Iterator[IO[Any]]:
    """``with atomic_file(path) as out: out.write(...)``: ``path`` replaced when the block ends.

    Text is UTF-8 (``binary``: bytes).  An exception in the block removes the
    temporary and propagates; the old file stays.  ``ValueError`` (one line)
    for a path that must never be replaced (a directory, a device, ...:
    :func:`.paths.output_target`).
    """
    # the one import of the package: loaded by path (the native build), this is not used
    from .paths import output_target

    target = output_target(path)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX,
                               dir=os.path.dirname(target))
    try:
        out: IO[Any] = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
        with out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, target)
    except BaseException:
        _discard(tmp)
        raise


def atomic_text(path: str) -> ContextManager[TextIO]:
    """:func:`atomic_file` for text."""
    return cast("ContextManager[TextIO]", atomic_file(path))


def atomic_bytes(path: str) -> ContextManager[BinaryIO]:
    """:func:`atomic_file` for bytes."""
    return cast("ContextManager[BinaryIO]", atomic_file(path, binary=True))


@contextmanager
def replaced_by(target: str) -> Iterator[str]:
    """A fresh name beside ``target`` for another program to write; renamed over ``target``
    when the block ends, removed if it raises.  Safe with concurrent writers (a unique name)."""
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{name}.{os.getpid()}.{uuid.uuid4().hex}"
                                  f"{TEMP_SUFFIX}")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        _discard(tmp)


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


# -- the append-only file of the trace so far -------------------------------------------------
def create_appendable(path: str) -> int:
    """Create (or empty) ``path`` for appending; returns its descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)


def reopen_appendable(path: str) -> int:
    """Open the existing ``path`` for appending (after it was replaced whole)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND)


def append(fd: int, data: bytes) -> None:
    """Write all of ``data`` (one ``write`` as a rule: whole records, never interleaved)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def rename(path: str, new_path: str) -> None:
    """The file is now called ``new_path`` (the MPI rank became known, say)."""
    os.replace(path, new_path)


def remove(path: str) -> None:
    """Delete ``path`` if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass
