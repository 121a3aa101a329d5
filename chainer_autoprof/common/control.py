"""The control socket of a profiled process: where it listens, who may ask, and the message format.

Every process with the agent listens on a Unix socket of its own, served by
a background thread (:mod:`..lifecycle.dump_server`), so it answers while its
main thread is blocked in C (an MPI collective, a queue ``get``, a CUDA
synchronization) and without any signal the program may use itself.
``chainer-autoprof dump PID`` (:mod:`..report.dump`) connects to it.

* **Where.**  A socket file ``PID.sock`` in a directory that only its user
  can create files in: ``$XDG_RUNTIME_DIR/chainer_autoprof`` (the login
  session's private directory), else ``$TMPDIR/chainer_autoprof-UID``, else
  ``/tmp/chainer_autoprof-UID``.  A directory is used only when it is a real
  directory (not a symbolic link) owned by the user, with no access for
  anyone else (made so when it is ours).  No name in a namespace every user
  shares (Linux's abstract sockets): no one can take a process's socket
  first.  Where another user has taken the directory's name, a private
  directory of a random name beside it (``chainer_autoprof-UID-XXXXXXXX``)
  serves instead, and the process says so in one line.
* **Who.**  The directory lets only its user (and root) reach the socket; the
  server checks its peer with ``SO_PEERCRED`` too.  The client uses a socket
  only when its directory and file belong to the process's user, and only a
  server that is the process it asked (``SO_PEERCRED``).
* **Finding it.**  ``dump PID`` looks where that process would listen (from
  its own environment, ``/proc/PID/environ``, and the client's) and, on
  Linux, among the bound sockets (``/proc/net/unix``); ``dump`` alone asks
  the user's own processes only.
* **Messages.**  One JSON object each way, the request ending with a newline,
  the answer with the end of the connection.

Every way of not reaching a process is a :class:`ControlError` whose text
says what went wrong (no such process, another user's, no socket, a socket
no one serves, a server that is another process, an answer cut short).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .typedefs import JsonObject

#: The directory's name in ``$XDG_RUNTIME_DIR``; elsewhere ``chainer_autoprof-UID``.
DIR_NAME = "chainer_autoprof"
SUFFIX = ".sock"
LINUX = sys.platform.startswith("linux")
#: The largest answer accepted (a report with every thread's stack is a few kB).
MAX_MESSAGE = 16 << 20
#: The longest path a Unix socket can be bound to (``sun_path``, less its final NUL).
MAX_PATH = 107
#: The system's shared temporary directory, the last place tried.
SYSTEM_TMP = "/tmp"


class ControlError(Exception):
    """A process could not be reached; ``str(err)`` says what went wrong, in one line."""


# -- where ----------------------------------------------------------------------------
def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` where the name is unknown."""
    try:
        import pwd  # not on every platform

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def candidate_dirs(uid: int, environ: Mapping[str, str]) -> list[str]:
    """The directories a process of ``uid`` with ``environ`` tries, in order."""
    dirs = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        dirs.append(os.path.join(runtime, DIR_NAME))
    for base in (environ.get("TMPDIR", ""), SYSTEM_TMP):
        if os.path.isabs(base):
            dirs.append(os.path.join(base, f"{DIR_NAME}-{uid}"))
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs))


def check_private(path: str, uid: int) -> str | None:
    """Why directory ``path`` must not hold the sockets of ``uid``'s processes (``None``: fine)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(uid)}"
    if st.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check_socket(path: str, uid: int) -> str | None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    if st.st_uid != uid:
        return f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(uid)}"
    return None


def _make_private(path: str) -> str | None:
    """Create directory ``path`` for this user's sockets, or say why it cannot hold them."""
    uid = os.geteuid()
    if os.path.basename(path) == DIR_NAME:  # in $XDG_RUNTIME_DIR: only in one of our own
        try:
            parent = os.lstat(os.path.dirname(path))
        except OSError as exc:
            return f"cannot create {path}: {exc.strerror or exc}"
        if parent.st_uid != uid or not stat.S_ISDIR(parent.st_mode):
            return f"cannot create {path}: {os.path.dirname(path)} is not a directory of yours"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror or exc}"
    problem = check_private(path, uid)
    if problem is not None and "open to other users" in problem:  # only said of our own
        try:  # ours, but open to others (made with another umask, or by hand): close it
            os.chmod(path, 0o700)
            problem = check_private(path, uid)
        except OSError:
            pass
    return problem


@dataclass
class Listening:
    """A socket bound and listening, where, and what had to be worked around to get there."""

    sock: socket.socket
    path: str
    #: a directory of a random name made because the usual one was taken: removed at the end
    own_dir: str | None = None
    notes: list[str] = field(default_factory=list)


