"""One client's way in: the startup packet, TLS, then a SCRAM-SHA-256 login.

A login never refuses a right password: failures only slow the pace of
guesses (:mod:`dpsql.server.logins` keeps the counts). Until it is logged in,
a connection holds one of the server's login slots, which a newcomer may take
while it waits for its client (:meth:`Login.drop`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable
from typing import TypeVar

from dpsql import passwords
from dpsql.server import messages as m
from dpsql.server.host import Host, Peer

log = logging.getLogger("dpsql.server")
T = TypeVar("T")
AUTH_MESSAGE_LIMIT = 10_000


class ConnectionClosed(Exception):
    """Stop serving this connection (after a FATAL error or Terminate)."""


async def fatal(writer: asyncio.StreamWriter, code: str, message: str) -> None:
    """Send a FATAL error, two seconds at most (the client may be gone)."""
    try:
        writer.write(m.error_response(code, message, severity="FATAL"))
        await asyncio.wait_for(writer.drain(), 2)
    except (ConnectionError, asyncio.TimeoutError, ssl.SSLError, OSError, RuntimeError):
        pass


class Login:
    """The login of ``connection`` to ``server``."""

    def __init__(self, server: Host, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, connection: Peer) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.connection = connection
        self.host = connection.host
        self.pid = connection.pid
        self.dropped = False  # its login slot went to a newcomer
        self.failure: str | None = None  # the answer held back after a failed proof
        self._awaiting_client = True  # for its client's next login message (from accept on)
        self._lingers = False  # dropped, it stays open until its login would have timed out

    def drop(self, task: asyncio.Task[object] | None) -> None:
        """Its login slot went to a newcomer: stop logging in (``task`` is the login's).

        One waiting for its client is closed only when its login would have timed
        out, whatever it sends meanwhile: a client that re-opens each closed socket at
        once cannot turn one drop into a chain of them, and each of its sockets made to
        make room is out of its hands that long. (At most ``server.max_lingering`` wait
        so, so that they cannot take all the file descriptors either.)
        """
        server = self.server
        self.dropped = True
        if self._awaiting_client and server.lingering < server.max_lingering:
            server.lingering += 1
            self._lingers = True
        elif task is not None:
            task.cancel()

    async def run(self) -> tuple[str, dict[str, str]] | None:
        """Startup packet and SCRAM login: the user and the client's parameters, or None."""
        tls = False
        while True:
            packet = m.decode_startup(await self._step(m.read_startup(self.reader)))
            if packet.kind == "ssl":
                context = self.server.tls_context
                if context is not None and not tls:
                    self.writer.write(b"S")
                    await self.writer.drain()
                    await self._step(self.writer.start_tls(context))  # type: ignore[attr-defined]
                    tls = True
                else:
                    self.writer.write(b"N")
                    await self.writer.drain()
                continue
            if packet.kind == "gss":
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            if packet.kind == "cancel":
                self.server.cancel(packet.pid, packet.key)
                return None
            break
        if self.server.tls_context is not None and not tls and \
                not self.server.config.allow_plaintext:
            await fatal(self.writer, "28000", "this server accepts TLS connections only; "
                        "connect with sslmode=require")
            return None
        params = dict(packet.params)
        unrecognized = [name for name in params if name.startswith("_pq_.")]
        if packet.version & 0xFFFF or unrecognized:
            self.writer.write(m.negotiate_protocol_version(0, unrecognized))
        user = params.get("user", "")
        if not user:
            await fatal(self.writer, "28000", "no PostgreSQL user name specified in startup "
                        "packet")
            return None
        if "replication" in params and params["replication"].lower() not in ("false", "0",
                                                                             "off", "no"):
            await fatal(self.writer, "28000", "replication connections are not supported")
            return None
        if not await self._authenticate(user):
            return None
        return user, params

    async def _step(self, awaitable: Awaitable[T]) -> T:
        """Wait for the client's next login message (or TLS handshake), a step timeout at most.

        Meanwhile the connection waits for its client: a newcomer may take its slot.
        """
        logins = self.server.logins
        logins.mark(self.pid, logins.CLIENT)
        self._awaiting_client = True
        try:
            result = await asyncio.wait_for(awaitable, self.server.config.login_step_timeout)
        except asyncio.CancelledError:  # the login timer (or the server's stop) ended it
            self._awaiting_client = False
            if self._lingers:  # nothing left to linger for: awaiting now would never end
                self._lingers = False
                self.server.lingering -= 1
            raise
        finally:
            if self._awaiting_client:
                self._awaiting_client = False
                if self._lingers:
                    await self._linger()
        if self.dropped:
            raise ConnectionClosed("its login slot went to a newcomer")
        logins.mark(self.pid, logins.SERVER)
        return result

    async def _linger(self) -> None:
        """Dropped: stay open until the login timer ends it, unless the client has left."""
        try:
            if not self.reader.at_eof():
                await asyncio.Event().wait()  # serve()'s login timer cancels it
        finally:
            self._lingers = False
            self.server.lingering -= 1

    async def _authenticate(self, user: str) -> bool:
        """SCRAM-SHA-256 for ``user``: every proof is checked, a right one always gets in.

        Failures never refuse a login: a wrong proof is answered late (the pair's
        and the address's :meth:`~dpsql.server.logins.LoginBackoff.delay`), and a
        proof waits for its turn (:class:`~dpsql.server.logins.GuessGate`) at most
        ``server.login_wait`` seconds. Once the salt is sent, an exchange that ends
        without a proof checked (the client left, stalled or broke the protocol)
        counts and is logged as a failure too, though it spends no turn (it guessed
        nothing, and must not slow the name's owner).
        """
        server = self.server
        verifier, genuine = await asyncio.get_running_loop().run_in_executor(
            server.executor, passwords.login_verifier, server.store, user, server.secret)
        exchange = passwords.ScramExchange(verifier, genuine=genuine)
        self.writer.write(m.auth_sasl([passwords.MECHANISM]))
        await self.writer.drain()
        salted = checked = False
        try:
            kind, payload = await self._step(m.read_message(self.reader, AUTH_MESSAGE_LIMIT))
            if kind != b"p":
                raise m.ProtocolViolation("expected a SASL response")
            mechanism, first = m.decode_sasl_initial(payload)
            if mechanism != passwords.MECHANISM:
                raise m.ProtocolViolation("client selected an invalid SASL authentication "
                                          "mechanism")
            self.writer.write(m.auth_sasl_continue(exchange.first(first)))
            salted = True
            await self.writer.drain()
            kind, payload = await self._step(m.read_message(self.reader, AUTH_MESSAGE_LIMIT))
            if kind != b"p":
                raise m.ProtocolViolation("expected a SASL response")
            await self._turn(user)
            checked = True
            final = exchange.final(payload)
        except passwords.AuthFailed:
            self._count_failure(user, "failed")
            if checked:  # a guess: it spends one of the name's turns
                server.gate.spend(user)
            await self._hold_failure(user)
            return False
        except BaseException:
            if salted and not self.dropped:
                self._count_failure(user, "abandoned")
            raise
        server.backoff.succeeded(user, self.host)
        self.writer.write(m.auth_sasl_final(final) + m.auth_ok())
        return True

    async def _turn(self, user: str) -> None:
        """Wait until a proof of ``user`` may be checked, ``login_wait`` seconds at most.

        It waits out of the login slots, among at most ``max_waiting_turn`` others:
        past that, it or another is turned away unchecked (only a flood of guesses
        fills them; see :meth:`~dpsql.server.server.Server.wait_turn`).
        """
        server, loop = self.server, asyncio.get_running_loop()
        if server.gate.turn(user) <= 0:
            return
        if not server.wait_turn(self.connection):
            self.dropped = True  # serve() says so
            raise ConnectionClosed("too many proofs wait for their turn")
        try:
            deadline = loop.time() + server.login_wait
            while (wait := server.gate.turn(user)) > 0 and loop.time() < deadline:
                await asyncio.sleep(min(wait, deadline - loop.time()))
        finally:
            server.turn_done(self.connection)

    def _count_failure(self, user: str, how: str) -> None:
        """Count a failed (or abandoned) exchange of ``user``: same count, known name or not."""
        self.server.backoff.failed(user, self.host)
        log.warning("%s login for user %r from %s", how, user, self.host)

    async def _hold_failure(self, user: str) -> None:
        """Answer a wrong proof, after the delay its name and address have earned.

        The slot stays taken meanwhile, first in line for a newcomer (which then
        gets this answer sent at once): a held answer never keeps anyone out.
        """
        server = self.server
        self.failure = f'password authentication failed for user "{user}"'
        server.logins.mark(self.pid, server.logins.HELD)
        await asyncio.sleep(max(server.config.failed_login_delay,
                                server.backoff.delay(user, self.host)))
        server.logins.release(self.pid)  # nothing left to do for this login but say so
        await fatal(self.writer, "28P01", self.failure)
