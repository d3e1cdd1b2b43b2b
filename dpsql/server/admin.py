"""The local admin channel: operations on a served store run inside the server.

While ``dpsql serve`` runs it owns the store file (DuckDB's write lock keeps every
other process out). It listens on a Unix socket named after the file's identity
(device and inode) in a private directory; a ``dpsql`` command pointed at the
store finds the socket (:mod:`dpsql.cli.door`) and sends each typed operation of
:mod:`dpsql.admin` it runs, by name with its arguments; the server runs it on
its open store and sends the typed result back. The command itself parses,
prompts, prints and reads and writes files in the caller's process: nothing of
the CLI runs here, and no operation takes a file path.

Trust is the file system's, as without a server: the directory is the user's own
(mode 0700), the socket 0600, and each side checks that the other runs as the
same uid (SO_PEERCRED): whoever may open the store file directly is an admin.

Protocol: frames of a 4-byte big-endian length and a JSON object. The client
sends ``{"op": name, "user": user or null, "args": {...}}`` (arguments as
:mod:`dpsql.admin.wire` encodes them), and ``{"cancel": true}`` on Ctrl-C (a
closed connection cancels too). The server answers each operation with
``{"progress": [stage, done, total]}`` frames while it works, then
``{"result": ...}`` or an error (:func:`dpsql.admin.wire.error_frame`). One
connection carries a command's operations in turn, on one session per user (a
``SET`` lasts to the end of a script); the sessions close with the connection.
A cancel interrupts the session's statement: a release being waited for is
cancelled and its charge stays.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsql.errors import ConfigurationError, DPSQLError, QueryCanceled, StoreError
from dpsql.files import check_private, runtime_file

if TYPE_CHECKING:
    from dpsql.session import Session

log = logging.getLogger("dpsql.server.admin")

MAX_FRAME = 16 << 20  # the largest request a client may send (a policy's text, say)


# -- where the socket is ------------------------------------------------------------------
def socket_path(db: str | Path) -> Path | None:
    """The admin socket of the store at ``db`` (None when there is no such file)."""
    try:
        info = Path(db).expanduser().stat()
    except OSError:
        return None
    return runtime_file(f"{info.st_dev:x}-{info.st_ino:x}.sock")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


# -- frames -------------------------------------------------------------------------------
def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one frame."""
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def receive(sock: socket.socket, limit: int = MAX_FRAME) -> dict[str, Any] | None:
    """The next frame (of at most ``limit`` bytes), or None when the other side closed."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    size = struct.unpack(">I", head)[0]
    if size > limit:
        raise ConnectionError(f"admin channel frame of {size} bytes")
    body = _exactly(sock, size)
    if body is None:
        return None
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ConnectionError("admin channel frame is not an object")
    return message


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# -- the server side ----------------------------------------------------------------------
class AdminChannel:
    """The admin socket of one served store: runs typed operations for its owner."""

    def __init__(self, db: Path) -> None:
        self.db = db
        path = socket_path(db)
        if path is None:
            raise StoreError(f"{db} disappeared while dpsql serve started; try again")
        self.path = path
        self._sock: socket.socket | None = None

    def start(self) -> None:
        """Listen (replacing a stale socket); refuse if another server answers on it."""
        check_private(self.path.parent, "directory")
        if self.path.exists() or self.path.is_symlink():
            if connect(self.db) is not None:
                raise StoreError(f"another dpsql serve answers on {self.path} for {self.db}; "
                                 "stop it first")
            self.path.unlink()
        if len(os.fsencode(self.path)) > 107:
            raise ConfigurationError(f"the admin socket path {self.path} is too long for a Unix "
                                     "socket; set XDG_RUNTIME_DIR to a shorter directory")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        sock.listen(16)
        self._sock = sock
        threading.Thread(target=self._accept, args=(sock,), name="dpsql-admin",
                         daemon=True).start()

    def stop(self) -> None:
        """Stop listening and remove the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._serve, args=(conn,), name="dpsql-admin-client",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = peer_uid(conn)
            except OSError as err:
                log.warning("admin channel: bad connection (%s)", err)
                return
            if uid != os.getuid():
                log.warning("admin channel: refused a process of uid %d", uid)
                return
            Caller(self.db, conn).serve()