def listen(backlog: int = 8) -> Listening:
    """Bind and listen on this process's control socket; raises :class:`ControlError` (why).

    A usual directory that someone else holds (another user's, a symbolic
    link) is passed over and named in the result's ``notes``, to be said.
    """
    uid, pid = os.geteuid(), os.getpid()
    problems: list[str] = []
    taken: list[str] = []  # usual directories another user (or a link) holds
    for directory in candidate_dirs(uid, os.environ):
        problem = _make_private(directory)
        if problem is None:
            path = os.path.join(directory, f"{pid}{SUFFIX}")
            try:
                sock = _bind(path, backlog)
            except OSError as exc:
                problems.append(f"cannot listen in {directory}: {exc.strerror or exc}")
                continue
            return Listening(sock, path, None, _passed_over(problems, taken, directory))
        if not problem.startswith("cannot create"):
            taken.append(directory)
        problems.append(problem)
    for directory in taken:  # someone else holds the name: a private one of a random name
        try:
            own = tempfile.mkdtemp(prefix=f"{os.path.basename(directory)}-",
                                   dir=os.path.dirname(directory))
        except OSError:
            continue
        path = os.path.join(own, f"{pid}{SUFFIX}")
        try:
            sock = _bind(path, backlog)
        except OSError as exc:
            problems.append(f"cannot listen in {own}: {exc.strerror or exc}")
            with contextlib.suppress(OSError):
                os.rmdir(own)
            continue
        return Listening(sock, path, own, _passed_over(problems, taken, own))
    raise ControlError("; ".join(problems) or "no directory to listen in")


def _passed_over(problems: list[str], taken: list[str], used: str) -> list[str]:
    """The line to say when a usual directory was someone else's (``[]``: none was)."""
    if not taken:
        return []
    said = [p for p in problems if any(p.startswith(t + " ") for t in taken)]
    return [f"{'; '.join(said)}: listening in {used} instead (remove "
            f"{' and '.join(taken)}, or ask the owner to)"]


def _bind(path: str, backlog: int) -> socket.socket:
    if len(os.fsencode(path)) > MAX_PATH:
        raise OSError(0, f"the socket path {path} is longer than {MAX_PATH} bytes")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by an earlier process with this pid (the directory is ours)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def unlisten(listening: Listening, sweep: bool = False) -> None:
    """Remove the socket file (and a directory made for it); the socket is closed by the caller.
    ``sweep`` (a run's first process, at its end): also those its directory holds that no
    process has bound (:func:`sweep_left`)."""
    with contextlib.suppress(OSError):
        os.unlink(listening.path)
    if sweep:
        sweep_left(os.path.dirname(listening.path))
    if listening.own_dir is not None:
        with contextlib.suppress(OSError):
            os.rmdir(listening.own_dir)


def sweep_left(directory: str) -> int:
    """Remove the control sockets in ``directory`` (this user's own) that no process has bound
    now: left by agents that died at once by a signal, as a pool's workers do when it ends
    them with SIGTERM, or were killed.  Linux only (``/proc/net/unix`` says what is bound);
    how many were removed.  Each file is looked at before what is bound is read, and removed
    only if it is still the same file (a process of the same pid that binds anew after the
    read makes a new one)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    seen: dict[str, int] = {}  # path -> inode, of our sockets named as control sockets
    for name in names:
        if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid():
                    seen[path] = st.st_ino
    bound = _bound_paths() if seen else None
    if bound is None:
        return 0
    removed = 0
    for path in seen.keys() - set(bound):
        try:
            if os.lstat(path).st_ino != seen[path]:
                continue
            os.unlink(path)
        except OSError:
            continue
        removed += 1
    return removed


# -- who -------------------------------------------------------------------------------
def _peer(conn: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the connected peer, where the system says (Linux)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None  # elsewhere the private directory is the only check
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def peer_allowed(conn: socket.socket) -> bool:
    """Whether the connected peer runs as this process's user (or root)."""
    peer = _peer(conn)
    return peer is None or peer[1] in (0, os.geteuid())


# -- finding a process's socket ----------------------------------------------------------
def _process_uid(pid: int) -> int | None:
    """The user ``pid`` runs as; ``None`` where unknown; raises ControlError if there is none."""
    if LINUX:
        try:
            return os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            raise ControlError("no such process") from None
        except OSError:
            return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ControlError("no such process") from None
    except PermissionError:
        raise ControlError("it runs as another user, not as you: only its own user and "
                           "root can ask it") from None
    return None


def _process_environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with, where readable (Linux; its user's or root)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def bound_sockets() -> dict[int, list[str]]:
    """Linux: the control socket paths bound now (``/proc/net/unix``), per pid in their name."""
    found: dict[int, list[str]] = {}
    for path in _bound_paths() or []:
        found.setdefault(int(os.path.basename(path)[:-len(SUFFIX)]), []).append(path)
    return found


def _bound_paths() -> list[str] | None:
    """Linux: the control socket paths bound now (``/proc/net/unix``); ``None`` where that
    cannot be read (another system, no /proc)."""
    if not LINUX:
        return None
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    found = []
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) < 8 or not fields[7].startswith("/"):
            continue
        path = fields[7]
        directory, name = os.path.split(path)
        stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
        if stem.isdigit() and os.path.basename(directory).startswith(DIR_NAME):
            found.append(path)
    return found


