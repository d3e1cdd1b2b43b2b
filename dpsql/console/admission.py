"""Who the console's HTTP server lets in: a bounded few waiting, a bounded few served.

A connection first waits for its request line among at most ``MAX_WAITING``
(``MAX_WAITING_PER_ADDRESS`` from one address), a newcomer dropping the oldest;
only a request below the secret prefix then takes one of ``MAX_CONNECTIONS``
serving slots. So a stranger's idle sockets keep no administrator out.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter, OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CONNECTIONS = 32  # requests below the prefix served at once; more are answered 503
MAX_WAITING = 64  # connections yet to send their request line (a thread each), in all
MAX_WAITING_PER_ADDRESS = 16  # ... and from one client address


class Waiting:
    """Connections yet to send their request line: ``total`` in all, ``per_address`` an address.

    Nothing shows the prefix before the request line, so strangers' idle sockets
    live here, apart from the requests being served. A newcomer is never turned
    away: the oldest waiting connection of its address (or, when all are taken,
    of all) is dropped to make room. An admin's browser sends its request line at
    once, so idle sockets, which can only ever be older, cannot keep it out.
    """

    def __init__(self, total: int, per_address: int) -> None:
        self.total = total
        self.per_address = per_address
        self._order: OrderedDict[Any, str] = OrderedDict()  # connection -> address, oldest first
        self._per_host: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, connection: Any, host: str) -> list[Any]:
        """Let ``connection`` from ``host`` wait; the connections to drop to make room."""
        with self._lock:
            dropped = []
            if self._per_host[host] >= self.per_address:
                dropped.append(next(c for c, h in self._order.items() if h == host))
                self._forget(dropped[-1])
            if len(self._order) >= self.total:
                dropped.append(next(iter(self._order)))
                self._forget(dropped[-1])
            self._order[connection] = host
            self._per_host[host] += 1
            return dropped

    def remove(self, connection: Any) -> bool:
        """``connection`` stops waiting; whether it was still waiting (not dropped)."""
        with self._lock:
            return self._forget(connection)

    def drop_all(self) -> None:
        """Drop every waiting connection (the console stops)."""
        with self._lock:
            waiting = list(self._order)
            for connection in waiting:
                self._forget(connection)
        for connection in waiting:
            drop(connection)

    def count(self, host: str | None = None) -> int:
        """Connections waiting now, in all or from ``host``."""
        with self._lock:
            return len(self._order) if host is None else self._per_host[host]

    def _forget(self, connection: Any) -> bool:
        host = self._order.pop(connection, None)
        if host is None:
            return False
        self._per_host[host] -= 1
        if not self._per_host[host]:
            del self._per_host[host]
        return True


def drop(connection: socket.socket) -> None:
    """End a connection another thread reads: its read returns at once, empty."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class Server(ThreadingHTTPServer):
    """A thread per connection; at most ``MAX_CONNECTIONS`` serve requests below the prefix.

    Idle or slow sockets would otherwise hold a thread each without end, until the
    process (the SQL server's too) could start no more. A connection first waits
    for its request line, briefly and among a bounded few (:class:`Waiting`); only
    a request below the prefix then takes one of the serving slots (503 when they
    are full), so a stranger, who does not know the prefix, cannot take them.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.waiting = Waiting(MAX_WAITING, MAX_WAITING_PER_ADDRESS)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Let the connection wait for its request line (dropping the oldest), then serve it."""
        for older in self.waiting.add(request, str(client_address[0])):
            drop(older)
        super().process_request(request, client_address)
