"""The asyncio server: listening, limits, TLS, cancel requests and clean shutdown.

One process serves one store. The store (and its DuckDB write lock) is opened
once and shared; each client connection gets its own :class:`~dpsql.Session`
and runs its statements on a shared thread pool. ``dpsql`` commands on the
store come in through the admin channel (:mod:`dpsql.server.admin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import signal
import ssl
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from dpsql.errors import AddressInUse, ConfigurationError
from dpsql.jobs import JOBS
from dpsql.passwords import login_secret
from dpsql.sandbox import SANDBOXES
from dpsql.server import procedure
from dpsql.server.admin import AdminChannel
from dpsql.server.catalog import CatalogSource
from dpsql.server.connection import Connection
from dpsql.server.host import Peer, ServerConfig
from dpsql.server.logins import GuessGate, LoginBackoff, LoginSlots
from dpsql.server.router import StatementHandler
from dpsql.services import open_store
from dpsql.session import Session, connect
from dpsql.store import Store

if TYPE_CHECKING:
    from dpsql.console.app import Console

log = logging.getLogger("dpsql.server")


def _default_handler(session: Session) -> StatementHandler:
    return procedure.handler(session)  # CALL dpsql(...) for admins, the rest to session.sql


class Server:
    """A running PostgreSQL-wire front door to one store."""

    def __init__(self, config: ServerConfig,
                 handler_factory: Callable[[Session], StatementHandler] | None = None) -> None:
        self.config = config
        self.handler_factory = handler_factory or _default_handler
        self.started = datetime.now(timezone.utc).isoformat()
        # A held failure, or a proof waiting for its turn, must end before the login timer
        # does, or it would not be answered.
        self.login_wait = min(5.0, config.login_timeout / 2)
        self.backoff = LoginBackoff(free=config.login_failures_free,
                                    free_per_host=config.login_failures_free_per_host,
                                    ceiling=self.login_wait, hold_ceiling=self.login_wait)
        self.gate = GuessGate(per_name=config.login_failures_free,
                              name_rate=config.login_guesses_per_second)
        self._waiting_turn: dict[int, Peer] = {}  # proofs waiting for their turn
        self.max_waiting_turn = config.max_pending_logins  # (out of the login slots)
        # A client sends its startup packet at once: one silent for a quarter of a step's
        # time is an idle socket, the first to make room for a newcomer.
        self.logins = LoginSlots(config.max_pending_logins, grace=config.login_step_timeout / 4)
        self.lingering = 0  # dropped connections not yet closed (Connection.drop)
        self.max_lingering = 4 * config.max_pending_logins
        self.executor = ThreadPoolExecutor(max_workers=config.workers,
                                           thread_name_prefix="dpsql-serve")
        self.tls_context = _tls_context(config)
        self.store: Store = open_store(config.db)
        self.secret = login_secret(self.store)  # the same at every start (mock salts)
        sandboxes = self.store[SANDBOXES]  # free and catalog queries run there
        if config.free_query_memory is not None:
            try:
                sandboxes.configure(config.free_query_memory)
            except ConfigurationError:
                self.store.close()
                raise
        sandboxes.warm()
        self.admin = AdminChannel(config.db)
        self.catalog = CatalogSource(self.store)
        self._connections: dict[int, Peer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_pid = 1000 + secrets.randbelow(10_000)
        self._server: asyncio.AbstractServer | None = None
        self.port = config.port
        self.console: Console | None = None

    # -- connections registry ---------------------------------------------------------------
    def next_pid(self) -> int:
        """A process id for a new connection (what BackendKeyData and pg_backend_pid show)."""
        self._next_pid += 1
        return self._next_pid

    def register(self, connection: Peer) -> bool:
        """Give a new connection a login slot, dropping another to make room if need be.

        False when every slot is the server's own work (see :class:`LoginSlots`).
        """
        dropped = self.logins.take(connection.pid, connection.host, self._heard)
        if dropped is None:
            return False
        for pid in dropped:
            victim = self._connections.get(pid)
            if victim is not None:
                victim.drop()
        self._connections[connection.pid] = connection
        return True

    @property
    def waiting_turn(self) -> int:
        """Proofs waiting for their turn now."""
        return len(self._waiting_turn)

    def wait_turn(self, connection: Peer) -> bool:
        """Let a connection's proof wait for its turn, out of the login slots; False: turned away.

        When ``max_waiting_turn`` wait already, the address with the most of them
        gives one up: the newcomer itself, if it comes from there, else that
        address's newest (dropped). A guesser's flood from one address so crowds
        out its own proofs, not another address's.
        """
        if len(self._waiting_turn) >= self.max_waiting_turn:
            count = Counter(c.host for c in self._waiting_turn.values())
            most = max(count.values())
            if count[connection.host] == most:
                return False
            host = next(h for h, n in count.items() if n == most)
            victim = [c for c in self._waiting_turn.values() if c.host == host][-1]
            del self._waiting_turn[victim.pid]
            victim.drop()
        self.logins.release(connection.pid)
        self._waiting_turn[connection.pid] = connection
        return True

    def turn_done(self, connection: Peer) -> None:
        """A connection's proof no longer waits (its turn came, or it ended)."""
        self._waiting_turn.pop(connection.pid, None)

    def _heard(self, pid: int) -> bool:
        connection = self._connections.get(pid)
        return connection is not None and connection.heard()

    def log_in(self, connection: Peer, user: str) -> bool:
        """Move an authenticated connection to a client slot; False when they are full."""
        clients = sum(1 for c in self._connections.values() if c.user is not None)
        if clients >= self.config.max_clients:
            return False
        connection.user = user
        self.logins.release(connection.pid)
        return True

    def unregister(self, connection: Peer) -> None:
        """Forget a closed connection."""
        self._connections.pop(connection.pid, None)
        self.logins.release(connection.pid)

    def count_user(self, user: str) -> int:
        """Connections ``user`` has open now."""
        return sum(1 for c in self._connections.values() if c.user == user)

    def cancel(self, pid: int, key: int) -> None:
        """Handle a CancelRequest: only the right secret key cancels (silently otherwise)."""
        target = self._connections.get(pid)
        if target is not None and secrets.compare_digest(target.key.to_bytes(4, "big"),
                                                         (key & 0x7FFFFFFF).to_bytes(4, "big")):
            target.cancel()

    def open_session(self, user: str) -> Session:
        """A session for an authenticated user on the shared store (worker thread)."""
        return connect(self.config.db, user)

    # -- running -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start listening (``port`` 0 picks a free port, then stored in ``self.port``)."""
        host, port = self.config.host, self.config.port
        self.admin.start()
        try:
            self._server = await asyncio.start_server(self._accept, host, port, limit=1 << 16)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise AddressInUse(f"port {port} on {host} is in use by another program; stop "
                                   "it, or choose another port with --port (0 picks a free "
                                   "one)") from err
            raise ConfigurationError(f"cannot listen on {host}:{port}: {err.strerror}; check "
                                     "--host and --port") from err
        sockets = list(self._server.sockets or ())
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        if self.config.console_port is not None:
            self.console = _console(self)
            self.console.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await Connection(self, reader, writer).serve()
        except Exception:
            log.exception("connection handler failed")
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def stop(self, grace: float = 10.0) -> bool:
        """Stop listening, tell connected clients, wait for them, release the store.

        Returns False when statements were still running after ``grace`` seconds; the
        store is then left open (a worker still uses it) and the caller should exit.
        """
        self.admin.stop()
        if self.console is not None:
            self.console.stop()
        if self._server is not None:
            self._server.close()
        # A release may fit for many minutes: stop it (nothing written, the charge stays).
        await asyncio.get_running_loop().run_in_executor(
            None, self.store[JOBS].cancel_all, "server shutdown")
        for connection in list(self._connections.values()):
            await connection.terminate("terminating connection due to administrator command")
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        clean = not self._tasks
        self.executor.shutdown(wait=clean, cancel_futures=True)
        if clean:
            self.catalog.close()
            self.store.close()
        return clean


