"""The local admin channel: ``dpsql`` commands on a served store run inside the server.

While ``dpsql serve`` runs it owns the store file (DuckDB's write lock keeps every
other process out). It listens on a Unix socket named after the file's identity
(device and inode) in a private directory; a ``dpsql`` command pointed at the
store finds the socket, sends its command line, working directory and
environment, and the server runs the same click command in a thread against its
open store (``dpsql.connect`` in the server process returns that store), sending
back what the command writes and its exit code.

Trust is the file system's, as without a server: the directory is the user's own
(mode 0700), the socket 0600, and each side checks that the other runs as the
same uid (SO_PEERCRED): whoever may open the store file directly is an admin.

Protocol: frames of a 4-byte big-endian length and a JSON object. The client
sends ``{"argv", "cwd", "env", "width", "tty": [stdin, stdout, stderr]}``, then
``{"input": text}`` answering a read (null at the end of input) and
``{"cancel": true}`` on Ctrl-C (a closed connection cancels too). The server
sends ``{"out": text}``, ``{"err": text}``, ``{"read": "line" | "all" | "secret",
"prompt": text}`` and last ``{"exit": code}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import json
import logging
import os
import queue
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

from dpsql.errors import ConfigurationError, StoreError
from dpsql.files import check_private, runtime_file

log = logging.getLogger("dpsql.server.admin")

FORWARDED_ENV = ("DPSQL_DB", "DPSQL_USER")  # what the commands read from the environment
MAX_FRAME = 16 << 20
NOT_FORWARDED = {  # commands that make no sense inside the server, and why
    "serve": "dpsql serve already runs on this store (it is the store's owner)",
    "init": "this store exists and dpsql serve runs on it; choose a new path",
    "demo": "this store exists and dpsql serve runs on it; choose a new path",
    "shell": "dpsql shell cannot run through dpsql serve; connect with psql instead",
}


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


def receive(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None when the other side closed the connection."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    size = struct.unpack(">I", head)[0]
    if size > MAX_FRAME:
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
class Interruptible:
    """A command running in the thread that made this: Ctrl-C for it, while it runs."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self._running = True
        self._cancelled = False
        self._lock = threading.Lock()  # a cancel never lands after the command ended

    def cancel(self) -> None:
        """KeyboardInterrupt in the command's thread, once, while it runs (any thread)."""
        with self._lock:
            if self._running and not self._cancelled:
                self._cancelled = True
                _raise_in(self.thread, KeyboardInterrupt)

    def finish(self) -> None:
        """The command ended: no cancel may reach its thread any more."""
        with self._lock:
            self._running = False
            _raise_in(self.thread, None)  # drop a cancel that had not landed yet


class Client(Interruptible):
    """One forwarded command: its connection, terminal flags and pending input."""

    def __init__(self, conn: socket.socket, tty: list[bool]) -> None:
        super().__init__()
        self.conn = conn
        self.tty = {"in": bool(tty[0]), "out": bool(tty[1]), "err": bool(tty[2])}
        self.inputs: queue.Queue[str | None] = queue.Queue()  # None: the end of input
        self.gone = False  # the client went away: output is dropped

    def write(self, message: dict[str, Any]) -> None:
        """Send a frame to the client (dropped once it is gone)."""
        if not self.gone:
            try:
                send(self.conn, message)
            except OSError:
                self.gone = True

    def read(self, kind: str, prompt: str = "") -> str | None:
        """A line, everything or a secret from the client's terminal (None at end of input)."""
        self.write({"read": kind, "prompt": prompt})
        return self.inputs.get()

    def listen(self) -> None:
        """Take the client's input and cancels until it closes (runs in its own thread)."""
        while True:
            try:
                message = receive(self.conn)
            except (OSError, ValueError):
                message = None
            if message is None or message.get("cancel"):
                self.cancel()
            if message is None:
                self.gone = True
                return
            if "input" in message:
                self.inputs.put(None if message["input"] is None else str(message["input"]))

    def cancel(self) -> None:
        """Ctrl-C for the command; one waiting for input sees its end."""
        super().cancel()
        self.inputs.put(None)


class Terminal(Protocol):
    """Where a command's streams go: a :class:`Client`, or a CALL's collector."""

    tty: dict[str, bool]  # "in", "out", "err": whether that stream is a terminal

    def write(self, message: dict[str, Any]) -> None:
        """Output: ``{"out": text}`` or ``{"err": text}``."""

    def read(self, kind: str, prompt: str = "") -> str | None:
        """A line, everything or a secret (``kind``); None at the end of input."""

    def finish(self) -> None:
        """The command ended: no cancel may reach its thread any more."""


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(exc) if exc else None)


