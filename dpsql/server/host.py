"""The server as its connections see it: its settings, and what a connection may ask of it.

:class:`~dpsql.server.server.Server` is the one host; a connection knows it only
through :class:`Host`, so the connection sits below the server that makes it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dpsql.server.catalog import CatalogSource
    from dpsql.server.logins import GuessGate, LoginBackoff, LoginSlots
    from dpsql.server.router import StatementHandler
    from dpsql.session import Session
    from dpsql.store import Store


@dataclass(frozen=True)
class ServerConfig:
    """How ``dpsql serve`` runs (see ``dpsql serve --help``)."""

    db: Path
    host: str = "127.0.0.1"
    port: int = 5433
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_plaintext: bool = False
    max_clients: int = 200  # logged-in connections
    max_pending_logins: int = 64  # connections still logging in (their own slots)
    login_timeout: float = 10.0  # seconds from connecting to logged in
    login_step_timeout: float = 1.0  # seconds for each message of the client's before that
    statement_timeout: float = 300.0  # seconds; 0 means none
    max_message: int = 1 << 20
    workers: int = 8
    failed_login_delay: float = 0.5
    login_failures_free: int = 5  # per name (then it waits its turn), and per (name, address)
    login_failures_free_per_host: int = 50  # per address: then its failures are answered later
    login_guesses_per_second: float = 1.0  # proofs of a name checked, once its free ones are spent
    console_port: int | None = None  # the admins' web console on 127.0.0.1 (None: off)
    console_prefix: str | None = None  # its secret path prefix (None: a random one)
    free_query_memory: int | None = None  # bytes a free or catalog query's sandbox may map


class Peer(Protocol):
    """A client connection as its server's registry sees it."""

    pid: int
    host: str
    key: int
    user: str | None

    def drop(self) -> None:
        """Its login slot goes to a newcomer."""

    def heard(self) -> bool:
        """Whether bytes from its client wait to be read."""

    def cancel(self) -> None:
        """Stop its running statement (a CancelRequest)."""

    async def terminate(self, message: str) -> None:
        """Tell its client the server stops, then close."""


class Host(Protocol):
    """What a connection uses of its server: shared settings, limits, the store, the pool."""

    config: ServerConfig
    store: Store
    secret: bytes
    tls_context: ssl.SSLContext | None
    executor: ThreadPoolExecutor
    catalog: CatalogSource
    handler_factory: Callable[[Session], StatementHandler]
    started: str
    login_wait: float
    logins: LoginSlots
    gate: GuessGate
    backoff: LoginBackoff
    lingering: int
    max_lingering: int

    def next_pid(self) -> int:
        """A process id for a new connection."""

    def register(self, connection: Peer) -> bool:
        """Give a new connection a login slot; False: none is free."""

    def unregister(self, connection: Peer) -> None:
        """Forget a closed connection."""

    def wait_turn(self, connection: Peer) -> bool:
        """Let a proof wait for its turn; False: turned away."""

    def turn_done(self, connection: Peer) -> None:
        """A proof no longer waits."""

    def log_in(self, connection: Peer, user: str) -> bool:
        """Move a logged-in connection to a client slot; False: full."""

    def count_user(self, user: str) -> int:
        """Connections ``user`` has open now."""

    def cancel(self, pid: int, key: int) -> None:
        """A CancelRequest for connection ``pid``, if ``key`` is its own."""

    def open_session(self, user: str) -> Session:
        """A session for a logged-in user (on a worker thread)."""

