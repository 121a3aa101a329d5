"""How every file the agent writes reaches the disk: whole or not at all, or appended to.

* :func:`atomic_text` / :func:`atomic_bytes`: the final trace, a merged trace and the HTML
  report.  A temporary file beside the target (same file system, so the
  rename is atomic), written, flushed to the disk, given the mode the umask
  allows, renamed over the target: a crash never leaves half a file, and a
  failure leaves the old one and no temporary.  Only a regular file is
  replaced (:func:`output_target`).  A symlink is written through to
  its target, but only where the kernel itself follows it: the link is opened
  for writing as any program would open it, so the target's permissions and
  ``fs.protected_symlinks`` decide, and the file replaced is the one the
  kernel reached (checked by device and inode), never a name resolved here.
* :class:`PrivateFile`: a file the agent creates for itself and deletes (the
  trace so far).  Created exclusively (``O_EXCL | O_NOFOLLOW``), mode 0600:
  never through a symlink, never someone else's file; only an earlier file of
  this user's at that name (a run that did not end) is replaced.  No
  descriptor is held between writes: each one opens the path again without
  following links and checks that it is still the file created (device and
  inode), so a program that closes every descriptor (``os.closerange``) and
  opens its own files never gets the agent's writes.  Each write first leaves
  the file system's headroom (:func:`check_room`) to the program.
* :func:`replaced_by`: the same rename for a file another program writes (the
  compiler of the native hot path).
* :func:`identity` / :func:`still_ours`: whether a descriptor the agent holds
  across the program's code (the dump server's socket) is still the one it
  opened.

Each decision (where a temporary goes and how it is created, how the partial
file is created and written, the mode a file gets, the headroom) is made
once, here.  Only the standard library at import: the native build loads
this file by path, before the package is importable.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO, ContextManager, Iterator, TextIO, Tuple, Union, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

#: Prefix and suffix of the temporary files (dot files: hidden while they exist).
TEMP_PREFIX = ".chainer_autoprof."
TEMP_SUFFIX = ".tmp"

#: What the trace so far leaves free on its file system for the program: this share of the
#: file system's size, at most HEADROOM_MAX (systemd-journald's default rule for its logs).
HEADROOM_SHARE = 0.15
HEADROOM_MAX = 4 << 30

#: The mode of a file the agent creates for itself (the trace so far, a temporary).
PRIVATE_MODE = 0o600

#: A descriptor's or a file's identity: (device, inode).
FileId = Tuple[int, int]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_WRITE_BUFFER = 1 << 20


class NotOursError(OSError):
    """A path or a descriptor is not (or no longer) the file the agent created; one line."""


class NoRoomError(OSError):
    """Writing would leave its file system less than the headroom; one line."""


def umask() -> int:
    """The process's umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new output gets: what ``open(path, "w")`` would give it."""
    return 0o666 & ~umask()


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a directory``, ``a FIFO``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "something else"


#: Kernel interfaces: files there are not storage, and creating one fails at exit.
KERNEL_TREES = ("/proc", "/sys")