def _console(server: Server) -> Console:
    """The web console of ``server`` (``dpsql serve --console``)."""
    from dpsql.console.app import Console

    port = server.config.console_port or 0
    try:
        return Console(server.store, server.secret, server.open_session, port,
                       server.config.console_prefix)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise AddressInUse(f"console port {port} on 127.0.0.1 is in use by another "
                               "program; choose another with --console-port (0 picks a free "
                               "one)") from err
        raise


def _tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    if config.tls_cert is None and config.tls_key is None:
        return None
    if config.tls_cert is None or config.tls_key is None:
        raise ConfigurationError("TLS needs both --tls-cert and --tls-key")
    if sys.version_info < (3, 11):
        raise ConfigurationError("TLS in dpsql serve needs Python 3.11 or newer")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
    except (OSError, ssl.SSLError) as err:
        raise ConfigurationError(f"cannot load the TLS certificate or key: {err}") from err
    return context


def run(config: ServerConfig, *, ready: Callable[[Server], Any] | None = None,
        handler_factory: Callable[[Session], StatementHandler] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly."""

    async def main() -> None:
        server = Server(config, handler_factory)
        try:
            await server.start()
        except BaseException:
            await server.stop()
            raise
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready(server)
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            clean.append(await server.stop())

    clean: list[bool] = []
    asyncio.run(main())
    if clean and not clean[0]:
        # A statement is stuck in a worker thread; its charge (if any) is committed. Exit
        # without waiting for it: the store's write-ahead log keeps the file consistent.
        log.error("statements were still running 10 s after shutdown began; exiting anyway")
        logging.shutdown()
        os._exit(1)