_clients: dict[int, Terminal] = {}  # thread id -> the client whose command runs in it


def _client() -> Terminal | None:
    return _clients.get(threading.get_ident())


class RoutedStream:
    """sys.stdin, sys.stdout or sys.stderr of the server process, seen per thread.

    A forwarded command's thread reads and writes its client's terminal (click
    and tqdm look up sys.stdout/sys.stderr when they write); every other thread
    the process's own stream.
    """

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, original: Any, kind: str) -> None:
        self.original = original
        self.kind = kind  # "in", "out" or "err"

    def write(self, text: str) -> int:
        """Write to the client of this thread, else to the original stream."""
        client = _client()
        if client is None:
            return int(self.original.write(text))
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        client.write({self.kind: text})
        return len(text)

    def flush(self) -> None:
        """Frames go out as they are written; flush the original stream."""
        if _client() is None:
            self.original.flush()

    def isatty(self) -> bool:
        """Whether the client's (or the process's) stream is a terminal."""
        client = _client()
        return client.tty[self.kind] if client is not None else bool(self.original.isatty())

    def fileno(self) -> int:
        """The original descriptor; a client's stream has none."""
        if _client() is not None:
            raise OSError("a forwarded command's stream has no file descriptor")
        return int(self.original.fileno())

    def readline(self, size: int = -1) -> str:
        """A line of the client's standard input."""
        client = _client()
        if client is None:
            return str(self.original.readline(size))
        return client.read("line") or ""

    def read(self, size: int = -1) -> str:
        """The rest of the client's standard input."""
        client = _client()
        if client is None:
            return str(self.original.read(size))
        return client.read("all") or ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def _getpass(prompt: str = "Password: ", stream: Any = None) -> str:
    """getpass.getpass, asking the client's terminal in a forwarded command's thread."""
    client = _client()
    if client is None:
        return _original_getpass(prompt, stream)
    secret = client.read("secret", prompt)
    if secret is None:  # as getpass at the end of input (an empty line is "")
        raise EOFError
    return secret


_original_getpass = getpass.getpass


def _route_streams() -> None:
    """Make sys.stdin/stdout/stderr and getpass per-thread (once per process)."""
    for name, kind in (("stdin", "in"), ("stdout", "out"), ("stderr", "err")):
        if not isinstance(getattr(sys, name), RoutedStream):
            setattr(sys, name, RoutedStream(getattr(sys, name), kind))
    getpass.getpass = _getpass


class AdminChannel:
    """The admin socket of one served store: accepts ``dpsql`` commands from its owner."""

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
        _route_streams()
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
            threading.Thread(target=self._serve, args=(conn,), name="dpsql-admin-command",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                if peer_uid(conn) != os.getuid():
                    log.warning("admin channel: refused a process of uid %d", peer_uid(conn))
                    return
                request = receive(conn)
            except (OSError, ValueError) as err:
                log.warning("admin channel: bad request (%s)", err)
                return
            if request is not None:
                code = self._run(conn, request)
                with contextlib.suppress(OSError):
                    send(conn, {"exit": code})

    def _run(self, conn: socket.socket, request: dict[str, Any]) -> int:
        """Run a forwarded command in this thread; its exit code."""
        from dpsql.cli.common import Caller

        argv = [str(a) for a in request.get("argv", [])]
        refusal = NOT_FORWARDED.get(argv[0]) if argv else None
        if refusal is not None:
            send(conn, {"err": f"error: {refusal}\n"})
            return StoreError.exit_code
        env = {k: str(v) for k, v in dict(request.get("env", {})).items() if k in FORWARDED_ENV}
        client = Client(conn, list(request.get("tty", [False, False, False])))
        threading.Thread(target=client.listen, name="dpsql-admin-input", daemon=True).start()
        log.info("admin channel: dpsql %s", " ".join(argv[:2]))
        caller = Caller(cwd=str(request.get("cwd", "/")), env=env, store=str(self.db))
        return run_for(client, argv, caller, request.get("width"))


def run_for(client: Terminal, argv: list[str], caller: Any, width: int | None = None) -> int:
    """Run the command line ``argv`` in this thread, its streams routed to ``client``.

    ``client`` is made in this thread (an :class:`Interruptible`, so a cancel
    reaches the command). Returns the exit code.
    """
    from dpsql.cli import run

    _route_streams()
    _clients[threading.get_ident()] = client
    try:
        try:
            run(argv, caller, width=width)
            return 0
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else int(done.code is not None)
        finally:
            client.finish()
            del _clients[threading.get_ident()]
    except KeyboardInterrupt:  # a cancel that landed after the command's own handling
        return 130


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