def output_target(path: str) -> str:
    """The regular file that writing ``path`` replaces: ``path``, or a symlink's final target.

    Raises ``ValueError`` (one line) for what must never be replaced or is
    almost surely a typing mistake: an empty path, a path with a space at
    either end or a control character (a newline, a tab), one that names a
    directory (``dir/``, ``dir/.``), a directory, a device, a FIFO, a socket,
    anything under ``/proc`` or ``/sys``, a link the kernel does not let this
    process follow.  The kernel reads the path as given (``ü/../x.json`` needs
    ``ü``); a path that does not exist yet is fine here (its directory is
    checked by :func:`.paths.check_writable`).  The name returned serves to compare
    outputs with inputs: writing (:func:`atomic_file`) leaves following links to the
    kernel.
    """
    if not path.strip():
        raise ValueError("the path is empty")
    if path != path.strip():
        raise ValueError(f"{path!r} begins or ends with white space, which would be part of "
                         "the file name")
    from .one_line import has_control  # a package module: loaded by path, this is not used

    if has_control(path):
        raise ValueError(f"{path!r} holds a control character")
    name = os.path.basename(path)
    if name in ("", ".", ".."):
        raise ValueError(f"{path} names a directory, not a file (a file name such as "
                         f"{os.path.join(path, 'run.json')} is)")
    target = os.path.realpath(path)
    shown = path if target == os.path.abspath(path) else f"{path} (-> {target})"
    for tree in KERNEL_TREES:
        for where in (target, os.path.abspath(path)):
            if where == tree or where.startswith(tree + os.sep):
                raise ValueError(f"{shown} is under {tree}, a kernel interface, not a file "
                                 "system")
    planted = _planted_link(path)
    if planted:
        raise ValueError(planted)
    try:
        mode = os.stat(path).st_mode  # the kernel follows the links, with its protections
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ValueError(f"{shown}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return target
    raise ValueError(f"{shown} is {file_kind(mode)}, not a regular file")


def _planted_link(path: str) -> str | None:
    """Why ``path`` must not be followed, where it is another user's symlink in a sticky
    world-writable directory (``/tmp``): the rule of the kernel's ``fs.protected_symlinks``,
    kept where the kernel's is off (a link of one's own, or of the directory's owner, is
    followed)."""
    try:
        link = os.lstat(path)
        if not stat.S_ISLNK(link.st_mode):
            return None
        parent = os.stat(os.path.dirname(path) or os.curdir)
    except OSError:
        return None
    shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    euid = os.geteuid() if hasattr(os, "geteuid") else link.st_uid
    if not shared or link.st_uid in (euid, parent.st_uid):
        return None
    return (f"{path} is a symlink of another user's (uid {link.st_uid}) in a sticky "
            "world-writable directory: not followed (the rule of fs.protected_symlinks)")


# -- descriptors --------------------------------------------------------------------------------
def identity(fd: int) -> FileId | None:
    """(device, inode) of what descriptor ``fd`` refers to now (``None``: closed)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def still_ours(fd: int, ident: FileId | None) -> bool:
    """Whether ``fd`` still refers to the file or socket ``ident`` (the program may have
    closed it, and its number gone to a file of the program's)."""
    return ident is not None and identity(fd) == ident


def close_if_ours(fd: int, ident: FileId | None) -> None:
    """Close ``fd`` only if it is still ours: a number the program reused stays open."""
    if still_ours(fd, ident):
        try:
            os.close(fd)
        except OSError:
            pass


def _write_all(fd: int, ident: FileId, data: bytes, name: str) -> None:
    """Write all of ``data`` to ``fd``, checking before each ``write`` that it is still ours."""
    view = memoryview(data)
    while view:
        if not still_ours(fd, ident):
            raise NotOursError(f"the descriptor of {name} was closed by the program")
        written = os.write(fd, view)
        view = view[written:]


class _Owned(io.RawIOBase):
    """A descriptor the agent opened, written only while it is still that file."""

    def __init__(self, fd: int, ident: FileId, name: str) -> None:
        super().__init__()
        self.fd, self.ident, self.name = fd, ident, name

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, b: ReadableBuffer) -> int:
        if not still_ours(self.fd, self.ident):
            raise NotOursError(f"the descriptor of {self.name} was closed by the program")
        return os.write(self.fd, b)

    def finish(self, mode: int) -> None:
        """On the disk, with ``mode``, before the rename."""
        if not still_ours(self.fd, self.ident):
            raise NotOursError(f"the descriptor of {self.name} was closed by the program")
        os.fsync(self.fd)
        os.fchmod(self.fd, mode)

    def close(self) -> None:
        if not self.closed:
            close_if_ours(self.fd, self.ident)
        super().close()


def _temporary(directory: str) -> tuple[int, str, FileId]:
    """A new temporary file in ``directory``: created exclusively, not through a link, 0600."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=directory or os.curdir)
    st = os.fstat(fd)
    return fd, tmp, (st.st_dev, st.st_ino)


def _is(path: str, ident: FileId) -> bool:
    """Whether ``path`` itself (not a link's target) is the file ``ident``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def _unlink_if(path: str, ident: FileId) -> bool:
    """Delete ``path`` if it is still the file ``ident`` (ours); whether it was deleted."""
    if not _is(path, ident):
        return False
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def _rename_if(tmp: str, ident: FileId, target: str) -> None:
    """Rename our ``tmp`` over ``target`` (the entry itself: a link there is replaced)."""
    if not _is(tmp, ident):
        raise NotOursError(f"the temporary file {tmp} was replaced")
    os.replace(tmp, target)


# -- whole files ---------------------------------------------------------------------------------
def _through_link(path: str) -> tuple[str, FileId | None]:
    """The file writing ``path`` replaces, and the identity of one created to get there.

    ``path`` itself unless it is a symlink.  A symlink is opened for writing
    by the kernel, which follows it as for any program (the target's
    permissions, ``fs.protected_symlinks``); a dangling one creates its
    target where the kernel allows it.  The file reached is the one replaced:
    its name, resolved here, is checked to be that very file.
    """
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return path, None
    except FileNotFoundError:
        return path, None
    flags = os.O_WRONLY | _NOCTTY | _NONBLOCK | _CLOEXEC
    created: FileId | None = None
    target = os.path.realpath(path)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:  # the kernel followed it to nothing: the target is created
        fd = os.open(target, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, file_mode())
        created = identity(fd)
    except PermissionError as exc:
        raise PermissionError(exc.errno, f"{path} is a symlink (to {target}) that the kernel "
                              "does not let this process write through (the target's "
                              "permissions, or fs.protected_symlinks)") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    reached = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} (-> {target}) is {file_kind(st.st_mode)}, not a regular file")
    try:  # the name replaced is the file the kernel reaches through the link
        same = all((s.st_dev, s.st_ino) == reached for s in (os.stat(target), os.stat(path)))
    except OSError:
        same = False
    if not same:
        if created is not None:
            _unlink_if(target, created)
        raise ValueError(f"{path}: the link changed while it was followed")
    return target, created


@contextmanager
def atomic_file(path: str, binary: bool = False) -> Iterator[Union[TextIO, BinaryIO]]:
    """``with atomic_file(path) as out: out.write(...)``: ``path`` replaced when the block ends.

    Text is UTF-8 (``binary``: bytes).  An exception in the block removes the
    temporary and propagates; the old file stays.  ``ValueError`` (one line)
    for a path that must never be replaced (a directory, a device, ...:
    :func:`output_target`); ``OSError`` where the kernel refuses.
    """
    output_target(path)
    target, created = _through_link(path)
    try:
        fd, tmp, ident = _temporary(os.path.dirname(target))
    except BaseException:
        if created is not None:
            _unlink_if(target, created)
        raise
    raw = _Owned(fd, ident, tmp)
    try:
        buffered = io.BufferedWriter(raw, _WRITE_BUFFER)
        out: TextIO | BinaryIO = (buffered if binary else
                                  io.TextIOWrapper(buffered, encoding="utf-8"))
        with out:
            yield out
            out.flush()
            raw.finish(file_mode())
        _rename_if(tmp, ident, target)
    except BaseException:
        raw.close()
        _unlink_if(tmp, ident)
        if created is not None:
            _unlink_if(target, created)
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
        try:
            os.unlink(tmp)
        except OSError:
            pass


# -- the headroom -------------------------------------------------------------------------------
def headroom(total: int) -> int:
    """Bytes the trace so far leaves free on a file system of ``total`` bytes."""
    return min(int(total * HEADROOM_SHARE), HEADROOM_MAX)


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MB"


def check_room(fd: int, size: int, name: str) -> None:
    """Raise :class:`NoRoomError` when writing ``size`` bytes on the file system of ``fd``
    would leave it less free than :func:`headroom` (what the program may still need)."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    keep = headroom(total)
    if free - size < keep:
        raise NoRoomError(f"{_size(free)} free of {_size(total)} on the file system of {name}; "
                          f"writing {_size(size)} more would leave less than the "
                          f"{_size(keep)} kept for the program "
                          f"({HEADROOM_SHARE:.0%} of it, at most {_size(HEADROOM_MAX)})")


def has_room(path: str) -> bool:
    """Whether the file system of ``path`` still has its headroom (``True`` if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return True
    return st.f_bavail * st.f_frsize >= headroom(st.f_blocks * st.f_frsize)


# -- files the agent creates for itself ---------------------------------------------------------
class PrivateFile:
    """A file of the agent's own (the trace so far), known by its identity, not a descriptor.

    :meth:`create` makes it (exclusively, 0600), :meth:`append` and
    :meth:`replace` write it (each checking the headroom first), :meth:`rename`
    moves it, :meth:`remove` deletes it: each only while the path is still the
    file created.  :class:`NotOursError` when it is not, :class:`NoRoomError` when the
    file system is nearly full (nothing written), ``OSError`` otherwise.
    """

    def __init__(self, path: str, ident: FileId) -> None:
        self.path = path
        self.ident = ident

    @classmethod
    def create(cls, path: str, data: bytes) -> PrivateFile:
        """Create ``path`` holding ``data``: never through a link, never another's file."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        try:
            fd = os.open(path, flags, PRIVATE_MODE)
        except FileExistsError:
            _remove_leftover(path)
            try:
                fd = os.open(path, flags, PRIVATE_MODE)
            except FileExistsError:
                raise NotOursError(f"{path} was created by someone else meanwhile") from None
        st = os.fstat(fd)
        made = cls(path, (st.st_dev, st.st_ino))
        try:
            check_room(fd, len(data), path)
            _write_all(fd, made.ident, data, path)
        except BaseException:
            close_if_ours(fd, made.ident)
            _unlink_if(path, made.ident)
            raise
        close_if_ours(fd, made.ident)
        return made

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
        except OSError as exc:
            if os.path.islink(self.path):
                raise NotOursError(f"{self.path} was replaced by a symlink") from None
            if isinstance(exc, FileNotFoundError):
                raise NotOursError(f"{self.path} was removed") from None
            raise
        if not still_ours(fd, self.ident):
            os.close(fd)
            raise NotOursError(f"{self.path} was replaced by another file")
        return fd

    def append(self, data: bytes) -> None:
        """Append ``data`` (whole records: one ``write`` as a rule)."""
        fd = self._open()
        try:
            check_room(fd, len(data), self.path)
            _write_all(fd, self.ident, data, self.path)
        finally:
            close_if_ours(fd, self.ident)

    def replace(self, data: bytes) -> None:
        """Replace the file with ``data``, atomically (a new private file renamed over it)."""
        fd, tmp, ident = _temporary(os.path.dirname(self.path))
        try:
            check_room(fd, len(data), self.path)
            _write_all(fd, ident, data, tmp)
            if not still_ours(fd, ident):
                raise NotOursError(f"the descriptor of {tmp} was closed by the program")
            os.fsync(fd)
            close_if_ours(fd, ident)
            if not _is(self.path, self.ident):
                raise NotOursError(f"{self.path} was replaced by another file")
            _rename_if(tmp, ident, self.path)
        except BaseException:
            close_if_ours(fd, ident)
            _unlink_if(tmp, ident)
            raise
        self.ident = ident

    def rename(self, new_path: str) -> None:
        """The file is now called ``new_path`` (an earlier file of this user's there replaced)."""
        if new_path == self.path:
            return
        try:
            os.lstat(new_path)
        except FileNotFoundError:
            pass
        else:
            _check_leftover(new_path)
        if not _is(self.path, self.ident):
            raise NotOursError(f"{self.path} was replaced by another file")
        os.replace(self.path, new_path)
        self.path = new_path

    def remove(self) -> bool:
        """Delete the file if the path is still it; whether it was deleted."""
        return _unlink_if(self.path, self.ident)


def _check_leftover(path: str) -> None:
    """Raise :class:`NotOursError` unless ``path`` is a regular file of this user's (an earlier
    run's trace so far, which the new one replaces)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise NotOursError(f"{path} is a symlink (to {os.readlink(path)}): the agent writes "
                           "there only a file it creates itself")
    if not stat.S_ISREG(st.st_mode):
        raise NotOursError(f"{path} is {file_kind(st.st_mode)}, not a regular file")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise NotOursError(f"{path} belongs to another user (uid {st.st_uid}): the agent "
                           "writes there only a file it creates itself")


def _remove_leftover(path: str) -> None:
    """Delete an earlier run's file of this user's at ``path`` (:class:`NotOursError`: another)."""
    try:
        _check_leftover(path)
    except FileNotFoundError:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
