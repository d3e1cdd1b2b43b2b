"""Where analysts' free SQL runs: sandbox processes with a hard memory limit.

Free queries (released and public tables, queries that read no table:
:mod:`dpsql.query.free`) and SQL clients' catalog queries
(:mod:`dpsql.server.catalog`) run analyst SQL on DuckDB databases that hold no
private data. DuckDB's ``memory_limit`` does not bound what such SQL can
allocate (a vector's string heap is not counted: ``repeat``, ``lpad``, ``||``,
``printf`` with a width build strings of any size), and an interrupt takes
effect only between chunks. So that SQL never runs in the process that owns
the store. It runs in a sandbox: a fresh interpreter (``python -I -c BOOT``,
never a fork; its working directory a private folder of its own; none of the
owner's environment variables but locale, time zone and the loader's paths)
that sets a hard address-space limit (``RLIMIT_AS``, soft and hard) on itself
before it imports DuckDB. Past the limit an allocation fails: DuckDB raises its
out-of-memory error, or the sandbox dies; either way its owner answers the
query with :class:`~dpsql.errors.OutOfMemory` and goes on. A sandbox that died,
or ran out of memory (DuckDB may keep address space it cannot use again), is
replaced on the next query. The kernel is also told to kill a sandbox first
when the host runs out of memory (``oom_score_adj`` 1000).

:class:`Sandboxes` is a small pool, one per open store: each sandbox runs one
query at a time, at most :data:`PROCESSES` run at once (a query waits for a
free one), and one user holds at most :data:`PER_USER` of them, so one user's
slow queries never take them all. One query per process is what makes a
statement timeout or cancel prompt without touching other sessions: the
owner interrupts the query, and kills its sandbox when the query goes on
:data:`KILL_AFTER` seconds later (work inside one chunk ignores interrupts).

The sandbox's side is :mod:`dpsql.sandboxed`. A sandbox opens a database on
the first query that names it (:class:`Database`: a function and its
arguments, pickled by reference, and a version; a new version replaces the old
one) and keeps a cursor per :class:`Setup` key (a catalog connection's client
rows). It sends back only bytes: an Arrow IPC stream, or an error as JSON; the
owner unpickles nothing a sandbox sends. It dies with its owner: it reads its
pipe, and the pipe closes when the owner dies.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from dpsql.engines.interrupt import Interrupter
from dpsql.errors import ConfigurationError, InternalError, OutOfMemory, QueryCanceled
from dpsql.sizes import machine_memory, mib
from dpsql.store import StoreKey

log = logging.getLogger(__name__)

PROCESSES = 4  # sandboxes of one store at most: queries that run at once
PER_USER = 2  # of them one user may hold at once
KILL_AFTER = 1.0  # seconds an interrupted query may go on before its sandbox is killed
READY_TIMEOUT = 120.0  # seconds for a new sandbox to start (a loaded host)
MIN_MEMORY = 2**30  # the interpreter, DuckDB and pyarrow map about 500 MiB of it before a query
#: The owner's variables a sandbox sees: locale and time zone (DuckDB's TIMESTAMPTZ), and
#: what the interpreter may need to load; never a password or a DSN a dataset names.
ENVIRONMENT = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME",
               "LC_COLLATE", "LC_MESSAGES", "TZ", "LD_LIBRARY_PATH")

#: Run by ``python -I -c`` in the sandbox's folder: the address-space limit comes first,
#: before anything that allocates much; the owner's ``sys.path`` is appended after the
#: interpreter's own (no folder of it shadows the standard library or an installed package).
BOOT = """\
import resource, sys
limit = int(sys.argv[2])
_, hard = resource.getrlimit(resource.RLIMIT_AS)
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")
except OSError:
    pass
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
sys.path.extend(p for p in conn.recv() if p and p not in sys.path)
try:
    from dpsql.sandboxed import serve
except BaseException as err:
    conn.send_bytes(("refused " + type(err).__name__ + ": " + str(err)).encode()[:4000])
    raise SystemExit(1) from None
