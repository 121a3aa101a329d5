"""The control socket of a profiled process: where it listens, who may ask, and the message format.

Every process with the agent listens on a Unix socket of its own, served by
a background thread (:mod:`..lifecycle.dump_server`), so it answers while its
main thread is blocked in C (an MPI collective, a queue ``get``, a CUDA
synchronization) and without any signal the program may use itself.
``chainer-autoprof dump PID`` (:mod:`..report.dump`) connects to it.

* Address: on Linux an abstract socket ``@chainer_autoprof.PID`` (no file to
  clean up after a SIGKILL); elsewhere ``$TMPDIR/chainer_autoprof-UID/PID.sock``
  in a directory only its owner can enter.
* Who: on Linux the server accepts only a peer of its own user (or root),
  and the client only a server that is the process it asked, both checked
  with ``SO_PEERCRED`` (an abstract name taken by someone else is refused).
* Messages: one JSON object each way, the request ending with a newline,
  the answer with the end of the connection.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import tempfile
from typing import Any

NAME_PREFIX = "chainer_autoprof."
ABSTRACT = sys.platform.startswith("linux")
#: The largest answer accepted (a report with every thread's stack is a few kB).
MAX_MESSAGE = 16 << 20


def address(pid: int | None = None) -> str:
    """The control socket address of process ``pid`` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    if ABSTRACT:
        return f"\0{NAME_PREFIX}{pid}"
    return os.path.join(_socket_dir(), f"{pid}.sock")


def _socket_dir() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"chainer_autoprof-{uid}")


def prepare_dir() -> None:
    """Create the socket directory (non-Linux only), private to its owner."""
    if not ABSTRACT:
        os.makedirs(_socket_dir(), mode=0o700, exist_ok=True)


def listening_pids() -> list[int]:
    """Pids of the processes on this host whose agent listens (any user's, on Linux)."""
    pids: set[int] = set()
    if ABSTRACT:
        try:
            with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            return []
        marker = "@" + NAME_PREFIX
        for line in lines:
            path = line.split()[-1] if line.split() else ""
            if path.startswith(marker) and path[len(marker):].isdigit():
                pids.add(int(path[len(marker):]))
    else:
        try:
            names = os.listdir(_socket_dir())
        except OSError:
            return []
        for name in names:
            stem = name[:-len(".sock")] if name.endswith(".sock") else ""
            if stem.isdigit():
                pids.add(int(stem))
    return sorted(pid for pid in pids if _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _peer(conn: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the connected peer, where the system says (Linux)."""
    if not ABSTRACT or not hasattr(socket, "SO_PEERCRED"):
        return None  # elsewhere the socket directory is private to its owner
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def peer_allowed(conn: socket.socket) -> bool:
    """Whether the connected peer runs as this process's user (or root)."""
    peer = _peer(conn)
    return peer is None or peer[1] in (0, os.getuid())


def send(conn: socket.socket, message: dict[str, Any], end: bool = False) -> None:
    """Send one JSON message (``end``: then close the sending side)."""
    data = json.dumps(message, default=str, separators=(",", ":")).encode() + b"\n"
    conn.sendall(data)
    if end:
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def receive(conn: socket.socket, line: bool = False) -> dict[str, Any]:
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


def request(pid: int, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send ``message`` to process ``pid``'s agent and return its answer.

    Raises ``OSError`` when nothing listens there (no agent, or another
    user's process) and ``TimeoutError`` when it does not answer in time.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(address(pid))
        peer = _peer(conn)
        if peer is not None and peer[0] != pid:
            raise ConnectionRefusedError(f"the socket of pid {pid} belongs to pid {peer[0]}")
        send(conn, message)
        return receive(conn)
