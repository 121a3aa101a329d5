"""The on-demand report: a background thread answering ``chainer-autoprof dump PID``.

The thread waits in ``accept`` on this process's control socket
(:mod:`..common.control`), so it costs nothing until asked, and it answers
while the main thread is blocked in C (an MPI collective, a queue ``get``, a
CUDA synchronization): no signal is involved, so none of the program's own
signals is taken.  Each request runs the handler the agent passed down
(write the trace so far, make the report), sends its answer back, and only
then prints the report on this process's stderr: a stderr that blocks (a
full pipe, a terminal on hold) never keeps the answer from the client.

The listening socket is held across the program's code: a program that
closes every descriptor (``os.closerange``, as daemonizing libraries do) may
then open its own files under its number.  The server checks before each
``accept`` that the number is still its socket (device and inode), listens
anew where it is not, and never closes a number that is no longer its own.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable, Mapping, Optional, Tuple

from ..common import control, log
from ..common.outputs import FileId, close_if_ours, identity, still_ours
from ..common.typedefs import JsonObject
from .processes import is_child

#: Seconds a client may take to send its request.
REQUEST_TIMEOUT = 5.0

#: What the handler gives: the answer, and what to do once it is sent (``None``: nothing).
Answer = Tuple[Mapping[str, object], Optional[Callable[[], None]]]


class DumpServer:
    """Serves dump requests on this process's control socket."""

    def __init__(self, handle: Callable[[JsonObject], Answer]) -> None:
        self.handle = handle
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._listening: control.Listening | None = None
        self._ident: FileId | None = None  # the socket's identity while it is ours
        self.address = ""
        # start, stop and listening anew (from the serving thread) change the fields above
        # together: a stop() never sees a thread not yet started, nor undoes a new listener
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Listen (``False``, said in one line, where the socket cannot be made)."""
        with self._lock:
            self._stopping = False
        return self._listen()

    def _listen(self) -> bool:
        try:
            listening = control.listen()
        except control.ControlError as exc:
            log.warning(f"no on-demand reports (chainer-autoprof dump) for this process: {exc}")
            return False
        for note in listening.notes:  # e.g. another user holds the usual directory
            log.warning(f"control socket: {note}")
        sock = listening.sock
        with self._lock:  # published whole, its thread started: stop() joins only a started one
            if self._stopping:  # stop() came while we made it
                sock.close()
                control.unlisten(listening)
                return False
            self._listening = listening
            self.address = listening.path
            self._ident = identity(sock.fileno())
            thread = threading.Thread(target=self._serve, args=(sock,),
                                      name="chainer_autoprof dump server", daemon=True)
            thread.start()
            self._thread = thread
            self._sock = sock
        return True

    def _serve(self, sock: socket.socket) -> None:
        while not self._stopping:
            if not still_ours(sock.fileno(), self._ident):  # the program closed it
                self._lost(sock)
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if not self._stopping and not still_ours(sock.fileno(), self._ident):
                    self._lost(sock)
                return  # closed
            with conn:
                if self._stopping:
                    return
                try:
                    self._answer(conn)
                except Exception as exc:  # a bad client must not end the service  # noqa: BLE001
                    log.debug(f"dump request failed: {type(exc).__name__}: {exc}")

    def _answer(self, conn: socket.socket) -> None:
        if not control.peer_allowed(conn):
            return
        conn.settimeout(REQUEST_TIMEOUT)
        message = control.receive(conn, line=True)
        then: Callable[[], None] | None = None
        try:
            answer, then = self.handle(message)
        except Exception as exc:  # our error goes to the client as the answer  # noqa: BLE001
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        try:
            control.send(conn, answer, end=True)
        finally:
            if then is not None:  # after the answer: printing may block on a full stderr
                then()

    def _lost(self, sock: socket.socket) -> None:
        """The program closed the socket (its number may be a file of its own now): forget
        it without closing, and listen on a new one."""
        sock.detach()
        with self._lock:
            if self._sock is not sock or self._stopping:
                return
            self._sock = None
        self._listen()

    def stop(self) -> None:
        """Stop serving and close the socket (at exit, on uninstall)."""
        with self._lock:
            self._stopping = True  # also ends a listening anew under way
            sock, self._sock = self._sock, None
            thread, ident, address = self._thread, self._ident, self.address
            listening, self._listening = self._listening, None
        if sock is not None:
            try:  # wake the accept() with a connection of our own
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                    wake.settimeout(1.0)
                    wake.connect(address)
            except OSError:
                pass
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2.0)
            close_if_ours(sock.detach(), ident)
        if listening is not None:  # also the file of a socket the program closed; the run's
            # first process also removes those its children's deaths by a signal left
            control.unlisten(listening, sweep=not is_child())

    def forget(self) -> None:
        """In a forked child: the inherited socket is the parent's (close our copy only)."""
        self._lock = threading.Lock()  # the parent's serving thread may have held it at the fork
        sock, self._sock = self._sock, None
        self._thread = None
        self._listening = None  # the parent's file stays the parent's
        if sock is not None:
            close_if_ours(sock.detach(), self._ident)