def _candidate_paths(pid: int, uid: int, bound: list[str]) -> list[str]:
    paths = []
    for environ in (_process_environ(pid), os.environ):
        paths += [os.path.join(d, f"{pid}{SUFFIX}") for d in candidate_dirs(uid, environ)]
    return list(dict.fromkeys(paths + bound))


def locate(pid: int) -> str:
    """The control socket of process ``pid``; raises :class:`ControlError` saying why none."""
    me = os.geteuid()
    uid = _process_uid(pid)
    if uid is not None and uid != me and me != 0:
        raise ControlError(f"it runs as {user_name(uid)}, not as you ({user_name(me)}): only "
                           "its own user and root can ask it")
    owner = me if uid is None else uid
    looked: list[str] = []
    problems: list[str] = []
    for path in _candidate_paths(pid, owner, bound_sockets().get(pid, [])):
        directory = os.path.dirname(path)
        looked.append(directory)
        if not os.path.lexists(path):
            continue
        problem = check_private(directory, owner) or _check_socket(path, owner)
        if problem is None:
            return path
        problems.append(problem)
    if problems:
        raise ControlError("no usable control socket: " + "; ".join(problems))
    where = ", ".join(dict.fromkeys(looked))
    raise ControlError(f"no agent listens there (no control socket in {where}): not running "
                       "with chainer_autoprof, its agent is off, or it could not listen "
                       "(then it said why on its stderr)")


def own_processes() -> dict[int, str]:
    """This user's processes on this host whose agent listens now: pid -> socket path."""
    me = os.geteuid()
    found: dict[int, str] = {}
    bound = bound_sockets()
    paths = [p for ps in bound.values() for p in ps]
    if not LINUX:  # no list of bound sockets: whatever lies in this user's directories
        for directory in candidate_dirs(me, os.environ):
            try:
                paths += [os.path.join(directory, n) for n in sorted(os.listdir(directory))]
            except OSError:
                continue
    for path in paths:
        name = os.path.basename(path)
        stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
        if not stem.isdigit() or int(stem) in found or int(stem) == os.getpid():
            continue
        pid = int(stem)
        if check_private(os.path.dirname(path), me) or _check_socket(path, me):
            continue  # another user's, or not a socket of ours
        try:
            if _process_uid(pid) not in (me, None):
                continue
        except ControlError:
            continue  # gone
        found[pid] = path
    return dict(sorted(found.items()))


# -- messages ---------------------------------------------------------------------------
def send(conn: socket.socket, message: Mapping[str, object], end: bool = False) -> None:
    """Send one JSON message (``end``: then close the sending side)."""
    data = json.dumps(message, default=str, separators=(",", ":")).encode() + b"\n"
    conn.sendall(data)
    if end:
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def receive(conn: socket.socket, line: bool = False) -> JsonObject:
    """Read one JSON message: up to a newline (``line``) or to the end of the connection."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_MESSAGE:
            raise ValueError("message too long")
        if line and b"\n" in chunk:
            break
    data = b"".join(chunks)
    if line:
        data = data.split(b"\n", 1)[0]
    value = json.loads(data.decode("utf-8")) if data.strip() else {}
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def request(pid: int, message: Mapping[str, object], timeout: float = 10.0,
            path: str | None = None) -> JsonObject:
    """Send ``message`` to process ``pid``'s agent and return its answer.

    ``path``: its socket, where already found.  Raises :class:`ControlError`
    (what went wrong) and ``TimeoutError`` when it does not answer in time.
    """
    path = locate(pid) if path is None else path
    uid = _process_uid(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(path)
        except ConnectionRefusedError:
            raise ControlError(f"no agent listens there: its control socket {path} is left "
                               "from an agent that is gone (the pid is another process's "
                               "now, or its agent stopped)") from None
        except FileNotFoundError:
            raise ControlError(f"no agent listens there: {path} went away (the agent "
                               "stopped)") from None
        except PermissionError:
            raise ControlError(f"{path}: permission denied (only its own user and root "
                               "can ask it)") from None
        except BlockingIOError:
            raise ControlError(f"{path}: too many requests already wait for it (its agent "
                               "does not answer them)") from None
        peer = _peer(conn)
        if peer is not None and (peer[0] != pid or (uid is not None and peer[1] != uid)):
            raise ControlError(f"{path} is served by pid {peer[0]} ({user_name(peer[1])}), "
                               f"not by pid {pid}: not asked")
        try:
            send(conn, message)
            answer = receive(conn)
        except (ConnectionResetError, BrokenPipeError):
            answer = {}
        except json.JSONDecodeError as exc:
            raise ControlError(f"its answer is not JSON ({exc})") from None
    if not answer:
        raise ControlError("its agent closed the connection without answering (it answers "
                           "its own user and root only)")
    return answer