serve(conn)
"""


@dataclass(frozen=True)
class Database:
    """A database a sandbox opens with ``opener(*args)`` on the first query that names it.

    ``key`` names it in the sandbox; a query with a new ``version`` makes the
    sandbox close the old one and open this one. ``opener`` must be a function
    of an importable module (it travels pickled by reference).
    """

    key: str
    version: int
    opener: Callable[..., duckdb.DuckDBPyConnection]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Setup:
    """A cursor a sandbox keeps for ``key`` (one client connection), made ready before each query.

    ``prepare(cursor, state, *args)`` runs first: ``state`` is a dict kept with
    the cursor (empty on a new cursor), so that it changes only what changed.
    """

    key: object
    prepare: Callable[..., None]
    args: tuple[Any, ...] = ()


def default_memory() -> int:
    """A sandbox's limit unless configured: an eighth of the memory (all of them: a half)."""
    return max(MIN_MEMORY, machine_memory() // 8)



# -- in the owner ------------------------------------------------------------------------


class _Sandbox:
    """The owner's handle on one sandbox process (used by one query at a time)."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection, folder: Path,
                 limit: int) -> None:
        self.process = process
        self.conn = conn
        self.folder = folder
        self.limit = limit
        self.known: dict[str, int] = {}  # databases it has opened (key -> version)
        self.retired = False  # it may not take another query (it ran out of Python memory)
        self._send = threading.Lock()
        self._seq = itertools.count(1)

    @classmethod
    def start(cls, limit: int, folder: Path) -> _Sandbox:
        """Start a sandbox limited to ``limit`` bytes in ``folder`` and wait until it is ready."""
        python = sys.executable
        if not python:
            raise InternalError("cannot start the process that runs free queries: this Python "
                                "does not know its interpreter (sys.executable is empty)")
        mine, theirs = multiprocessing.Pipe()
        env = {k: v for k, v in os.environ.items() if k in ENVIRONMENT or k.startswith("LC_")}
        env["MALLOC_ARENA_MAX"] = "2"  # each thread's arena reserves 64 MiB of address space
        try:
            process = subprocess.Popen(
                [python, "-I", "-c", BOOT, str(theirs.fileno()), str(limit)],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, cwd=folder, env=env)
        except OSError as err:
            mine.close()
            raise InternalError(f"cannot start the process that runs free queries ({python}: "
                                f"{err.strerror})") from err
        finally:
            theirs.close()
        sandbox = cls(process, mine, folder, limit)
        try:
            sandbox._handshake()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _handshake(self) -> None:
        with contextlib.suppress(OSError):  # it died at once: the reply below says so
            self.conn.send(list(sys.path))
        reply = b""
        with contextlib.suppress(EOFError, OSError):
            if not self.conn.poll(READY_TIMEOUT):
                raise InternalError(f"the process that runs free queries did not start within "
                                    f"{READY_TIMEOUT:.0f} s; try again when the host is less busy")
            reply = self.conn.recv_bytes(8192)
        if reply == b"ready":
            return
        why = reply.decode(errors="replace") or "it ended as it started"
        if "MemoryError" in why or not why.startswith("refused"):
            raise ConfigurationError(
                f"the process that runs free queries cannot start within its memory limit "
                f"({mib(self.limit)}: {why}); give it more (dpsql serve --free-query-memory)")
        raise InternalError(f"the process that runs free queries cannot start ({why})")

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, database: Database, setup: Setup | None, sql: str, most: int,
            request: _Request) -> pa.Table:
        """Run ``sql`` on ``database`` here; raise what the sandbox raised (see the module doc)."""
        seq = next(self._seq)
        spec: tuple[Any, ...] = (database.key, database.version, None, ())
        if self.known.get(database.key) != database.version:  # only then the opener travels
            spec = (database.key, database.version, database.opener, database.args)
        self.known[database.key] = database.version
        request.attach(self, seq)
        try:
            with self._send:
                self.conn.send(("run", seq, spec, setup and (setup.key, setup.prepare, setup.args),
                                sql, most))
            head = self.conn.recv_bytes(1 << 16)
            if head == b"R":
                payload = self.conn.recv_bytes(most)
                return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
        except (EOFError, OSError):  # killed, out of memory, crashed, or an answer too large
            self.retired = True
            self.kill()
            if request.interrupted:
                raise QueryCanceled() from None
            log.warning("a free query's sandbox (pid %d) ended while it ran the query: "
                        "answered as out of memory", self.process.pid)
            raise OutOfMemory() from None
        finally:
            request.detach()
        self.known.pop(database.key, None)  # it may have failed before the database opened
        if head[:1] != b"E":
            self.retired = True
            raise InternalError("the process that runs free queries answered out of turn")
        error = json.loads(head[1:])
        self.retired = bool(error.get("retire"))
        kind, message = str(error["kind"]), str(error["message"])
        if kind == "OutOfMemory":
            log.info("a free query ran out of memory in its sandbox (pid %d, limit %s): %s",
                     self.process.pid, mib(self.limit), message)
            raise OutOfMemory()
        if kind == "TooLarge":
            raise OutOfMemory(f"the answer is larger than a free query may return "
                              f"({mib(most)}); add a LIMIT or aggregate")
        if kind == "InterruptException" or request.interrupted:
            raise QueryCanceled()
        found = getattr(duckdb, kind, None)
        if isinstance(found, type) and issubclass(found, duckdb.Error):
            raise found(message)
        raise duckdb.Error(f"{kind}: {message}")

    def interrupt(self, seq: int) -> None:
        with self._send, contextlib.suppress(OSError, ValueError):
            self.conn.send(("interrupt", seq))

    def kill(self) -> None:
        """End the sandbox now (any thread)."""
        with contextlib.suppress(OSError):
            self.process.kill()

    def close(self) -> None:
        """Close the pipe (an idle sandbox then exits), wait for the end and remove the folder."""
        self.conn.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Request:
    """One query as :class:`~dpsql.engines.interrupt.Interrupter` sees it.

    Interrupting it interrupts the sandbox's query, and kills the sandbox once
    :data:`KILL_AFTER` has passed.
    """

    def __init__(self, pool: Sandboxes) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._sandbox: _Sandbox | None = None
        self._seq = 0
        self._since: float | None = None

    @property
    def interrupted(self) -> bool:
        return self._since is not None

    def attach(self, sandbox: _Sandbox, seq: int) -> None:
        with self._lock:
            self._sandbox, self._seq = sandbox, seq

    def detach(self) -> None:
        with self._lock:
            self._sandbox = None

    def interrupt(self) -> None:
        """Called again and again by the Interrupter until the query ends."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
            sandbox, seq, since = self._sandbox, self._seq, self._since
        if sandbox is None:
            self._pool.wake()  # waiting for a sandbox: give up
        elif time.monotonic() - since > KILL_AFTER:
            sandbox.retired = True
            log.info("a free query's sandbox (pid %d) went on %.1f s after an interrupt: "
                     "killed", sandbox.process.pid, KILL_AFTER)
            sandbox.kill()
        else:
            sandbox.interrupt(seq)


class Sandboxes:
    """The sandboxes of one open store (``store[SANDBOXES]``; the store closes it)."""

    def __init__(self) -> None:
        self.memory = default_memory()  # each sandbox's address-space limit, bytes
        self._cond = threading.Condition()
        self._idle: list[_Sandbox] = []
        self._all: set[_Sandbox] = set()
        self._count = 0  # started or starting
        self._held: dict[str, int] = {}  # user -> sandboxes taken
        self._names = itertools.count(1)
        self._folder: Path | None = None  # made with the first sandbox
        self._closed = False
        self._warming = False  # a first sandbox is starting for whoever comes first

    def configure(self, memory: int) -> None:
        """Limit each sandbox to ``memory`` bytes (sandboxes started before are replaced)."""
        if memory < MIN_MEMORY:
            raise ConfigurationError(f"free queries need at least {mib(MIN_MEMORY)} of memory "
                                     f"each ({mib(memory)} given)")
        with self._cond:
            self.memory = memory
            stale, self._idle = self._idle, []
            self._count -= len(stale)
            self._all.difference_update(stale)
        for sandbox in stale:
            sandbox.close()

    @property
    def most(self) -> int:
        """The largest answer a query may send back (the owner holds it): a quarter of the limit."""
        return self.memory // 4

    def run(self, database: Database, sql: str, *, user: str, setup: Setup | None = None,
            interrupts: Interrupter | None = None) -> pa.Table:
        """``sql``'s answer on ``database`` in a sandbox, for ``user``.

        Raises OutOfMemory, QueryCanceled (``interrupts``: the statement timeout
        or a cancel) or the ``duckdb.Error`` the query raised.
        """
        request = _Request(self)
        running = interrupts.running(request) if interrupts is not None \
            else contextlib.nullcontext()
        with running:
            sandbox = self._take(user, request)
            try:
                if request.interrupted:  # while a new sandbox started
                    raise QueryCanceled()
                return sandbox.ask(database, setup, sql, self.most, request)
            finally:
                self._give(user, sandbox)

    def wake(self) -> None:
        """Let waiting queries look again (one was interrupted)."""
        with self._cond:
            self._cond.notify_all()

    def pids(self) -> list[int]:
        """Process ids of the sandboxes running now (for tests and diagnostics)."""
        with self._cond:
            return [s.process.pid for s in self._all if s.alive()]

    def warm(self) -> None:
        """Start a first sandbox in the background, so that the first query need not wait."""
        threading.Thread(target=self._warm, daemon=True, name="dpsql-sandbox-warm").start()

    def _warm(self) -> None:
        with self._cond:
            if self._closed or self._count:
                return
            self._count += 1
            self._warming = True
            folder, limit = self._new_folder(), self.memory
        try:
            sandbox = _Sandbox.start(limit, folder)
        except Exception as err:  # the first query will start one and say why
            log.warning("could not start a sandbox for free queries: %s", err)
            with self._cond:
                self._count -= 1
                self._warming = False
                self._cond.notify_all()
            return
        with self._cond:
            self._warming = False
            self._cond.notify_all()
            if not self._closed and sandbox.limit == self.memory:
                self._all.add(sandbox)
                self._idle.append(sandbox)
                self._cond.notify_all()
                return
            self._count -= 1
        sandbox.close()

    def _new_folder(self) -> Path:
        """A private folder for the next sandbox (caller holds the condition)."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="dpsql-sandbox-"))
        folder = self._folder / f"sandbox-{next(self._names)}"
        folder.mkdir(mode=0o700)
        return folder

    def _take(self, user: str, request: _Request) -> _Sandbox:
        dead: list[_Sandbox] = []
        try:
            with self._cond:
                while True:
                    if self._closed:
                        raise InternalError("the store was closed while a free query waited")
                    if request.interrupted:
                        raise QueryCanceled()
                    if self._held.get(user, 0) < PER_USER:
                        while self._idle:
                            sandbox = self._idle.pop()
                            if sandbox.alive() and not sandbox.retired \
                                    and sandbox.limit == self.memory:
                                self._held[user] = self._held.get(user, 0) + 1
                                return sandbox
                            dead.append(sandbox)
                            self._all.discard(sandbox)
                            self._count -= 1
                        if self._count < PROCESSES and not self._warming:
                            self._count += 1
                            self._held[user] = self._held.get(user, 0) + 1
                            folder, limit = self._new_folder(), self.memory
                            break
                    self._cond.wait()
        finally:
            for sandbox in dead:
                sandbox.close()
        try:
            sandbox = _Sandbox.start(limit, folder)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._release(user)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._cond:
            self._all.add(sandbox)
        return sandbox

    def _release(self, user: str) -> None:
        left = self._held.get(user, 0) - 1
        if left > 0:
            self._held[user] = left
        else:
            self._held.pop(user, None)
        self._cond.notify_all()

    def _give(self, user: str, sandbox: _Sandbox) -> None:
        with self._cond:
            self._release(user)
            if not self._closed and sandbox.alive() and not sandbox.retired \
                    and sandbox.limit == self.memory:
                self._idle.append(sandbox)
                return
            self._all.discard(sandbox)
            self._count -= 1
        sandbox.close()

    def close(self) -> None:
        """End every sandbox (a running query fails) and remove their folders."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = self._all.difference(idle)
            self._all.clear()
            self._cond.notify_all()
        for sandbox in busy:
            sandbox.kill()
        for sandbox in idle:
            sandbox.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


#: Sandboxes of each open store: ``store[SANDBOXES]``.
SANDBOXES: StoreKey[Sandboxes] = StoreKey("sandboxes")