class Caller:
    """One client connection: its operations in turn, each in a thread of its own."""

    def __init__(self, db: Path, conn: socket.socket) -> None:
        self.db, self.conn = db, conn
        self.sessions: dict[str | None, Session] = {}
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.cancelled = threading.Event()  # a cancel of the running operation
        self._send_lock = threading.Lock()
        self._gone = False

    def serve(self) -> None:
        """Answer the client's operations until it hangs up; then close its sessions."""
        threading.Thread(target=self._listen, name="dpsql-admin-input", daemon=True).start()
        running: Session | None = None
        try:
            while True:
                kind, value = self.events.get()
                if kind == "done":
                    running = None
                    self._send(value)
                elif kind == "closed":
                    if running is None:
                        return
                    self._cancel(running)  # and wait for the operation to end
                    while self.events.get()[0] != "done":
                        pass
                    return
                elif value.get("cancel"):
                    if running is not None:
                        self._cancel(running)
                elif running is not None:
                    self._send({"error": "configuration_error", "exit_code": 8,
                                "message": "one operation at a time on an admin connection"})
                else:
                    running = self._start(value)
        finally:
            for session in self.sessions.values():
                with contextlib.suppress(Exception):
                    session.close()

    def _cancel(self, running: Session) -> None:
        """Stop the running operation: interrupt its statement (or the one about to begin)."""
        self.cancelled.set()
        running.interrupts.interrupt()

    def _listen(self) -> None:
        """Put the client's frames on the queue until it closes (its own thread)."""
        while True:
            try:
                message = receive(self.conn)
            except (OSError, ValueError, RecursionError):  # a frame nested past any use
                message = None
            if message is None:
                self.events.put(("closed", None))
                return
            self.events.put(("frame", message))

    def _send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            if self._gone:
                return
            try:
                send(self.conn, message)
            except OSError:
                self._gone = True

    def _start(self, request: dict[str, Any]) -> Session | None:
        """Start the operation ``request`` names; the session it runs on (None: refused)."""
        from dpsql import admin
        from dpsql.admin import wire

        try:
            operation = admin.find(str(request.get("op")))
            arguments = wire.decode_arguments(operation, dict(request.get("args") or {}))
            user = request.get("user")
            session = self._session(None if user is None else str(user))
        except Exception as err:
            self._send(wire.error_frame(err))
            return None
        log.info("admin channel: dpsql %s", admin.name_of(operation).replace(".", " "))
        self.cancelled.clear()
        threading.Thread(target=self._run, args=(operation, arguments, session),
                         name="dpsql-admin-operation", daemon=True).start()
        return session

    def _session(self, user: str | None) -> Session:
        session = self.sessions.get(user)
        if session is None:
            from dpsql.admin import default_user
            from dpsql.services import open_store
            from dpsql.session import Session

            store = open_store(self.db)  # the server's open store, shared
            try:
                session = Session(store, user or default_user(store))
            except BaseException:
                store.close()
                raise
            self.sessions[user] = session
        return session

    def _run(self, operation: Callable[..., Any], arguments: dict[str, Any],
             session: Session) -> None:
        """Run the operation (this thread); its result or error goes on the queue."""
        from dpsql.admin import wire

        if wire.takes_progress(operation):
            arguments["progress"] = self._progress
        try:
            with session.interrupts.statement():
                if self.cancelled.is_set():  # cancelled before its statement began
                    raise QueryCanceled()
                result = operation(session, **arguments)
            reply = {"result": wire.encode(result)}
        except Exception as err:
            if not isinstance(err, DPSQLError):
                log.exception("admin channel: %s failed", getattr(operation, "__name__", "?"))
            reply = wire.error_frame(err)
        self.events.put(("done", reply))

    def _progress(self, stage: str, done: float, total: float | None = None) -> None:
        self._send({"progress": [stage, done, total]})


def connect(db: str | Path) -> socket.socket | None:
    """A connection to the server that owns the store at ``db``, or None when none runs.

    Raises ConfigurationError when the channel is not private (another user's
    directory or socket, a loose mode) or answered by another uid.
    """
    path = socket_path(db)
    if path is None:
        return None
    check_private(path.parent, "directory")
    if not (path.exists() or path.is_symlink()):
        return None
    check_private(path, "socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):  # a stale socket: no server
        sock.close()
        return None
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise ConfigurationError(f"the admin socket {path} is served by uid {uid}, "
                                 f"not by you (uid {os.getuid()}); dpsql refuses to talk to it")
    return sock


def refuse_if_served(db: str | Path, why: str) -> None:
    """StoreError saying ``why`` when ``dpsql serve`` owns the store at ``db``.

    For the terminal's own commands that open the store themselves (serve, shell).
    """
    sock = connect(db)
    if sock is not None:
        sock.close()
        raise StoreError(why)
